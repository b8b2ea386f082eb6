"""What the engine says it can split, and that its README's table says the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from exo_core.plugin import (
    ModelId,
    NodeId,
    NodeShare,
    PlacementOption,
    PlacementRefused,
    Sharding,
    runnable,
)
from exo_engine_mlx.engine import MlxEngine
from exo_engine_mlx.families import WHY_NO_PIPELINE, family_support, markdown_table
from exo_engine_mlx.family_sweep import tiny_card
from exo_engine_mlx.tiny_unbuildable import UNBUILDABLE

README = Path(__file__).parents[1] / "README.md"


def test_the_readme_table_is_the_generated_one() -> None:
    text = README.read_text()
    start = text.index("<!-- families:start -->\n") + len("<!-- families:start -->\n")
    end = text.index("<!-- families:end -->")
    assert text[start:end] == markdown_table(), (
        "regenerate: uv run python -m exo_engine_mlx.families"
    )


@pytest.mark.parametrize(
    ("model_type", "pipeline", "tensor"),
    [
        ("llama", "layers", True),
        ("mistral", "layers", True),  # an alias of llama in mlx-lm
        ("qwen3_moe", "mlx-lm", True),
        ("kimi_k2", "mlx-lm", True),  # an alias of deepseek_v3
        ("qwen3_next", "mlx-lm", False),
        ("gpt_oss", "layers", True),  # its own forward on a slice of its layers
        ("minimax_m2", "layers", True),  # an alias of minimax
        # The rest of the families the issue names: every one splits pipeline-wise.
        ("deepseek_v32", "mlx-lm", True),
        ("glm4_moe", "mlx-lm", True),
        ("qwen3_5", "mlx-lm", True),
        ("qwen3_5_moe", "mlx-lm", True),  # its model extends qwen3_5's, which has the mixin
        ("step3p5", "layers", True),
        ("gemma", "layers", False),  # the embedding scale only on the first rank
        ("gemma2", "layers", False),
        ("gemma3", "layers", False),  # a multimodal wrapper of gemma3_text
        ("gemma3_text", "layers", False),  # sliding layers by their index in the whole model
        ("nemotron_h", "layers", False),  # caches only in mamba and attention blocks
        ("iquestloopcoder", "layers", True),  # its stack twice: the state goes round twice
        ("gemma3n", "layers", False),  # per-layer inputs packed after the hidden state
        ("bitnet", None, False),  # not tried: no tiny bitnet runs here (Metal kernels)
    ],
)
def test_support_per_family(model_type: str, pipeline: str | None, tensor: bool) -> None:
    support = family_support(model_type)
    assert support.runs and (support.pipeline, support.tensor) == (pipeline, tensor)


def test_a_no_says_why() -> None:
    # Every family without a tiny model that runs here (it was not tried), and every reason
    # families.WHY_NO_PIPELINE gives, is a "no" that says why; a reason goes once it splits.
    for model_type in [*UNBUILDABLE, *WHY_NO_PIPELINE]:
        support = family_support(model_type)
        assert support.pipeline or support.why_no_pipeline, model_type
    stale = [t for t in WHY_NO_PIPELINE if family_support(t).pipeline is not None]
    assert not stale, "these split now: drop their reasons"


def test_refusals_say_why() -> None:
    assert family_support("qwen3_moe").refusal("pipeline") is None
    bitnet = family_support("bitnet").refusal("pipeline")
    assert bitnet is not None and bitnet.startswith("bitnet: pipeline parallel")
    assert "not tried" in bitnet  # the reason
    nxt = family_support("qwen3_next").refusal("tensor")
    assert nxt is not None and "shard()" in nxt
    unknown = family_support("no_such_model").refusal("pipeline")
    assert unknown is not None and "cannot load" in unknown


def test_the_engine_refuses_only_what_it_cannot_split() -> None:
    engine = MlxEngine()
    assert engine.sharding_refusal(tiny_card("qwen3_moe"), "pipeline", 4) is None
    bitnet = engine.sharding_refusal(tiny_card("bitnet"), "pipeline", 2)
    assert bitnet is not None and bitnet.startswith("bitnet: pipeline parallel")
    assert engine.sharding_refusal(tiny_card("qwen3_moe"), "tensor", 2) is None
    assert engine.sharding_refusal(tiny_card("bitnet"), "pipeline", 1) is None  # one node
    assert engine.sharding_refusal(tiny_card("gpt_oss"), "pipeline", 2) is None
    assert engine.sharding_refusal(tiny_card(""), "pipeline", 2) is None  # architecture unknown


def test_placement_keeps_only_runnable_options_and_says_why_when_none_is() -> None:
    def option(sharding: Sharding, nodes: int) -> PlacementOption:
        shares = tuple(
            NodeShare(node_id=NodeId(f"n{i}"), start_layer=i, end_layer=i + 1, memory_bytes=1)
            for i in range(nodes)
        )
        return PlacementOption(model_id=ModelId("x/bitnet"), sharding=sharding, shares=shares)

    engine = MlxEngine()
    card = tiny_card("bitnet")

    def refusal(o: PlacementOption) -> str | None:
        return engine.sharding_refusal(card, o.sharding, len(o.shares))

    options = [option("pipeline", 2), option("tensor", 2), option("pipeline", 1)]
    assert runnable(options, refusal) == options[2:]  # neither pipeline nor tensor on 2
    with pytest.raises(PlacementRefused, match="bitnet: pipeline parallel"):
        runnable([option("pipeline", 2), option("pipeline", 3)], refusal)
    assert runnable([], refusal) == []
