"""Image generation as the core sees it: one request type every API dialect translates to.

A dialect builds an `ImageRequest` and calls `GenerationService.generate_images`; the task's
stream carries `ProgressChunk`s (step i of N), `ImageChunk`s (partial, then final images) and
ends with a `FinishChunk`. Text requests keep `GenerationParams`; an image task carries both
(its params stay empty).
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from exo_core.model_cards import ModelCard, ModelTask

ImageFormat = Literal["png", "jpeg", "webp"]
"""The file formats an image can be returned in."""

MIN_SIDE = 64
MAX_SIDE = 2048
# Latents are 1/8 of the image and the transformer takes 2x2 patches of them.
SIDE_MULTIPLE = 16
MAX_IMAGES = 10
MAX_STEPS = 200
MAX_PARTIAL_IMAGES = 3
MAX_PROMPT_CHARS = 32_000
# An uploaded image travels point to point to the runner (never in the log); larger inputs
# are refused.
MAX_INPUT_IMAGE_BYTES = 8 * 1024 * 1024


class ImageRequest(msgspec.Struct, frozen=True, kw_only=True):
    """An image generation (or edit) request: prompt, count, size, steps, format."""

    prompt: str
    n: int = 1
    width: int = 1024
    height: int = 1024
    # None: the model's own default (e.g. 4 for FLUX.1-schnell, 25 for FLUX.1-dev).
    steps: int | None = None
    guidance: float | None = None
    # None: a random seed, reported back with the image; image i of n uses seed + i.
    seed: int | None = None
    negative_prompt: str | None = None
    output_format: ImageFormat = "png"
    # 0-100, for jpeg and webp.
    quality: int = 90
    # Partial images to stream while denoising (0: none).
    partial_images: int = 0
    # An image to edit (PNG, JPEG or WebP bytes); set for image-edit requests only.
    input_image: bytes | None = None


class InvalidImageRequest(ValueError):
    """The message names the field and what is wrong with it."""


_SIZE = re.compile(r"^(\d{2,5})x(\d{2,5})$")


def parse_size(size: str, default: tuple[int, int] = (1024, 1024)) -> tuple[int, int]:
    """`"WxH"` (or `"auto"`) as (width, height); raises `InvalidImageRequest` when unusable."""
    if size == "auto":
        return default
    match = _SIZE.match(size)
    if match is None:
        raise InvalidImageRequest(f"size must look like '1024x1024' or be 'auto', got '{size}'")
    width, height = int(match[1]), int(match[2])
    check_side("width", width)
    check_side("height", height)
    return width, height


def check_side(name: str, value: int) -> None:
    if not MIN_SIDE <= value <= MAX_SIDE or value % SIDE_MULTIPLE:
        raise InvalidImageRequest(
            f"{name} must be a multiple of {SIDE_MULTIPLE} between {MIN_SIDE} and {MAX_SIDE}, "
            f"got {value}"
        )


def validate_image_request(card: ModelCard, request: ImageRequest) -> None:
    """Refuse what the model or the cluster cannot do, naming the field."""
    editing = request.input_image is not None
    if not card.makes_images:
        raise InvalidImageRequest(
            f"model '{card.model_id}' generates text, not images; use a model whose task is "
            "image_generation or image_edit"
        )
    if editing and ModelTask.IMAGE_EDIT not in card.tasks:
        raise InvalidImageRequest(f"model '{card.model_id}' does not edit images")
    if not editing and ModelTask.IMAGE_GENERATION not in card.tasks:
        raise InvalidImageRequest(
            f"model '{card.model_id}' edits images: use the edits route with an image"
        )
    if not request.prompt.strip():
        raise InvalidImageRequest("prompt must not be empty")
    if len(request.prompt) > MAX_PROMPT_CHARS:
        raise InvalidImageRequest(f"prompt is longer than {MAX_PROMPT_CHARS} characters")
    if not 1 <= request.n <= MAX_IMAGES:
        raise InvalidImageRequest(f"n must be between 1 and {MAX_IMAGES}, got {request.n}")
    check_side("width", request.width)
    check_side("height", request.height)
    if request.steps is not None and not 1 <= request.steps <= MAX_STEPS:
        raise InvalidImageRequest(
            f"num_inference_steps must be between 1 and {MAX_STEPS}, got {request.steps}"
        )
    if request.guidance is not None and not 0 <= request.guidance <= 100:
        raise InvalidImageRequest(f"guidance must be between 0 and 100, got {request.guidance}")
    if request.seed is not None and not 0 <= request.seed < 2**63:
        raise InvalidImageRequest("seed must be a non-negative 64-bit integer")
    if not 0 <= request.partial_images <= MAX_PARTIAL_IMAGES:
        raise InvalidImageRequest(f"partial_images must be between 0 and {MAX_PARTIAL_IMAGES}")
    if not 0 <= request.quality <= 100:
        raise InvalidImageRequest(f"quality must be between 0 and 100, got {request.quality}")
    if editing and len(request.input_image or b"") > MAX_INPUT_IMAGE_BYTES:
        raise InvalidImageRequest(
            f"the image is larger than {MAX_INPUT_IMAGE_BYTES // (1024 * 1024)} MiB"
        )
