"""exo's `POST /place_instance` body places a real instance on a real `exo` process (the MLX
engine, SmolLM2): its runner comes up ready and answers a chat; exo's `/instance/placement`
refuses a listed model whose architecture the engine lacks, saying why."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from exo_core.testing.processes import exo_processes, runners_ready, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.smollm]

MODEL = "SmolLM2-135M-Instruct"


def test_exos_place_instance_body_places_smollm2(tmp_path: Path) -> None:
    with exo_processes(tmp_path, 1) as (node,):
        wait_until(lambda: node.get("/healthz")["master"] is not None, timeout=60)
        body = {
            "model_id": MODEL,
            "sharding": "Pipeline",
            "instance_meta": "MlxRing",
            "min_nodes": 1,
        }
        placed = httpx.post(f"{node.url}/place_instance", json=body, timeout=60)
        assert placed.status_code == 200, placed.text
        created = placed.json()
        assert created["message"] == "Command received." and created["command_id"]
        assert created["model_card"]["modelId"] == MODEL
        instance_id = created["instance_id"]
        wait_until(lambda: runners_ready(node, instance_id), timeout=180)
        ready = httpx.get(f"{node.url}/instance/await", params={"model_id": MODEL}, timeout=10)
        assert '"type":"ready"' in ready.text and instance_id in ready.text
        client = OpenAI(base_url=f"{node.url}/v1", api_key="none", timeout=120)
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=4
        )
        assert reply.choices[0].message.content is not None
        assert httpx.head(f"{node.url}/ollama/", timeout=10).status_code == 200  # exo's probe
        # Listed (exo's catalogue) but not runnable here: refused before any download.
        refused = httpx.get(
            f"{node.url}/instance/placement",
            params={"model_id": "mlx-community/DeepSeek-V4-Flash"},
            timeout=30,
        )
        assert refused.status_code == 400
        assert "deepseek_v4: mlx-lm cannot load it" in refused.json()["detail"]
        assert (
            not node.get("/state")["downloads"]
            .get(node.get("/node_id")["node_id"], {})
            .get("mlx-community/DeepSeek-V4-Flash")
        )
