"""Gemma 3's vision side: the SigLIP tower and the soft-token projector, from mlx-vlm."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from PIL import Image

# The SigLIP normalisation Gemma 3's image processor uses (preprocessor_config.json may differ).
DEFAULT_MEAN = (0.5, 0.5, 0.5)
DEFAULT_STD = (0.5, 0.5, 0.5)


def _vision_weights(model_dir: Path) -> dict[str, mx.array]:
    prefixes = ("vision_tower.", "multi_modal_projector.")
    weights: dict[str, mx.array] = {}
    for path in sorted(model_dir.glob("model*.safetensors")):
        loaded = mx.load(str(path))
        assert isinstance(loaded, dict)
        weights.update({k: v for k, v in loaded.items() if k.startswith(prefixes)})
    return weights


class Gemma3Vision:
    """One image in, its `tokens_per_image` soft tokens out (as the text model's embedding
    would give them: Gemma's text model scales embeddings by sqrt(hidden), so the features
    are divided by it first, as mlx-vlm does)."""

    def __init__(self, model_dir: Path, config: dict[str, Any], *, tower: bool = True) -> None:
        """`tower=False`: the token layout only (a pipeline rank after the first never embeds,
        so it never loads the tower)."""
        try:
            from mlx_vlm.models.gemma3.config import ModelConfig, TextConfig, VisionConfig
        except ImportError as e:  # a text-only install (mlx-vlm is the `vision` extra)
            raise RuntimeError(
                "vision models need mlx-vlm: pip install 'exo-engine-mlx[vision]'"
            ) from e

        text = TextConfig.from_dict(config["text_config"])
        vision = VisionConfig.from_dict(config["vision_config"])
        self.tokens_per_image = int(text.mm_tokens_per_image)
        self.image_size = int(vision.image_size)
        self.scale = float(text.hidden_size) ** -0.5
        self.start_token = int(config.get("boi_token_index", 255999))
        self.end_token = int(config.get("eoi_token_index", 256000))
        pre = _preprocessor(model_dir)
        self.mean = np.array(pre.get("image_mean", DEFAULT_MEAN), np.float32)
        self.std = np.array(pre.get("image_std", DEFAULT_STD), np.float32)
        if tower:
            cfg = ModelConfig(text_config=text, vision_config=vision, model_type="gemma3")
            self._load(model_dir, vision, cfg)

    def _load(self, model_dir: Path, vision: Any, cfg: Any) -> None:
        from mlx_vlm.models.gemma3.gemma3 import Gemma3MultiModalProjector
        from mlx_vlm.models.gemma3.vision import VisionModel

        self.tower = VisionModel(vision)
        self.projector = Gemma3MultiModalProjector(cfg)
        weights = self.tower.sanitize(_vision_weights(model_dir))
        prefix = "multi_modal_projector."
        self.tower.load_weights(
            [
                (k.removeprefix("vision_tower."), v)
                for k, v in weights.items()
                if not k.startswith(prefix)
            ]
        )
        self.projector.load_weights(
            [(k.removeprefix(prefix), v) for k, v in weights.items() if k.startswith(prefix)]
        )
        for module in (self.tower, self.projector):
            module.apply(lambda x: x.astype(mx.float32))  # the CPU runs float32 fastest
            mx.eval(module.parameters())

    def pixels(self, image: Image.Image) -> mx.array:
        """(1, H, W, 3) float32: resized to the tower's square, rescaled and normalised."""
        size = (self.image_size, self.image_size)
        rgb = image.convert("RGB").resize(size, Image.Resampling.BILINEAR)
        x = (np.asarray(rgb, np.float32) / 255.0 - self.mean) / self.std
        return mx.array(x[None])

    def features(self, image: Image.Image) -> mx.array:
        hidden, _, _ = self.tower(self.pixels(image), output_hidden_states=True)
        out = self.projector(hidden)[0] * self.scale
        mx.eval(out)
        return out


def _preprocessor(model_dir: Path) -> dict[str, Any]:
    try:
        found = json.loads((model_dir / "preprocessor_config.json").read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}
