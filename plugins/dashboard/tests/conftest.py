"""Fixtures of the dashboard tests: one headless Chromium (Debian's, driven by Playwright) for
the whole session, pages that record console errors and requests to other hosts, and
screenshots under `artifacts/dashboard/` (gitignored)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Request, sync_playwright

import exo_dashboard.plugin as dashboard_plugin
from exo_core.testing.harness import RunningNode, running_node
from exo_core.testing.scripted_engine import ScriptedEnginePlugin

from .support import StandIns

ARTIFACTS = Path(__file__).resolve().parents[3] / "artifacts" / "dashboard"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


@dataclass
class WatchedPage:
    """A page that keeps what went wrong: console errors, uncaught errors, foreign requests."""

    page: Page
    origin: str
    errors: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)

    def on_console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(f"console: {message.text} ({message.location})")

    def on_request(self, request: Request) -> None:
        url = request.url
        if not (url.startswith(self.origin) or url.startswith(("data:", "blob:"))):
            self.foreign.append(url)

    def assert_clean(self) -> None:
        assert not self.errors, self.errors
        assert not self.foreign, f"requests to other hosts: {self.foreign}"

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path))
        return path


@pytest.fixture(scope="session")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    """One in-process node for the quick tests: the dashboard, the scripted engine, and the
    stand-ins (the OpenAI API with a stand-in image route, and two more cards). A prompt over
    50 words reports its prefill progress first."""
    plugins = [dashboard_plugin, ScriptedEnginePlugin(delay_s=0.05, prefill_step=50), StandIns()]
    # dialects=False: the stand-ins replace the installed OpenAI dialect (same routes).
    with running_node(tmp_path_factory.mktemp("dashboard"), plugins, dialects=False) as node:
        yield node


# Module scope, not session: Playwright's sync API keeps an event loop running in the main
# thread until it stops, which would break every later test that runs a loop of its own.
@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("chromium is missing: scripts/ensure-browser.sh installs it (apt)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable)
        yield browser
        browser.close()


OpenPage = Callable[..., WatchedPage]


def open_chat(open_page: OpenPage, url: str, model: str) -> WatchedPage:
    """A watched page on the chat view of the node at `url`, with `model` picked."""
    watched = open_page(url)
    watched.page.goto(f"{url}/#chat")
    watched.page.select_option("#chat-model", model)
    return watched


@pytest.fixture
def open_page(browser: Browser) -> Iterator[OpenPage]:
    """open_page(origin, viewport=DESKTOP) -> WatchedPage, each in a fresh browser context."""
    contexts = []

    def open_(origin: str, viewport: dict[str, int] | None = None) -> WatchedPage:
        context = browser.new_context(viewport=viewport or DESKTOP)  # type: ignore[arg-type]
        context.set_default_timeout(15_000)
        contexts.append(context)
        page = context.new_page()
        watched = WatchedPage(page=page, origin=origin)
        page.on("console", watched.on_console)
        page.on("pageerror", lambda error: watched.errors.append(f"page error: {error}"))
        page.on("request", watched.on_request)
        page.on("dialog", lambda dialog: dialog.accept())
        return watched

    yield open_
    for context in contexts:
        context.close()
