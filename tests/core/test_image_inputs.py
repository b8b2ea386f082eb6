"""The checks on a chat request's images (exo_core.image_inputs): what is refused, and why."""

from __future__ import annotations

import base64

import pytest

from exo_core.generation import ChatMessage, ContentPart, GenerationParams
from exo_core.image_inputs import ImageInputError, ImageLimits, check_images, decode_data_url

PNG = b"\x89PNG\r\n\x1a\n" + bytes(100)


def url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def params(*urls: str) -> GenerationParams:
    parts = tuple(ContentPart(type="image", image_url=u) for u in urls)
    return GenerationParams(messages=(ChatMessage(role="user", content=parts),))


def test_a_png_data_url_is_decoded() -> None:
    assert decode_data_url(url(PNG), 1000) == PNG
    assert check_images(params(url(PNG), url(PNG)), ImageLimits(max_images=2)) == 2


@pytest.mark.parametrize(
    ("image", "words"),
    [
        ("https://example.com/a.png", "not fetched"),
        ("data:image/png,rawbytes", "base64 data URL"),
        ("file:///etc/passwd", "base64 data URL"),
        ("data:image/png;base64,@@@@", "invalid"),
        (url(b"plain text"), "not a PNG"),
        (url(PNG + bytes(2000)), "larger than the limit"),
        ("data:image/png;base64," + "A" * 10_000, "larger than the limit"),
    ],
)
def test_a_bad_image_is_refused_with_words(image: str, words: str) -> None:
    with pytest.raises(ImageInputError, match=words):
        check_images(params(image), ImageLimits(max_bytes=1000))


def test_too_many_images_are_refused() -> None:
    with pytest.raises(ImageInputError, match="at most 1"):
        check_images(params(url(PNG), url(PNG)), ImageLimits(max_images=1))


def test_limits_come_from_the_environment() -> None:
    limits = ImageLimits.from_env({"EXO_MAX_IMAGES_PER_REQUEST": "3", "EXO_MAX_IMAGE_BYTES": "9"})
    assert limits == ImageLimits(max_images=3, max_bytes=9)
