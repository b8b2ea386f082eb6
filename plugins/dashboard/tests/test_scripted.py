"""The page in headless Chromium against an in-process node with the scripted engine: thinking
is shown collapsed, conversations switch, a model that fits nowhere is refused in words, and
the images view appears with a ready image model, shows partial images, the final one, cancels,
and hides itself again when the model goes."""

from __future__ import annotations

import httpx
from playwright.sync_api import expect

from exo_core.testing.harness import RunningNode
from exo_core.testing.processes import wait_until

from .conftest import OpenPage, open_chat
from .support import HUGE_MODEL, IMAGE_MODEL, RECEIVED


def test_thinking_is_collapsed_and_conversations_switch(
    node: RunningNode, open_page: OpenPage
) -> None:
    watched = open_chat(open_page, node.url, "scripted-thinker")
    page = watched.page
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
    expect(page.locator("#image-status")).to_have_text("Step 1 of 4…")
    expect(page.locator("#image-out img")).to_have_attribute("alt", "partial image 0")
    expect(page.locator("#image-out img")).to_have_attribute("alt", "a yellow square")
    expect(page.locator("#image-status")).to_contain_text("Done in")
    width = page.locator("#image-out img").evaluate("img => img.naturalWidth")
    assert width == 64
    sent = RECEIVED[-1]
    assert sent["stream"] is True and sent["partial_images"] == 2 and sent["size"] == "512x512"
    assert sent["advanced_params"] == {"num_inference_steps": 4}

    page.fill("#image-prompt", "slow")
    page.get_by_role("button", name="Generate").click()
    expect(page.locator("#image-status")).to_contain_text("Partial image")
    page.get_by_role("button", name="Cancel").click()
    expect(page.locator("#image-status")).to_have_text("Cancelled")
    expect(page.get_by_role("button", name="Generate")).to_be_visible()

    # The model goes: the view hides itself and the page falls back to the cluster.
    instances = httpx.get(f"{node.url}/state/instances").json()
    instance = next(i for i, v in instances.items() if v["model_id"] == IMAGE_MODEL)
    assert httpx.delete(f"{node.url}/instance/{instance}").status_code == 200
    expect(tab).to_be_hidden()
    expect(page.locator("#view-cluster")).to_be_visible()
    watched.assert_clean()


def test_the_page_applies_events_as_the_node_does(node: RunningNode, open_page: OpenPage) -> None:
    """Replaying the node's whole log with the page's reducer (store.js) gives the node's state."""
    if not httpx.get(f"{node.url}/state/instances").json():
        assert httpx.post(f"{node.url}/instance", json={"model_id": "scripted-echo"}).is_success
    wait_until(lambda: httpx.get(f"{node.url}/state/runners").json(), timeout=30)
    watched = open_page(node.url)
    page = watched.page
    page.goto(node.url)
    expect(page.locator(".node-card")).to_have_count(1)
    replayed, state, refused = page.evaluate(
        """async () => {
            const { applyEvent } = await import("/static/js/store.js");
            const { readEvents } = await import("/static/js/api.js");
            const state = await (await fetch("/state")).json();
            let replayed = { last_index: -1, master: null, nodes: {}, topology: {},
                model_cards: {}, downloads: {}, instances: {}, runners: {}, tasks: {} };
            const controller = new AbortController();
            const response = await fetch("/events?since=0", { signal: controller.signal });
            await readEvents(response, (message) => {
                if (message.event === "snapshot") {
                    replayed = JSON.parse(message.data);
                    if (replayed.last_index >= state.last_index) controller.abort();
                    return;
                }
                const indexed = JSON.parse(message.data);
                if (indexed.index > state.last_index) return;
                replayed = applyEvent(replayed, indexed);
                if (indexed.index === state.last_index) controller.abort();
            }, controller.signal);
            // A gap or an event the page does not know means: fetch the state again.
            const refused = [
                applyEvent(replayed, { index: replayed.last_index + 2, event: { type: "MasterElected" } }),
                applyEvent(replayed, { index: replayed.last_index + 1, event: { type: "SomethingNew" } }),
            ];
            return [replayed, state, refused];
        }"""
    )
    assert state["instances"] and state["runners"]
    assert replayed == state
    assert refused == [None, None]
    watched.assert_clean()


def test_a_long_prompt_shows_its_prefill_progress_before_the_answer(
    node: RunningNode, open_page: OpenPage
) -> None:
    watched = open_chat(open_page, node.url, "scripted-echo")
    page = watched.page
    # Every state of the reply, as the page draws it: the progress shows only for moments.
    page.evaluate(
        """() => {
        window.seen = [];
        new MutationObserver(() => {
          const reply = document.querySelector(".message.assistant:last-child");
          const prefill = reply?.querySelector(".prefill");
          const text = reply?.querySelector(".markdown")?.textContent ?? "";
          window.seen.push(prefill ? "prefill " + prefill.textContent : text ? "text" : "");
        }).observe(document.getElementById("messages"), { childList: true, subtree: true });
      }"""
    )
    words = 220  # the scripted engine prefills 50 words a step
    page.fill("#prompt", " ".join(["word"] * words))
    page.keyboard.press("Enter")
    reply = page.locator(".message.assistant").last
    expect(reply.locator(".stats-line")).to_contain_text("out", timeout=30_000)
    seen: list[str] = [s for s in page.evaluate("window.seen") if s]
    progress = [s for s in seen if s.startswith("prefill")]
    # Each step's count, rising; the page may draw its first one after the first step's event.
    steps = [f"prefill Reading the prompt: {n} / {words} tokens" for n in range(50, words, 50)]
    assert progress and all(p in steps for p in progress), seen
    assert [steps.index(p) for p in progress] == sorted(steps.index(p) for p in progress), seen
    assert seen.index(progress[-1]) < seen.index("text")  # before the answer, then gone
    expect(reply.locator(".prefill")).to_have_count(0)
    watched.assert_clean()


def test_what_is_typed_while_a_reply_streams_waits_in_the_box(
    node: RunningNode, open_page: OpenPage
) -> None:
    watched = open_chat(open_page, node.url, "scripted-echo")
    page = watched.page
    page.fill("#prompt", " ".join(["word"] * 60))  # echoed a word each 0.05 s: ~3 s
    page.keyboard.press("Enter")
    expect(page.locator("#stop")).to_be_visible()
    page.fill("#prompt", "next question")
    page.keyboard.press("Enter")  # still streaming: not sent, and not thrown away
    expect(page.locator("#prompt")).to_have_value("next question")
    expect(page.locator(".message.user")).to_have_count(1)
    expect(page.locator("#send")).to_be_visible(timeout=30_000)
    page.keyboard.press("Enter")
    expect(page.locator(".message.user")).to_have_count(2)
    expect(page.locator(".message.user").last).to_contain_text("next question")
    watched.assert_clean()


def test_each_instance_shows_where_its_prompts_go(node: RunningNode, open_page: OpenPage) -> None:
    """Issue 25: the operator sees which nodes read the prompts sent to a model (and a pin)."""
    for instance_id in httpx.get(f"{node.url}/state/instances").json():
        httpx.delete(f"{node.url}/instance/{instance_id}")
    placed = httpx.post(
        f"{node.url}/instance", json={"model_id": "scripted-echo", "nodes": [node.node_id]}
    )
    assert placed.is_success, placed.text
    watched = open_page(node.url)
    page = watched.page
    page.goto(f"{node.url}/#cluster")
    prompts = page.locator(".instance .prompts")
    expect(prompts).to_have_attribute("data-nodes", node.node_id)
    expect(prompts).to_contain_text("Prompts go to")
    expect(prompts).to_contain_text("pinned to")
    watched.assert_clean()
