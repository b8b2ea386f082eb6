"""Small files that must survive power loss: written whole or not at all, and remembered.

A rename is atomic but not durable by itself: the new name lives in the directory, which has
to be fsynced too, and the file's bytes must reach the disk before the rename does. So a
durable replace is: write a temporary file, fsync it, rename it over the target, fsync the
directory. A crash at any point leaves the old file or the new one, never a mix or nothing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

# Called at each step of a durable write with the step's name and the file, so that the
# deterministic simulation can crash a node exactly there. None outside tests.
CrashHook = Callable[[str, Path], None]
_crash_hook: CrashHook | None = None


def crash_point(name: str, path: Path) -> None:
    """A point where a crash must leave the disk in a state the node recovers from."""
    if _crash_hook is not None:
        _crash_hook(name, path)


def crash_points_enabled() -> bool:
    return _crash_hook is not None


@contextlib.contextmanager
def crash_hook(hook: CrashHook) -> Iterator[None]:
    """Install `hook` at every crash point while the block runs (tests only)."""
    global _crash_hook
    previous, _crash_hook = _crash_hook, hook
    try:
        yield
    finally:
        _crash_hook = previous


def fsync_dir(directory: Path) -> None:
    """Make the names in `directory` (a file just created or renamed there) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """`os.write` until every byte is written (a write may be short, e.g. near a full disk)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def replace_durably(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data`: temp file, fsync, rename, fsync the directory."""
    crash_point("write", path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        try:
            write_all(fd, data)
            crash_point("written", tmp)
            os.fsync(fd)
        finally:
            os.close(fd)
        crash_point("synced", tmp)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    crash_point("renamed", path)
    fsync_dir(path.parent)


__all__ = [
    "CrashHook",
    "crash_hook",
    "crash_point",
    "crash_points_enabled",
    "fsync_dir",
    "replace_durably",
    "write_all",
]
