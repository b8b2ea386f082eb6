"""The layer-slicing adapters on one rank: a `SlicedStage` holding every layer computes the
family's own logits, in prefill and in decode with its caches (the 2-rank runs are in
test_family_groups; these take a second and show which adapter broke)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from exo_engine_mlx.distributed.pipeline import (
    PipelineUnsupported,
    SlicedStage,
    pipeline_method,
    split_pipeline,
)
from exo_engine_mlx.distributed.testing import RankOfTwo
from exo_engine_mlx.tiny_model import TINY_FAMILIES, make_tiny_model

PROMPT = [[5, 17, 42, 8, 99, 3, 250, 7, 61, 12, 33]]  # longer than gemma3_text's window of 8


def _load(path: Path) -> Any:
    from mlx_lm import load

    return load(str(path))[0]


def _gemma3() -> Any:
    """Gemma 3's multimodal wrapper around a tiny gemma3_text (no tiny files for it)."""
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.models import gemma3

    text = {
        "model_type": "gemma3_text",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        **TINY_FAMILIES["gemma3_text"],
    }
    mx.random.seed(0)
    model = gemma3.Model(gemma3.ModelArgs(model_type="gemma3", text_config=text, vocab_size=400))
    # Larger weights than the default init, as make_tiny_model does: a clear winner.
    weights: Any = tree_flatten(model.parameters())
    model.update(tree_unflatten([(k, v * 4 if v.ndim == 2 else v) for k, v in weights]))
    return model


def _logits(model: Any, cache: list[Any]) -> list[mx.array]:
    first = model(mx.array(PROMPT), cache=cache)[:, -1, :]
    second = model(mx.array([[9]]), cache=cache)[:, -1, :]
    mx.eval(first, second)
    return [first, second]


@pytest.mark.parametrize("family", ["gemma", "gemma2", "gemma3_text", "gemma3", "nemotron_h"])
def test_a_stage_with_every_layer_computes_the_familys_logits(family: str, tmp_path: Path) -> None:
    def build() -> Any:
        if family == "gemma3":
            return _gemma3()
        return _load(make_tiny_model(tmp_path / family, model_type=family, layers=4))

    whole = build()
    expected = _logits(whole, make_prompt_cache(whole))
    model = build()
    assert pipeline_method(model) == "sliced"
    n = len(model.layers)
    stage = split_pipeline(model, 0, n, (n,), mx.distributed.init())
    assert isinstance(stage, SlicedStage)
    got = _logits(stage, stage.make_cache())
    for want, have in zip(expected, got, strict=True):
        assert mx.allclose(want.astype(mx.float32), have, atol=1e-4).item()


def test_a_nemotron_h_slice_without_caches_is_refused(tmp_path: Path) -> None:
    # The pattern is M E * -: layer 1 (experts) alone holds no cache for the send to ride on.
    model = _load(make_tiny_model(tmp_path / "n", model_type="nemotron_h", layers=4))
    with pytest.raises(PipelineUnsupported, match="hold no cache"):
        split_pipeline(model, 1, 2, (1, 1), mx.distributed.init())


def test_qwen3_5_moe_splits_through_the_model_it_extends() -> None:
    from mlx_lm.models import qwen3_5_moe

    text = {
        "model_type": "qwen3_5_moe_text",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 100,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "full_attention_interval": 2,
    }
    args: Any = qwen3_5_moe.ModelArgs.from_dict(
        {"model_type": "qwen3_5_moe", "text_config": text}
    )  # the Model class it extends declares the base family's args
    assert pipeline_method(qwen3_5_moe.Model(args)) == "mlx-lm"


@pytest.mark.parametrize("first", [1, 2, 3])
def test_llama4_split_anywhere_gives_the_whole_models_tokens(
    first: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Llama 4's own forward tells chunked from global layers by list position; the engine's
    # loop by each layer's index in the whole model. 18 prompt tokens and 11 more cross the
    # tiny config's chunks of 8; every split point of 4 layers is checked (the sweep: 1 + 3).
    handed: dict[str, mx.array] = {}

    def send(x: mx.array, dst: int, group: Any = None) -> mx.array:
        handed["h"] = x
        return x

    monkeypatch.setattr(mx.distributed, "send", send)
    monkeypatch.setattr(mx.distributed, "recv_like", lambda like, src, group=None: handed["h"])
    monkeypatch.setattr(mx.distributed, "all_sum", lambda x, group=None: x)
    path = make_tiny_model(tmp_path / "llama4", model_type="llama4", layers=4)
    prompt = [5, 17, 42, 8, 99, 3, 250, 7, 61, 12, 33, 14, 15, 16, 17, 18, 19, 20]

    def greedy(step: Any) -> list[int]:
        x, out = mx.array([prompt]), []
        for _ in range(12):
            out.append(int(mx.argmax(step(x)[:, -1, :], axis=-1).item()))
            x = mx.array([out[-1:]])
        return out

    whole = _load(path)
    whole_cache = whole.make_cache()
    expected = greedy(lambda x: whole(x, cache=whole_cache))
    counts = (first, 4 - first)
    stages = [
        split_pipeline(_load(path), 0, first, counts, RankOfTwo(0)),
        split_pipeline(_load(path), first, 4, counts, RankOfTwo(1)),
    ]
    caches = [s.make_cache() for s in stages]

    def both(x: mx.array) -> mx.array:
        stages[0](x, cache=caches[0])
        return stages[1](x, cache=caches[1])

    assert greedy(both) == expected
