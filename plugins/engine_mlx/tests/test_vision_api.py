"""The tiny vision model served by a real `exo` process, asked about images through the
official openai, anthropic and ollama clients: the same image gives the same greedy answer in
every dialect, another image another answer, and images past the limits are a 400 in the
caller's own format."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import anthropic
import httpx
import ollama
import openai
import pytest

from exo_core.testing.processes import ExoProcess, exo_processes, wait_until

from .test_vision import BLUE, RED, data_url

pytestmark = pytest.mark.slow

MODEL = "tiny-vision"
MAX_TOKENS = 10
QUESTION = "what is in the picture?"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoProcess]:
    from exo_engine_mlx.tiny_vision import write_tiny_vision

    root = tmp_path_factory.mktemp("vision-node")
    write_tiny_vision(root / "node0" / "models" / MODEL, MODEL)
    env = {"EXO_MAX_IMAGES_PER_REQUEST": "2", "EXO_MAX_IMAGE_BYTES": "200000"}
    with exo_processes(root, 1, extra_args=[["--transport", "memory"]], env=env) as (n,):
        wait_until(lambda: MODEL in _models(n.url), timeout=60)
        yield n


def _models(url: str) -> set[str]:
    return {m["id"] for m in httpx.get(f"{url}/v1/models", timeout=5).json()["data"]}


def _b64(url: str) -> str:
    return url.split(",", 1)[1]


def _openai(node: ExoProcess, *images: str, text_first: bool = False) -> str | None:
    client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="-", max_retries=0, timeout=120)
    parts: list[dict[str, object]] = [
        {"type": "image_url", "image_url": {"url": u}} for u in images
    ]
    text = [{"type": "text", "text": QUESTION}]
    content = [*text, *parts] if text_first else [*parts, *text]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": content}],  # type: ignore[list-item]
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    return reply.choices[0].message.content


def _anthropic(node: ExoProcess, *images: str) -> str:
    client = anthropic.Anthropic(base_url=node.url, api_key="-", max_retries=0, timeout=120)
    blocks: list[dict[str, object]] = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _b64(u)}}
        for u in images
    ]
    reply = client.messages.create(
        model=MODEL,
        max_tokens=MAX_TOKENS,
        extra_body={"temperature": 0},  # this client version has no argument for it
        messages=[{"role": "user", "content": [*blocks, {"type": "text", "text": QUESTION}]}],  # type: ignore[list-item]
    )
    return "".join(b.text for b in reply.content if b.type == "text")


def _ollama(node: ExoProcess, *images: str) -> str:
    client = ollama.Client(host=node.url, timeout=120)
    reply = client.chat(
        model=MODEL,
        messages=[{"role": "user", "content": QUESTION, "images": [_b64(u) for u in images]}],
        options={"num_predict": MAX_TOKENS, "temperature": 0},
    )
    return reply.message.content or ""


def test_every_dialect_sees_the_image(node: ExoProcess) -> None:
    red = _openai(node, RED)
    assert red
    assert _anthropic(node, RED) == red
    # An Ollama message is its text, then its images.
    assert _ollama(node, RED) == _openai(node, RED, text_first=True)
    assert _openai(node, BLUE) != red
    assert _openai(node, RED, BLUE) not in (red, None)


def test_too_many_or_too_large_images_are_a_400_in_each_format(node: ExoProcess) -> None:
    three = (RED, BLUE, RED)
    with pytest.raises(openai.BadRequestError, match="at most 2"):
        _openai(node, *three)
    with pytest.raises(anthropic.BadRequestError, match="at most 2"):
        _anthropic(node, *three)
    with pytest.raises(ollama.ResponseError, match="at most 2") as e:
        _ollama(node, *three)
    assert e.value.status_code == 400
    large = data_url(size=(400, 400))  # noise does not compress: ~480 kB
    with pytest.raises(openai.BadRequestError, match="larger than the limit"):
        _openai(node, large)
    with pytest.raises(openai.BadRequestError, match="base64 data URL"):
        _openai(node, "https://example.com/cat.png")
    not_png = "data:image/png;base64," + base64.b64encode(b"hello").decode()
    with pytest.raises(anthropic.BadRequestError, match="not a PNG"):
        _anthropic(node, not_png)
    assert _openai(node, RED)  # and the node still answers


def test_a_text_model_refuses_images(node: ExoProcess) -> None:
    client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="-", max_retries=0, timeout=120)
    with pytest.raises(openai.BadRequestError, match="does not accept images"):
        client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": RED}}]}
            ],
            max_tokens=2,
        )
