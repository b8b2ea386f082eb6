"""OpenAI's image routes: `POST /v1/images/generations`, `POST /v1/images/edits`, and the
stored images behind `response_format=url` (`GET /images`, `GET /images/{id}`).

Translation only: requests become the core's `ImageRequest`, chunks become OpenAI's image
objects or its `image_generation.*` / `image_edit.*` stream events. exo's own options ride in
`advanced_params` (seed, num_inference_steps, guidance, negative_prompt, num_sync_steps).

Images kept for `response_format=url` are files in the node's data directory (`ImageStore`),
oldest dropped first once there are more than `max_images` or they take more than `max_bytes`.
"""

from __future__ import annotations

import base64
import json
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec
from litestar.datastructures import UploadFile

from exo_api_openai import translate
from exo_core.plugin import (
    Chunk,
    ErrorChunk,
    FinishChunk,
    ImageChunk,
    InvalidRequest,
    KeepAliveChunk,
    ProgressChunk,
)
from exo_core.plugin.dialect import AnyRequest, GenerationFailed, answered
from exo_core.plugin.images import ImageRequest, InvalidImageRequest, parse_size

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


ResponseFormat = Literal["b64_json", "url"]
OutputFormat = Literal["png", "jpeg", "webp"]
# OpenAI's quality names; exo's models have one quality, so they are accepted and ignored.
Quality = Literal["auto", "low", "medium", "high", "standard", "hd"]


class AdvancedParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    seed: int | None = None
    num_inference_steps: int | None = None
    guidance: float | None = None
    negative_prompt: str | None = None
    # exo's count of steps run in lockstep before its patch-parallel split takes over. The
    # image engine here splits by layers and syncs every step: checked, with no effect.
    num_sync_steps: int | None = None


# exo's bounds on `num_sync_steps`.
SYNC_STEPS_RANGE = (1, 100)


class ImagesRequest(msgspec.Struct, kw_only=True):
    """The JSON body of `/v1/images/generations` (and the form fields of `/v1/images/edits`)."""

    prompt: str | None = None
    model: str | None = None
    n: int | None = None
    size: str | None = None
    response_format: ResponseFormat | None = None
    output_format: OutputFormat | None = None
    output_compression: int | None = None
    quality: Quality | None = None
    stream: bool | None = None
    partial_images: int | None = None
    advanced_params: AdvancedParams | None = None
    # Accepted for compatibility; they change nothing here.
    background: str | None = None
    moderation: str | None = None
    style: str | None = None
    user: str | None = None
    input_fidelity: str | None = None


@dataclass
class EditForm:
    """The multipart form of `/v1/images/edits` (for the OpenAPI schema: `form_request`
    reads the form itself)."""

    image: UploadFile
    prompt: str
    model: str | None = None
    n: int | None = None
    size: str | None = None
    response_format: ResponseFormat | None = None
    output_format: OutputFormat | None = None
    stream: bool | None = None
    partial_images: int | None = None


def to_image_request(req: ImagesRequest, input_image: bytes | None = None) -> ImageRequest:
    if req.prompt is None:
        raise InvalidRequest("prompt is required")
    try:
        width, height = parse_size(req.size or "auto")
    except InvalidImageRequest as e:
        raise InvalidRequest(str(e)) from None
    advanced = req.advanced_params or AdvancedParams()
    low, high = SYNC_STEPS_RANGE
    if advanced.num_sync_steps is not None and not low <= advanced.num_sync_steps <= high:
        raise InvalidRequest(f"advanced_params.num_sync_steps must be between {low} and {high}")
    if req.output_compression is not None and not 0 <= req.output_compression <= 100:
        raise InvalidRequest("output_compression must be between 0 and 100")
    return ImageRequest(
        prompt=req.prompt,
        n=1 if req.n is None else req.n,
        width=width,
        height=height,
        steps=advanced.num_inference_steps,
        guidance=advanced.guidance,
        seed=advanced.seed,
        negative_prompt=advanced.negative_prompt,
        output_format=req.output_format or "png",
        quality=90 if req.output_compression is None else req.output_compression,
        partial_images=(req.partial_images or 0) if req.stream else 0,
        input_image=input_image,
    )


def require_model(req: ImagesRequest) -> str:
    if not req.model:
        raise InvalidRequest("model is required: name an image model from GET /v1/models")
    return req.model


# -- multipart (edits) --------------------------------------------------------------------------

_FORM_INTS = ("n", "output_compression", "partial_images")
_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"RIFF")


def form_request(form: dict[str, list[Any]]) -> ImagesRequest:
    """An edit's multipart fields (but the image) as an `ImagesRequest`."""
    files = [v for key in ("image", "image[]") for v in form.get(key, [])]
    uploads = [f for f in files if isinstance(f, UploadFile)]
    if not uploads:
        raise InvalidRequest("image is required: upload the image to edit as a file")
    if "mask" in form:
        raise InvalidRequest("mask is not supported: exo edits the whole image")
    fields: dict[str, Any] = {}
    for key, values in form.items():
        if key in ("image", "image[]") or not values or isinstance(values[0], UploadFile):
            continue
        value = values[0]
        if key in _FORM_INTS:
            try:
                fields[key] = int(value)
            except ValueError:
                raise InvalidRequest(f"{key} must be an integer, got '{value}'") from None
        elif key == "stream":
            fields[key] = str(value).lower() in ("true", "1")
        elif key == "advanced_params":
            try:
                fields[key] = json.loads(value)
            except json.JSONDecodeError:
                raise InvalidRequest("advanced_params must be a JSON object") from None
        else:
            fields[key] = value
    return translate.convert(fields, ImagesRequest, "request")


async def upload_bytes(form: dict[str, list[Any]]) -> bytes:
    """The uploaded image (the first, when `image[]` holds several), checked to be an image."""
    upload = next(
        f for key in ("image", "image[]") for f in form.get(key, []) if isinstance(f, UploadFile)
    )
    data = await upload.read()
    if not data.startswith(_IMAGE_MAGIC):
        raise InvalidRequest("image must be a PNG, JPEG or WebP file")
    return data


async def edit_request(request: AnyRequest) -> tuple[ImagesRequest, bytes]:
    """An edit's multipart upload: its fields as an `ImagesRequest`, and the image's bytes."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise InvalidRequest("an edit is a multipart/form-data upload with the image")
    form = (await request.form()).dict()
    return form_request(form), await upload_bytes(form)


# -- answers --------------------------------------------------------------------------------------


def _size(chunk: ImageChunk) -> str:
    return f"{chunk.width}x{chunk.height}"


def images_response(
    chunks: list[Chunk],
    response_format: ResponseFormat,
    store: ImageStore,
    base_url: str,
) -> dict[str, Any]:
    """The non-streamed answer: `created` and `data[]` of b64_json or url, in request order."""
    finish: FinishChunk | None = None
    finals: list[ImageChunk] = []
    for chunk in chunks:
        match chunk:
            case ImageChunk(partial=False):
                finals.append(chunk)
            case FinishChunk():
                finish = chunk
            case ErrorChunk(message=message):
                raise GenerationFailed(message)
            case _:
                pass
    answered(finish)
    finals.sort(key=lambda c: c.index)
    data: list[dict[str, Any]] = []
    for chunk in finals:
        if response_format == "url":
            image_id = store.save(chunk.data, chunk.format)
            data.append({"url": f"{base_url.rstrip('/')}/images/{image_id}"})
        else:
            data.append({"b64_json": base64.b64encode(chunk.data).decode()})
    first = finals[0] if finals else None
    return {
        "created": now(),
        "data": data,
        "output_format": first.format if first else "png",
        "size": _size(first) if first else None,
        "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
    }


class ImageStream:
    """Streamed answers: `<kind>.partial_image` events while denoising, `<kind>.completed` for
    each final image, exo's `<kind>.progress` events (step i of N), then `[DONE]`."""

    def __init__(self, kind: Literal["image_generation", "image_edit"], request_id: str) -> None:
        self.kind = kind
        self.request_id = request_id

    def _event(self, name: str, body: dict[str, Any]) -> str:
        payload = {"type": f"{self.kind}.{name}", **body}
        return f"event: {self.kind}.{name}\ndata: {json.dumps(payload)}\n\n"

    def start(self) -> list[str]:
        return []

    def feed(self, chunk: Chunk) -> list[str]:
        match chunk:
            case ProgressChunk(step=step, total=total, index=index):
                progress = {"id": self.request_id, "step": step, "total": total, "index": index}
                return [self._event("progress", progress)]
            case ImageChunk():
                body = {
                    "b64_json": base64.b64encode(chunk.data).decode(),
                    "created_at": now(),
                    "size": _size(chunk),
                    "quality": "auto",
                    "background": "opaque",
                    "output_format": chunk.format,
                    "index": chunk.index,
                }
                if chunk.partial:
                    body["partial_image_index"] = chunk.partial_index
                    return [self._event("partial_image", body)]
                body["usage"] = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
                return [self._event("completed", body)]
            case FinishChunk(finish_reason=reason):
                if reason.value == "cancelled":
                    return self.fail("the generation was cancelled in the cluster")
                return ["data: [DONE]\n\n"]
            case ErrorChunk(message=message):
                return self.fail(message)
            case KeepAliveChunk():
                return [": keep-alive\n\n"]
            case _:
                return []

    def fail(self, message: str) -> list[str]:
        return [f"data: {json.dumps(translate.error_body(500, message))}\n\n", "data: [DONE]\n\n"]


_STORES: dict[Path, ImageStore] = {}


def store_for(data_dir: Path) -> ImageStore:
    """One store per data directory (the node's), shared by its routes."""
    if data_dir not in _STORES:
        _STORES[data_dir] = ImageStore.from_env(data_dir)
    return _STORES[data_dir]
