"""Which pipeline splits a model with KV shared between layers (Gemma 3n, Gemma 4) can run:
a KV-shared layer must sit on the rank of the layer whose keys and values it reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exo_engine_mlx.distributed.slicing_state import kv_sources, shared_kv_split_refusal

TINY_CONFIGS = Path(__file__).parents[1] / "src" / "exo_engine_mlx" / "tiny_configs"
S, F = "sliding_attention", "full_attention"


def test_kv_sources_follow_the_last_earlier_layer_of_each_kind() -> None:
    # Gemma 3n E2B's shape: 30 layers (4 sliding, 1 full), the last 10 reuse layers 18 / 19.
    kinds = ([S] * 4 + [F]) * 6
    sources = kv_sources(kinds, 10)
    assert sources[:20] == list(range(20))
    assert sources[20:] == [18, 18, 18, 18, 19] * 2
    assert kv_sources(kinds, 0) == list(range(30))


@pytest.mark.parametrize("model_type", ["gemma3n", "gemma4", "gemma4_text"])
def test_a_split_must_keep_a_kv_shared_layer_with_its_source(model_type: str) -> None:
    # The tiny models: S F S F, layer 3 reuses layer 1's keys and values.
    entries = json.loads((TINY_CONFIGS / f"{model_type}.json").read_text())
    config = {k: v for k, v in entries.items() if not k.startswith("_")}
    common = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
              "intermediate_size": 128, "vocab_size": 400, "rms_norm_eps": 1e-5}  # fmt: skip
    if "text_config" in config:
        config["text_config"] = {**common, **config["text_config"]}
    else:
        config = {**common, **config}
    module = "gemma4" if model_type == "gemma4_text" else model_type
    assert shared_kv_split_refusal(module, config, [(0, 1), (1, 4)]) is None
    refusal = shared_kv_split_refusal(module, config, [(0, 2), (2, 4)])
    assert refusal is not None and refusal.startswith(f"{module}: rank 1 would hold layer 3")
    assert "layers 1 to 3" in refusal
    assert shared_kv_split_refusal(module, config, [(0, 3), (3, 4)]) is not None
    assert shared_kv_split_refusal("llama", config, [(0, 2), (2, 4)]) is None
