"""Model directories from the environment, and the hashes files are checked against."""

from __future__ import annotations

from pathlib import Path

import pytest

from exo_download_hf.dirs import ModelDirs, dir_name, disk_free
from exo_download_hf.verify import ExpectedHash, HashMismatch, file_digest, verify_file


def test_default_dir_is_first_and_alone_without_env(tmp_path: Path) -> None:
    dirs = ModelDirs.from_env(tmp_path / "models", {})
    assert dirs.writable == (tmp_path / "models",) and dirs.read_only == ()


def test_env_dirs_follow_the_default_without_duplicates(tmp_path: Path) -> None:
    default, ssd, nfs = tmp_path / "models", tmp_path / "ssd", tmp_path / "nfs"
    env = {
        "EXO_MODELS_DIRS": f"{ssd}:{default}::{ssd}",
        "EXO_MODELS_READ_ONLY_DIRS": f"{nfs}:",
    }
    dirs = ModelDirs.from_env(default, env)
    assert dirs.writable == (default, ssd)
    assert dirs.read_only == (nfs,)


def test_a_read_only_dir_is_never_writable(tmp_path: Path) -> None:
    default, nfs = tmp_path / "models", tmp_path / "nfs"
    env = {"EXO_MODELS_DIRS": f"{nfs}/sub", "EXO_MODELS_READ_ONLY_DIRS": str(nfs)}
    dirs = ModelDirs.from_env(default, env)
    assert dirs.writable == (default,)
    assert dirs.is_read_only(nfs / "org--m") and not dirs.is_read_only(default / "org--m")


def test_layout_names() -> None:
    assert dir_name("mlx-community/Qwen3-0.6B-4bit") == "mlx-community--Qwen3-0.6B-4bit"
    dirs = ModelDirs(writable=(Path("/a"),), read_only=(Path("/ro"),))
    assert dirs.writable_candidates("o/m") == [Path("/a/o--m")]
    assert dirs.read_only_candidates("o/m") == [Path("/ro/o--m"), Path("/ro/o/m")]


def test_free_space_of_a_dir_not_made_yet(tmp_path: Path) -> None:
    assert disk_free(tmp_path / "not" / "yet") == disk_free(tmp_path) > 0


@pytest.mark.parametrize(
    ("content", "blob_id"),
    [  # `git hash-object` of these contents
        (b"", "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"),
        (b"hello\n", "ce013625030ba8dba906f756967f9e9ca394464a"),
    ],
)
def test_git_blob_ids(tmp_path: Path, content: bytes, blob_id: str) -> None:
    path = tmp_path / "f"
    path.write_bytes(content)
    assert file_digest(path, "git-sha1") == blob_id
    verify_file(path, ExpectedHash("git-sha1", blob_id), "f")


def test_sha256_mismatch_names_the_file_and_both_hashes(tmp_path: Path) -> None:
    path = tmp_path / "w"
    path.write_bytes(b"abc")
    good = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    verify_file(path, ExpectedHash("sha256", good.upper()), "o/m/w")
    with pytest.raises(HashMismatch) as mismatch:
        verify_file(path, ExpectedHash("sha256", "0" * 64), "o/m/w")
    assert str(mismatch.value) == f"o/m/w: sha256 mismatch (expected {'0' * 64}, got {good})"
