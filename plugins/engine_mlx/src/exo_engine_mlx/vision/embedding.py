"""Virtual token ids for images, and the embedding layer that reads them.

An image seen by the runner gets a slot for good (by the SHA-256 of its bytes): its soft
tokens are the ids `base + slot * tokens_per_image + i`. Slots are never reused, so equal ids
always mean the same image and the prefix cache can never hand one image's keys and values
to another. The features themselves are kept for the most recent images only and computed
again when an older image comes back.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np


class FeatureStore:
    def __init__(
        self, base: int, tokens_per_image: int, capacity: int = 64, *, embeds: bool = True
    ) -> None:
        self.base = base  # the first id past the vocabulary
        self.tokens_per_image = tokens_per_image
        self.capacity = capacity
        # False on a pipeline rank that receives hidden states: it needs the ids (its prefix
        # cache is keyed by them), never the features.
        self.embeds = embeds
        self._slots: dict[bytes, int] = {}
        self._features: OrderedDict[int, mx.array] = OrderedDict()

    def ids_for(self, digest: bytes, compute: Callable[[], mx.array]) -> list[int]:
        """The image's virtual ids, computing its features unless they are kept."""
        slot = self._slots.setdefault(digest, len(self._slots))
        if not self.embeds:
            pass
        elif slot in self._features:
            self._features.move_to_end(slot)
        else:
            features = compute()
            if features.shape[0] != self.tokens_per_image:
                raise ValueError(f"the vision tower gave {features.shape[0]} soft tokens")
            self._features[slot] = features
            while len(self._features) > self.capacity:
                self._features.popitem(last=False)
        start = self.base + slot * self.tokens_per_image
        return list(range(start, start + self.tokens_per_image))

    def rows(self, ids: mx.array) -> tuple[mx.array, mx.array] | None:
        """(mask of the virtual ids, their feature rows) for a batch of ids, or None when
        there are none."""
        arr = np.array(ids)
        mask = arr >= self.base
        if not mask.any():
            return None
        rel = arr[mask] - self.base
        slots = rel // self.tokens_per_image
        present = [int(s) for s in np.unique(slots)]
        missing = [s for s in present if s not in self._features]
        if missing:
            raise RuntimeError("an image's features were dropped while its prompt was read")
        rank = np.searchsorted(np.array(present), slots)
        index = np.zeros(arr.shape, np.int32)
        index[mask] = rank * self.tokens_per_image + rel % self.tokens_per_image
        table = mx.concatenate([self._features[s] for s in present])
        return ids >= self.base, table[mx.array(index)]


class VisionEmbedding(nn.Module):
    """The text model's embedding, with the virtual ids of images read from a `FeatureStore`.
    A one-token call (a decode step) holds a sampled token, never an image's."""

    def __init__(self, base: Any, store: FeatureStore) -> None:
        super().__init__()
        self.base = base
        self._store = store

    def __call__(self, ids: mx.array) -> mx.array:
        if ids.shape[-1] > 1:
            found = self._store.rows(ids)
            if found is not None:
                mask, rows = found
                text = self.base(mx.where(mask, 0, ids))
                return mx.where(mask[..., None], rows.astype(text.dtype), text)
        return self.base(ids)

    def as_linear(self, x: mx.array) -> mx.array:
        return self.base.as_linear(x)


def text_ids_only(processor: Callable[[mx.array, mx.array], mx.array], base: int) -> Any:
    """A logits processor (a repetition penalty) that reads the tokens seen so far, with an
    image's virtual ids (past the logits) read as token 0: they are no token it could index."""

    def wrapped(tokens: mx.array, logits: mx.array) -> mx.array:
        return processor(mx.where(tokens >= base, 0, tokens), logits)

    return wrapped
