"""The built-in catalogue: exo's card files as exo writes them, what this project adds to
them, and this project's own cards over both.

Layout of a card directory (`resources/model_cards`):

- `*.toml`: this project's cards (its format, or exo's);
- `exo/inference_model_cards/*.toml`, `exo/image_model_cards/*.toml`: exo's card files,
  unchanged (`scripts/sync_exo_cards.py` copies them and says what changed);
- `exo/additions.toml`: by exo's `base_model`, what exo's cards leave out and placement here
  needs (`model_type`, KV heads, parsers, config keys).

A model with a card of each kind gets this project's card, with the fields only exo's card
gives (its reasoning dialect, sampling defaults, vision table) filled in from exo's.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import msgspec

from exo_core.exo_card_format import from_exo_card, is_exo_card
from exo_core.model_cards import Capability, ModelCard, ModelCardError

EXO_DIR = "exo"
EXO_CARD_DIRS = ("inference_model_cards", "image_model_cards")
ADDITIONS_FILE = "additions.toml"
# Fields additions.toml may give for a base model.
ADDITION_FIELDS = frozenset(
    {"model_type", "num_key_value_heads", "reasoning_parser", "tool_parser", "config"}
)


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ModelCardError(f"{path}: {e}") from e


def exo_card_files(directory: Path) -> list[Path]:
    """exo's card files under `directory/exo`, sorted by name."""
    root = directory / EXO_DIR
    return sorted(p for sub in EXO_CARD_DIRS for p in (root / sub).glob("*.toml"))


def read_additions(directory: Path) -> dict[str, dict[str, Any]]:
    """additions.toml's entries by base model (none when the file is absent)."""
    path = directory / EXO_DIR / ADDITIONS_FILE
    if not path.is_file():
        return {}
    entries = _read(path).get("base_model", {})
    for name, entry in entries.items():
        unknown = set(entry) - ADDITION_FIELDS
        if unknown:
            raise ModelCardError(f"{path}: base_model {name!r}: unknown field {min(unknown)!r}")
    return entries


def exo_card_fields(data: dict[str, Any], additions: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """An exo card's fields as this project's, with additions.toml's for its base model."""
    fields = from_exo_card(data)
    added = dict(additions.get(str(data.get("base_model", "")), {}))
    if added.get("tool_parser") and Capability.TOOLS.value not in fields["capabilities"]:
        # exo lists no "tools" capability (every text model there takes tools); a card here
        # says so where a parser reads the calls.
        fields["capabilities"] = [*fields["capabilities"], Capability.TOOLS.value]
    if "num_key_value_heads" in fields:
        added.pop("num_key_value_heads", None)  # exo's own number wins
    return {**fields, **added}


def _card(data: dict[str, Any], where: str) -> ModelCard:
    try:
        return msgspec.convert(data, ModelCard)
    except (msgspec.ValidationError, ValueError) as e:
        raise ModelCardError(f"{where}: {e}") from e


def load_catalogue(directory: Path) -> list[ModelCard]:
    """Every card the directory holds (see the module's docstring), sorted by model id."""
    additions = read_additions(directory)
    fields: dict[str, dict[str, Any]] = {}
    where: dict[str, str] = {}
    for path in exo_card_files(directory):
        try:
            card = exo_card_fields(_read(path), additions)
        except (KeyError, ValueError, TypeError) as e:
            raise ModelCardError(f"{path}: {e}") from e
        fields[card["model_id"]] = card
        where[card["model_id"]] = str(path)
    for path in sorted(directory.glob("*.toml")):
        data = _read(path)
        try:
            own = from_exo_card(data) if is_exo_card(data) else data
        except (KeyError, ValueError, TypeError) as e:
            raise ModelCardError(f"{path}: {e}") from e
        model_id = own.get("model_id", "")
        # This project's card wins; exo's supplies only the fields it leaves out.
        fields[model_id] = {**fields.get(model_id, {}), **own}
        where[model_id] = " and ".join(filter(None, (where.get(model_id), str(path))))
    return [_card(fields[m], where[m]) for m in sorted(fields)]
