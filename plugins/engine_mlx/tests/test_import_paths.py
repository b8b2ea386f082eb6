"""`exo import-gguf` writes only below the models directory, and replaces only its own imports."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from exo_core.cli import main

UNSAFE_IDS = [".", "..", "%2E%2E", "a/..", "/etc", "evil"]


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "logs" not in p.relative_to(root).parts
    }


@pytest.mark.parametrize("model_id", UNSAFE_IDS)
def test_import_gguf_refuses_ids_that_leave_the_models_dir(
    model_id: str,
    tiny_gguf: Callable[..., Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = tmp_path / "data"
    (data / "models" / "org--kept").mkdir(parents=True)
    (data / "models" / "org--kept" / "model.safetensors").write_bytes(b"weights")
    (data / "events.log").write_bytes(b"log")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    (data / "models" / "evil").symlink_to(outside, target_is_directory=True)
    before = snapshot(tmp_path)

    code = main(["--data-dir", str(data), "import-gguf", str(tiny_gguf()), "--model-id", model_id])

    assert code != 0
    assert "exo import-gguf:" in capsys.readouterr().err
    assert snapshot(tmp_path) == before
    assert sorted(p.name for p in (data / "models").iterdir()) == ["evil", "org--kept"]


def test_import_gguf_never_replaces_a_directory_it_did_not_write(
    tiny_gguf: Callable[..., Path], tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    args = ["--data-dir", str(tmp_path / "data"), "import-gguf", str(tiny_gguf())]
    assert main([*args, "--model-id", "org/x", "--out", str(home)]) == 2
    assert (home / "notes.txt").read_text() == "mine"
    # Its own earlier import it does replace.
    assert main([*args, "--model-id", "org/x"]) == 0
    assert main([*args, "--model-id", "org/x"]) == 0
