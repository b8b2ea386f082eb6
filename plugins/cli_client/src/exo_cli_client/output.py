"""How the client commands print: rich tables and progress bars on a terminal, plain
tab-separated text when piped, the API's own JSON with --json."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table


class Output:
    def __init__(self, *, as_json: bool = False, console: Console | None = None) -> None:
        self.as_json = as_json
        self.console = console or Console(highlight=False)
        self.err = Console(stderr=True, highlight=False)

    @property
    def rich(self) -> bool:
        """Decorations (tables, colours, progress bars) only on a terminal, never in JSON."""
        return self.console.is_terminal and not self.as_json

    def json(self, value: Any) -> None:
        sys.stdout.write(json.dumps(value, indent=2, sort_keys=True) + "\n")

    def table(self, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        if not self.rich:
            print("\t".join(columns))
            for row in rows:
                print("\t".join(row))
            return
        table = Table(*columns, box=None, header_style="bold", pad_edge=False)
        for row in rows:
            table.add_row(*row)
        self.console.print(table)

    def line(self, text: str) -> None:
        if self.rich:
            self.console.print(text)
        else:
            print(text, flush=True)

    def error(self, text: str) -> None:
        self.err.print(f"[red]error:[/red] {text}" if self.err.is_terminal else f"error: {text}")


def size(n: float) -> str:
    """Bytes in the largest unit that keeps the number readable (1.3 GB, 270 MB)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" or n >= 100 else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
