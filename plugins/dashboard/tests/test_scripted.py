"""The page in headless Chromium against an in-process node with the scripted engine: thinking
is shown collapsed, conversations switch, a model that fits nowhere is refused in words, and
the images view shows partial images, the final one, and cancels. The image route here is a
stand-in that speaks OpenAI's streaming shape (the image engine is its own plugin)."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from collections.abc import AsyncIterator, Iterator

import anyio
import httpx
import pytest
from litestar import post
from litestar.response import Stream
from playwright.sync_api import expect

import exo_api_openai.plugin as openai_plugin
import exo_dashboard.plugin as dashboard_plugin
from exo_core.hookspecs import hookimpl
from exo_core.ids import ModelId
from exo_core.model_cards import ModelCard, ModelTask
from exo_core.testing.harness import RunningNode, running_node
from exo_core.testing.scripted_engine import ScriptedEnginePlugin

from .conftest import OpenPage

IMAGE_MODEL = "scripted-painter"
HUGE_MODEL = "scripted-huge"


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A valid one-colour PNG, written by hand (no imaging library needed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def _event(kind: str, **fields: object) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()


@post("/v1/images/generations")
async def images_stand_in(data: dict[str, object]) -> Stream:
    """Two partial images, then the final one; a prompt with "slow" never finishes."""

    async def frames() -> AsyncIterator[bytes]:
        for index, colour in enumerate([(60, 60, 90), (120, 120, 160)]):
            b64 = base64.b64encode(png(32, 32, colour)).decode()
            yield _event("image_generation.partial_image", b64_json=b64, partial_image_index=index)
            await anyio.sleep(0.4)
        if "slow" in str(data.get("prompt")):
            await anyio.sleep(120)
        final = base64.b64encode(png(64, 64, (250, 204, 21))).decode()
        yield _event("image_generation.completed", b64_json=final)

    return Stream(frames(), media_type="text/event-stream")


class StandIns:
    @hookimpl
    def exo_routes(self) -> list[object]:
        return [images_stand_in]

    @hookimpl
    def exo_model_cards(self) -> list[ModelCard]:
        common = {"family": "scripted", "n_layers": 4, "hidden_size": 64}
        return [
            ModelCard(
                model_id=ModelId(IMAGE_MODEL),
                storage_size_bytes=1_000_000,
                tasks=(ModelTask.IMAGE_GENERATION,),
                source="scripted:painter",
                **common,  # type: ignore[arg-type]
            ),
            ModelCard(
                model_id=ModelId(HUGE_MODEL),
                storage_size_bytes=1 << 50,
                source="scripted:huge",
                **common,  # type: ignore[arg-type]
            ),
        ]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    plugins = [dashboard_plugin, openai_plugin, ScriptedEnginePlugin(delay_s=0.05), StandIns()]
    with running_node(tmp_path_factory.mktemp("scripted"), plugins) as node:
        yield node


def test_thinking_is_collapsed_and_conversations_switch(
    node: RunningNode, open_page: OpenPage
) -> None:
    watched = open_page(node.url)
    page = watched.page
    page.goto(f"{node.url}/#chat")
    page.select_option("#chat-model", "scripted-thinker")
    page.fill("#prompt", "hello **there**")
    page.keyboard.press("Enter")
    reply = page.locator(".message.assistant").last
    expect(reply.locator(".stats-line")).to_contain_text("out", timeout=30_000)
    expect(reply.locator(".markdown strong")).to_have_text("there")
    thinking = reply.locator("details.thinking")
    expect(thinking).not_to_have_attribute("open", "")
    expect(thinking.locator("summary")).to_have_text("Thought")
    thinking.locator("summary").click()
    expect(thinking.locator(".thinking-text")).to_have_text("pondering")

    page.get_by_role("button", name="New chat").click()
    page.select_option("#chat-model", "scripted-echo")
    page.fill("#prompt", "second")
    page.keyboard.press("Enter")
    expect(page.locator(".message.assistant .markdown").last).to_have_text("echo: second")
    page.get_by_role("button", name="Open chat hello **there**").click()
    expect(page.locator(".message.user .bubble")).to_have_text(["hello **there**"])
    expect(page.locator("#chat-model")).to_have_value("scripted-thinker")
    # Kept in the browser: a reload shows both conversations.
    page.reload()
    expect(page.locator("#conversation-list li")).to_have_count(2)
    watched.assert_clean()


def test_a_model_that_fits_nowhere_is_refused_in_words(
    node: RunningNode, open_page: OpenPage
) -> None:
    watched = open_page(node.url)
    page = watched.page
    page.goto(f"{node.url}/#models")
    page.locator(f'.model-item[data-model-id="{HUGE_MODEL}"]').click()
    refused = page.locator("#model-detail .refused")
    expect(refused).to_contain_text("It does not fit:")
    expect(page.locator("#model-detail .preview")).to_have_count(0)
    page.select_option("#model-kind", "image")
    expect(page.locator(".model-item")).to_have_count(1)
    expect(page.locator(".model-item .badge.kind-image")).to_have_text("image")
    watched.assert_clean()


def test_images_stream_partials_then_the_final_one_and_cancel(
    node: RunningNode, open_page: OpenPage
) -> None:
    watched = open_page(node.url)
    page = watched.page
    page.goto(node.url)
    tab = page.locator('.tabs a[data-view="images"]')
    expect(page.locator(".node-card")).to_have_count(1)
    expect(tab).to_be_hidden()
    answer = httpx.post(f"{node.url}/instance", json={"model_id": IMAGE_MODEL})
    assert answer.status_code == 201, answer.text
    expect(tab).to_be_visible(timeout=30_000)
    tab.click()
    expect(page.locator("#image-model")).to_have_value(IMAGE_MODEL)
    page.fill("#image-prompt", "a yellow square")
    page.get_by_role("button", name="Generate").click()
    expect(page.locator("#image-out img")).to_have_attribute("alt", "partial image 0")
    expect(page.locator("#image-out img")).to_have_attribute("alt", "a yellow square")
    expect(page.locator("#image-status")).to_contain_text("Done in")
    width = page.locator("#image-out img").evaluate("img => img.naturalWidth")
    assert width == 64

    page.fill("#image-prompt", "slow")
    page.get_by_role("button", name="Generate").click()
    expect(page.locator("#image-status")).to_contain_text("Partial image")
    page.get_by_role("button", name="Cancel").click()
    expect(page.locator("#image-status")).to_have_text("Cancelled")
    expect(page.get_by_role("button", name="Generate")).to_be_visible()
    watched.assert_clean()
