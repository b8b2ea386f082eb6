"""Images kept for `response_format=url`: files in the node's data directory, oldest dropped
first once there are more than `max_images` or they take more than `max_bytes`."""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from pathlib import Path

import msgspec

MEDIA_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
_ID = re.compile(r"^img_[0-9a-f]{32}\.(png|jpeg|webp)$")


class StoredImage(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    created: int
    bytes: int
    media_type: str


class ImageStore:
    def __init__(self, directory: Path, max_images: int = 200, max_bytes: int = 512 << 20) -> None:
        self.directory = directory
        self.max_images = max_images
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, data_dir: Path) -> ImageStore:
        return cls(
            data_dir / "images",
            max_images=int(os.environ.get("EXO_IMAGE_RETENTION", "200")),
            max_bytes=int(os.environ.get("EXO_IMAGE_RETENTION_BYTES", str(512 << 20))),
        )

    def save(self, data: bytes, fmt: str) -> str:
        """Store an image; returns its id (the file name, with its format's extension)."""
        image_id = f"img_{uuid.uuid4().hex}.{fmt}"
        with self._lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = self.directory / f".{image_id}.tmp"
            tmp.write_bytes(data)
            tmp.replace(self.directory / image_id)
            self._prune()
        return image_id

    def path(self, image_id: str) -> Path | None:
        """The file of a stored image, or None (unknown ids and anything not an id)."""
        if not _ID.match(image_id):
            return None
        path = self.directory / image_id
        return path if path.is_file() else None

    def list(self) -> list[StoredImage]:
        """Stored images, newest first."""
        out: list[StoredImage] = []
        for path in self._files():
            st = path.stat()
            fmt = path.suffix.lstrip(".")
            out.append(
                StoredImage(
                    id=path.name,
                    created=int(st.st_mtime),
                    bytes=st.st_size,
                    media_type=MEDIA_TYPES[fmt],
                )
            )
        return sorted(out, key=lambda i: (-i.created, i.id))

    def _files(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return [p for p in self.directory.iterdir() if _ID.match(p.name) and p.is_file()]

    def _prune(self) -> None:
        files = sorted(self._files(), key=lambda p: (p.stat().st_mtime_ns, p.name))
        total = sum(p.stat().st_size for p in files)
        while files and (len(files) > self.max_images or total > self.max_bytes):
            oldest = files.pop(0)
            total -= oldest.stat().st_size
            oldest.unlink(missing_ok=True)


def now() -> int:
    return int(time.time())
