"""Votes: at most one master per term, and only one whose log holds everything committed.

The election picks one candidate deterministically; votes make that choice safe under
partitions and lost messages. A node grants one vote per term, never to a candidate whose log
is less complete than its own, and remembers its vote on disk across restarts. Once it has
voted in a term, it no longer acknowledges events of earlier terms (a deposed master's).
"""

from __future__ import annotations

import json
from pathlib import Path

from exo_core.ids import NodeId
from exo_core.wire import Vote, VoteRequest


class VoteBook:
    def __init__(self, path: Path) -> None:
        self._path = path
        self.term = 0
        self.voted_for: NodeId | None = None
        if path.exists():
            data = json.loads(path.read_text())
            self.term, self.voted_for = int(data["term"]), data.get("voted_for")

    def _save(self) -> None:
        tmp = self._path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"term": self.term, "voted_for": self.voted_for}))
        tmp.replace(self._path)

    def decide(self, request: VoteRequest, last_term: int, last_index: int) -> Vote:
        """Answer a vote request, given our own log's last term and index."""
        if request.term < self.term or (
            request.term == self.term and self.voted_for not in (None, request.candidate)
        ):
            return Vote(granted=False, reason=f"already voted in term {self.term}")
        if (last_term, last_index) > (request.last_term, request.last_index):
            return Vote(granted=False, reason="my log is more complete")
        self.term, self.voted_for = request.term, request.candidate
        self._save()
        return Vote(granted=True)
