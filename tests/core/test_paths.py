"""The one check between a model id and a path (`exo_core.paths`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exo_core.paths import (
    UnsafeModelPath,
    check_model_id,
    is_safe_model_id,
    model_path,
    remove_model_dir,
)

UNSAFE = [
    "",
    ".",
    "..",
    "a/..",
    "../a",
    "a/./b",
    "/etc",
    "a//b",
    "a/",
    "%2E%2E",
    "%2e",
    "a%2Fb",
    "a\\..",
    "a\x00b",
    "a\nb",
    "x" * 201,
]


@pytest.mark.parametrize("model_id", UNSAFE)
def test_unsafe_ids_are_refused(model_id: str, tmp_path: Path) -> None:
    assert not is_safe_model_id(model_id)
    with pytest.raises(UnsafeModelPath):
        check_model_id(model_id)
    with pytest.raises(UnsafeModelPath):
        model_path(tmp_path, model_id)


@pytest.mark.parametrize("model_id", ["org/name", "org--name", "Qwen3-0.6B-4bit", "a.b_c-d"])
def test_ordinary_ids_are_children(model_id: str, tmp_path: Path) -> None:
    assert model_path(tmp_path, model_id) == tmp_path / model_id


def test_symlinks_out_are_refused(tmp_path: Path) -> None:
    root, outside = tmp_path / "models", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "evil").symlink_to(outside)
    (root / "self").symlink_to(root)
    (root / "inner").mkdir()
    (root / "alias").symlink_to(root / "inner")
    for name in ("evil", "evil/x", "self"):
        with pytest.raises(UnsafeModelPath):
            model_path(root, name)
    assert model_path(root, "alias") == root / "alias"  # leads to a child: allowed to read
    with pytest.raises(UnsafeModelPath):
        remove_model_dir(root, root / "alias")  # but never deleted through the link
    assert (root / "inner").is_dir()


@given(st.text(alphabet="./%2Eae\\", max_size=8))
def test_a_safe_id_always_stays_a_strict_child(model_id: str) -> None:
    root = Path("/models")
    if is_safe_model_id(model_id):
        resolved = model_path(root, model_id).resolve()
        assert resolved != root and resolved.is_relative_to(root)
