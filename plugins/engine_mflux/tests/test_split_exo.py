"""The transformer split over two real `exo` processes (libp2p on loopback, a runner group on an
mx.distributed ring): the image of a 2-rank instance equals one node's for the same seed, and a
cancel stops both ranks at the same step, after which the group serves the next request."""

from __future__ import annotations

import base64
import io
import json
import re
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from PIL import Image

from exo_core.testing.harness import events_text
from exo_core.testing.processes import (
    ExoProcess,
    exo_processes,
    runners_ready,
    wait_joined,
    wait_until,
)

from .conftest import link_model

pytestmark = pytest.mark.slow

MODEL_ID = "tiny-split-flux"
QWEN = "tiny-split-qwen-image"  # two blocks, one for each rank
BODY = {
    "model": MODEL_ID,
    "prompt": "a lighthouse on 7f3k",
    "size": "64x64",
    "response_format": "b64_json",
}


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ExoProcess]]:
    from exo_engine_mflux.tiny_model import write_tiny_model_with_card
    from exo_engine_mflux.tiny_qwen import write_tiny_qwen_with_card

    root = tmp_path_factory.mktemp("split-exo")
    # Two single blocks: one for each rank (a joint block would double the size).
    model = write_tiny_model_with_card(root / "models" / MODEL_ID, MODEL_ID, single_blocks=2)
    qwen = write_tiny_qwen_with_card(root / "models" / QWEN, QWEN)
    for i in range(2):
        link_model(root / f"node{i}", model)
        link_model(root / f"node{i}", qwen)
    env = {"EXO_RUNNER_WARMUP": "0"}
    with exo_processes(root, 2, extra_args=[["--no-auto-place"]] * 2, env=env) as started:
        wait_joined(started, engine="mflux")
        yield started


def _place(node: ExoProcess, min_nodes: int, model: str = MODEL_ID) -> str:
    body = {"model_id": model, "min_nodes": min_nodes}
    created = httpx.post(f"{node.url}/instance", json=body, timeout=60)
    assert created.status_code == 201, created.text
    instance_id = str(created.json()["instance_id"])
    assert len(node.get(f"/instance/{instance_id}")["shards"]) == min_nodes
    try:
        wait_until(lambda: runners_ready(node, instance_id), timeout=180)
    except TimeoutError:
        pytest.fail(f"instance {instance_id} did not become ready:\n{node.log()[-3000:]}")
    return instance_id


def _delete(node: ExoProcess, instance_id: str) -> None:
    httpx.delete(f"{node.url}/instance/{instance_id}", timeout=30)
    wait_until(lambda: instance_id not in node.state()["instances"], timeout=60)


def _pixels(node: ExoProcess, seed: int, model: str = MODEL_ID) -> np.ndarray:
    body = {**BODY, "model": model, "advanced_params": {"seed": seed, "num_inference_steps": 1}}
    reply = httpx.post(f"{node.url}/v1/images/generations", json=body, timeout=180)
    assert reply.status_code == 200, reply.text
    data = base64.b64decode(reply.json()["data"][0]["b64_json"])
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.int16)


def _cancels(node: ExoProcess) -> list[int]:
    return [int(s) for s in re.findall(r"cancelled after step (\d+) of 200", node.log())]


def test_two_ranks_give_one_nodes_image_and_a_cancel_stops_both(
    nodes: list[ExoProcess],
) -> None:
    first, second = nodes
    single = _place(first, 1)
    reference = _pixels(first, seed=7)
    _delete(first, single)
    assert reference.shape == (64, 64, 3) and reference.std() > 0

    split = _place(first, 2)
    try:
        body = {**BODY, "stream": True, "advanced_params": {"seed": 3, "num_inference_steps": 200}}
        with httpx.stream(
            "POST", f"{first.url}/v1/images/generations", json=body, timeout=180
        ) as response:
            request_id = response.headers["x-request-id"]
            lines = (line for line in response.iter_lines() if line.startswith("data:"))
            assert json.loads(next(lines)[5:])["type"] == "image_generation.progress"
            cancelled = httpx.post(f"{second.url}/v1/cancel/{request_id}", timeout=30)
            assert cancelled.status_code == 200, cancelled.text
            rest = list(lines)
        assert "cancelled" in rest[-2] and rest[-1] == "data: [DONE]"
        # Both ranks stopped, at the same step (they vote after every step), far before 200.
        wait_until(lambda: len(_cancels(first)) == len(_cancels(second)) == 1, timeout=120)
        assert _cancels(first) == _cancels(second) and _cancels(first)[0] < 100

        # The group is free for the next request (asked on the other node), and its image is
        # one node's.
        assert np.abs(_pixels(second, seed=7) - reference).max() <= 2
        # Each rank held its own block; the prompt went to the other rank off the log.
        logs = first.log() + second.log()
        assert "rank 0 of 2 holds transformer blocks [0, 1)" in logs
        assert "rank 1 of 2 holds transformer blocks [1, 2)" in logs
        assert str(BODY["prompt"]) not in events_text(first.url)
    finally:
        _delete(first, split)


def test_two_ranks_of_qwen_image_give_one_nodes_image(nodes: list[ExoProcess]) -> None:
    """Qwen-Image's joint blocks split as FLUX.1's do (`SplitQwenTransformer`), its true CFG's
    two passes a step included."""
    first, second = nodes
    single = _place(first, 1, QWEN)
    reference = _pixels(first, seed=7, model=QWEN)
    _delete(first, single)
    assert reference.shape == (64, 64, 3) and reference.std() > 0
    split = _place(first, 2, QWEN)
    try:
        assert np.abs(_pixels(second, seed=7, model=QWEN) - reference).max() <= 2
        assert np.abs(_pixels(first, seed=8, model=QWEN) - reference).max() > 2
    finally:
        _delete(first, split)
