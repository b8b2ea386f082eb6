"""Every `EXO_*` environment variable the code reads is in the README's settings table, and the
table lists no variable the code no longer reads."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# As the code reads them: in quotes (os.environ.get("EXO_..."), env::var("EXO_...")).
NAME = re.compile(r"""["'](EXO_[A-Z0-9_]*[A-Z0-9])["']""")


def _code_files() -> list[Path]:
    roots = [ROOT / "exo_core" / "src", *(ROOT / "plugins").glob("*/src")]
    return [p for r in roots for p in r.rglob("*") if p.suffix in (".py", ".rs")]


def names_in_code() -> set[str]:
    return {name for path in _code_files() for name in NAME.findall(path.read_text())}


def names_in_readme_table() -> set[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Settings", 1)[1].split("\n## ", 1)[0]
    return {m for m in re.findall(r"^\| `(EXO_[A-Z0-9_]+)` \|", section, flags=re.M)}


def test_every_variable_the_code_reads_is_in_the_settings_table() -> None:
    code, table = names_in_code(), names_in_readme_table()
    assert len(code) > 5
    assert sorted(code - table) == [], "add these to README.md's settings table"
    assert sorted(table - code) == [], "the code no longer reads these: remove them"
