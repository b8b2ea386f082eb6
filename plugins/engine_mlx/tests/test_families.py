"""What the engine says it can split, and that its README's table says the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exo_core.plugin import ModelId, NodeId, PlacementRefused, Sharding
from exo_core.plugin.placement import NodeShare, PlacementOption, PlacementRequest, place, runnable
from exo_core.testing.cluster_state import nodes_with_free_memory
from exo_engine_mlx.engine import MlxEngine
from exo_engine_mlx.families import (
    WHY_NO_PIPELINE,
    FamilySupport,
    all_model_types,
    family_support,
    markdown_table,
)
from exo_engine_mlx.family_sweep import tiny_card

README = Path(__file__).parents[1] / "README.md"
TINY_CONFIGS = Path(__file__).parents[1] / "src" / "exo_engine_mlx" / "tiny_configs"


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
        ("bitnet", "layers", False),  # ternary layers as 8-bit affine ones off Metal
        ("jamba", "layers", False),  # attention + mamba: mask indices re-found on a slice
        ("falcon_h1", "layers", False),  # attention and mamba in every layer (CacheList)
        ("kimi_k3", "mlx-lm", True),  # pipelines itself, without mlx-lm's mixin
        ("longcat_flash", "layers", True),  # two attention blocks per layer (CacheList)
    ],
)
def test_support_per_family(model_type: str, pipeline: str | None, tensor: bool) -> None:
    support = family_support(model_type)
    assert support.runs and (support.pipeline, support.tensor) == (pipeline, tensor)


def test_every_no_says_why() -> None:
    # A family the engine does not split says why (families.WHY_NO_PIPELINE, read from its
    # mlx-lm code, or why no tiny model of it runs here); a reason goes once it splits.
    supports = [family_support(t) for t in all_model_types()]
    silent = [s.model_type for s in supports if s.runs and not s.pipeline and not s.why_no_pipeline]
    assert not silent, "say why in families.WHY_NO_PIPELINE"
    stale = [t for t in WHY_NO_PIPELINE if family_support(t).pipeline is not None]
    assert not stale, "these split now: drop their reasons"


def test_refusals_say_why() -> None:
    assert family_support("qwen3_moe").refusal("pipeline") is None
    # Every family mlx-lm runs splits pipeline-wise today; one that did not would say why.
    unsplit = FamilySupport("x", True, None, False, why_no_pipeline="its layers share a cache")
    assert unsplit.refusal("pipeline") == (
        "x: pipeline parallel is not supported here (its layers share a cache)"
    )
    nxt = family_support("qwen3_next").refusal("tensor")
    assert nxt is not None and "shard()" in nxt
    unknown = family_support("no_such_model").refusal("pipeline")
    assert unknown is not None and "cannot load" in unknown


def test_the_engine_refuses_only_what_it_cannot_split() -> None:
    engine = MlxEngine()
    assert engine.sharding_refusal(tiny_card("qwen3_moe"), "pipeline", 4) is None
    bitnet = engine.sharding_refusal(tiny_card("bitnet"), "tensor", 2)
    assert bitnet is not None and bitnet.startswith("bitnet: tensor parallel")
    assert engine.sharding_refusal(tiny_card("qwen3_moe"), "tensor", 2) is None
    assert engine.sharding_refusal(tiny_card("bitnet"), "tensor", 1) is None  # one node
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
    assert runnable(options, refusal) == [options[0], options[2]]  # no tensor on 2
    with pytest.raises(PlacementRefused, match="bitnet: tensor parallel"):
        runnable([option("tensor", 2), option("tensor", 3)], refusal)
    assert runnable([], refusal) == []


def test_placement_gives_every_nemotron_h_rank_a_layer_that_holds_a_cache(tmp_path: Path) -> None:
    """The tiny Nemotron-H's pattern is M E * -: its last layer (an MLP) holds no cache, so a
    rank given only that layer cannot run (the runner refuses it at load). Placement splits
    by free memory: 3:1 gives the second rank just that layer, 1:1 gives it * -."""
    import msgspec

    from exo_engine_mlx.distributed.pipeline import PipelineUnsupported
    from exo_engine_mlx.tiny_model import make_tiny_model

    path = make_tiny_model(tmp_path / "nemotron_h", model_type="nemotron_h", layers=4)
    card = msgspec.structs.replace(tiny_card("nemotron_h"), source=f"local:{path}")
    engine = MlxEngine()
    request = PlacementRequest(model_id=card.model_id, sharding="pipeline", min_nodes=2)

    def placed(free_gb: tuple[int, int]) -> list[PlacementOption]:
        options = place(card, request, nodes_with_free_memory(free_gb))  # the node's own path
        return runnable(options, lambda o: engine.placement_refusal(card, o))

    with pytest.raises(PlacementRefused, match=r"nemotron_h: rank 1 would hold layers \[3, 4\)"):
        placed((3, 1))
    even = placed((1, 1))
    assert [(s.start_layer, s.end_layer) for s in even[0].shares] == [(0, 2), (2, 4)]
    # The runner agrees: it refuses the split placement refused and loads the one it kept.
    with pytest.raises(PipelineUnsupported, match="hold no cache"):
        _slice(path, 3, 4, rank=1)
    _slice(path, 2, 4, rank=1)
    # A hub card has no config.json here: the pattern key it carries (as a shipped Nemotron-H
    # card does) gets the same answers; with no key, the split is left to the runner's check.
    pattern = json.loads((path / "config.json").read_text())["hybrid_override_pattern"]
    hub = msgspec.structs.replace(
        card, source="hf:x/y", config={"hybrid_override_pattern": "".join(pattern)}
    )
    bad, good = place(card, request, nodes_with_free_memory((3, 1)))[0], even[0]
    refusal = engine.placement_refusal(hub, bad)
    assert refusal is not None and refusal.startswith("nemotron_h: rank 1 would hold layers [3, 4)")
    assert engine.placement_refusal(hub, good) is None
    bare = msgspec.structs.replace(hub, config={})
    assert engine.placement_refusal(bare, bad) is None


def _slice(path: Path, start: int, end: int, rank: int) -> None:
    """Cut the model as a pipeline rank's runner does (no ring needed to cut it)."""
    from exo_engine_mlx.distributed.pipeline import split_pipeline
    from exo_engine_mlx.distributed.testing import RankOfTwo
    from exo_engine_mlx.loading import load_model

    model, _ = load_model(str(path))
    split_pipeline(model, start, end, (start, 4 - start), RankOfTwo(rank))  # type: ignore[arg-type]


def test_a_nemotron_nas_rank_of_no_op_attention_blocks_only_is_refused() -> None:
    from exo_engine_mlx.distributed.slicing_hybrid import cacheless_rank_refusal

    config = json.loads((TINY_CONFIGS / "nemotron-nas.json").read_text())  # layer 1: no-op
    refusal = cacheless_rank_refusal("nemotron-nas", config, [(0, 1), (1, 2), (2, 4)])
    assert refusal is not None and refusal.startswith("nemotron-nas: rank 1 would hold")
    assert cacheless_rank_refusal("nemotron-nas", config, [(0, 2), (2, 4)]) is None
    assert cacheless_rank_refusal("llama", config, [(0, 1), (1, 2), (2, 4)]) is None


def test_placement_keeps_a_gemma_kv_shared_layer_with_the_layer_it_reads(tmp_path: Path) -> None:
    """The tiny Gemma 3n's layers are S F S F and layer 3 reuses layer 1's keys and values:
    a split that puts layer 3 on another rank than layer 1 cannot run. Placement splits by
    free memory: 1:1 and 3:1 separate them, 1:3 gives the second rank layers 1 to 3."""
    import msgspec

    from exo_engine_mlx.tiny_model import make_tiny_model

    path = make_tiny_model(tmp_path / "gemma3n", model_type="gemma3n", layers=4)
    card = msgspec.structs.replace(tiny_card("gemma3n"), source=f"local:{path}")
    engine = MlxEngine()
    request = PlacementRequest(model_id=card.model_id, sharding="pipeline", min_nodes=2)

    def placed(free_gb: tuple[int, int]) -> list[PlacementOption]:
        options = place(card, request, nodes_with_free_memory(free_gb))
        return runnable(options, lambda o: engine.placement_refusal(card, o))

    for free in ((1, 1), (3, 1)):
        with pytest.raises(PlacementRefused, match="gemma3n: rank 1 would hold layer 3"):
            placed(free)
    kept = placed((1, 3))
    assert [(s.start_layer, s.end_layer) for s in kept[0].shares] == [(0, 1), (1, 4)]
    # The runner agrees: it refuses the split placement refused and loads the one it kept.
    with pytest.raises(ValueError, match="layer 3 reuses the keys and values of layer 1"):
        _slice(path, 2, 4, rank=1)
    _slice(path, 1, 4, rank=1)
    # A hub card carrying the two keys the check reads, from the model's config.json, gets
    # the same answers without the directory.
    text = json.loads((path / "config.json").read_text())
    text = text.get("text_config") or text
    keys = {k: text[k] for k in ("layer_types", "num_kv_shared_layers")}
    hub = msgspec.structs.replace(card, source="hf:x/y", config={"text_config": keys})
    refused = place(card, request, nodes_with_free_memory((1, 1)))[0]
    refusal = engine.placement_refusal(hub, refused)
    assert refusal is not None and refusal.startswith("gemma3n: rank 1 would hold layer 3")
    assert engine.placement_refusal(hub, kept[0]) is None
