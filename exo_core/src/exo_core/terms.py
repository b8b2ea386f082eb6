"""Master terms: ordered by round, and unique to the node that started them.

Votes keep two masters of a connected cluster from sharing a term. Two clusters that formed
apart (a node that started before it could reach its peers) can both reach the same round,
though, and their logs must not look alike when they merge. So a term carries the round in its
high bits and a 16-bit mark of its master in the low bits: comparing terms compares rounds
first, and logs of different masters differ in their terms.

Terms are bounded by what the wire carries (`MAX_TERM`): a vote in a term with no next term
under the bound would leave the cluster no term to elect its next master in (every campaign
above the bound is undecodable to the others), so nobody votes in one (`has_successor`).
"""

from __future__ import annotations

import zlib

_MARK_BITS = 16
# The largest term (and index) a peer message carries (`exo_core.wire.Count`).
MAX_TERM = 1 << 62


def node_mark(node_id: str) -> int:
    return zlib.crc32(node_id.encode()) & ((1 << _MARK_BITS) - 1)


def term_round(term: int) -> int:
    return term >> _MARK_BITS


def next_term(highest: int, node_id: str) -> int:
    """The term a node claims after seeing `highest`: the next round, marked as its own."""
    return ((term_round(highest) + 1) << _MARK_BITS) | node_mark(node_id)


def has_successor(term: int) -> bool:
    """Whether the term after `term` fits on the wire (an honest cluster is centuries away from
    the bound: a term near it was forced by a hostile peer)."""
    highest_mark = (1 << _MARK_BITS) - 1
    return ((term_round(term) + 1) << _MARK_BITS | highest_mark) <= MAX_TERM
