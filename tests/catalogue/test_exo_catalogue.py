"""exo's card files in the built-in catalogue: every model id exo ships, with exo's fields,
the architecture this project adds, and placement refusing what no engine here runs."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from exo_core.catalogue import exo_card_files, load_catalogue, read_additions
from exo_core.ids import ModelId
from exo_core.model_cards import Capability, ModelCard, ModelTask
from exo_core.placement import place, runnable
from exo_core.placement_types import PlacementRefused, PlacementRequest
from exo_core.testing.cluster_state import nodes_with_free_memory
from exo_download_hf import plugin
from exo_engine_mflux.engine import MfluxEngine
from exo_engine_mflux.placement import place_image_model
from exo_engine_mlx.engine import MlxEngine
from exo_engine_mlx.families import family_support

CARD_DIR = Path(__file__).parents[2] / "resources" / "model_cards"
EXO_FILES = exo_card_files(CARD_DIR)
# The ids of exo's cards, read straight from the files (exo's resources/*_model_cards).
EXO_IDS = {tomllib.loads(p.read_text())["model_id"] for p in EXO_FILES}
OUR_IDS = {tomllib.loads(p.read_text())["model_id"] for p in CARD_DIR.glob("*.toml")}


@pytest.fixture(scope="module")
def cards() -> dict[str, ModelCard]:
    return {c.model_id: c for c in load_catalogue(CARD_DIR)}


def test_the_catalogue_holds_every_exo_model_and_our_own(cards: dict[str, ModelCard]) -> None:
    assert len(EXO_IDS) == len(EXO_FILES) == 141
    assert set(cards) >= EXO_IDS
    assert set(cards) == EXO_IDS | OUR_IDS
    assert {c.model_id for c in plugin.exo_model_cards()} == set(cards)


def test_every_exo_base_model_has_its_architecture() -> None:
    additions = read_additions(CARD_DIR)
    base_models = {tomllib.loads(p.read_text())["base_model"] for p in EXO_FILES}
    assert base_models == set(additions), "add each new base model to exo/additions.toml"
    assert all(entry.get("model_type") for entry in additions.values())


def test_exo_fields_are_kept(cards: dict[str, ModelCard]) -> None:
    for path in EXO_FILES:
        raw = tomllib.loads(path.read_text())
        card = cards[raw["model_id"]]
        assert card.model_type, f"{path.name}: no model_type"
        if card.model_id in OUR_IDS:
            continue  # our card's fields win (test_our_card_wins_...)
        assert card.storage_size_bytes == raw["storage_size"]["in_bytes"], path.name
        assert card.n_layers == raw["n_layers"] and card.hidden_size == raw["hidden_size"]
        assert card.context_length == (raw.get("context_length") or card.context_length)
        assert card.reasoning_dialect == raw.get("reasoning_dialect", card.reasoning_dialect)
        assert card.uses_cfg == raw.get("uses_cfg", False)
        assert card.family == raw["family"] and card.base_model == raw["base_model"]
        assert [c.value for c in card.capabilities][: len(raw["capabilities"])] == [
            c for c in raw["capabilities"]
        ]
        if card.num_key_value_heads is None:
            assert card.makes_images, f"{path.name}: a text card needs its KV heads"


def test_a_gemma_4_card(cards: dict[str, ModelCard]) -> None:
    card = cards["mlx-community/gemma-4-26b-a4b-it-4bit"]
    assert (card.family, card.model_type, card.base_model) == ("gemma", "gemma4", "Gemma 4 26B A4B")
    assert card.storage_size_bytes == 15_608_614_044 and card.context_length == 262144
    assert (card.n_layers, card.hidden_size, card.num_key_value_heads) == (30, 2816, 8)
    assert card.has(Capability.VISION) and not card.supports_tensor
    assert card.tasks == (ModelTask.TEXT_GENERATION,) and card.quantization == "4bit"
    assert card.tool_parser == "gemma4" and card.has(Capability.TOOLS)
    # The engine here runs and pipelines Gemma 4: placement offers a two-node split.
    options = _placed(card, (20, 20), min_nodes=2)
    assert [len(o.shares) for o in options] == [2]


def test_a_deepseek_v4_card_is_listed_and_refused_with_the_reason(
    cards: dict[str, ModelCard],
) -> None:
    card = cards["mlx-community/DeepSeek-V4-Flash"]
    assert (card.model_type, card.reasoning_dialect) == ("deepseek_v4", "tool_conditional")
    assert card.has(Capability.THINKING_TOGGLE) and card.context_length == 1_048_576
    assert not family_support("deepseek_v4").runs  # no mlx-lm module for it in this release
    with pytest.raises(PlacementRefused, match="deepseek_v4: mlx-lm cannot load it"):
        _placed(card, (400,), min_nodes=1)  # on one node too, before any download


def test_a_kimi_card_keeps_exos_vision_table(cards: dict[str, ModelCard]) -> None:
    card = cards["moonshotai/Kimi-K2.6"]
    assert card.vision is not None
    assert (card.vision.model_type, card.vision.image_token_id) == ("kimi_vl", 163605)
    assert card.vision.weights_repo == "exolabs/Kimi-K2.6-vision"
    assert card.model_type == "kimi_k25" and card.quantization == "none"


def test_exolabs_quantized_flux_is_an_image_model_the_image_engine_places(
    cards: dict[str, ModelCard],
) -> None:
    card = cards["exolabs/FLUX.1-dev-4bit"]
    assert card.tasks == (ModelTask.IMAGE_GENERATION,) and card.makes_images
    assert (card.family, card.model_type, card.quantization) == ("flux", "flux1-dev", "4bit")
    assert card.has(Capability.IMAGE_GEN) and card.storage_size_bytes == 15_475_325_472
    assert [c.name for c in card.components if c.splittable] == ["transformer"]
    assert MfluxEngine().can_serve(card)
    state = nodes_with_free_memory((40,), engines=("mflux",))
    request = PlacementRequest(model_id=card.model_id, sharding="pipeline", min_nodes=1)
    assert place_image_model(card, request, state)


@pytest.mark.parametrize(
    ("model_id", "model_type", "task"),
    [
        ("exolabs/Qwen-Image", "qwen-image", ModelTask.IMAGE_GENERATION),
        ("exolabs/Qwen-Image-Edit-2509", "qwen-image-edit", ModelTask.IMAGE_EDIT),
    ],
)
def test_exo_qwen_image_cards_use_cfg_and_are_placed_whole_or_split(
    cards: dict[str, ModelCard], model_id: str, model_type: str, task: ModelTask
) -> None:
    card = cards[model_id]
    assert card.uses_cfg and card.family == "qwen-image" and card.model_type == model_type
    assert card.tasks == (task,)
    assert MfluxEngine().can_serve(card)
    request = PlacementRequest(model_id=card.model_id, sharding="pipeline", min_nodes=1)
    assert place_image_model(card, request, nodes_with_free_memory((100,), engines=("mflux",)))
    split = PlacementRequest(model_id=card.model_id, sharding="pipeline", min_nodes=2)
    (option,) = place_image_model(card, split, nodes_with_free_memory((100, 100), ("mflux",)))
    assert len(option.shares) == 2


def test_our_card_wins_and_exo_fills_in_what_it_leaves_out(
    cards: dict[str, ModelCard],
) -> None:
    card = cards["mlx-community/Qwen3.5-9B-4bit"]
    assert (card.family, card.model_type) == ("qwen3.5", "qwen3_5")  # ours
    assert not card.has(Capability.VISION)  # ours: this engine serves its text only
    assert card.reasoning_dialect == "post_last_user"  # exo's


TEXT_IDS = sorted(i for i in EXO_IDS if "FLUX" not in i and "Qwen-Image" not in i)


def test_every_exo_text_card_is_placed_or_refused_with_a_reason(
    cards: dict[str, ModelCard],
) -> None:
    """On two roomy nodes: a family the engine runs gets a two-node pipeline; one it cannot
    run is refused, saying why, and nothing crashes."""
    engine = MlxEngine()
    refused: dict[str, str] = {}
    for model_id in TEXT_IDS:
        card = cards[model_id]
        assert engine.can_serve(card)
        support = family_support(card.model_type)
        room = card.storage_size_bytes // 10**9 + 8
        try:
            options = _placed(card, (room, room), min_nodes=2)
        except PlacementRefused as e:
            assert not support.runs, f"{model_id}: {e}"
            refused[model_id] = str(e)
            continue
        assert support.runs and options and len(options[0].shares) == 2
    assert set(refused) == {"mlx-community/DeepSeek-V4-Flash", "mlx-community/DeepSeek-V4-Pro"}
    assert all("mlx-lm cannot load it" in why for why in refused.values())


def _placed(card: ModelCard, free_gb: tuple[int, ...], min_nodes: int) -> list:  # type: ignore[type-arg]
    engine = MlxEngine()
    request = PlacementRequest(
        model_id=ModelId(card.model_id), sharding="pipeline", min_nodes=min_nodes
    )
    options = place(card, request, nodes_with_free_memory(free_gb))
    return runnable(options, lambda o: engine.placement_refusal(card, o))


def test_every_exo_card_names_parsers_that_exist(cards: dict[str, ModelCard]) -> None:
    """The same rule as this project's own cards (test_model_cards)."""
    from .test_model_cards import REASONING_PARSERS, _tool_parsers

    tool_parsers = _tool_parsers()
    for model_id in EXO_IDS:
        card = cards[model_id]
        assert card.reasoning_parser in REASONING_PARSERS, model_id
        assert card.tool_parser in tool_parsers, model_id
        if card.reasoning_parser is not None:
            assert card.has(Capability.THINKING) or not card.has(Capability.THINKING_TOGGLE)
        if card.tool_parser is not None:
            assert card.has(Capability.TOOLS), model_id
