"""The checks on a chat request's images (exo_core.image_inputs): what is refused, and why."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anyio
import pytest

from exo_core.generation import ChatMessage, ContentPart, GenerationParams
from exo_core.image_inputs import (
    ImageInputError,
    ImageLimits,
    check_images,
    decode_data_url,
    inline_image_urls,
)

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


@pytest.fixture
def image_server() -> Iterator[str]:
    """A local HTTP server: /a.png (an image), /t.txt (text), /big.png (past the limit)."""
    bodies = {"/a.png": PNG, "/t.txt": b"hello", "/big.png": PNG + bytes(5000)}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = bodies.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _inline(p: GenerationParams, env: dict[str, str]) -> GenerationParams:
    return anyio.run(inline_image_urls, p, ImageLimits(max_bytes=1000), env)


def test_image_urls_are_fetched_only_when_the_operator_allows_it(image_server: str) -> None:
    asked = params(f"{image_server}/a.png", url(PNG))
    assert _inline(asked, {}) == asked  # unchanged: check_images then refuses the URL
    with pytest.raises(ImageInputError, match="EXO_FETCH_IMAGE_URLS"):
        check_images(asked)
    inlined = _inline(asked, {"EXO_FETCH_IMAGE_URLS": "1"})
    assert check_images(inlined) == 2
    parts = [p for m in inlined.messages for p in m.content if not isinstance(p, str)]
    assert [p.image_url for p in parts] == [url(PNG), url(PNG)]


@pytest.mark.parametrize(
    ("path", "words"),
    [("/t.txt", "not a PNG"), ("/big.png", "larger than the limit"), ("/none.png", "HTTP 404")],
)
def test_a_fetched_url_that_is_no_image_is_refused(
    image_server: str, path: str, words: str
) -> None:
    with pytest.raises(ImageInputError, match=words):
        _inline(params(f"{image_server}{path}"), {"EXO_FETCH_IMAGE_URLS": "1"})
