"""The operator's `--exclude-node` list and the API's pin and exclusions reach placement
(docs/security.md, "Pinning and excluding nodes")."""

from __future__ import annotations

from pathlib import Path

import httpx
from openai import APIStatusError, OpenAI

from exo_core.testing.harness import running_node
from exo_core.testing.scripted_engine import ECHO, ScriptedEnginePlugin


def test_placements_honour_the_exclusions_and_the_pin(tmp_path: Path) -> None:
    with running_node(tmp_path, [ScriptedEnginePlugin()]) as node:
        me = node.node_id
        # The API: exclude this node, or pin another one: nothing is allowed.
        for body in ({"exclude_nodes": [me]}, {"nodes": ["node-elsewhere"]}):
            placed = httpx.post(f"{node.url}/instance", json={"model_id": ECHO.model_id, **body})
            assert placed.status_code == 409, placed.text
            assert "no node is allowed" in placed.json()["detail"]
        # The operator's list (`--exclude-node`) applies to the API and to auto-placement.
        node.node.config.exclude_nodes = [me]
        placed = httpx.post(f"{node.url}/instance", json={"model_id": ECHO.model_id})
        assert placed.status_code == 409, placed.text
        client = OpenAI(base_url=f"{node.url}/v1", api_key="none", max_retries=0)
        try:
            client.chat.completions.create(
                model=ECHO.model_id, messages=[{"role": "user", "content": "hi"}]
            )
            raise AssertionError("an excluded node was given the model")
        except APIStatusError as e:
            assert "no node is allowed" in str(e.body), e.body
        assert httpx.get(f"{node.url}/state/instances").json() == {}
        node.node.config.exclude_nodes = []
        pinned = httpx.post(f"{node.url}/instance", json={"model_id": ECHO.model_id, "nodes": [me]})
        assert pinned.status_code == 201, pinned.text
        instance = httpx.get(f"{node.url}/state/instances").json()[pinned.json()["instance_id"]]
        assert instance["nodes"] == [me]
