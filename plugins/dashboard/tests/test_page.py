"""The page in headless Chromium against an in-process node: model output stays text, the page
is usable by keyboard and at phone width, and it asks for nothing from other hosts."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import expect

import exo_dashboard.plugin as dashboard_plugin
from exo_core.plugin import NodeConfig
from exo_core.testing.harness import RunningNode, running_node

from .conftest import PHONE, OpenPage
from .firefox import firefox, firefox_path

HOSTILE = """# Title
<img src=x onerror="window.__pwned = 1">
**bold <script>window.__pwned = 2</script>** and `<b>code</b>`
[click](javascript:window.__pwned=3) [ok](https://example.org/a?b=1)

```html
<iframe src="https://example.org"></iframe>
```

- one
- two
"""


def test_markdown_from_a_model_never_becomes_html(node: RunningNode, open_page: OpenPage) -> None:
    watched = open_page(node.url)
    page = watched.page
    page.goto(node.url)
    counts = page.evaluate(
        """async (source) => {
            const { renderMarkdown } = await import("/static/js/markdown.js");
            const box = document.createElement("div");
            box.append(renderMarkdown(source));
            document.body.append(box);
            await new Promise((r) => setTimeout(r, 200));
            return {
                img: box.querySelectorAll("img").length,
                script: box.querySelectorAll("script").length,
                iframe: box.querySelectorAll("iframe").length,
                b: box.querySelectorAll("b").length,
                links: [...box.querySelectorAll("a")].map((a) => a.href),
                code: box.querySelector("pre code").textContent,
                strong: box.querySelector("strong").textContent,
                items: box.querySelectorAll("li").length,
                heading: box.querySelector("h3").textContent,
                pwned: window.__pwned ?? null,
            };
        }""",
        HOSTILE,
    )
    assert counts["img"] == counts["script"] == counts["iframe"] == counts["b"] == 0
    assert counts["pwned"] is None
    assert counts["links"] == ["https://example.org/a?b=1"]
    assert counts["code"] == '<iframe src="https://example.org"></iframe>'
    assert counts["strong"].startswith("bold <script>")
    assert counts["items"] == 2 and counts["heading"] == "Title"
    watched.assert_clean()


def test_the_views_are_reachable_by_keyboard(node: RunningNode, open_page: OpenPage) -> None:
    watched = open_page(node.url)
    page = watched.page
    page.goto(node.url)
    expect(page.locator(".node-card")).to_have_count(1)
    # Tab from the top: the skip link, then the views.
    labels = []
    for _ in range(4):
        page.keyboard.press("Tab")
        labels.append(page.evaluate("document.activeElement.textContent.trim()"))
    assert labels[:4] == ["Skip to content", "Cluster", "Models", "Chat"], labels
    page.keyboard.press("Enter")
    expect(page.locator("#view-chat")).to_be_visible()
    expect(page.locator("#prompt")).to_be_focused()
    watched.assert_clean()


def test_phone_width_has_no_sideways_scrolling(node: RunningNode, open_page: OpenPage) -> None:
    watched = open_page(node.url, PHONE)
    page = watched.page
    for view in ("cluster", "models", "chat"):
        page.goto(f"{node.url}/#{view}")
        expect(page.locator(f"#view-{view}")).to_be_visible()
        page.wait_for_timeout(300)
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, (view, overflow)
    watched.screenshot("phone-chat-empty")
    watched.assert_clean()


def test_the_page_asks_for_the_api_key_and_sends_it(tmp_path: Path, open_page: OpenPage) -> None:
    if "api_key" not in NodeConfig.__struct_fields__:
        pytest.skip("this core has no API key setting")
    with running_node(tmp_path, [dashboard_plugin], api_key="s3cret") as node:
        watched = open_page(node.url)
        page = watched.page
        page.goto(node.url)
        dialog = page.locator("#key-dialog")
        expect(dialog).to_be_visible()
        # Closed without a key: the banner offers to enter it.
        page.keyboard.press("Escape")
        expect(page.locator("#banner")).to_contain_text("needs an API key")
        expect(page.locator("#conn")).to_have_attribute("data-state", "locked")
        page.get_by_role("button", name="Enter API key").click()
        # A wrong key is asked again; the right one opens the page.
        expect(dialog).to_be_visible()
        page.fill("#key-input", "wrong")
        page.keyboard.press("Enter")
        expect(dialog).to_be_visible(timeout=10_000)
        page.fill("#key-input", "s3cret")
        page.keyboard.press("Enter")
        expect(dialog).to_be_hidden()
        expect(page.locator("#banner")).to_be_hidden()
        expect(page.locator(".node-card")).to_have_count(1)
        expect(page.locator("#conn")).to_have_attribute("data-state", "up")
        # Kept in this browser: a reload asks no more.
        page.reload()
        expect(page.locator(".node-card")).to_have_count(1)
        expect(dialog).to_be_hidden()
        # The only errors are the first, keyless answers (401).
        assert all("401" in e for e in watched.errors), watched.errors
        assert not watched.foreign


@pytest.mark.skipif(firefox_path() is None, reason="Firefox is not installed")
def test_the_page_works_in_firefox(node: RunningNode) -> None:
    with firefox() as browser:
        for width, height in ((1280, 800), (390, 844)):
            browser.open(f"{node.url}/#cluster", width, height)
            assert browser.wait_for("document.querySelectorAll('.node-card').length") == 1
            assert browser.wait_for("document.querySelector('#conn').dataset.state === 'up'")
            overflow = browser.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, (width, overflow)
            browser.open(f"{node.url}/#models", width, height)
            assert browser.wait_for("!document.querySelector('#view-models').hidden")
            assert browser.wait_for("document.querySelectorAll('#model-list li').length") >= 1
        assert browser.errors() == []
