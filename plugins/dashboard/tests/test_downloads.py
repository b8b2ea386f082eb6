"""The dashboard against a real `exo` process fetching from the stand-in hub: a model found by
hub search is added and launched from the page, its download's progress bar moves (with speed
and ETA), the runner's failure is shown in words, and the download can be deleted. Then the
node dies and comes back: the page says so, and recovers."""

from __future__ import annotations

import json
import random
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from exo_core.testing.processes import ExoProcess, exo_processes, wait_until
from exo_download_hf.testing import HubStandIn

from .conftest import OpenPage

pytestmark = [pytest.mark.slow]

TINY = "org/tiny-dashboard"
WEIGHTS = 1_500_000


def tiny_repo() -> dict[str, bytes]:
    """A small llama-shaped MLX repo whose weights are noise (loading it fails, on purpose)."""
    config = {
        "model_type": "llama",
        "num_hidden_layers": 4,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 128,
    }
    return {
        "config.json": json.dumps(config).encode(),
        "tokenizer.json": b'{"model": {"type": "BPE"}}',
        "tokenizer_config.json": b'{"chat_template": "{{ messages }}"}',
        "model.safetensors": random.Random(0).randbytes(WEIGHTS),
    }


@pytest.fixture
def node(tmp_path: Path) -> Iterator[ExoProcess]:
    with HubStandIn() as hub:
        hub.add_repo(TINY, tiny_repo(), downloads=7)
        # About ten seconds for the weights: long enough to watch the bar move.
        hub.throttle_bytes_per_s = 150_000
        env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "", "EXO_MODELS_READ_ONLY_DIRS": ""}
        with exo_processes(tmp_path, 1, env=env) as (node,):
            wait_until(lambda: node.get("/healthz")["master"] is not None, timeout=60)
            yield node


def _progress_values(page: object, seen: set[int]) -> bool:
    bar = page.locator(f'.download[data-model-id="{TINY}"] [role="progressbar"]')  # type: ignore[attr-defined]
    if bar.count():
        seen.add(int(bar.get_attribute("aria-valuenow") or 0))
    return len({v for v in seen if 0 < v < 100}) >= 2


def test_a_download_moves_and_the_page_follows_its_node(
    node: ExoProcess, open_page: OpenPage
) -> None:
    watched = open_page(node.url)
    page = watched.page
    page.goto(f"{node.url}/#models")
    page.locator("details.hub summary").click()
    page.fill("#hub-query", "tiny")
    page.keyboard.press("Enter")
    page.get_by_role("button", name=f"Add {TINY}").click()
    expect(page.locator("#model-detail h2")).to_have_text(TINY)
    page.locator(".preview").first.get_by_role("button", name="Launch").click()

    row = page.locator(f'.download[data-model-id="{TINY}"]')
    expect(row).to_contain_text("/s · ETA", timeout=30_000)
    seen: set[int] = set()
    wait_until(lambda: _progress_values(page, seen), timeout=30, interval=0.3)
    watched.screenshot("download-desktop")
    expect(row).to_have_attribute("data-status", "completed", timeout=60_000)
    # The weights are noise: the runner fails, and the page says why.
    failed = page.locator('.instance tbody tr[data-status="failed"] .error-text')
    expect(failed).not_to_have_text("", timeout=120_000)

    page.locator(".instance").get_by_role("button", name=f"Delete instance of {TINY}").click()
    expect(page.locator(".instance")).to_have_count(0)
    row.get_by_role("button", name=f"Delete {TINY}", exact=False).click()
    expect(row).to_have_count(0)
    watched.assert_clean()

    # The node goes away: a banner says so; it comes back: the banner goes and the view is live.
    node.kill(signal.SIGKILL)
    expect(page.locator("#banner")).to_contain_text("Cannot reach", timeout=15_000)
    expect(page.locator("#conn")).to_have_attribute("data-state", "down")
    node.start()
    expect(page.locator("#banner")).to_be_hidden(timeout=60_000)
    expect(page.locator("#conn")).to_have_attribute("data-state", "up")
    expect(page.locator(".node-card")).to_have_count(1)
    # While the node was down, the browser logged the broken and refused connections, and only
    # those.
    network = "console: Failed to load resource: net::ERR_"
    assert all(e.startswith(network) for e in watched.errors), watched.errors
