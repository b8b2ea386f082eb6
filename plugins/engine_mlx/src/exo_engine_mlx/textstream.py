"""Streaming text for one sequence: whole characters only, and stop strings cut cleanly.

The detokenizer holds back the bytes of a character split across tokens (emoji, CJK), so no
U+FFFD ever reaches a client. On top of it, text that might be the start of a stop string is
held back until it is decided.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class TextStream:
    def __init__(self, detokenizer: Any, stops: Sequence[str]) -> None:
        self._detokenizer = detokenizer
        self._stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False
        # The stop string that ended the text, once one has.
        self.matched: str | None = None

    def add(self, token: int) -> str:
        """Add one token; returns the text that is now safe to emit."""
        self._detokenizer.add_token(token)
        return self._push(self._detokenizer.last_segment)

    def finish(self) -> str:
        """The sequence ended: flush what the detokenizer and the stop check held back."""
        self._detokenizer.finalize()
        text = self._push(self._detokenizer.last_segment)
        if self.stopped:
            return text
        text += self._held
        self._held = ""
        return text

    def _push(self, segment: str) -> str:
        if self.stopped:
            return ""
        text = self._held + segment
        self._held = ""
        found = [(i, s) for s in self._stops if (i := text.find(s)) >= 0]
        if found:
            cut, self.matched = min(found)
            self.stopped = True
            return text[:cut]
        keep = max((_partial(text, s) for s in self._stops), default=0)
        if keep:
            text, self._held = text[:-keep], text[-keep:]
        return text


def _partial(text: str, stop: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `stop`."""
    for n in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
