"""Compare exo's model card files with the catalogue's copies, and optionally take exo's.

    .venv/bin/python scripts/sync_exo_cards.py <exo checkout> [--write] [--check]

`<exo checkout>` is a clone of exo-explore/exo (its `resources/inference_model_cards` and
`resources/image_model_cards` are read) or that `resources/` directory itself. The report
lists the models exo added and removed, and for each changed card the fields that changed
(ours -> exo's), then exo's base models `resources/model_cards/exo/additions.toml` does not
name yet. `--write` copies exo's files over ours (and deletes the removed ones); the
additions are still yours to write. `--check` exits 1 when anything differs (for CI).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from exo_core.exo_card_sync import apply, compare, report

CARD_DIR = Path(__file__).resolve().parents[1] / "resources" / "model_cards"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("exo", type=Path, help="a checkout of exo, or its resources/ directory")
    parser.add_argument("--cards", type=Path, default=CARD_DIR, help="the catalogue directory")
    parser.add_argument("--write", action="store_true", help="take exo's card files")
    parser.add_argument("--check", action="store_true", help="exit 1 when anything differs")
    args = parser.parse_args(argv)
    resources = (
        args.exo if (args.exo / "inference_model_cards").is_dir() else args.exo / "resources"
    )
    if not (resources / "inference_model_cards").is_dir():
        parser.error(f"{args.exo} holds no resources/inference_model_cards: not an exo checkout")
    changes = compare(resources, args.cards)
    sys.stdout.write(report(changes))
    if args.write and not changes.empty:
        apply(changes, args.cards)
        sys.stdout.write(f"wrote exo's card files into {args.cards / 'exo'}\n")
    return 1 if args.check and not changes.empty else 0


if __name__ == "__main__":
    sys.exit(main())
