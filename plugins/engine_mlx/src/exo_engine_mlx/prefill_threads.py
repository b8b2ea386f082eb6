"""More BLAS threads for the steps that prefill prompts (EXO_PREFILL_BLAS_THREADS, default auto).

A prompt's many rows go through dequantize + BLAS (cpu_kernels.py), which is compute bound: on
SmolLM2, 8 prompts of ~45 tokens are ~76 GFLOP, ~60 % of that step's CPU time in sgemm on the
runner's one BLAS thread (bench/profiles/batch8_step_smollm2.txt). The runner keeps that one
thread for decode (cores - 1, exo_core.blas.blas_threads) because idle OpenBLAS threads
busy-wait and take a core from the decode step's kernels. EXO_PREFILL_BLAS_THREADS=auto (the
default: every usable core) or N raises the thread count for a step that prefills and sets it
back after; `off` leaves the BLAS alone. Measured on a quiet 2-core machine
(bench/profiles/vs_llamacpp_smollm2.txt, alternating runs): time to first token 0.31-0.41 s with
it against 0.34-0.42 s without, 8-stream aggregate 86-95 tok/s against 74-83. On a machine
loaded by other work 2 threads made the prefill 2x slower (spinning threads): `off` there.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from exo_core.plugin.engine import usable_cores

# (library file name prefix, its set/get thread count functions)
_LIBRARIES = (
    ("libscipy_openblas", "scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
    ("libopenblas", "openblas_set_num_threads", "openblas_get_num_threads"),
    ("libmkl_rt", "MKL_Set_Num_Threads", "MKL_Get_Max_Threads"),
)


def requested(env: Mapping[str, str] | None = None) -> int | None:
    """Threads wanted for prefill steps, or None (the setting is off)."""
    env = os.environ if env is None else env
    value = env.get("EXO_PREFILL_BLAS_THREADS", "auto").strip().lower()
    if value in ("off", "0", "no", "false"):
        return None
    if value in ("", "auto"):
        return usable_cores()
    return max(1, int(value))


class BlasThreads:
    """The loaded BLAS's thread count, switched around prefill steps."""

    def __init__(self, library: ctypes.CDLL, setter: str, getter: str, prefill: int) -> None:
        self._set = getattr(library, setter)
        self._get = getattr(library, getter)
        self.decode = self.threads()
        self.prefill = prefill

    def threads(self) -> int:
        """The BLAS's thread count now."""
        return int(self._get())

    @contextmanager
    def prefilling(self) -> Iterator[None]:
        self._set(self.prefill)
        try:
            yield
        finally:
            self._set(self.decode)


def _mapped_libraries() -> list[str]:
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    return list(dict.fromkeys(line.split()[-1] for line in maps.splitlines() if "/" in line))


def for_this_process(env: Mapping[str, str] | None = None) -> BlasThreads | None:
    """The switch for the BLAS mapped into this process, or None (setting off, no such BLAS)."""
    prefill = requested(env)
    if prefill is None:
        return None
    for path in _mapped_libraries():
        name = os.path.basename(path)
        for prefix, setter, getter in _LIBRARIES:
            if name.startswith(prefix):
                library = ctypes.CDLL(path)
                if hasattr(library, setter) and hasattr(library, getter):
                    return BlasThreads(library, setter, getter, prefill)
    return None
