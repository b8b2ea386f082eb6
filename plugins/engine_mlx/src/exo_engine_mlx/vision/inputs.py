"""A request's images turned into prompt tokens: each image's start marker (placed by the chat
template) is followed by the image's virtual ids and its end marker."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any, Protocol

import mlx.core as mx
import mlx.nn as nn
from loguru import logger
from PIL import Image

from exo_core.plugin import GenerationParams
from exo_core.plugin.images import ImageInputError, decode_data_url
from exo_engine_mlx.prompt import PromptError
from exo_engine_mlx.vision.embedding import FeatureStore, VisionEmbedding, text_ids_only

MAX_IMAGE_BYTES = 64 * 1024 * 1024  # the API checked the caller's limit; this bounds a peer's
MAX_PIXELS = 64_000_000  # a decompression bomb is refused before it is decoded


class VisionTower(Protocol):
    tokens_per_image: int
    start_token: int
    end_token: int

    def features(self, image: Image.Image) -> mx.array: ...


def request_images(params: GenerationParams) -> list[bytes]:
    return [
        decode_data_url(p.image_url, MAX_IMAGE_BYTES)
        for m in params.messages
        if not isinstance(m.content, str)
        for p in m.content
        if p.type == "image"
    ]


def open_image(data: bytes) -> Image.Image:
    try:
        image = Image.open(io.BytesIO(data))
        if image.width * image.height > MAX_PIXELS:
            raise PromptError(f"an image has more than {MAX_PIXELS} pixels")
        image.load()
    except (OSError, Image.DecompressionBombError, ValueError) as e:
        raise PromptError(f"an image could not be decoded: {e}") from e
    return image


class VisionInputs:
    def __init__(self, tower: VisionTower, store: FeatureStore) -> None:
        self.tower = tower
        self.store = store

    def processor(self, processor: Any) -> Any:
        return text_ids_only(processor, self.store.base)

    def expand(self, tokens: list[int], params: GenerationParams) -> list[int]:
        try:
            images = request_images(params)
        except ImageInputError as e:
            raise PromptError(str(e)) from e
        if not images:
            return tokens
        starts = [i for i, t in enumerate(tokens) if t == self.tower.start_token]
        if len(starts) != len(images):
            raise PromptError(
                f"the chat template placed {len(starts)} image markers for {len(images)} images"
            )
        out: list[int] = []
        previous = 0
        for at, data in zip(starts, images, strict=True):
            ids = self.store.ids_for(
                hashlib.sha256(data).digest(), lambda d=data: self.tower.features(open_image(d))
            )
            out += [*tokens[previous : at + 1], *ids, self.tower.end_token]
            previous = at + 1
        return out + tokens[previous:]


class VisionUnsupported(ValueError):
    """The model's vision side is of a family the engine does not run yet (it serves text)."""


def _embedding_owner(model: Any) -> Any:
    """The module holding the text model's `embed_tokens`."""
    for _, module in model.named_modules():
        if "embed_tokens" in module:
            return module
    raise ValueError("the model has no embed_tokens to read images through")


def attach_vision(model: Any, model_dir: str) -> VisionInputs:
    """Load the vision tower of the model at `model_dir` and route images through the
    language model's embedding. A pipeline rank whose embedding only receives the hidden
    state from the rank before (any rank but the first) loads no tower: it lays out the same
    token ids and never reads features."""
    path = Path(model_dir)
    config = json.loads((path / "config.json").read_text())
    model_type = config.get("model_type")
    if model_type != "gemma3":
        raise VisionUnsupported(f"images are not supported for model_type {model_type!r} yet")
    from exo_engine_mlx.vision.gemma3 import Gemma3Vision

    owner = _embedding_owner(model)
    base: Any = owner["embed_tokens"]
    # A real embedding (plain or quantized) holds weights; a later pipeline rank's stand-in
    # (distributed/pipeline.py's `_Received`) holds none.
    embeds = isinstance(base, nn.Module) and "weight" in base
    tower = Gemma3Vision(path, config, tower=embeds)
    configured = config.get("vocab_size") or config["text_config"].get("vocab_size") or 0
    weight: Any = base["weight"] if embeds else None
    rows = int(weight.shape[0]) if weight is not None else 0
    store = FeatureStore(max(rows, int(configured)), tower.tokens_per_image, embeds=embeds)
    if embeds:
        owner["embed_tokens"] = VisionEmbedding(base, store)
        logger.info(f"vision tower loaded: {tower.tokens_per_image} soft tokens an image")
    return VisionInputs(tower, store)
