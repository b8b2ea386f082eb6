"""Images through the MLX engine's batch engine, on the tiny random vision model (Gemma 3's
layout): the image is really seen, requests with images batch beside text ones, and the prefix
cache is keyed by the image's content."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace
from PIL import Image

from exo_core.plugin import (
    ChatMessage,
    ContentPart,
    ErrorChunk,
    GenerationParams,
    SamplingParams,
    TaskId,
)
from exo_engine_mlx.batching import BatchEngine
from exo_engine_mlx.prefix_cache import PrefixCache
from exo_engine_mlx.testing import finish_of, run_requests, text_of


def data_url(color: tuple[int, int, int] | None = None, size: tuple[int, int] = (48, 40)) -> str:
    """A PNG data URL: one colour, or noise when `color` is None."""
    image = Image.new("RGB", size, color) if color else Image.effect_noise(size, 80).convert("RGB")
    out = io.BytesIO()
    image.save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


RED, BLUE, NOISE = data_url((255, 0, 0)), data_url((0, 0, 255)), data_url()


def ask(*images: str, text: str = "what is in the picture?") -> GenerationParams:
    parts = (
        *(ContentPart(type="image", image_url=u) for u in images),
        ContentPart(type="text", text=text),
    )
    return GenerationParams(
        messages=(ChatMessage(role="user", content=parts),),
        max_tokens=10,
        sampling=SamplingParams(temperature=0),
    )


@pytest.fixture(scope="module")
def tiny_vision(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from exo_engine_mlx.tiny_vision import write_tiny_vision

    return write_tiny_vision(tmp_path_factory.mktemp("vision") / "tiny-vision", "tiny-vision")


@pytest.fixture(scope="module")
def loaded(tiny_vision: Path) -> tuple[Any, Any, Any]:
    from exo_engine_mlx.loading import load_model
    from exo_engine_mlx.vision.inputs import attach_vision

    model, tokenizer = load_model(str(tiny_vision))
    return model, tokenizer, attach_vision(model, str(tiny_vision))


def engine(loaded: tuple[Any, Any, Any], cache: bool = False) -> BatchEngine:
    model, tokenizer, vision = loaded
    prefix = PrefixCache(1 << 26, 4) if cache else None
    return BatchEngine(model, tokenizer, vision=vision, prefix_cache=prefix)


def answer(e: BatchEngine, params: GenerationParams) -> str:
    return text_of(run_requests(e, {"one": params})["one"])


def test_different_images_give_different_greedy_answers(loaded: Any) -> None:
    e = engine(loaded)
    answers = {u: answer(e, ask(u)) for u in (RED, BLUE, NOISE)}
    assert len(set(answers.values())) == 3, answers
    assert answer(e, ask(RED)) == answers[RED]  # and the same image the same answer


def test_images_batch_beside_text_with_each_answer_as_alone(loaded: Any) -> None:
    e = engine(loaded)
    requests = {
        "red": ask(RED),
        "text": GenerationParams(
            messages=(ChatMessage(role="user", content="hello there"),),
            max_tokens=10,
            sampling=SamplingParams(temperature=0),
        ),
        "two": ask(BLUE, NOISE),
    }
    alone = {k: answer(e, p) for k, p in requests.items()}
    together = run_requests(e, requests)
    assert {k: text_of(v) for k, v in together.items()} == alone
    # An image is its soft tokens plus its two markers in the prompt.
    assert (
        finish_of(together["two"]).usage.prompt_tokens
        > finish_of(together["red"]).usage.prompt_tokens
    )


def test_the_prefix_cache_is_keyed_by_the_image(loaded: Any) -> None:
    fresh = {u: answer(engine(loaded), ask(u)) for u in (RED, BLUE)}
    e = engine(loaded, cache=True)
    first = run_requests(e, {"a": ask(RED)})["a"]
    again = run_requests(e, {"b": ask(RED)})["b"]
    assert text_of(again) == text_of(first) == fresh[RED]
    assert finish_of(again).usage.cached_tokens > finish_of(first).usage.cached_tokens
    # Same text, another image: the cache may give back only what comes before the image.
    other = run_requests(e, {"c": ask(BLUE)})["c"]
    assert text_of(other) == fresh[BLUE]
    start = finish_of(other).usage.prompt_tokens
    assert finish_of(other).usage.cached_tokens < start - 6


def test_a_repetition_penalty_reads_past_the_image(loaded: Any) -> None:
    params = ask(RED)
    sampling = SamplingParams(temperature=0, repetition_penalty=1.5)
    chunks = run_requests(engine(loaded), {"p": replace(params, sampling=sampling)})["p"]
    assert finish_of(chunks).usage.completion_tokens == 10


def test_a_bad_image_fails_only_its_request(loaded: Any) -> None:
    e = engine(loaded)
    broken = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\nnot really").decode()
    (chunk,) = e.submit(TaskId("bad"), ask(broken))
    assert isinstance(chunk, ErrorChunk) and "could not be decoded" in chunk.message
    assert e.active == 0
    assert answer(e, ask(RED))


def test_a_family_without_vision_support_serves_text_and_refuses_images(tmp_path: Path) -> None:
    from exo_engine_mlx.loading import load_model
    from exo_engine_mlx.tiny_model import make_tiny_model
    from exo_engine_mlx.vision.inputs import VisionUnsupported, attach_vision

    path = make_tiny_model(tmp_path / "qwen2-vl", model_type="qwen2_vl")
    model, tokenizer = load_model(str(path))
    with pytest.raises(VisionUnsupported):
        attach_vision(model, str(path))
    e = BatchEngine(model, tokenizer)
    (chunk,) = e.submit(TaskId("img"), ask(RED))
    assert isinstance(chunk, ErrorChunk) and "not supported" in chunk.message
    text = GenerationParams(messages=(ChatMessage(role="user", content="hi"),), max_tokens=3)
    assert finish_of(run_requests(e, {"t": text})["t"]).usage.completion_tokens == 3
