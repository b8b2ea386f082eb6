"""What the ranks of a pipeline share each decode step: the last rank's sampled tokens.

Only a pipeline's last rank computes logits. Every rank still runs the same batch generator
(the same requests, samplers with their seeded keys, logits processors, stop rules), so every
rank must learn the tokens the last rank picked. Each decode step the rows' samplers run on
every rank (elsewhere on placeholder logits, so that a sampler or processor that fails does so
on every rank alike), and the last rank's result is handed round the ring (last -> 0 -> 1 ...,
point to point, one hop to rank 0): one float32 array of the sampled ids, plus, for a request
that reads logprobs, its token's and its top alternatives' ids and log-probabilities. That is
4 bytes a sequence a step (greedy or sampled), against the whole vocabulary's logits before
(SmolLM2: 196 kB).

A request's logprobs row is rebuilt from those few values: -inf everywhere but the token and
its alternatives, which is all `BatchEngine` reads of it.

The ids travel as float32, exact up to 2**24: far above any vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx

# float32 holds every integer up to this exactly.
MAX_VOCABULARY = 2**24


@dataclass(frozen=True)
class LastRankSampling:
    """Shares the last rank's sampled tokens (and asked-for logprobs) over a pipeline group."""

    group: mx.distributed.Group
    last: bool

    def share(
        self, sampled: mx.array, rows: list[mx.array], tops: Sequence[int | None]
    ) -> tuple[mx.array, list[mx.array]]:
        """Every rank's copy of the last rank's `sampled` tokens and of the log-probability
        rows of the sequences that read them (`tops[e]`: how many alternatives row e reports;
        None: it reads none, and its row stays this rank's own)."""
        vocabulary = rows[0].shape[-1] if rows else 0
        if vocabulary > MAX_VOCABULARY:
            raise ValueError(f"a vocabulary of {vocabulary} ids does not fit a float32 exchange")
        count = sampled.shape[0]
        parts = [sampled.reshape(-1).astype(mx.float32)]
        wanted: list[tuple[int, int]] = []  # (row, ids sent for it)
        for e, top in enumerate(tops):
            if top is None:
                continue
            ids = _reported_ids(sampled[e : e + 1], rows[e], min(max(top, 0), vocabulary))
            parts += [ids.astype(mx.float32), rows[e][ids].astype(mx.float32)]
            wanted.append((e, ids.shape[0]))
        payload = mx.concatenate(parts) if len(parts) > 1 else parts[0]
        shared = self._relay(payload)
        tokens = shared[:count].astype(sampled.dtype)
        out = list(rows)
        at = count
        for e, n in wanted:
            ids = shared[at : at + n].astype(mx.uint32)
            values = shared[at + n : at + 2 * n]
            at += 2 * n
            out[e] = mx.full((vocabulary,), -mx.inf, mx.float32).at[ids].maximum(values)
        return tokens, out

    def _relay(self, payload: mx.array) -> mx.array:
        """The last rank's `payload` on every rank, handed round the ring: last -> 0 -> 1 ->
        ... -> the rank before the last. Rank 0, which starts the next step, has it after one
        hop (an all_sum of two ranks takes two exchanges)."""
        rank, size = self.group.rank(), self.group.size()
        if size == 1:
            return payload
        if self.last:
            sent = mx.distributed.send(payload, (rank + 1) % size, group=self.group)
            return mx.depends(payload, sent)
        # This rank's own sampling still runs (its keys and contexts advance alike), and is
        # queued on the stream first, with this step's forward and the hidden state's send:
        # a receive has no inputs to order it by, and before the send it would wait forever.
        mx.async_eval(payload)
        got = mx.distributed.recv_like(payload, (rank - 1) % size, group=self.group)
        if rank + 1 < size - 1:
            got = mx.depends(got, mx.distributed.send(got, rank + 1, group=self.group))
        return got


def _reported_ids(token: mx.array, row: mx.array, top: int) -> mx.array:
    """The sampled token's id, then its row's `top` most likely ids."""
    token = token.astype(mx.uint32)
    if top == 0:
        return token
    best = mx.argpartition(-row, kth=top - 1)[:top].astype(mx.uint32)
    return mx.concatenate([token, best])
