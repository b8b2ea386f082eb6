"""A card's `config` (the config.json keys engines judge a placement by): it survives every
encoding a card travels in, and a card carrying too much, or what is not JSON, is refused."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from exo_core.commands import AddModelCard, CommandEnvelope
from exo_core.events import IndexedEvent, ModelCardAdded
from exo_core.ids import CommandId, ModelId, NodeId
from exo_core.model_cards import (
    MAX_CARD_CONFIG_BYTES,
    ModelCard,
    ModelCardError,
    card_config_problem,
    load_card_file,
)
from exo_core.snapshot import Snapshot, decode_snapshot, encode_snapshot
from exo_core.state import State
from exo_core.wire import decode_request, encode

CARD = """
model_id = "org/hybrid"
family = "nemotron"
model_type = "nemotron_h"
n_layers = 4
hidden_size = 64
storage_size_bytes = 1000
source = "hf:org/hybrid"

[config]
hybrid_override_pattern = "ME*-"
rope_scaling = {type = "yarn", factor = 4.0}
"""


def card_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "card.toml"
    path.write_text(text)
    return path


def envelope(card: ModelCard) -> CommandEnvelope:
    return CommandEnvelope(
        command_id=CommandId("c1"), origin=NodeId("peer"), command=AddModelCard(card=card)
    )


def test_a_card_file_carries_config_keys_through_every_encoding(tmp_path: Path) -> None:
    card = load_card_file(card_file(tmp_path, CARD))
    assert card.config == {
        "hybrid_override_pattern": "ME*-",
        "rope_scaling": {"type": "yarn", "factor": 4.0},
    }
    # JSON (the API), msgpack (peers: a command, the log's events, a snapshot's state).
    assert msgspec.json.decode(msgspec.json.encode(card), type=ModelCard) == card
    assert decode_request(encode(envelope(card))) == envelope(card)
    event = IndexedEvent(index=0, term=1, event=ModelCardAdded(card=card))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(event), type=IndexedEvent) == event
    state = State(model_cards={card.model_id: card})
    snapshot = Snapshot(state=state, terms=())
    assert decode_snapshot(encode_snapshot(snapshot)).state.model_cards[card.model_id] == card


def test_a_card_without_config_is_unchanged() -> None:
    card = ModelCard(model_id=ModelId("org/x"), family="x", storage_size_bytes=1)
    assert card.config == {}
    old = b'{"model_id": "org/x", "family": "x", "storage_size_bytes": 1}'  # before the field
    assert msgspec.json.decode(old, type=ModelCard) == card


def test_a_card_file_with_too_much_config_is_refused_naming_the_file(tmp_path: Path) -> None:
    text = CARD + f'block_configs = "{"x" * MAX_CARD_CONFIG_BYTES}"\n'
    path = card_file(tmp_path, text)
    with pytest.raises(ModelCardError, match=rf"{path}: .*config encodes to \d+ bytes"):
        load_card_file(path)


def test_a_peer_card_with_too_much_config_does_not_decode(tmp_path: Path) -> None:
    card = load_card_file(card_file(tmp_path, CARD))
    fields = msgspec.to_builtins(envelope(card))
    fields["command"]["card"]["config"]["padding"] = "x" * MAX_CARD_CONFIG_BYTES
    with pytest.raises(msgspec.ValidationError, match="more than the 8192 a card may carry"):
        decode_request(msgspec.msgpack.encode(fields))
    # Just under the bound is fine: the bound is on the encoded config, not the message.
    fields["command"]["card"]["config"] = {"k": "x" * (MAX_CARD_CONFIG_BYTES - 8)}
    assert len(msgspec.json.encode(fields["command"]["card"]["config"])) == MAX_CARD_CONFIG_BYTES
    assert decode_request(msgspec.msgpack.encode(fields)) is not None


@pytest.mark.parametrize(
    "value",
    [b"raw bytes", msgspec.msgpack.Ext(1, b"x"), {1: "int key"}, float("nan")],
    ids=["bytes", "ext", "int-key", "nan"],
)
def test_a_peer_card_whose_config_is_not_json_does_not_decode(value: object) -> None:
    fields = msgspec.to_builtins(
        ModelCard(model_id=ModelId("org/x"), family="x", storage_size_bytes=1)
    )
    fields["config"] = {"k": value}
    with pytest.raises(msgspec.ValidationError, match="not JSON data"):
        msgspec.msgpack.decode(msgspec.msgpack.encode(fields), type=ModelCard)


def test_a_card_built_in_code_is_held_to_the_same_bound() -> None:
    with pytest.raises(ValueError, match="org/x: config encodes to"):
        ModelCard(
            model_id=ModelId("org/x"),
            family="x",
            storage_size_bytes=1,
            config={"k": "x" * MAX_CARD_CONFIG_BYTES},
        )
    assert card_config_problem({"nested": {"list": [1, 2.5, None, True, "s"]}}) is None
