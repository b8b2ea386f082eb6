"""Images: an image generation request and its sizes and formats, and images sent inside a
chat (data URLs)."""

from __future__ import annotations

from exo_core.image_inputs import ImageInputError, decode_data_url
from exo_core.images import ImageFormat, ImageRequest, InvalidImageRequest, parse_size

__all__ = [
    "ImageFormat",
    "ImageInputError",
    "ImageRequest",
    "InvalidImageRequest",
    "decode_data_url",
    "parse_size",
]
