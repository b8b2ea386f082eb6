"""A custom model added on one node appears on another, over the real libp2p transport."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from exo_core.testing.processes import exo_processes, wait_until
from exo_download_hf.testing import TINY, HubStandIn

pytestmark = pytest.mark.slow


def model_ids(url: str) -> set[str]:
    return {m["model_id"] for m in httpx.get(f"{url}/models", timeout=5).json()["models"]}


def test_custom_card_reaches_the_other_node(hub: HubStandIn, tmp_path: Path) -> None:
    env = {"HF_ENDPOINT": hub.url}
    with exo_processes(tmp_path, 2, env=env) as (a, b):
        wait_until(lambda: all(len(n.state()["nodes"]) == 2 for n in (a, b)), timeout=90)
        added = httpx.post(f"{a.url}/models/add", json={"model_id": TINY}, timeout=30)
        assert added.status_code == 201, added.text
        wait_until(lambda: TINY in model_ids(b.url), timeout=20)
        removed = httpx.delete(f"{b.url}/models/custom/{TINY}", timeout=30)
        assert removed.status_code in (200, 204), removed.text
        wait_until(lambda: TINY not in model_ids(a.url), timeout=20)
