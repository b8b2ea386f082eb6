"""What changed between exo's card files and the copies in this catalogue
(`resources/model_cards/exo`), field by field; `scripts/sync_exo_cards.py` prints it and
can apply it.

Cards are matched by `model_id` (a renamed file is a change, not a removal and an addition),
fields by their dotted path in the TOML (`storage_size.in_bytes`,
`sampling_defaults.non_thinking.temperature`).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exo_core.catalogue import EXO_CARD_DIRS, EXO_DIR, read_additions


@dataclass(frozen=True)
class CardFile:
    path: Path
    relative: str  # e.g. "inference_model_cards/mlx-community--Qwen3.5-9B-4bit.toml"
    data: dict[str, Any]

    @property
    def model_id(self) -> str:
        return str(self.data.get("model_id", self.relative))


@dataclass
class CardChanges:
    added: list[CardFile] = field(default_factory=list)
    removed: list[CardFile] = field(default_factory=list)
    # model id -> (the file in exo, [(field, ours, exo's)]); None: the field is absent.
    changed: dict[str, tuple[CardFile, list[tuple[str, Any, Any]]]] = field(default_factory=dict)
    # exo's base models additions.toml does not name (their cards would have no model_type).
    unmapped_base_models: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed or self.unmapped_base_models)


def read_card_files(resources: Path) -> dict[str, CardFile]:
    """exo's card files under `resources` (a `resources/` of exo, or our `exo/` copy), by id."""
    found: dict[str, CardFile] = {}
    for sub in EXO_CARD_DIRS:
        for path in sorted((resources / sub).glob("*.toml")):
            card = CardFile(path, f"{sub}/{path.name}", tomllib.loads(path.read_text()))
            found[card.model_id] = card
    return found


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Tables as dotted keys; lists (tasks, components) stay whole values."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def field_changes(ours: dict[str, Any], theirs: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    a, b = flatten(ours), flatten(theirs)
    return [(k, a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


def compare(exo_resources: Path, card_dir: Path) -> CardChanges:
    """exo's card files (`<exo checkout>/resources`) against the catalogue's copies."""
    theirs = read_card_files(exo_resources)
    ours = read_card_files(card_dir / EXO_DIR)
    changes = CardChanges(
        added=[theirs[m] for m in sorted(theirs.keys() - ours.keys())],
        removed=[ours[m] for m in sorted(ours.keys() - theirs.keys())],
    )
    for model_id in sorted(theirs.keys() & ours.keys()):
        diff = field_changes(ours[model_id].data, theirs[model_id].data)
        if diff or ours[model_id].relative != theirs[model_id].relative:
            changes.changed[model_id] = (theirs[model_id], diff)
    mapped = read_additions(card_dir)
    wanted = {str(c.data.get("base_model", "")) for c in theirs.values()}
    changes.unmapped_base_models = sorted(wanted - mapped.keys())
    return changes


def apply(changes: CardChanges, card_dir: Path) -> None:
    """Make the catalogue's copies exo's: new and changed files copied, removed ones deleted."""
    root = card_dir / EXO_DIR
    for card in changes.removed:
        card.path.unlink()
    old = read_card_files(root)
    for card in [*changes.added, *(c for c, _ in changes.changed.values())]:
        if card.model_id in old and old[card.model_id].relative != card.relative:
            old[card.model_id].path.unlink()  # renamed in exo
        target = root / card.relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(card.path.read_bytes())


def report(changes: CardChanges) -> str:
    if changes.empty:
        return "exo's card files and the catalogue's copies are the same.\n"
    lines: list[str] = []
    for title, cards in (("added in exo", changes.added), ("removed from exo", changes.removed)):
        if cards:
            lines.append(f"{title} ({len(cards)}):")
            lines += [f"  {c.model_id}  ({c.relative})" for c in cards]
    if changes.changed:
        lines.append(f"changed in exo ({len(changes.changed)}):")
        for model_id, (card, diff) in changes.changed.items():
            lines.append(f"  {model_id}  ({card.relative})")
            lines += [f"    {name}: {old!r} -> {new!r}" for name, old, new in diff]
    if changes.unmapped_base_models:
        lines.append(
            "base models exo/additions.toml does not name yet (add their model_type, so "
            "placement can check their splits):"
        )
        lines += [f"  {name}" for name in changes.unmapped_base_models]
    return "\n".join(lines) + "\n"
