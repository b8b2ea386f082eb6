"""Checks on the images a chat request sends to a vision model, before any node works on it.

Every dialect turns its images into `data:` URLs (OpenAI `image_url` parts, Anthropic base64
`image` blocks, Ollama `images`). Here they are counted, decoded and sized, so that a bad image
is a 400 in the caller's own format and never reaches a runner. `http(s)` URLs are refused
unless the operator sets `EXO_FETCH_IMAGE_URLS=1`: nodes may not reach the internet, and a node
that fetches URLs for its callers can be made to reach hosts they cannot (its LAN). With the
setting, the API node fetches each URL once and inlines it as a data URL.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:  # httpx (and, through its CLI, rich) only when a URL is fetched
    import httpx

from exo_core.generation import ChatMessage, GenerationParams

_DATA_URL = re.compile(r"data:(image/[A-Za-z0-9.+-]+)?(;[^,]*)?,", re.ASCII)
# The formats a runner can decode (Pillow), by their first bytes.
_MAGIC = {
    b"\x89PNG\r\n\x1a\n": "png",
    b"\xff\xd8\xff": "jpeg",
    b"GIF87a": "gif",
    b"GIF89a": "gif",
    b"BM": "bmp",
}


class ImageInputError(ValueError):
    """The request's images are refused (the message says why)."""


@dataclass(frozen=True)
class ImageLimits:
    max_images: int = 8  # per request
    max_bytes: int = 20 * 1024 * 1024  # per image, decoded

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ImageLimits:
        env = os.environ if env is None else env
        d = cls()
        return cls(
            max_images=int(env.get("EXO_MAX_IMAGES_PER_REQUEST", d.max_images)),
            max_bytes=int(env.get("EXO_MAX_IMAGE_BYTES", d.max_bytes)),
        )


FETCH_TIMEOUT_S = 10.0
_MEDIA_TYPES = {"png": "png", "jpeg": "jpeg", "gif": "gif", "bmp": "bmp", "webp": "webp"}


def fetching_allowed(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get("EXO_FETCH_IMAGE_URLS", "0").strip().lower() in ("1", "true", "yes", "on")


def image_format(data: bytes) -> str | None:
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return next((name for magic, name in _MAGIC.items() if data.startswith(magic)), None)


def decode_data_url(url: str, max_bytes: int) -> bytes:
    """The image bytes of a base64 `data:` URL, or `ImageInputError`."""
    if url.startswith(("http://", "https://")):
        raise ImageInputError(
            "image URLs are not fetched (nodes may not reach the internet; an operator may "
            "allow it with EXO_FETCH_IMAGE_URLS=1): send the image inline as a base64 data "
            "URL (data:image/png;base64,...)"
        )
    match = _DATA_URL.match(url)
    if match is None or "base64" not in (match.group(2) or ""):
        raise ImageInputError("an image must be a base64 data URL (data:image/png;base64,...)")
    body = url[match.end() :]
    # base64 grows data by 4/3: refuse a body too long before decoding it.
    if len(body) > (max_bytes // 3 + 1) * 4 + 4:
        raise ImageInputError(f"an image is larger than the limit of {max_bytes} bytes")
    try:
        data = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageInputError(f"an image's base64 data is invalid: {e}") from e
    if len(data) > max_bytes:
        raise ImageInputError(f"an image is larger than the limit of {max_bytes} bytes")
    if image_format(data) is None:
        raise ImageInputError("an image is not a PNG, JPEG, GIF, WebP or BMP file")
    return data


def check_images(params: GenerationParams, limits: ImageLimits | None = None) -> int:
    """The number of images in the request, after checking each; `ImageInputError` if any
    is refused or there are too many."""
    limits = limits or ImageLimits.from_env()
    urls = [
        p.image_url
        for m in params.messages
        if not isinstance(m.content, str)
        for p in m.content
        if p.type == "image"
    ]
    if len(urls) > limits.max_images:
        raise ImageInputError(
            f"the request has {len(urls)} images; at most {limits.max_images} are accepted"
        )
    for url in urls:
        decode_data_url(url, limits.max_bytes)
    return len(urls)


async def _fetch(client: httpx.AsyncClient, url: str, max_bytes: int) -> str:
    """The image at `url` as a data URL, read up to `max_bytes`."""
    import httpx

    try:
        async with client.stream("GET", url) as response:
            if response.status_code != 200:
                raise ImageInputError(f"fetching an image URL answered HTTP {response.status_code}")
            data = b""
            async for piece in response.aiter_bytes():
                data += piece
                if len(data) > max_bytes:
                    raise ImageInputError(f"an image is larger than the limit of {max_bytes} bytes")
    except httpx.HTTPError as e:
        raise ImageInputError(f"an image URL could not be fetched: {e}") from e
    kind = image_format(data)
    if kind is None:
        raise ImageInputError("an image URL is not a PNG, JPEG, GIF, WebP or BMP file")
    return f"data:image/{_MEDIA_TYPES[kind]};base64,{base64.b64encode(data).decode()}"


async def inline_image_urls(
    params: GenerationParams,
    limits: ImageLimits | None = None,
    env: Mapping[str, str] | None = None,
) -> GenerationParams:
    """`params` with its http(s) image URLs fetched and inlined, when the operator allows it
    (`EXO_FETCH_IMAGE_URLS=1`); unchanged otherwise (`check_images` then refuses them)."""
    if not fetching_allowed(env):
        return params
    limits = limits or ImageLimits.from_env(env)
    urls = {
        p.image_url
        for m in params.messages
        if not isinstance(m.content, str)
        for p in m.content
        if p.type == "image" and p.image_url.startswith(("http://", "https://"))
    }
    if not urls:
        return params
    if len(urls) > limits.max_images:
        raise ImageInputError(
            f"the request has {len(urls)} images; at most {limits.max_images} are accepted"
        )
    inlined: dict[str, str] = {}
    import httpx

    async with httpx.AsyncClient(timeout=FETCH_TIMEOUT_S, follow_redirects=True) as client:
        for url in sorted(urls):
            inlined[url] = await _fetch(client, url, limits.max_bytes)

    def message(m: ChatMessage) -> ChatMessage:
        if isinstance(m.content, str):
            return m
        parts = tuple(
            msgspec.structs.replace(p, image_url=inlined[p.image_url])
            if p.type == "image" and p.image_url in inlined
            else p
            for p in m.content
        )
        return msgspec.structs.replace(m, content=parts)

    return msgspec.structs.replace(params, messages=tuple(message(m) for m in params.messages))
