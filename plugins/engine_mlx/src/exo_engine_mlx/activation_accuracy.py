"""How far int8 activations move a model from its float32 activations (the accuracy policy of
EXO_CPU_KERNELS, measured by bench/bench_int8_accuracy.py and held by a test).

Both models read the same tokens (teacher-forced: each position's logits given the true text
before it), in chunks through a KV cache as a runner's prefill does, so each kernel call sees
at most `chunk` rows and stays on the kernels (a long call would take dequantize + BLAS, float
either way). Per position: whether the two argmaxes agree, and KL(float || int8) in nats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

# Real text, written for this measurement: English prose and Python code.
PROSE = """\
The lighthouse keeper's log for the winter of that year is mostly about the weather. Each \
morning he wrote down the direction of the wind, the height of the swell and how much oil \
the lamp had burned overnight. On the days when a ship passed close to the rocks he added a \
line about it: the name if he could read it, the flag, and whether the crew had seen his \
signal. In February a storm took part of the roof off the store room, and for nine days the \
entries are short, written in pencil, because the ink had frozen. When the supply boat came \
back in March it brought a new roof, two barrels of oil, a letter from his sister and a crate \
of oranges, which he counted twice and recorded as thirty-one.

Most people who read the log today are surprised by how little happens in it. But the \
repetition is the point: a light that is kept the same way every night is a light that \
sailors can trust, and the keeper's job was to make each night exactly like the one before.
"""

CODE = '''\
def merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge overlapping closed intervals and return them sorted by start."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            last_start, last_end = merged[-1]
            merged[-1] = (last_start, max(last_end, end))
        else:
            merged.append((start, end))
    return merged


class LRUCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: dict[str, int] = {}

    def get(self, key: str) -> int | None:
        if key not in self.items:
            return None
        value = self.items.pop(key)
        self.items[key] = value
        return value

    def put(self, key: str, value: int) -> None:
        self.items.pop(key, None)
        if len(self.items) >= self.capacity:
            del self.items[next(iter(self.items))]
        self.items[key] = value
'''

TEXTS = {"prose": PROSE, "code": CODE}


# The policy int8 activations must meet on SmolLM2 over each of TEXTS (written down in
# plugins/mlx_cpu_kernels/README.md).
# Measured (2026-12-06, VNNI superblock kernels, the output head int8 too): top-1 0.958 prose /
# 0.993 code, mean KL 0.0033 / 0.0031, p99 0.011 / 0.018, max 0.032 / 0.080 nats. The flips
# are near-ties of a 135M model on prose (KL stays tiny); the bounds leave ~2-4x room for
# kernel changes that reorder float sums.
MIN_TOP1 = 0.90
MAX_MEAN_KL = 0.01
MAX_P99_KL = 0.05


@dataclass(frozen=True)
class Agreement:
    """int8 against float over the same positions."""

    positions: int
    top1: float  # share of positions whose argmaxes agree
    mean_kl: float  # KL(float || int8), nats, mean over positions
    p99_kl: float
    max_kl: float

    def breaches(self) -> list[str]:
        """The policy's bounds this measurement misses (empty: within the policy)."""
        checks = [
            (self.top1 >= MIN_TOP1, f"top-1 {self.top1:.3f} < {MIN_TOP1}"),
            (self.mean_kl <= MAX_MEAN_KL, f"mean KL {self.mean_kl:.4f} > {MAX_MEAN_KL}"),
            (self.p99_kl <= MAX_P99_KL, f"p99 KL {self.p99_kl:.4f} > {MAX_P99_KL}"),
        ]
        return [why for ok, why in checks if not ok]


def teacher_forced_logits(model: Any, ids: list[int], chunk: int = 64) -> np.ndarray:
    """The model's logits at every position of `ids` [positions, vocab] (float64), read in
    chunks of `chunk` tokens through one KV cache."""
    cache = make_prompt_cache(model)
    out: list[np.ndarray] = []
    for start in range(0, len(ids), chunk):
        logits = model(mx.array([ids[start : start + chunk]]), cache=cache)[0]
        out.append(np.array(logits.astype(mx.float32), dtype=np.float64))
    return np.concatenate(out)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def agreement(float_logits: np.ndarray, int8_logits: np.ndarray) -> Agreement:
    """Top-1 agreement and KL(float || int8) per position of two [positions, vocab] arrays."""
    log_p, log_q = _log_softmax(float_logits), _log_softmax(int8_logits)
    kl = np.maximum((np.exp(log_p) * (log_p - log_q)).sum(-1), 0.0)
    same = float_logits.argmax(-1) == int8_logits.argmax(-1)
    return Agreement(
        positions=len(kl),
        top1=float(same.mean()),
        mean_kl=float(kl.mean()),
        p99_kl=float(np.percentile(kl, 99)),
        max_kl=float(kl.max()),
    )
