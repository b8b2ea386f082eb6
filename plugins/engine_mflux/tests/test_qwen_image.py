"""Qwen-Image and Qwen-Image-Edit end to end: the official openai client against a real `exo`
process serving the tiny random-weight models (every part small: see `tiny_qwen`) in real
image runners, mflux's Qwen pipelines built at the models' own sizes (`exo_engine_mflux.qwen`)."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import openai
import pytest
from PIL import Image

from exo_core.testing.processes import exo_processes, wait_until

from .conftest import SIZE, ImageNode, link_model, models, png_bytes

QWEN = "tiny-qwen-image"
QWEN_EDIT = "tiny-qwen-image-edit"
FAST = {"seed": 5, "num_inference_steps": 2}


@pytest.fixture(scope="module")
def qwen_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ImageNode]:
    from exo_engine_mflux.tiny_qwen import write_tiny_qwen_with_card

    written = tmp_path_factory.mktemp("qwen-models")
    root = tmp_path_factory.mktemp("qwen-node")
    link_model(root / "node0", write_tiny_qwen_with_card(written / QWEN, QWEN))
    link_model(root / "node0", write_tiny_qwen_with_card(written / QWEN_EDIT, QWEN_EDIT, edit=True))
    # The runners warm up (as by default) before the first request: the edit model with an
    # image.
    with exo_processes(root, 1, extra_args=[["--transport", "memory"]]) as (node,):
        wait_until(lambda: {QWEN, QWEN_EDIT} <= models(node.url), timeout=60)
        yield ImageNode(url=node.url, data_dir=node.data_dir, log_path=node.log_path)


def _png(b64: str | None) -> Image.Image:
    assert b64
    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    image.load()
    assert (image.format, image.size) == ("PNG", (64, 64))
    return image


def test_tiny_qwen_image_generates_and_the_prompt_changes_the_image(qwen_node: ImageNode) -> None:
    client = qwen_node.client()

    def generate(prompt: str, steps: int = 2) -> bytes:
        params = {**FAST, "num_inference_steps": steps}
        answer = client.images.generate(
            model=QWEN, prompt=prompt, size=SIZE, extra_body={"advanced_params": params}
        )
        assert answer.data is not None and len(answer.data) == 1
        return _png(answer.data[0].b64_json).tobytes()

    cat = generate("a red cat on a roof")
    assert generate("a red cat on a roof") == cat  # the seed repeats the image
    assert generate("a green boat at sea") != cat  # the text encoder's output is used
    # One step is an image too (mflux's schedule divides by zero there: NaN, a black image).
    assert len(set(generate("a red cat on a roof", steps=1))) > 1
    # A partial image decodes Qwen's latents mid-way (Qwen's VAE, not FLUX's).
    stream = client.images.generate(
        model=QWEN,
        prompt="a red cat on a roof",
        size=SIZE,
        stream=True,
        partial_images=1,
        extra_body={"advanced_params": FAST},
    )
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds.count("image_generation.partial_image") == 1
    assert kinds[-1] == "image_generation.completed"
    assert _png(events[-1].b64_json).tobytes() == cat
    with pytest.raises(openai.BadRequestError, match="does not edit images"):
        client.images.edit(
            model=QWEN, image=("in.png", png_bytes(), "image/png"), prompt="x", size=SIZE
        )


def test_tiny_qwen_image_edit_edits_the_upload_and_sees_it(qwen_node: ImageNode) -> None:
    client = qwen_node.client()

    def edit(prompt: str, color: tuple[int, int, int]) -> bytes:
        answer = client.images.edit(
            model=QWEN_EDIT,
            image=("in.png", png_bytes((80, 80), color), "image/png"),
            prompt=prompt,
            size=SIZE,
            extra_body={"advanced_params": '{"seed": 5, "num_inference_steps": 2}'},
        )
        assert answer.data is not None and len(answer.data) == 1
        return _png(answer.data[0].b64_json).tobytes()

    red = edit("make it brighter", (200, 30, 30))
    assert edit("make it brighter", (20, 60, 220)) != red  # the input image is seen
    assert edit("turn it into a drawing", (200, 30, 30)) != red  # and so is the prompt
    with pytest.raises(openai.BadRequestError, match="edits images"):
        client.images.generate(model=QWEN_EDIT, prompt="x", size=SIZE)
