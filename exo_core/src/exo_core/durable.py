"""Small files that must survive power loss: written whole or not at all, and remembered.

A rename is atomic but not durable by itself: the new name lives in the directory, which has
to be fsynced too, and the file's bytes must reach the disk before the rename does. So a
durable replace is: write a temporary file, fsync it, rename it over the target, fsync the
directory. A crash at any point leaves the old file or the new one, never a mix or nothing.
"""

from __future__ import annotations

import os
from pathlib import Path


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
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


__all__ = ["fsync_dir", "replace_durably", "write_all"]
