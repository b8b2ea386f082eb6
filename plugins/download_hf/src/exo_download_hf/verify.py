"""Checking a fetched file against the hash the hub advertises for it.

huggingface_hub checks only sizes; a file corrupted in transit or on a proxy would otherwise be
loaded as weights. LFS files carry their sha256 (the LFS oid); small files kept in git carry
their git blob id, the sha1 of `blob <size>\\0<content>`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

import msgspec

CHUNK = 4 * 1024 * 1024

HashKind = Literal["sha256", "git-sha1"]


class ExpectedHash(msgspec.Struct, frozen=True):
    kind: HashKind
    hex: str


class HashMismatch(Exception):
    def __init__(self, path: str, expected: ExpectedHash, actual: str) -> None:
        super().__init__(
            f"{path}: {expected.kind} mismatch (expected {expected.hex}, got {actual})"
        )
        self.path = path
        self.expected = expected
        self.actual = actual


def file_digest(path: Path, kind: HashKind) -> str:
    if kind == "sha256":
        h = hashlib.sha256()
    else:
        h = hashlib.sha1(usedforsecurity=False)
        h.update(f"blob {path.stat().st_size}\0".encode())
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def verify_file(path: Path, expected: ExpectedHash, name: str) -> None:
    """Raise `HashMismatch` (naming the file as `name`) unless `path` has the expected hash."""
    actual = file_digest(path, expected.kind)
    if actual != expected.hex.lower():
        raise HashMismatch(name, expected, actual)
