"""Freed memory handed back to the system when a runner goes idle.

MLX's CPU buffers come from malloc. A long prompt's transient arrays (its attention scores, a KV
cache that grows by concatenation) are freed when its request ends, but glibc keeps freed heap
chunks in its arenas (anything under its mmap threshold, which rises to 32 MB as large blocks
are freed): the runner's resident size stays at its peak. `malloc_trim(0)` returns the free
pages of every arena; it runs once each time the engine goes idle, between requests, where the
few milliseconds it costs delay no one. MLX's own buffer cache (reused by the next request) is
left as it is. A C library without `malloc_trim` (musl, macOS) skips it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def give_back_freed_memory() -> bool:
    """Return the C heap's free pages to the system. True when the C library could."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
