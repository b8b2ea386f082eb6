# ruff: noqa: RUF001  (DeepSeek's markers are fullwidth characters by design)
"""Built-in cards (resources/model_cards) and custom cards built from a repo's config.json."""

from __future__ import annotations

from pathlib import Path

import pytest

from exo_core.builtin import output_parsers
from exo_core.ids import ModelId, NodeId
from exo_core.model_cards import Capability, ModelCard, load_card_file
from exo_core.placement import place, runnable
from exo_core.placement_types import NodeShare, PlacementOption, PlacementRefused, PlacementRequest
from exo_core.state import Sharding
from exo_core.testing.cluster_state import nodes_with_free_memory
from exo_download_hf import plugin
from exo_download_hf.cards import CardError, card_dir, card_from_config, hub_ref
from exo_download_hf.chat_format import detect
from exo_download_hf.hub import RemoteFile
from exo_download_hf.verify import ExpectedHash
from exo_engine_mlx.engine import MlxEngine
from exo_engine_mlx.families import family_support

CARDS = sorted(Path(__file__).parents[2].joinpath("resources", "model_cards").glob("*.toml"))


def test_there_are_builtin_cards() -> None:
    assert len(CARDS) >= 5


@pytest.mark.parametrize("path", CARDS, ids=lambda p: p.stem)
def test_every_card_file_is_valid(path: Path) -> None:
    card = load_card_file(path)  # the core's schema: unknown keys are errors
    assert path.stem == card.model_id.replace("/", "--")
    ref = hub_ref(card)
    assert ref is not None and ref.repo_id == card.model_id
    assert card.n_layers > 0 and card.hidden_size > 0 and card.storage_size_bytes > 0
    if card.makes_images:  # image models: their parts add up, one of them splits
        assert sum(c.storage_size_bytes for c in card.components) == card.storage_size_bytes
        assert [c.n_blocks for c in card.components if c.splittable] == [card.n_layers]
    else:
        kv = card.num_key_value_heads
        assert kv is not None and kv > 0
    assert not card.custom


TEXT_CARDS = [p for p in CARDS if not load_card_file(p).makes_images]


def _two_ranks(card: ModelCard, sharding: Sharding) -> PlacementOption:
    half = card.n_layers // 2
    return PlacementOption(
        model_id=ModelId(card.model_id),
        sharding=sharding,
        shares=(
            NodeShare(node_id=NodeId("a"), start_layer=0, end_layer=half, memory_bytes=1),
            NodeShare(
                node_id=NodeId("b"), start_layer=half, end_layer=card.n_layers, memory_bytes=1
            ),
        ),
    )


@pytest.mark.parametrize("path", TEXT_CARDS, ids=lambda p: p.stem)
def test_every_text_card_names_a_family_the_engine_splits(path: Path) -> None:
    # Cards are shipped for models people split over nodes: each names an architecture the
    # MLX engine runs and pipelines over two ranks, and claims a tensor split exactly when
    # placement offers one, so no card names a family the engine would refuse.
    card = load_card_file(path)
    assert card.model_type, "a text card names its config's model_type"
    support = family_support(card.model_type)
    assert support.runs, support.why_not
    engine = MlxEngine()
    assert engine.can_serve(card)
    assert support.pipeline is not None
    assert engine.placement_refusal(card, _two_ranks(card, "pipeline")) is None
    tensor_refusal = engine.placement_refusal(card, _two_ranks(card, "tensor"))
    assert card.supports_tensor == (tensor_refusal is None), tensor_refusal
    assert card.supports_tensor == support.tensor


NEMOTRON_H_CARDS = [p for p in TEXT_CARDS if load_card_file(p).model_type == "nemotron_h"]


@pytest.mark.parametrize("path", NEMOTRON_H_CARDS, ids=lambda p: p.stem)
def test_every_nemotron_h_card_carries_its_layer_pattern(path: Path) -> None:
    # Placement reads it to keep every rank holding a cached (Mamba or attention) layer.
    card = load_card_file(path)
    pattern = card.config["hybrid_override_pattern"]
    assert isinstance(pattern, str) and len(pattern) == card.n_layers
    assert set(pattern) <= set("ME*-") and {"M", "*"} <= set(pattern)


def test_placement_refuses_a_shipped_nemotron_h_split_that_leaves_a_rank_no_cache() -> None:
    """The hub card (no weights on this node) is placed by free memory: 55:1 gives the second
    node only the last layer, an MLP, which the runner would refuse at load; 1:1 is fine."""
    card = load_card_file(_card_path(NEMOTRON_NANO_9B_V2))
    assert card.source.startswith("hf:")
    engine = MlxEngine()
    request = PlacementRequest(model_id=card.model_id, sharding="pipeline", min_nodes=2)

    def placed(free_gb: tuple[int, ...]) -> list[PlacementOption]:
        options = place(card, request, nodes_with_free_memory(free_gb))
        return runnable(options, lambda o: engine.placement_refusal(card, o))

    with pytest.raises(PlacementRefused, match=r"nemotron_h: rank 1 would hold layers \[55, 56\)"):
        placed((55, 1))
    kept = placed((4, 4))
    assert [(s.start_layer, s.end_layer) for s in kept[0].shares] == [(0, 28), (28, 56)]


# Parser names a card may give: the core's parsers, mlx-lm's tool parser modules (what a custom
# card records from the tokenizer, `chat_format.detect`), and the engine's Harmony reader.
REASONING_PARSERS = {None, "think"}


def _tool_parsers() -> set[str | None]:
    import mlx_lm.tool_parsers

    modules = {p.stem for p in Path(mlx_lm.tool_parsers.__file__).parent.glob("*.py")}
    core = set(output_parsers.exo_output_parsers()) - {"think"}  # hermes, DeepSeek's DSML
    return {None, "harmony", *core} | (modules - {"__init__", "json_tools"})


@pytest.mark.parametrize("path", TEXT_CARDS, ids=lambda p: p.stem)
def test_every_text_card_names_parsers_that_exist(path: Path) -> None:
    card = load_card_file(path)
    assert card.reasoning_parser in REASONING_PARSERS
    assert card.tool_parser in _tool_parsers()
    if card.reasoning_parser is not None:  # thinking parsed only for a tokenizer with markers
        assert card.has(Capability.THINKING) or not card.has(Capability.THINKING_TOGGLE)
    if card.tool_parser is not None:
        assert card.has(Capability.TOOLS)


def test_the_plugin_contributes_every_card() -> None:
    ids = {c.model_id for c in plugin.exo_model_cards()}
    assert {load_card_file(p).model_id for p in CARDS} <= ids  # and exo's (test_exo_catalogue)
    assert "mlx-community/Qwen3-0.6B-4bit" in ids


def test_cards_are_found_inside_a_wheel_first(tmp_path: Path) -> None:
    package = tmp_path / "site-packages" / "exo_download_hf"
    (package / "model_cards").mkdir(parents=True)
    assert card_dir(package) == package / "model_cards"
    # An editable install: the workspace's resources/ above the package.
    workspace = tmp_path / "ws"
    (workspace / "resources" / "model_cards").mkdir(parents=True)
    src = workspace / "plugins" / "download_hf" / "src" / "exo_download_hf"
    src.mkdir(parents=True)
    assert card_dir(src) == workspace / "resources" / "model_cards"


def _weights(*sizes: int) -> list[RemoteFile]:
    files = [RemoteFile("config.json", 100, ExpectedHash("git-sha1", "0" * 40))]
    return files + [
        RemoteFile(f"model-{i}.safetensors", s, ExpectedHash("sha256", "0" * 64))
        for i, s in enumerate(sizes)
    ]


def test_card_from_an_mlx_llama_config() -> None:
    config = {
        "model_type": "llama",
        "num_hidden_layers": 16,
        "hidden_size": 2048,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "quantization": {"group_size": 64, "bits": 4},
    }
    card = card_from_config("mlx-community/x", config, _weights(600, 400))
    assert card == ModelCard(
        model_id=card.model_id,
        family="llama",
        model_type="llama",
        n_layers=16,
        hidden_size=2048,
        num_key_value_heads=8,
        storage_size_bytes=1000,
        quantization="4bit",
        supports_tensor=True,
        source="hf:mlx-community/x",
        custom=True,
        config=config,  # small enough to keep whole
    )


def test_card_from_a_nested_multimodal_config() -> None:
    config = {
        "model_type": "gemma3",
        "text_config": {"num_hidden_layers": 34, "hidden_size": 2560, "num_attention_heads": 8},
        "vision_config": {"hidden_size": 1152},
        "quantization_config": {"quant_method": "awq", "bits": 8},
    }
    card = card_from_config("org/vlm", config, _weights(5))
    assert (card.family, card.n_layers, card.hidden_size) == ("gemma3", 34, 2560)
    assert card.num_key_value_heads == 8  # no KV heads given: every head has its own
    assert card.quantization == "8bit" and not card.supports_tensor
    assert Capability.VISION in card.capabilities


def test_card_needs_layers_and_weights() -> None:
    with pytest.raises(CardError, match="layers"):
        card_from_config("org/x", {"model_type": "llama", "hidden_size": 8}, _weights(5))
    config = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 8}
    with pytest.raises(CardError, match=r"no \.safetensors weights"):
        card_from_config("org/x", config, _weights())


def test_a_custom_card_takes_its_context_length_from_the_config() -> None:
    config = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "max_position_embeddings": 131072,
    }
    assert card_from_config("mlx-community/x", config, _weights(10)).context_length == 131072


NEMOTRON_NANO_9B_V2 = "mlx-community--NVIDIA-Nemotron-Nano-9B-v2-4bits"


def _nemotron_h_config(pattern: str) -> dict[str, object]:
    """config.json of a Nemotron-H repo, as the hub has it (the keys the card reads, the
    pattern placement reads, and the quantization an MLX conversion writes)."""
    return {
        "model_type": "nemotron_h",
        "num_hidden_layers": len(pattern),
        "hidden_size": 4480,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "hybrid_override_pattern": pattern,
        "quantization": {"group_size": 64, "bits": 4},
    }


def test_a_custom_card_keeps_the_config_engines_judge_a_placement_by() -> None:
    """/models/add of a Nemotron-H repo: its card carries the layer pattern, so placement
    refuses a split the runner would refuse at load, with no weights on this node."""
    pattern = load_card_file(_card_path(NEMOTRON_NANO_9B_V2)).config["hybrid_override_pattern"]
    config = _nemotron_h_config(pattern)
    card = card_from_config("org/nemotron", config, _weights(10))
    assert card.config == config
    engine = MlxEngine()
    refusal = engine.placement_refusal(card, _split(card, [55, 1]))  # layer 55 is an MLP
    assert refusal is not None and "rank 1 would hold layers [55, 56)" in refusal
    assert engine.placement_refusal(card, _split(card, [28, 28])) is None


def test_a_custom_card_drops_what_does_not_fit_the_bound() -> None:
    config = _nemotron_h_config("M*-" * 20)
    # An MLX conversion that quantized layers differently lists each: the card keeps the
    # model's keys without those.
    per_layer = {f"backbone.layers.{i}.mixer.gate": {"bits": 8} for i in range(200)}
    quantized = {**config, "quantization": {"bits": 4, "group_size": 64, **per_layer}}
    card = card_from_config("org/big", quantized, _weights(10))
    assert card.quantization == "4bit"
    assert card.config == {k: v for k, v in config.items() if k != "quantization"}
    # A config whose model keys alone are over the bound: the card carries none of it.
    huge = {**config, "block_configs": [{"attention": {"no_op": False}}] * 1000}
    assert card_from_config("org/huge", huge, _weights(10)).config == {}


def _card_path(stem: str) -> Path:
    return next(p for p in CARDS if p.stem == stem)


def _split(card: ModelCard, counts: list[int]) -> PlacementOption:
    """A pipeline giving node i the next `counts[i]` layers."""
    starts = [sum(counts[:i]) for i in range(len(counts))]
    return PlacementOption(
        model_id=ModelId(card.model_id),
        sharding="pipeline",
        shares=tuple(
            NodeShare(node_id=NodeId(f"n{i}"), start_layer=s, end_layer=s + n, memory_bytes=1)
            for i, (s, n) in enumerate(zip(starts, counts, strict=True))
        ),
    )


def _added(*tokens: str) -> dict[str, dict[str, object]]:
    # tokenizer_config.json's added tokens, as transformers writes them.
    return {str(1000 + i): {"content": t, "special": True} for i, t in enumerate(tokens)}


# Chat-template pieces with each family's markers (what mlx-lm's detection reads), and the
# parsers and capabilities a custom card then records.
QWEN3 = {
    "chat_template": (
        "{%- if tools %}<tools>{{ tools }}</tools>{% endif %}"
        '{%- for tool_call in m.tool_calls %}<tool_call>\\n{"name": "{{ tool_call.name }}"}'
        "</tool_call>{% endfor %}{%- if enable_thinking is false %}<think>\\n\\n</think>{% endif %}"
    ),
    "added_tokens_decoder": _added("<think>", "</think>", "<tool_call>", "</tool_call>"),
}
MINIMAX_M2 = {
    "chat_template": "{% if tools %}<minimax:tool_call>{% endif %}",
    "added_tokens_decoder": _added("<think>", "</think>"),
}
KIMI_K2 = {
    "chat_template": [
        {"name": "tool_use", "template": "nothing"},
        {"name": "default", "template": "{% if tools %}<|tool_calls_section_begin|>{% endif %}"},
    ]
}

DEEPSEEK_V31 = {  # thinking switched by a bare `thinking`; its tool format is the engine's own
    "chat_template": (
        "{% if not thinking is defined %}{% set thinking = false %}{% endif %}"
        "{% if add_generation_prompt %}{% if thinking %}<think>{% else %}</think>{% endif %}"
        "{% endif %}"
    ),
    "added_tokens_decoder": _added("<think>", "</think>"),
}
DEEPSEEK_V4 = {  # DSML tool calls, which mlx-lm does not read: the core's parser does
    "chat_template": "{% if tools %}<｜DSML｜tool_calls>{% endif %}<think>",
    "added_tokens_decoder": _added("<think>", "</think>"),
}
GPT_OSS = {  # Harmony: no markers in the template mlx-lm knows; the vocabulary tells
    "chat_template": "{{ messages }}",
    "added_tokens_decoder": _added(
        "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>"
    ),
}


@pytest.mark.parametrize(
    ("tokenizer_config", "tool_parser", "reasoning_parser", "capabilities"),
    [
        (
            QWEN3,
            "hermes",  # mlx-lm's json_tools: the core's hermes parser reads it
            "think",
            {Capability.THINKING, Capability.THINKING_TOGGLE, Capability.TOOLS},
        ),
        (MINIMAX_M2, "minimax_m2", "think", {Capability.THINKING, Capability.TOOLS}),
        (KIMI_K2, "kimi_k2", None, {Capability.TOOLS}),  # the "default" named template
        (DEEPSEEK_V31, None, "think", {Capability.THINKING, Capability.THINKING_TOGGLE}),
        (GPT_OSS, "harmony", None, {Capability.THINKING, Capability.TOOLS}),
        (DEEPSEEK_V4, "deepseek_v4", "think", {Capability.THINKING, Capability.TOOLS}),
        ({"chat_template": "{{ messages }}"}, None, None, set()),
        ({}, None, None, set()),
    ],
    ids=[
        "qwen3",
        "minimax_m2",
        "kimi_k2",
        "deepseek_v31",
        "gpt_oss",
        "deepseek_v4",
        "plain",
        "none",
    ],
)
def test_a_custom_card_detects_its_parsers_from_the_tokenizer_config(
    tokenizer_config: dict[str, object],
    tool_parser: str | None,
    reasoning_parser: str | None,
    capabilities: set[Capability],
) -> None:
    config = {"model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 64}
    card = card_from_config("org/x", config, _weights(5), detect(tokenizer_config))
    assert (card.tool_parser, card.reasoning_parser) == (tool_parser, reasoning_parser)
    assert set(card.capabilities) == {Capability.TEXT, *capabilities}


def test_a_chat_template_file_overrides_the_config() -> None:
    found = detect({"chat_template": "{{ messages }}"}, "<minimax:tool_call>")
    assert found.tool_parser == "minimax_m2"
