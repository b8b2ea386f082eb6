"""The runner hands freed C-heap memory back to the system when it goes idle."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# In a fresh interpreter: freeing a 16 MB block raises glibc's mmap threshold (as a long
# prompt's large arrays do), so the 1 MB blocks after it come from the heap; every tenth stays
# alive, so the freed ones are holes that free() alone does not return.
_CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import numpy as np
    from exo_engine_mlx.idle_memory import give_back_freed_memory

    def rss_mb():
        return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20

    big = np.ones(16 << 20, dtype=np.uint8)
    del big
    blocks = [np.ones(1 << 20, dtype=np.uint8) for _ in range(200)]
    kept = blocks[9::10]
    del blocks
    freed = rss_mb()
    gave = give_back_freed_memory() if sys.argv[1] == "trim" else None
    print(freed - rss_mb(), gave)
    """
)


def _given_back_mb(mode: str) -> tuple[float, str]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode], check=True, capture_output=True, text=True
    ).stdout.split()
    return float(out[0]), out[1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_heap_memory_goes_back_to_the_system() -> None:
    kept_mb, _ = _given_back_mb("none")
    given_mb, gave = _given_back_mb("trim")
    assert kept_mb < 20  # free() alone keeps the ~180 MB of holes resident
    assert gave == "True" and given_mb > 150
