"""A header-only GGUF reader: metadata and tensor descriptions, no tensor data.

We parse the header ourselves (the format is small and stable) so that model-card fields and
up-front refusals (architecture, tokenizer, tensor types) cost milliseconds and give clear
messages, before `mx.load` reads the tensors.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class GGUFImportError(Exception):
    """The GGUF file cannot be imported; the message says why."""


# ggml tensor types: (name, elements per block, bytes per block).
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    30: ("BF16", 1, 2),
}

# GGUF metadata value types -> struct format of scalars.
_SCALARS: dict[int, str] = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    name: str
    # Row-major shape (outermost first), the order `mx.load` and numpy use; GGUF stores the
    # reverse (ggml's ne[0] is the innermost dimension).
    shape: tuple[int, ...]
    type_id: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.type_id, (f"type {self.type_id}", 0, 0))[0]

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo]

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise GGUFImportError(f"{self.path.name}: missing metadata key {key!r}")
        return self.metadata[key]

    @property
    def architecture(self) -> str:
        return str(self.get("general.architecture", "?"))


class _Cursor:
    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.buf):
            raise GGUFImportError(f"{self.path.name}: truncated header (not a complete GGUF file)")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        return struct.unpack_from(fmt, self.take(size))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        return bytes(self.take(n)).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype = self.scalar("<I")
            count = self.scalar("<Q")
            if etype in _SCALARS:
                fmt = _SCALARS[etype]
                size = struct.calcsize(fmt)
                raw = self.take(size * count)
                return list(struct.unpack(f"<{count}{fmt[1]}", raw))
            return [self.value(etype) for _ in range(count)]
        raise GGUFImportError(f"{self.path.name}: unknown metadata value type {vtype}")


def read_header(path: Path) -> GGUFHeader:
    """Parse the GGUF header of `path` (versions 2 and 3)."""
    path = Path(path)
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            cur = _Cursor(memoryview(mm), path)
            try:
                return _parse(cur, path)
            finally:
                cur.buf.release()
    except (OSError, ValueError) as e:
        raise GGUFImportError(f"cannot read {path}: {e}") from e


def _parse(cur: _Cursor, path: Path) -> GGUFHeader:
    if bytes(cur.take(4)) != b"GGUF":
        raise GGUFImportError(f"{path.name}: not a GGUF file (bad magic)")
    version = cur.scalar("<I")
    if version not in (2, 3):
        raise GGUFImportError(f"{path.name}: unsupported GGUF version {version}")
    n_tensors = cur.scalar("<Q")
    n_kv = cur.scalar("<Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.scalar("<I"))
    tensors: list[TensorInfo] = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.scalar("<I")
        dims = [cur.scalar("<Q") for _ in range(n_dims)]
        type_id = cur.scalar("<I")
        cur.scalar("<Q")  # data offset: mx.load reads the data, we do not
        tensors.append(TensorInfo(name, tuple(reversed(dims)), type_id))
    return GGUFHeader(path, version, metadata, tensors)
