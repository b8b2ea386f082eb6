"""Images in the page, in headless Chromium and in Firefox, against an in-process node with the
scripted engine: images attached to a chat with a vision model (refused in words when they are
no image, removable, sent as OpenAI `image_url` parts, shown in the message), and the image
view's parameters (size, steps, seed, guidance) and edits (an upload, or the last result)."""

from __future__ import annotations

import base64
import json

import httpx
import pytest
from playwright.sync_api import FilePayload, expect

from exo_core.testing.harness import RunningNode

from .conftest import OpenPage, open_chat
from .firefox import firefox, firefox_path
from .support import IMAGE_MODEL, RECEIVED, VISION_MODEL, png

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _file(name: str, data: bytes, mime: str = "image/png") -> FilePayload:
    return {"name": name, "mimeType": mime, "buffer": data}


def test_images_attach_to_a_chat_with_a_vision_model(
    node: RunningNode, open_page: OpenPage
) -> None:
    watched = open_chat(open_page, node.url, "scripted-echo")
    page = watched.page
    expect(page.locator("#attach-button")).to_be_disabled()
    page.select_option("#chat-model", VISION_MODEL)
    expect(page.locator("#attach-button")).to_be_enabled()
    red, blue = png(8, 8, (255, 0, 0)), png(8, 8, (0, 0, 255))
    page.set_input_files(
        "#attach",
        [
            _file("red.png", red),
            _file("notes.txt", b"hello", "text/plain"),
            _file("blue.png", blue),
        ],
    )
    expect(page.locator("#attachments figure")).to_have_count(2)
    expect(page.locator("#attach-note")).to_contain_text("notes.txt: not a PNG")
    page.get_by_role("button", name="Remove image blue.png").click()
    expect(page.locator("#attachments figure")).to_have_count(1)

    page.fill("#prompt", "what is this?")
    with page.expect_request("**/v1/chat/completions") as sent:
        page.keyboard.press("Enter")
    body = json.loads(sent.value.post_data or "{}")
    parts = body["messages"][-1]["content"]
    assert parts[0]["type"] == "image_url"
    assert base64.b64decode(parts[0]["image_url"]["url"].split(",", 1)[1]) == red
    assert parts[1] == {"type": "text", "text": "what is this?"}
    expect(page.locator(".message.assistant .markdown").last).to_have_text("echo: what is this?")
    expect(page.locator(".message.user").last.locator(".thumbs img")).to_have_count(1)
    expect(page.locator("#attachments")).to_be_hidden()
    # The next message carries the image again (it is part of the conversation). The reply's
    # text shows before its stream has ended; Enter sends once the send button is back.
    page.fill("#prompt", "and now?")
    expect(page.locator("#send")).to_be_visible()
    with page.expect_request("**/v1/chat/completions") as again:
        page.keyboard.press("Enter")
    history = json.loads(again.value.post_data or "{}")["messages"]
    assert [type(m["content"]).__name__ for m in history] == ["list", "str", "str"]
    watched.assert_clean()


def test_image_parameters_and_edits(node: RunningNode, open_page: OpenPage) -> None:
    watched = open_page(node.url)
    page = watched.page
    page.goto(node.url)
    answer = httpx.post(f"{node.url}/instance", json={"model_id": IMAGE_MODEL})
    assert answer.status_code == 201, answer.text
    tab = page.locator('.tabs a[data-view="images"]')
    expect(tab).to_be_visible(timeout=30_000)
    tab.click()
    page.select_option("#image-size", "256x256")
    page.fill("#image-steps", "2")
    page.fill("#image-seed", "42")
    page.fill("#image-guidance", "3.5")
    page.fill("#image-prompt", "a yellow square")
    page.get_by_role("button", name="Generate").click()
    expect(page.locator("#image-status")).to_contain_text("Done in")
    sent = RECEIVED[-1]
    assert sent["size"] == "256x256" and sent["prompt"] == "a yellow square"
    assert sent["advanced_params"] == {"num_inference_steps": 2, "seed": 42, "guidance": 3.5}

    # Edit the result: the last image goes up as the form's file.
    page.get_by_role("button", name="Edit this image").click()
    expect(page.locator("#image-source")).to_contain_text("Editing the last result")
    page.fill("#image-prompt", "make it blue")
    page.get_by_role("button", name="Edit", exact=True).click()
    expect(page.locator("#image-status")).to_contain_text("Done in")
    form = RECEIVED[-1]
    assert form["prompt"] == "make it blue" and form["stream"] == "true"
    assert isinstance(form["image"], bytes) and form["image"].startswith(PNG_MAGIC)
    assert json.loads(str(form["advanced_params"])) == {
        "num_inference_steps": 2,
        "seed": 42,
        "guidance": 3.5,
    }

    # Edit an upload.
    upload = png(16, 16, (10, 200, 10))
    page.set_input_files("#image-input", [_file("leaf.png", upload)])
    expect(page.locator("#image-source")).to_contain_text("Editing leaf.png")
    page.get_by_role("button", name="Edit", exact=True).click()
    expect(page.locator("#image-status")).to_contain_text("Done in")
    assert RECEIVED[-1]["image"] == upload
    page.get_by_role("button", name="Generate instead").click()
    expect(page.locator("#image-source")).to_be_hidden()
    expect(page.get_by_role("button", name="Generate")).to_be_visible()

    instances = httpx.get(f"{node.url}/state/instances").json()
    instance = next(i for i, v in instances.items() if v["model_id"] == IMAGE_MODEL)
    assert httpx.delete(f"{node.url}/instance/{instance}").status_code == 200
    expect(tab).to_be_hidden()
    watched.assert_clean()


CHOOSE_IN_FIREFOX = """(() => {
  const select = document.getElementById("chat-model");
  select.value = "%s";
  select.dispatchEvent(new Event("change"));
  return !document.getElementById("attach-button").disabled;
})()"""
ATTACH_IN_FIREFOX = """(async () => {
  const { attachFiles, attachedImages } = await import("/static/js/attachments.js");
  const bytes = Uint8Array.from(atob("%s"), (c) => c.charCodeAt(0));
  await attachFiles([new File([bytes], "dot.png", { type: "image/png" }), new File(["x"], "a.txt", { type: "text/plain" })]);
  const img = document.querySelector("#attachments figure img");
  await img.decode();
  return [document.querySelectorAll("#attachments figure").length, img.naturalWidth,
          attachedImages()[0].startsWith("data:image/png;base64,"),
          document.getElementById("attach-note").textContent,
          document.getElementById("attach-button").disabled];
})()"""


@pytest.mark.skipif(firefox_path() is None, reason="Firefox is not installed")
def test_attachments_and_image_parameters_work_in_firefox(node: RunningNode) -> None:
    dot = base64.b64encode(png(8, 8, (255, 0, 0))).decode()
    with firefox() as browser:
        browser.open(f"{node.url}/#chat", 1280, 800)
        assert browser.wait_for(
            f"document.querySelector('#chat-model option[value=\"{VISION_MODEL}\"]') !== null"
        )
        # The button is offered once the model's card (GET /models) says it reads images.
        assert browser.wait_for(CHOOSE_IN_FIREFOX % VISION_MODEL)
        count, width, is_data_url, note, disabled = browser.evaluate(ATTACH_IN_FIREFOX % dot)
        assert (count, width, is_data_url, disabled) == (1, 8, True, False)
        assert "a.txt: not a PNG" in note
        browser.open(f"{node.url}/#chat", 390, 844)
        overflow = browser.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0
        # The image view's fields (shown with an image model) are there to fill.
        fields = browser.evaluate(
            "['image-seed', 'image-guidance', 'image-steps', 'image-size', 'image-input']"
            ".map((id) => document.getElementById(id)?.tagName)"
        )
        assert fields == ["INPUT", "INPUT", "INPUT", "SELECT", "INPUT"]
        assert browser.errors() == []
