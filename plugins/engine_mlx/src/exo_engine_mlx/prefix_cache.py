"""A prefix cache: reuse the model cache of an earlier request that shares a prefix.

A multi-turn chat resends the whole conversation each turn; with the cache, only the new turn
is prefilled. Every cache type the families use is kept, on the batched path and on the solo
one alike: plain KV caches are cut back to the common prefix; rotating (sliding-window) caches
past their window, SSM state caches and deepseek_v41's compressed `LayerCache` cannot be cut,
so they are reused when the stored sequence is a whole prefix of the new prompt (the next turn
of a chat); llama4's chunked-attention cache can be cut back no further than the start of the
first chunk it still holds whole (`shortest_cut`). Entries are evicted least recently used first
under a byte budget.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlx_lm.models.cache import CacheList, ChunkedKVCache, trim_prompt_cache

from exo_engine_mlx.protocol import MIN_PREFIX_TOKENS


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _processed(tokens: Sequence[int], cache: list[Any]) -> int:
    """How many of `tokens` the cache holds: attention caches count them; a model made only
    of state caches has processed all of them (as the batch generator hands them back)."""
    for c in cache:
        offset = getattr(c, "offset", None)
        if isinstance(offset, int):
            return offset
    return len(tokens)


def _layer_cut(cache: Any) -> int | None:
    """The shortest prefix one layer's cache can be cut back to; None: not at all."""
    if isinstance(cache, CacheList):
        cuts = [_layer_cut(c) for c in cache.caches]
        return None if None in cuts else max((c for c in cuts if c is not None), default=0)
    if isinstance(cache, ChunkedKVCache):
        # It keeps only the last `chunk_size` keys, and a query attends to the keys of its own
        # chunk: cut back to n, it must still hold n's chunk from its start. mlx-lm calls it
        # trimmable at any length (its `trim` silently stops at the first key it holds).
        chunk = cache.chunk_size
        return -(-cache.start_position // chunk) * chunk
    return 0 if cache.is_trimmable() else None


def shortest_cut(cache: list[Any], length: int) -> int:
    """The shortest prefix a model's cache holding `length` tokens can be cut back to
    (`length` itself when it cannot be cut at all)."""
    cuts = [_layer_cut(c) for c in cache]
    if None in cuts:
        return length
    return min(length, max((c for c in cuts if c is not None), default=0))


def _nbytes(cache: list[Any]) -> int:
    return sum(int(c.nbytes) for c in cache)


def _copy(cache: list[Any], n: int, stored: int) -> list[Any]:
    """A private copy of a stored cache holding its first `n` positions (the stored entry
    stays intact: generation mutates the caches it is given)."""
    fresh = copy.deepcopy(cache)
    if n < stored:
        trim_prompt_cache(fresh, stored - n)
    return fresh


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    cache: list[Any]
    nbytes: int
    # The shortest prefix the entry can be cut back to (its whole length: not cuttable).
    shortest: int = 0


class PrefixCache:
    def __init__(self, budget_bytes: int, min_tokens: int = MIN_PREFIX_TOKENS) -> None:
        self.budget_bytes = budget_bytes
        self.min_tokens = min_tokens
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next_key = 0
        self.hits = 0
        self.misses = 0

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, tokens: Sequence[int]) -> tuple[list[Any] | None, int]:
        """A cache for the longest stored prefix of `tokens`, and its length.

        At least one token is always left to prefill, since generation starts from the logits
        of the last prompt token."""
        best_key, best_n = None, 0
        for key, entry in self._entries.items():
            n = min(common_prefix(entry.tokens, tokens), len(tokens) - 1)
            if n < entry.shortest:
                continue  # e.g. a state cache is reused only when the whole entry matches
            if n > best_n:
                best_key, best_n = key, n
        if best_key is None or best_n < self.min_tokens:
            self.misses += 1
            return None, 0
        self._entries.move_to_end(best_key)
        self.hits += 1
        entry = self._entries[best_key]
        return _copy(entry.cache, best_n, len(entry.tokens)), best_n

    def store(self, tokens: Sequence[int], cache: list[Any]) -> None:
        if not cache or len(tokens) < self.min_tokens:
            return
        tokens = tuple(tokens[: _processed(tokens, cache)])
        nbytes = _nbytes(cache)
        if nbytes > self.budget_bytes:
            return
        # Plain KV caches can be cut back to any position; rotating (sliding-window) caches
        # past their window and state caches cannot: those are reused only whole.
        shortest = shortest_cut(cache, len(tokens))
        # An entry that this one extends is now redundant, when this one can be cut back to
        # every length that entry serves.
        for key in [
            k
            for k, e in self._entries.items()
            if tokens[: len(e.tokens)] == e.tokens and shortest <= e.shortest
        ]:
            del self._entries[key]
        self._entries[self._next_key] = _Entry(tokens, cache, nbytes, shortest)
        self._next_key += 1
        while self.nbytes > self.budget_bytes:
            self._entries.popitem(last=False)
