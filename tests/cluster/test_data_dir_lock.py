"""One `exo` per data directory: a second process on the same directory exits at once.

Two real `exo` processes: the second, on the first's data directory (on another API port, and
on the same one), must exit non-zero with "data directory ... in use by pid N", before it
opens the event log or starts anything; the first keeps serving with its log intact.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from exo_core.testing.harness import free_port
from exo_core.testing.processes import exo_processes, wait_until


def second_exo(data_dir: Path, api_port: int) -> subprocess.CompletedProcess[str]:
    args = ["--data-dir", str(data_dir), "--api-port", str(api_port), "--transport", "memory"]
    return subprocess.run(
        [sys.executable, "-m", "exo_core.cli", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.slow
def test_a_second_exo_on_the_same_data_dir_exits_and_the_first_keeps_serving(
    tmp_path: Path,
) -> None:
    with exo_processes(tmp_path, 1, extra_args=[["--transport", "memory"]]) as (first,):
        wait_until(lambda: first.get("/healthz")["master"] is not None, timeout=60)
        assert first.process is not None
        log = first.data_dir / "events.log"
        before = log.read_bytes()
        files = sorted(p.name for p in first.data_dir.iterdir())

        for port in (free_port(), first.api_port):
            started = time.monotonic()
            second = second_exo(first.data_dir, port)
            assert second.returncode != 0
            assert f"in use by pid {first.process.pid}" in second.stderr, second.stderr
            assert "data directory" in second.stderr
            assert "Traceback" not in second.stderr, second.stderr  # the message, and only it
            # At once: it stops before loading anything else (python start-up aside).
            assert time.monotonic() - started < 30

        assert first.alive()
        assert httpx.get(f"{first.url}/healthz", timeout=5).status_code == 200
        assert log.read_bytes().startswith(before)
        assert sorted(p.name for p in first.data_dir.iterdir()) == files
        last = first.get("/healthz")["last_index"]
        # Still the log's one writer: a command it accepts is committed and appended.
        placed = httpx.post(
            f"{first.url}/instance", json={"model_id": "SmolLM2-135M-Instruct"}, timeout=60
        )
        assert placed.status_code == 201, placed.text
        wait_until(lambda: first.get("/healthz")["last_index"] > last, timeout=30)
        assert log.read_bytes().startswith(before)
        assert len(log.read_bytes()) > len(before)
