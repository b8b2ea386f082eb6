"""A KV prefix cache: reuse the attention cache of an earlier request that shares a prefix.

A multi-turn chat resends the whole conversation each turn; with the cache, only the new turn
is prefilled. Entries are evicted least recently used first under a byte budget.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _reusable(cache: list[Any]) -> bool:
    # Only plain KV caches can be cut at any position; rotating or quantized ones cannot.
    return bool(cache) and all(type(c) is KVCache for c in cache)


def _nbytes(cache: list[Any]) -> int:
    return sum(int(c.nbytes) for c in cache)


def _prefix_copy(cache: list[Any], n: int) -> list[Any]:
    """New caches holding the first `n` positions (slices: the stored entry stays intact)."""
    out = []
    for c in cache:
        keys, values = c.keys_and_values()
        fresh = KVCache()
        fresh.state = (mx.contiguous(keys[..., :n, :]), mx.contiguous(values[..., :n, :]), n)
        out.append(fresh)
    return out


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    cache: list[Any]
    nbytes: int


class PrefixCache:
    def __init__(self, budget_bytes: int, min_tokens: int = 8) -> None:
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
            if n > best_n:
                best_key, best_n = key, n
        if best_key is None or best_n < self.min_tokens:
            self.misses += 1
            return None, 0
        self._entries.move_to_end(best_key)
        self.hits += 1
        return _prefix_copy(self._entries[best_key].cache, best_n), best_n

    def store(self, tokens: Sequence[int], cache: list[Any]) -> None:
        if not _reusable(cache) or len(tokens) < self.min_tokens:
            return
        offset = cache[0].offset
        tokens = tuple(tokens[:offset])
        nbytes = _nbytes(cache)
        if nbytes > self.budget_bytes:
            return
        # An entry that this one extends is now redundant.
        for key in [k for k, e in self._entries.items() if tokens[: len(e.tokens)] == e.tokens]:
            del self._entries[key]
        self._entries[self._next_key] = _Entry(tokens, cache, nbytes)
        self._next_key += 1
        while self.nbytes > self.budget_bytes:
            self._entries.popitem(last=False)
