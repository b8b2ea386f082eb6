"""Votes: at most one master per term, and only one whose log holds everything committed.

The election picks one candidate deterministically; votes make that choice safe under
partitions and lost messages. A node grants one vote per term, never to a candidate whose log
is less complete than its own, and remembers its vote on disk across restarts. Once it has
voted in a term, it no longer acknowledges events of earlier terms (a deposed master's). It
never votes in a term that leaves no term after it (`exo_core.terms.has_successor`): once
voted there, it could vote for no later master, and its campaigns would no longer decode.
"""

from __future__ import annotations

import json
from pathlib import Path

from exo_core.durable import replace_durably
from exo_core.ids import NodeId
from exo_core.terms import has_successor
from exo_core.wire import Vote, VoteRequest


class VoteBook:
    def __init__(self, path: Path) -> None:
        self._path = path
        self.term = 0
        self.voted_for: NodeId | None = None
        if path.exists():
            data = json.loads(path.read_text())
            self.term, self.voted_for = int(data["term"]), data.get("voted_for")

    @property
    def path(self) -> Path:
        return self._path

    def _save(self) -> None:
        # Durable before the vote is answered: a vote forgotten by a power loss could let this
        # node vote again in the same term, for another candidate (two masters in one term).
        data = json.dumps({"term": self.term, "voted_for": self.voted_for}).encode()
        replace_durably(self._path, data)

    def decide(self, request: VoteRequest, last_term: int, last_index: int) -> Vote:
        """Answer a vote request, given our own log's last term and index."""
        if not has_successor(request.term):
            return Vote(granted=False, reason=f"term {request.term} leaves no term after it")
        if request.term < self.term or (
            request.term == self.term and self.voted_for not in (None, request.candidate)
        ):
            return Vote(granted=False, reason=f"already voted in term {self.term}")
        if (last_term, last_index) > (request.last_term, request.last_index):
            return Vote(granted=False, reason="my log is more complete")
        previous = self.term, self.voted_for
        self.term, self.voted_for = request.term, request.candidate
        try:
            self._save()
        except OSError as e:  # not on disk, so not granted (and not remembered either)
            self.term, self.voted_for = previous
            return Vote(granted=False, reason=f"cannot record the vote: {e}")
        return Vote(granted=True)
