"""One process per data directory: an exclusive lock held for as long as a node runs.

Two nodes on one data directory would append to one event log, use one identity and fight
over one models directory. So a node takes `flock(LOCK_EX)` on `<data dir>/lock` before it
opens anything else there; a second one fails at once, naming the pid that holds it. The kernel
drops the lock when the holder dies, so a crash never leaves a directory locked. The lock's
descriptor is not inherited by runner subprocesses.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

LOCK_FILE = "lock"


class DataDirInUse(RuntimeError):
    """Another process holds the data directory."""


class DataDirLock:
    # Set before anything can fail, so that `__del__` of a lock never taken finds it.
    _fd: int | None = None

    def __init__(self, data_dir: Path) -> None:
        """Take the lock, or raise `DataDirInUse` at once."""
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        path = data_dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise DataDirInUse(
                f"data directory {data_dir} in use by pid {holder or 'unknown'}: "
                "run one exo per data directory (or pass another --data-dir)"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __del__(self) -> None:
        self.release()


def _read_pid(fd: int) -> str:
    with contextlib.suppress(OSError):
        return os.pread(fd, 32, 0).decode(errors="replace").strip()
    return ""


__all__ = ["LOCK_FILE", "DataDirInUse", "DataDirLock"]
