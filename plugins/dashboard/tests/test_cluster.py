"""The dashboard against real `exo` processes on loopback, in headless Chromium.

Three nodes (so that a majority remains when one dies): the view shows them and the master,
launching SmolLM2 from the page places an instance whose runner turns ready in the page, a chat
streams and Stop cancels it (its task leaves the cluster state), `?q=` sends a message, and a
killed node leaves the view. Screenshots (desktop and phone) go to artifacts/dashboard/.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from exo_core.testing.processes import ExoProcess, exo_processes, wait_until

from .conftest import PHONE, OpenPage

pytestmark = [pytest.mark.slow, pytest.mark.smollm]

SMOLLM = "SmolLM2-135M-Instruct"
LONG_PROMPT = "Write a very long story about a dragon who learns to cook, with many chapters."


def _links(state: dict[str, Any]) -> int:
    pairs = {
        tuple(sorted((a, b)))
        for a, peers in state["topology"].items()
        for b in peers
        if a in state["nodes"] and b in state["nodes"] and a != b
    }
    return len(pairs)


def _launch_from_the_page(page: Page, url: str) -> None:
    page.goto(f"{url}/#models")
    page.locator(f'.model-item[data-model-id="{SMOLLM}"]').click()
    launch = page.locator(".preview").first.get_by_role("button", name="Launch")
    expect(launch).to_be_visible()
    launch.click()
    expect(page).to_have_url(f"{url}/#cluster")


def _stop_a_long_reply(page: Page, node: ExoProcess) -> None:
    page.fill("#prompt", LONG_PROMPT)
    page.keyboard.press("Enter")
    reply = page.locator(".message.assistant .markdown").last
    expect(reply).not_to_have_text("", timeout=60_000)
    # The generation is a task in the replicated state while it runs...
    wait_until(lambda: len(node.state()["tasks"]) == 1, timeout=10)
    before = len(reply.inner_text())
    page.get_by_role("button", name="Stop").click()
    expect(page.locator(".message.assistant .stats-line").last).to_contain_text("stopped")
    # ...and leaves it once stopped; the reply stops growing.
    wait_until(lambda: node.state()["tasks"] == {}, timeout=15)
    after = len(reply.inner_text())
    page.wait_for_timeout(1000)
    assert len(reply.inner_text()) == after >= before
    expect(page.get_by_role("button", name="Send")).to_be_visible()


def test_a_cluster_launch_chat_stop_and_a_node_leaving(tmp_path: Path, open_page: OpenPage) -> None:
    with exo_processes(tmp_path, 3) as (first, _second, third):
        wait_until(lambda: len(first.state()["nodes"]) == 3 and _links(first.state()) >= 2, 90)
        state = first.state()
        master = state["master"]["node_id"]

        watched = open_page(first.url)
        page = watched.page
        page.goto(first.url)
        cards = page.locator(".node-card")
        expect(cards).to_have_count(3)
        expect(page.locator(f'.node-card[data-node-id="{master}"] .badge.master')).to_have_text(
            f"master · term {state['master']['term']}"
        )
        expect(
            page.locator(
                f'.node-card[data-node-id="{first.get("/node_id")["node_id"]}"] .badge.self'
            )
        ).to_be_visible()
        # The topology may still grow (a link found after `state` was read): the page follows
        # the live state, so compare it with the state of the moment.
        lines = page.locator("#topology line")
        wait_until(lambda: lines.count() == _links(first.state()) >= 2, 20)
        expect(page.locator("#conn")).to_have_attribute("data-state", "up")

        _launch_from_the_page(page, first.url)
        instance = page.locator(".instance")
        expect(instance).to_have_count(1)
        expect(instance.locator("h3")).to_have_text(SMOLLM)
        expect(instance).to_have_attribute("data-ready", "true", timeout=240_000)
        expect(instance.locator("tbody tr").first).to_have_attribute("data-status", "ready")
        watched.screenshot("cluster-desktop")

        page.goto(f"{first.url}/#chat")
        expect(page.locator("#chat-model")).to_have_value(SMOLLM)
        expect(page.locator("#chat-model-note")).to_have_text("ready")
        _stop_a_long_reply(page, first)

        # `?q=` starts a new chat with that message; a short limit lets the reply finish.
        page.fill("#chat-max-tokens", "24")
        page.locator("#chat-max-tokens").dispatch_event("change")
        page.goto(f"{first.url}/?q=What+is+the+capital+of+France%3F")
        expect(page.locator(".message.user .bubble").last).to_have_text(
            "What is the capital of France?"
        )
        stats = page.locator(".message.assistant .stats-line").last
        expect(stats).to_contain_text("tok/s", timeout=60_000)
        expect(stats).to_contain_text("out")
        assert "?q=" not in page.url
        expect(page.locator("#conversation-list li")).to_have_count(2)
        watched.screenshot("chat-desktop")

        phone = open_page(first.url, PHONE)
        phone.page.goto(first.url)
        expect(phone.page.locator(".node-card")).to_have_count(3)
        phone.screenshot("cluster-phone")
        phone.page.goto(f"{first.url}/#chat")
        phone.screenshot("chat-phone")
        phone.assert_clean()

        # A node dies: the master times it out and it leaves the view.
        third_id = third.get("/node_id")["node_id"]
        third.kill(signal.SIGKILL)
        gone = page.locator(f'.node-card[data-node-id="{third_id}"]')
        expect(gone).to_have_count(0, timeout=90_000)
        expect(cards).to_have_count(2)
        watched.assert_clean()
