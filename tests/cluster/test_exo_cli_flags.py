"""exo's start-up flags on a real `exo` process: `-m MODEL` places the model with no request,
`--no-batch` serves one request at a time, `--no-downloads` fetches nothing."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from exo_core.testing.processes import ExoProcess, exo_processes, runners_ready, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.smollm]

MODEL = "SmolLM2-135M-Instruct"


def _instances_of(node: ExoProcess, model: str) -> list[str]:
    return [i for i, inst in node.state()["instances"].items() if inst["model_id"] == model]


def _stream_span(client: OpenAI, prompt: str, spans: dict[str, tuple[float, float]]) -> None:
    """When the first and the last token of a streamed answer arrived."""
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=24,
        temperature=0,
        stream=True,
    )
    arrivals = [time.monotonic() for c in stream if c.choices and c.choices[0].delta.content]
    spans[prompt] = (arrivals[0], arrivals[-1])


def _hub_model(node: ExoProcess) -> dict[str, Any]:
    hub = [m for m in node.get("/models")["models"] if str(m.get("source", "")).startswith("hf:")]
    if not hub:
        pytest.skip("no card of a hub model here")
    return min(hub, key=lambda m: m["storage_size_bytes"])


@pytest.mark.timeout(600)
def test_model_flag_places_at_start_and_no_batch_serves_one_at_a_time(tmp_path: Path) -> None:
    flags = ["-m", MODEL, "--no-batch", "--no-downloads"]
    with exo_processes(tmp_path, 1, extra_args=[flags]) as (node,):
        # -m: an instance with a ready runner, and no request ever sent.
        wait_until(lambda: len(_instances_of(node, MODEL)) == 1, timeout=120)
        (instance_id,) = _instances_of(node, MODEL)
        wait_until(lambda: runners_ready(node, instance_id), timeout=300)

        # --no-batch: two answers streamed at once come one after the other, never interleaved.
        client = OpenAI(base_url=f"{node.url}/v1", api_key="none", timeout=300)
        spans: dict[str, tuple[float, float]] = {}
        threads = [
            threading.Thread(target=_stream_span, args=(client, p, spans))
            for p in ("Name three colours.", "Name three animals.")
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        (_, a_end), (b_start, _) = sorted(spans.values())
        assert a_end < b_start, "the second answer started before the first one ended"

        # --no-downloads: a model on the hub is neither pulled nor fetched for a placement.
        hub = _hub_model(node)
        node_id = node.get("/node_id")["node_id"]
        pulled = httpx.post(f"{node.url}/download/{node_id}/{hub['model_id']}", timeout=10)
        assert pulled.status_code == 409 and "--no-downloads" in pulled.text
        # Its telemetry leaves the hub's models out of what it serves: placement refuses.
        served = node.state()["nodes"][node_id]["resources"]["serves"]
        assert MODEL in served and hub["model_id"] not in served
        placed = httpx.post(f"{node.url}/instance", json={"model_id": hub["model_id"]}, timeout=60)
        assert placed.status_code >= 400 and _instances_of(node, hub["model_id"]) == []
        assert not _model_files(node, "mlx-community")

    # Started again with -m, the node finds its instance in its log and places no second.
    with exo_processes(tmp_path, 1, extra_args=[["-m", MODEL]]) as (again,):
        wait_until(lambda: "an instance of it is running already" in again.log(), timeout=120)
        wait_until(lambda: len(_instances_of(again, MODEL)) == 1, timeout=60)
        assert "placed instance" not in again.log().split("starting exo (pid")[-1]


def _model_files(node: ExoProcess, under: str) -> list[Path]:
    return list((node.data_dir / "models").glob(f"**/{under}*"))
