"""Votes and terms near the wire's bound (`exo_core.votes`, `exo_core.terms`): a hostile peer
that asks for a vote in the largest term the wire carries must not leave the cluster with no
term to elect its next master in."""

from __future__ import annotations

from pathlib import Path

from exo_core.ids import NodeId
from exo_core.terms import MAX_TERM, has_successor, next_term, term_round
from exo_core.votes import VoteBook
from exo_core.wire import VoteRequest

A, B = NodeId("a"), NodeId("b")
LAST_ROUND = term_round(MAX_TERM) - 1  # the last round with a round after it on the wire


def request(term: int, candidate: NodeId = B) -> VoteRequest:
    return VoteRequest(term=term, candidate=candidate, last_term=term, last_index=1 << 40)


def test_only_terms_below_the_last_round_have_a_successor() -> None:
    assert has_successor(0) and has_successor(next_term(12345, "a"))
    assert has_successor((LAST_ROUND << 16) - 1)
    assert not has_successor(LAST_ROUND << 16)
    assert not has_successor(MAX_TERM)
    assert next_term((LAST_ROUND << 16) - 1, "any node") <= MAX_TERM


def test_no_vote_is_cast_in_a_term_that_leaves_no_term_after_it(tmp_path: Path) -> None:
    book = VoteBook(tmp_path / "votes.json")
    refused = book.decide(request(MAX_TERM), last_term=5, last_index=3)
    assert not refused.granted and "no term after" in refused.reason
    assert (book.term, book.voted_for) == (0, None) and not book.path.exists()
    # The book still votes for an honest candidate, in any term that has a successor.
    assert book.decide(request(next_term(5, A), A), last_term=5, last_index=3).granted
    assert book.decide(request((LAST_ROUND << 16) - 1), last_term=5, last_index=3).granted
