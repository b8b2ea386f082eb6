"""The identity key is written durably: temp file, fsync, rename, fsync of the directory.

Observed with strace (the key is written by the Rust extension, out of Python's reach)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

WRITE_KEY = "from exo_transport_libp2p import _native; _native.load_or_create_key({path!r})"


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_a_new_key_is_fsynced_renamed_and_its_directory_fsynced(tmp_path: Path) -> None:
    key = tmp_path / "libp2p_identity.key"
    trace = tmp_path / "trace.txt"
    subprocess.run(
        ["strace", "-f", "-e", "trace=openat,fsync,rename", "-o", str(trace), sys.executable,
         "-c", WRITE_KEY.format(path=str(key))],
        check=True,
        timeout=60,
    )  # fmt: skip
    fds: dict[str, str] = {}
    steps: list[str] = []
    for line in trace.read_text().splitlines():
        if (m := re.search(r'openat\(AT_FDCWD, "([^"]+)".*= (\d+)$', line)) and str(tmp_path) in m[
            1
        ]:
            fds[m[2]] = m[1]
        elif (m := re.search(r"fsync\((\d+)\)\s+= 0", line)) and m[1] in fds:
            steps.append(f"fsync {Path(fds[m[1]]).name or fds[m[1]]}")
        elif "rename(" in line and str(key) in line:
            steps.append("rename")
    assert len(steps) == 3, steps
    assert steps[0].startswith("fsync libp2p_identity.tmp"), steps  # the key, before the rename
    assert steps[1:] == ["rename", f"fsync {tmp_path.name}"], steps  # the directory, after it
