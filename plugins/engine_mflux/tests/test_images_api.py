"""The image routes end to end: the official openai client against a real `exo` process
running the tiny FLUX.1 model in a real image runner (mflux's own loader and pipeline)."""

from __future__ import annotations

import argparse
import base64
import io
import json
import re

import httpx
import openai
import pytest
from PIL import Image
from rich.console import Console

from exo_cli_client.client import NodeClient
from exo_cli_client.commands import ps
from exo_cli_client.output import Output
from exo_core.testing.harness import events_text
from exo_core.testing.processes import wait_until

from .conftest import MODEL_ID, SIZE, ImageNode, png_bytes

pytestmark = pytest.mark.slow

FAST = {"seed": 7, "num_inference_steps": 1}


def _image(b64: str | None) -> Image.Image:
    assert b64
    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    image.load()
    return image


def test_generate_returns_a_png_of_the_requested_size_and_a_seed_repeats(
    image_node: ImageNode,
) -> None:
    client = image_node.client()
    # The README's call, against a real exo process.
    large = client.images.generate(
        model=MODEL_ID, prompt="a lighthouse", size="256x256", extra_body={"advanced_params": FAST}
    )
    assert large.data is not None and len(large.data) == 1
    image = _image(large.data[0].b64_json)
    assert (image.format, image.size) == ("PNG", (256, 256))
    first = client.images.generate(
        model=MODEL_ID, prompt="a red cat", size=SIZE, extra_body={"advanced_params": FAST}
    )
    assert first.data is not None and _image(first.data[0].b64_json).size == (64, 64)
    again = client.images.generate(
        model=MODEL_ID, prompt="a red cat", size=SIZE, extra_body={"advanced_params": FAST}
    )
    assert again.data is not None
    assert again.data[0].b64_json == first.data[0].b64_json
    other = client.images.generate(
        model=MODEL_ID,
        prompt="a red cat",
        size=SIZE,
        extra_body={"advanced_params": {**FAST, "seed": 8}},
    )
    assert other.data is not None and other.data[0].b64_json != first.data[0].b64_json


def test_url_answers_are_served_from_the_image_store(image_node: ImageNode) -> None:
    client = image_node.client()
    answer = client.images.generate(
        model=MODEL_ID,
        prompt="a blue house",
        size="96x64",
        response_format="url",
        output_format="jpeg",
        extra_body={"advanced_params": FAST},
    )
    assert answer.data is not None and answer.data[0].url
    fetched = httpx.get(answer.data[0].url, timeout=10)
    assert fetched.headers["content-type"] == "image/jpeg"
    image = Image.open(io.BytesIO(fetched.content))
    assert (image.format, image.size) == ("JPEG", (96, 64))
    listed = httpx.get(f"{image_node.url}/images", timeout=10).json()["data"]
    assert answer.data[0].url.rsplit("/", 1)[1] in [i["id"] for i in listed]
    missing = httpx.get(f"{image_node.url}/images/img_{'0' * 32}.png", timeout=10)
    assert missing.status_code == 404 and "error" in missing.json()


def test_stream_sends_progress_and_partial_images_before_the_final_one(
    image_node: ImageNode,
) -> None:
    client = image_node.client()
    stream = client.images.generate(
        model=MODEL_ID,
        prompt="a green tree",
        size=SIZE,
        stream=True,
        partial_images=2,
        extra_body={"advanced_params": {"seed": 1, "num_inference_steps": 3}},
    )
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[-1] == "image_generation.completed"
    assert kinds.count("image_generation.completed") == 1
    partials = [e for e in events if e.type == "image_generation.partial_image"]
    assert len(partials) == 2  # after steps 1 and 2 of 3
    assert [getattr(p, "partial_image_index", None) for p in partials] == [0, 1]
    assert _image(partials[0].b64_json).size == (64, 64)
    progress = [e for e in events if e.type == "image_generation.progress"]
    assert [(getattr(p, "step", 0), getattr(p, "total", 0)) for p in progress] == [
        (1, 3),
        (2, 3),
        (3, 3),
    ]
    assert _image(events[-1].b64_json).size == (64, 64)


def test_edit_takes_an_uploaded_image_that_never_enters_the_log(image_node: ImageNode) -> None:
    client = image_node.client()
    secret, upload = "SECRET-41c9 make it blue", png_bytes((80, 80), (17, 201, 99))
    answer = client.images.edit(
        model=MODEL_ID,
        image=("input.png", upload, "image/png"),
        prompt=secret,
        size=SIZE,
        extra_body={"advanced_params": json.dumps({"seed": 2, "num_inference_steps": 3})},
    )
    assert answer.data is not None
    assert _image(answer.data[0].b64_json).size == (64, 64)
    # The prompt and the upload went to the runner point to point, not through the log.
    for path in image_node.data_dir.glob("*"):
        if path.is_file():
            stored = path.read_bytes()
            assert secret.encode() not in stored and upload not in stored, path
    served = events_text(image_node.url) + httpx.get(f"{image_node.url}/state", timeout=10).text
    assert "TaskCreated" in served and '"width":64' in served
    assert secret not in served and base64.b64encode(upload).decode() not in served


def test_a_disconnect_cancels_at_the_next_step_and_the_next_request_runs(
    image_node: ImageNode,
) -> None:
    body = {
        "model": MODEL_ID,
        "prompt": "a long one",
        "size": SIZE,
        "stream": True,
        "advanced_params": {"seed": 3, "num_inference_steps": 200},
    }
    earlier = _cancels(image_node)
    steps_seen = 0
    with httpx.stream(
        "POST", f"{image_node.url}/v1/images/generations", json=body, timeout=120
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data:") and "progress" in line:
                steps_seen += 1
                break  # leave after the first step: the client goes away
    assert steps_seen == 1
    # The runner serves one request at a time: this one answers only once the 200-step
    # generation has stopped (else it would wait minutes and the test would time out).
    answer = image_node.client().images.generate(
        model=MODEL_ID, prompt="next", size=SIZE, extra_body={"advanced_params": FAST}
    )
    assert answer.data is not None and _image(answer.data[0].b64_json).size == (64, 64)
    tasks = httpx.get(f"{image_node.url}/state/tasks", timeout=10).json()
    assert tasks == {}
    # The runner stopped at a step boundary soon after the client left, not after 200 steps.
    stopped = _cancels(image_node)[len(earlier) :]
    assert len(stopped) == 1 and stopped[0] < 20, stopped


def _cancels(node: ImageNode) -> list[int]:
    """The step after which each cancelled 200-step generation stopped, from the runner log."""
    return [int(s) for s in re.findall(r"cancelled after step (\d+) of 200", node.log())]


def test_cancel_by_the_request_id_stops_the_generation(
    image_node: ImageNode, capsys: pytest.CaptureFixture[str]
) -> None:
    earlier = _cancels(image_node)
    body = {
        "model": MODEL_ID,
        "prompt": "cancel me",
        "size": SIZE,
        "stream": True,
        "advanced_params": {"seed": 4, "num_inference_steps": 200},
    }
    with httpx.stream(
        "POST", f"{image_node.url}/v1/images/generations", json=body, timeout=120
    ) as response:
        request_id = response.headers["x-request-id"]
        lines = response.iter_lines()
        first = next(json.loads(line[5:]) for line in lines if line.startswith("data:"))
        assert first["type"] == "image_generation.progress" and first["id"] == request_id
        # Its step is served from memory, not from the replicated state.
        (progress,) = httpx.get(f"{image_node.url}/progress", timeout=10).json()["tasks"]
        assert progress["request_id"] == request_id and progress["total"] == 200
        assert 1 <= progress["step"] <= 200
        # `exo ps` shows it in the instance's row (its command, in this process: a CLI
        # process would spend seconds importing every plugin).
        client = NodeClient(image_node.url)
        output = Output(console=Console(file=io.StringIO()))  # not a terminal: tab-separated
        assert ps(argparse.Namespace(), client, output) == 0
        client.close()
        header, *rows = capsys.readouterr().out.splitlines()
        assert header.split("\t")[-1] == "STEPS"
        assert any(re.search(rf"\t{MODEL_ID}\t.*\t\d+/200$", row) for row in rows), rows
        cancelled = httpx.post(f"{image_node.url}/v1/cancel/{request_id}", timeout=30)
        assert cancelled.status_code == 200, cancelled.text
        rest = [line for line in lines if line.startswith("data:")]
    assert "cancelled" in rest[-2] and rest[-1] == "data: [DONE]"
    # The caller is answered at once; the runner stops at its next step boundary.
    wait_until(lambda: len(_cancels(image_node)) > len(earlier), timeout=60)
    stopped = _cancels(image_node)[len(earlier) :]
    # Far from 200 (the cancel travels through the master while the runner keeps stepping).
    assert len(stopped) == 1 and stopped[0] < 100, stopped

    def let_go() -> bool:  # the stream's end is sent before the server lets go of its id
        gone = httpx.post(f"{image_node.url}/v1/cancel/{request_id}", timeout=30)
        tasks = httpx.get(f"{image_node.url}/progress", timeout=10).json()["tasks"]
        return gone.status_code == 404 and tasks == []

    wait_until(let_go, timeout=30)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"prompt": "x", "size": "banana"}, "size"),
        ({"prompt": "x", "size": "100x100"}, "multiple of 16"),
        ({"prompt": "x", "advanced_params": {"num_inference_steps": 0}}, "num_inference_steps"),
        ({"size": SIZE}, "prompt"),
        ({"prompt": "x", "n": 0}, "n must be"),
        ({"prompt": "x", "advanced_params": {"sampler": "euler"}}, "sampler"),
        ({"prompt": "x", "advanced_params": {"num_sync_steps": 0}}, "num_sync_steps"),
        ({"prompt": "x", "response_format": "gif"}, "response_format"),
        ({"prompt": "x", "model": "SmolLM2-135M-Instruct"}, "generates text"),
        ({"prompt": "x", "model": "no-such-model"}, "no-such-model"),
    ],
)
def test_bad_generation_requests_get_openai_errors(
    image_node: ImageNode, body: dict[str, object], fragment: str
) -> None:
    response = httpx.post(
        f"{image_node.url}/v1/images/generations",
        json={"model": MODEL_ID, **body},
        timeout=10,
    )
    assert 400 <= response.status_code < 500, response.text
    error = response.json()["error"]
    assert fragment in error["message"] and error["type"] == "invalid_request_error"


def test_bad_edits_get_openai_errors(image_node: ImageNode) -> None:
    client = image_node.client()
    with pytest.raises(openai.BadRequestError, match="PNG, JPEG or WebP"):
        client.images.edit(
            model=MODEL_ID, image=("notes.txt", b"not an image", "text/plain"), prompt="x"
        )
    not_multipart = httpx.post(
        f"{image_node.url}/v1/images/edits", json={"model": MODEL_ID, "prompt": "x"}, timeout=10
    )
    assert (
        not_multipart.status_code == 400 and "multipart" in not_multipart.json()["error"]["message"]
    )


def test_text_and_image_models_are_told_apart(image_node: ImageNode) -> None:
    client = image_node.client()
    with pytest.raises(openai.BadRequestError, match="generates images"):
        client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "hi"}])
    ollama_chat = httpx.post(
        f"{image_node.url}/api/chat",
        json={"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]},
        timeout=10,
    )
    assert ollama_chat.status_code == 400 and "generates images" in ollama_chat.json()["error"]
    models = {
        m["id"]: m for m in httpx.get(f"{image_node.url}/v1/models", timeout=10).json()["data"]
    }
    assert models[MODEL_ID]["tasks"] == ["image_generation", "image_edit"]
    assert models["SmolLM2-135M-Instruct"]["tasks"] == ["text_generation"]
    tags = {
        m["name"]: m for m in httpx.get(f"{image_node.url}/api/tags", timeout=10).json()["models"]
    }
    assert "image" in tags[MODEL_ID]["capabilities"]
    assert "image" not in tags["SmolLM2-135M-Instruct"]["capabilities"]
    native = {
        m["model_id"]: m for m in httpx.get(f"{image_node.url}/models", timeout=10).json()["models"]
    }
    card = native[MODEL_ID]
    assert card["tasks"] == ["image_generation", "image_edit"]
    assert {c["name"]: c["splittable"] for c in card["components"]} == {
        "transformer": True,
        "vae": False,
        "clip_encoder": False,
        "t5_encoder": False,
    }


# exo's ImageGenerationStats (src/exo/api/types/api.py): field -> type.
EXO_IMAGE_STATS = {
    "seconds_per_step": float,
    "total_generation_time": float,
    "num_inference_steps": int,
    "num_images": int,
    "image_width": int,
    "image_height": int,
    "peak_memory_usage": dict,
}


def test_exos_image_bench_routes_answer_images_and_generation_stats(
    image_node: ImageNode,
) -> None:
    params = {**FAST, "num_inference_steps": 2, "num_sync_steps": 1}  # exo's field: accepted
    body = {"model": MODEL_ID, "prompt": "a lighthouse", "size": SIZE, "advanced_params": params}
    made = httpx.post(f"{image_node.url}/bench/images/generations", json=body, timeout=120)
    assert made.status_code == 200, made.text
    answer = made.json()
    assert _image(answer["data"][0]["b64_json"]).size == (64, 64)
    stats = answer["generation_stats"]
    assert {k: type(v) for k, v in stats.items()} == EXO_IMAGE_STATS
    assert (stats["num_inference_steps"], stats["num_images"]) == (2, 1)
    assert (stats["image_width"], stats["image_height"]) == (64, 64)
    assert 0 < stats["seconds_per_step"] <= stats["total_generation_time"]
    assert answer["power_usage"] is None and made.headers["x-request-id"].startswith("img-")
    form = {"model": MODEL_ID, "prompt": "make it blue", "size": SIZE}
    form["advanced_params"] = json.dumps({"seed": 3, "num_inference_steps": 2})
    files = {"image": ("in.png", png_bytes(), "image/png")}
    edited = httpx.post(f"{image_node.url}/bench/images/edits", data=form, files=files, timeout=120)
    assert edited.status_code == 200, edited.text
    assert edited.json()["generation_stats"]["num_images"] == 1
    streamed = httpx.post(
        f"{image_node.url}/bench/images/generations", json={**body, "stream": True}, timeout=10
    )
    assert streamed.status_code == 400 and "stream" in streamed.json()["error"]["message"]
