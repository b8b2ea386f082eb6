"""A request's output parser is set up without re-reading the tokenizer's vocabulary: that
view is rebuilt on every call (~0.1-0.3 s on SmolLM2 under load) and used to delay every
request's prefill twice."""

from __future__ import annotations

from typing import Any

from exo_core.plugin import ChatMessage, GenerationParams
from exo_core.plugin.parsers import ThinkParser
from exo_engine_mlx.output import family_parser


class CountingTokenizer:
    """A tokenizer stand-in that knows think markers and counts vocabulary reads."""

    chat_template = ""
    think_start = "<think>"
    think_end = "</think>"

    def __init__(self) -> None:
        self.vocab_reads = 0

    def get_vocab(self) -> dict[str, Any]:
        self.vocab_reads += 1
        return {"<think>": 1, "</think>": 2, "hello": 3}


def test_the_vocabulary_is_read_once_per_tokenizer() -> None:
    params = GenerationParams(messages=(ChatMessage(role="user", content="hi"),))
    tokenizer = CountingTokenizer()
    parsers = [family_parser(tokenizer, params, "prompt") for _ in range(5)]
    assert all(isinstance(p, ThinkParser) for p in parsers)
    reads = tokenizer.vocab_reads
    assert 1 <= reads <= 2  # harmony markers, tool formats: once each, on the first request
    family_parser(tokenizer, params, "prompt")
    assert tokenizer.vocab_reads == reads
    # Another tokenizer is read on its own.
    other = CountingTokenizer()
    family_parser(other, params, "prompt")
    assert other.vocab_reads == reads
