"""A download killed with SIGKILL resumes in a new process, fetching only the remainder."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from exo_download_hf.store import ModelStore
from exo_download_hf.testing import TINY, HubStandIn, tiny_files

SCRIPT = Path(__file__).with_name("fetch_model.py")
WEIGHTS = 4_000_000


def fetch(models: Path, hub: HubStandIn) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HF_ENDPOINT": hub.url}
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), str(models), TINY],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def test_resume_after_sigkill(hub: HubStandIn, tmp_path: Path) -> None:
    files = tiny_files(weights=WEIGHTS, seed=7)
    hub.add_repo(TINY, files)
    sha = hashlib.sha256(files["model.safetensors"]).hexdigest()
    part = ModelStore(tmp_path / "org--tiny").partial_dir / f"{sha}.part"
    hub.throttle_bytes_per_s = 1_500_000

    first = fetch(tmp_path, hub)
    deadline = time.monotonic() + 30
    while not (part.exists() and part.stat().st_size >= 1_000_000):
        assert first.poll() is None, first.stdout.read() if first.stdout else b""
        assert time.monotonic() < deadline, "the first download never got going"
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    kept = part.stat().st_size
    assert 1_000_000 <= kept < WEIGHTS
    assert not (tmp_path / "org--tiny" / "model.safetensors").exists()
    # The stand-in logs the cut-off transfer once its next write fails.
    while not (killed := [s for s in hub.content_requests() if s.path == f"/cdn/{sha}"]):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert killed[0].range_start is None and kept <= killed[0].body_bytes < WEIGHTS

    hub.clear()
    hub.throttle_bytes_per_s = None
    second = fetch(tmp_path, hub)
    out, _ = second.communicate(timeout=60)
    assert second.returncode == 0, out.decode()
    assert f"done {tmp_path / 'org--tiny'}" in out.decode()

    weights = tmp_path / "org--tiny" / "model.safetensors"
    assert weights.read_bytes() == files["model.safetensors"]
    cdn = [s for s in hub.content_requests() if s.path == f"/cdn/{sha}"]
    assert [(s.status, s.range_start) for s in cdn] == [(206, kept)]
    assert cdn[0].body_bytes == WEIGHTS - kept
