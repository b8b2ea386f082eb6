"""The term of every index of a log, kept as runs, so it survives compaction of the log.

A term changes only when a new master starts indexing, so the runs are few: one
`(first index, term)` pair per change. A node whose log was compacted behind a snapshot still
answers `term_at` for every index it ever held, which catch-up and replication checks need.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

TermRun = tuple[int, int]  # (first index of the run, its term)


class TermHistory:
    def __init__(self, runs: Iterable[TermRun] = (), next_index: int = 0) -> None:
        self._starts: list[int] = []
        self._terms: list[int] = []
        for start, term in runs:
            if start >= next_index:
                break
            self._starts.append(start)
            self._terms.append(term)
        self._next = next_index if self._starts else 0

    @property
    def next_index(self) -> int:
        return self._next

    @property
    def last_term(self) -> int:
        return self._terms[-1] if self._terms else 0

    def runs(self) -> tuple[TermRun, ...]:
        return tuple(zip(self._starts, self._terms, strict=True))

    def term_at(self, index: int) -> int:
        """The term of the event at `index`; 0 before the first event; -1 past the end."""
        if index < 0:
            return 0
        if index >= self._next:
            return -1
        return self._terms[bisect.bisect_right(self._starts, index) - 1]

    def append(self, term: int) -> None:
        if term != self.last_term or not self._terms:
            self._starts.append(self._next)
            self._terms.append(term)
        self._next += 1

    def last_run_start(self) -> int:
        """The first index of the last term (where a follower cuts after a mismatch)."""
        return self._starts[-1] if self._starts else 0

    def truncate(self, next_index: int) -> None:
        """Forget the terms from `next_index` on."""
        if next_index >= self._next:
            return
        keep = bisect.bisect_left(self._starts, next_index)
        del self._starts[keep:], self._terms[keep:]
        self._next = max(0, next_index) if self._starts else 0
