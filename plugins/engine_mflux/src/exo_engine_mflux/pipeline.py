"""mflux as the runner uses it: load a model by its card's family, and generate one image with
progress, partial images and cancellation at step boundaries.

Imported only in the runner subprocess (it imports MLX and mflux).
"""

from __future__ import annotations

import copy
import io
import json
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
from PIL import Image

from exo_core.plugin.images import ImageFormat

# The card's family -> (mflux model class, mflux model config name, default steps, guidance).
# Qwen-Image's steps and guidance are exo's (its "medium" quality).
FAMILIES: dict[str, tuple[str, str, int, float]] = {
    "flux1-schnell": ("txt2img", "schnell", 4, 0.0),
    "flux1-dev": ("txt2img", "dev", 25, 3.5),
    "flux1-krea-dev": ("txt2img", "krea-dev", 25, 4.5),
    "flux1-kontext-dev": ("kontext", "dev-kontext", 25, 2.5),
    "qwen-image": ("qwen", "qwen-image", 25, 3.5),
    "qwen-image-edit": ("qwen-edit", "qwen-image-edit", 25, 3.5),
}
# Model classes that edit the uploaded image itself (the others denoise from it, img2img).
EDIT_KINDS = frozenset({"kontext", "qwen-edit"})
QWEN_KINDS = frozenset({"qwen", "qwen-edit"})


# How much of the input image an image-to-image edit keeps (mflux's `image_strength`).
IMG2IMG_STRENGTH = 0.4


class Cancelled(Exception):
    """Raised from the step callback: the task was cancelled (or the runner is stopping)."""


@dataclass(frozen=True)
class Step:
    """Step `done` of `total` finished; `latents` are the current (packed) latents."""

    done: int
    total: int
    latents: mx.array


@dataclass
class LoadedModel:
    family: str
    model: Any
    default_steps: int
    default_guidance: float

    @property
    def kind(self) -> str:
        return FAMILIES[self.family][0]

    @property
    def edits(self) -> bool:
        return self.kind in EDIT_KINDS


def _use_fp32() -> None:
    """FP32 on the CPU: MLX's CPU bf16 matmuls are slow, the preloaded BLAS makes fp32 fast."""
    from mflux.models.common.config.model_config import ModelConfig

    ModelConfig.precision = mx.float32


def _trim_encoders(model: Any, path: Path) -> None:
    """Keep only the text-encoder blocks the weights hold.

    mflux builds T5 with 24 blocks and CLIP with 12 whatever the files hold; blocks without
    weights would run on random initial values. A full model holds them all (nothing changes);
    a reduced test model holds fewer, and the rest are never materialized."""
    t5 = _block_count(path / "text_encoder_2", "t5_blocks.", 1)
    clip = _block_count(path / "text_encoder", "text_model.encoder.layers.", 3)
    if t5 is not None:
        model.t5_text_encoder.t5_blocks = model.t5_text_encoder.t5_blocks[:t5]
    if clip is not None:
        layers = model.clip_text_encoder.text_model.encoder.layers
        model.clip_text_encoder.text_model.encoder.layers = layers[:clip]


def _to_fp32(model: Any) -> None:
    """Weights saved in bf16 (mflux-saved models, the test model) run in fp32 too."""
    from mlx.utils import tree_map

    def cast(value: mx.array) -> mx.array:
        floating = mx.issubdtype(value.dtype, mx.floating)
        return value.astype(mx.float32) if floating and value.dtype != mx.float32 else value

    model.update(tree_map(cast, model.parameters()))


def _block_count(component: Path, prefix: str, position: int) -> int | None:
    """Blocks named in an mflux-saved component's index (None: not an mflux-saved component)."""
    index = component / "model.safetensors.index.json"
    if not index.is_file():
        return None
    content = json.loads(index.read_text())
    if "mflux_version" not in content.get("metadata", {}):
        return None  # a hub (diffusers) layout: mflux maps its names, and it is complete
    names = content.get("weight_map", {})
    found = {int(n.split(".")[position]) for n in names if n.startswith(prefix)}
    return max(found) + 1 if found else 0


def _t5_max_length(path: Path) -> int | None:
    """A tokenizer that allows fewer tokens than the model config pads to caps the padding."""
    config = path / "tokenizer_2" / "tokenizer_config.json"
    if not config.is_file():
        return None
    value = json.loads(config.read_text()).get("model_max_length")
    return int(value) if isinstance(value, int | float) and value < 1e6 else None


def load(family: str, path: Path) -> LoadedModel:
    if family not in FAMILIES:
        raise ValueError(f"the image engine does not know the model family '{family}'")
    _use_fp32()
    from mflux.models.common.config.model_config import ModelConfig

    kind, config_name, steps, guidance = FAMILIES[family]
    if kind in QWEN_KINDS:
        from exo_engine_mflux.qwen import load_qwen

        qwen = load_qwen(path, config_name, edits=kind == "qwen-edit")
        _to_fp32(qwen)
        return LoadedModel(family, qwen, default_steps=steps, default_guidance=guidance)
    config = ModelConfig.from_name(model_name=config_name, base_model=None)
    if kind == "kontext":
        from mflux.models.flux.variants.kontext.flux_kontext import Flux1Kontext

        model: Any = Flux1Kontext(model_config=config, model_path=str(path))
    else:
        from mflux.models.flux.variants.txt2img.flux import Flux1

        model = Flux1(model_config=config, model_path=str(path))
    _trim_encoders(model, path)
    _to_fp32(model)
    limit = _t5_max_length(path)
    t5 = model.tokenizers["t5"]
    if limit is not None and limit < t5.max_length:
        t5.max_length = limit
    return LoadedModel(family=family, model=model, default_steps=steps, default_guidance=guidance)


def partial_steps(total: int, partials: int) -> frozenset[int]:
    """The steps (1-based) after which to send a partial image: evenly spread, never the last."""
    if partials <= 0 or total <= 1:
        return frozenset()
    steps = {max(1, round(total * (i + 1) / (partials + 1))) for i in range(partials)}
    return frozenset(s for s in steps if s < total)


def encode_image(image: Image.Image, fmt: ImageFormat, quality: int) -> bytes:
    out = io.BytesIO()
    if fmt == "png":
        image.save(out, format="PNG")
    else:
        rgb = image.convert("RGB")
        rgb.save(out, format="JPEG" if fmt == "jpeg" else "WEBP", quality=max(1, quality))
    return out.getvalue()


def decode_latents(loaded: LoadedModel, latents: mx.array, width: int, height: int) -> Image.Image:
    """The image the current latents show (for partial images)."""
    from mflux.models.common.vae.vae_util import VAEUtil
    from mflux.models.flux.latent_creator.flux_latent_creator import FluxLatentCreator
    from mflux.utils.image_util import ImageUtil

    unpacked = FluxLatentCreator.unpack_latents(latents=latents, height=height, width=width)
    decoded = VAEUtil.decode(vae=loaded.model.vae, latent=unpacked, tiling_config=None)
    return ImageUtil.to_pil(decoded)


class _StepCallback:
    """mflux's in-loop callback: report each step; `on_step` raises `Cancelled` to stop."""

    def __init__(self, on_step: Callable[[Step], None]) -> None:
        self.on_step = on_step
        self.done = 0

    def call_in_loop(
        self, t: int, seed: int, prompt: str, latents: mx.array, config: Any, time_steps: Any
    ) -> None:
        # The step's work completes first: in a runner group its transfers between ranks must
        # come before any collective of `on_step` (the stop vote), on every rank alike.
        mx.eval(latents)
        self.done += 1
        total = config.num_inference_steps - config.init_time_step
        self.on_step(Step(done=self.done, total=total, latents=latents))


def generate(
    loaded: LoadedModel,
    *,
    prompt: str,
    seed: int,
    width: int,
    height: int,
    steps: int,
    guidance: float,
    negative_prompt: str | None,
    input_image: bytes | None,
    on_step: Callable[[Step], None],
) -> Image.Image:
    """One image. `on_step` runs after every denoising step (it may raise `Cancelled`)."""
    model = loaded.model
    callback = _StepCallback(on_step)
    model.callbacks.in_loop = [callback]
    # mflux caches every prompt's encoding forever; a server would grow without bound.
    model.prompt_cache.clear()
    with tempfile.TemporaryDirectory(prefix="exo-image-") as scratch:
        image_path: str | None = None
        if input_image is not None:
            # mflux reads its input image from a file; re-encode so only a decodable image
            # reaches it.
            image_path = str(Path(scratch) / "input.png")
            Image.open(io.BytesIO(input_image)).convert("RGB").save(image_path)
        kwargs: dict[str, Any] = {
            "seed": seed,
            "prompt": prompt,
            "num_inference_steps": steps,
            "height": height,
            "width": width,
            "guidance": guidance,
        }
        if loaded.kind == "qwen-edit":
            if image_path is None:
                raise ValueError("Qwen-Image-Edit edits an image: send one to the edits route")
            kwargs["image_paths"] = [image_path]
            kwargs["negative_prompt"] = negative_prompt
        elif loaded.edits:
            kwargs["image_path"] = image_path
        else:
            # Qwen-Image guides by the negative prompt (true CFG, two transformer passes a
            # step); FLUX.1 has no true classifier-free guidance: mflux accepts and ignores it.
            kwargs["negative_prompt"] = negative_prompt
            if image_path is not None:
                # A text-to-image model edits by image-to-image: denoise from the input.
                kwargs["image_path"] = image_path
                kwargs["image_strength"] = IMG2IMG_STRENGTH
        with _one_step_schedule(model, steps):
            result = model.generate_image(**kwargs)
    return result.image


@contextmanager
def _one_step_schedule(model: Any, steps: int) -> Iterator[None]:
    """Qwen-Image's schedule stretches its sigmas to a terminal value, dividing by one minus
    the last sigma: 0 when there is one step (mflux's linear scheduler), so the latents are
    NaN and the image black. One step goes from sigma 1 to 0 and needs no stretch."""
    config = model.model_config
    if steps != 1 or getattr(config, "sigma_shift_terminal", None) is None:
        yield
        return
    one_step = copy.copy(config)
    one_step.sigma_shift_terminal = None
    model.model_config = one_step
    try:
        yield
    finally:
        model.model_config = config
