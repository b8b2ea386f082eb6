"""A card's sampling defaults: read from exo's card format, checked, and filled in for what a
request leaves out (thinking and non-thinking sets)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from exo_core.generation import SamplingParams
from exo_core.model_cards import ModelCard, ModelCardError, load_card_file
from exo_core.sampling_defaults import SamplingDefaults, SamplingValues, resolve_sampling

# The shape of exo's Qwen 3 cards (resources/inference_model_cards there).
QWEN3 = SamplingDefaults(
    temperature=0.6,
    top_p=0.95,
    top_k=20,
    min_p=0.0,
    presence_penalty=0.0,
    non_thinking=SamplingValues(temperature=0.7, top_p=0.8, presence_penalty=1.5),
    thinking=SamplingValues(temperature=1.0),
)
NOTHING = SamplingValues()


def test_a_request_without_fields_gets_the_cards_flat_values() -> None:
    got = resolve_sampling(NOTHING, QWEN3, None)
    assert (got.temperature, got.top_p, got.top_k, got.presence_penalty) == (0.6, 0.95, 20, 0.0)


def test_thinking_off_and_on_pick_their_own_set_then_the_flat_one() -> None:
    off = resolve_sampling(NOTHING, QWEN3, False)
    assert (off.temperature, off.top_p, off.top_k, off.presence_penalty) == (0.7, 0.8, 20, 1.5)
    on = resolve_sampling(NOTHING, QWEN3, True)
    assert (on.temperature, on.top_p, on.top_k) == (1.0, 0.95, 20)


def test_the_requests_own_values_win() -> None:
    asked = SamplingValues(temperature=0.0, top_k=5, frequency_penalty=0.5)
    got = resolve_sampling(asked, QWEN3, False, seed=3, repetition_context_size=64)
    assert (got.temperature, got.top_k, got.frequency_penalty) == (0.0, 5, 0.5)
    assert (got.top_p, got.seed, got.repetition_context_size) == (0.8, 3, 64)


def test_a_card_without_defaults_gives_the_built_in_ones() -> None:
    assert resolve_sampling(NOTHING, SamplingDefaults(), True) == SamplingParams()


EXO_CARD = """
model_id = "example-org/Qwen3-Like"
n_layers = 4
hidden_size = 64
supports_tensor = false
tasks = ["TextGeneration"]
family = "qwen"
capabilities = ["text", "thinking", "thinking_toggle"]
backends = ["MlxCpu"]

[storage_size]
in_bytes = 1000

[sampling_defaults]
temperature = 0.6
top_p = 0.95
top_k = 20
some_future_knob = 3

[sampling_defaults.non_thinking]
temperature = 0.7
presence_penalty = 1.5
"""


def test_exos_card_table_is_read(tmp_path: Path) -> None:
    path = tmp_path / "card.toml"
    path.write_text(EXO_CARD)
    defaults = load_card_file(path).sampling_defaults
    assert (defaults.temperature, defaults.top_p, defaults.top_k) == (0.6, 0.95, 20)
    assert defaults.non_thinking == SamplingValues(temperature=0.7, presence_penalty=1.5)
    assert defaults.thinking is None


@pytest.mark.parametrize(
    "table",
    [
        "[sampling_defaults]\ntemperature = -1",
        "[sampling_defaults]\ntop_p = 0",
        "[sampling_defaults.thinking]\npresence_penalty = 3",
        '[sampling_defaults]\ntemperature = "hot"',
    ],
)
def test_a_card_with_defaults_out_of_range_is_refused(tmp_path: Path, table: str) -> None:
    path = tmp_path / "card.toml"
    path.write_text(EXO_CARD.split("[sampling_defaults]")[0] + table + "\n")
    with pytest.raises(ModelCardError, match=r"sampling_defaults|temperature"):
        load_card_file(path)


def test_a_peers_card_with_bad_defaults_does_not_decode() -> None:
    card = {
        "model_id": "m",
        "family": "f",
        "storage_size_bytes": 1,
        "sampling_defaults": {"top_p": 7},
    }
    with pytest.raises(msgspec.ValidationError, match="top_p"):
        msgspec.json.decode(msgspec.json.encode(card), type=ModelCard)
