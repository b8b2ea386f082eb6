"""mflux's Qwen-Image and Qwen-Image-Edit, built at the sizes the model folder names.

mflux builds Qwen-Image's parts at their full size whatever the weights hold: its
initializer calls `QwenTransformer()`, `QwenTextEncoder()` (Qwen2.5-VL-7B's language model:
28 layers of width 3584 and a 152064-token embedding) and, for edits, `VisionTransformer()`
with no arguments. mflux's classes do take the sizes (the text encoder's layers and its
rotary embedding excepted), so this adapter builds the same classes with the sizes of the
folder's `transformer/config.json` (diffusers' transformer config) and
`text_encoder/config.json` (Qwen2.5-VL's config), and lets mflux's initializer do the rest
(weights, tokenizers, LoRA, the edit model's vision-language tokenizer). A full model's
config files name mflux's defaults, so nothing changes for it; a folder without them gets
mflux's defaults. The VAE has no sizes to give: mflux takes its widths from the weights.

Imported only in the runner subprocess (it imports MLX and mflux).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock


@dataclass(frozen=True)
class VisionSize:
    """Qwen2.5-VL's vision tower (`vision_config`), defaults as mflux builds it."""

    depth: int = 32
    hidden_size: int = 1280
    num_heads: int = 16
    intermediate_size: int = 3420
    out_hidden_size: int = 3584
    fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)


@dataclass(frozen=True)
class TextEncoderSize:
    """Qwen2.5-VL's language model, defaults as mflux builds it."""

    vocab_size: int = 152064
    hidden_size: int = 3584
    num_hidden_layers: int = 28
    num_attention_heads: int = 28
    num_key_value_heads: int = 4
    intermediate_size: int = 18944
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1000000.0
    mrope_section: tuple[int, ...] = (16, 24, 24)
    image_token_id: int = 151655
    vision: VisionSize = field(default_factory=VisionSize)


# diffusers' QwenImageTransformer2DModel config keys that mflux's `QwenTransformer` takes.
TRANSFORMER_KEYS = (
    "in_channels",
    "out_channels",
    "num_layers",
    "attention_head_dim",
    "num_attention_heads",
    "joint_attention_dim",
    "patch_size",
    "zero_cond_t",
)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    value = json.loads(path.read_text())
    if not isinstance(value, dict):
        raise ValueError(f"{path} is not a JSON object")
    return value


def transformer_size(model_dir: Path) -> dict[str, Any]:
    """`QwenTransformer`'s arguments from `transformer/config.json` (empty: mflux's defaults)."""
    config = _read_json(model_dir / "transformer" / "config.json")
    return {k: config[k] for k in TRANSFORMER_KEYS if k in config}


def text_encoder_size(model_dir: Path) -> TextEncoderSize:
    """The text encoder's sizes from `text_encoder/config.json` (Qwen2.5-VL's layout: the
    language model's keys at the top or under `text_config`, the tower's under
    `vision_config`)."""
    config = _read_json(model_dir / "text_encoder" / "config.json")
    text = {**config, **config.get("text_config", {})}
    default = TextEncoderSize()
    vision_config = config.get("vision_config", {})
    vision_default = VisionSize()
    vision = VisionSize(
        depth=int(vision_config.get("depth", vision_default.depth)),
        hidden_size=int(vision_config.get("hidden_size", vision_default.hidden_size)),
        num_heads=int(vision_config.get("num_heads", vision_default.num_heads)),
        intermediate_size=int(
            vision_config.get("intermediate_size", vision_default.intermediate_size)
        ),
        out_hidden_size=int(
            vision_config.get("out_hidden_size", text.get("hidden_size", default.hidden_size))
        ),
        fullatt_block_indexes=tuple(
            vision_config.get("fullatt_block_indexes", vision_default.fullatt_block_indexes)
        ),
    )
    rope_scaling = text.get("rope_scaling") or {}
    return TextEncoderSize(
        vocab_size=int(text.get("vocab_size", default.vocab_size)),
        hidden_size=int(text.get("hidden_size", default.hidden_size)),
        num_hidden_layers=int(text.get("num_hidden_layers", default.num_hidden_layers)),
        num_attention_heads=int(text.get("num_attention_heads", default.num_attention_heads)),
        num_key_value_heads=int(text.get("num_key_value_heads", default.num_key_value_heads)),
        intermediate_size=int(text.get("intermediate_size", default.intermediate_size)),
        rms_norm_eps=float(text.get("rms_norm_eps", default.rms_norm_eps)),
        rope_theta=float(text.get("rope_theta", default.rope_theta)),
        mrope_section=tuple(rope_scaling.get("mrope_section", default.mrope_section)),
        image_token_id=int(config.get("image_token_id", default.image_token_id)),
        vision=vision,
    )


def build_text_encoder(size: TextEncoderSize) -> Any:
    """mflux's `QwenTextEncoder` with the language model at `size`.

    `QwenEncoder` takes the vocabulary, width and depth, but builds its layers with
    Qwen2.5-VL-7B's heads and MLP and sizes its rotary embedding by width // 28 (the 7B's
    head size): both are rebuilt here from `size`."""
    from mflux.models.qwen.model.qwen_text_encoder.qwen_attention import QwenAttention
    from mflux.models.qwen.model.qwen_text_encoder.qwen_encoder import QwenEncoder
    from mflux.models.qwen.model.qwen_text_encoder.qwen_encoder_layer import QwenEncoderLayer
    from mflux.models.qwen.model.qwen_text_encoder.qwen_rope import QwenRotaryEmbedding
    from mflux.models.qwen.model.qwen_text_encoder.qwen_text_encoder import QwenTextEncoder

    head_dim = size.hidden_size // size.num_attention_heads
    encoder = QwenEncoder(
        vocab_size=size.vocab_size,
        hidden_size=size.hidden_size,
        num_hidden_layers=0,
        rope_theta=size.rope_theta,
    )
    layers = []
    for _ in range(size.num_hidden_layers):
        layer = QwenEncoderLayer(
            hidden_size=size.hidden_size,
            num_attention_heads=size.num_attention_heads,
            num_key_value_heads=size.num_key_value_heads,
            intermediate_size=size.intermediate_size,
            rms_norm_eps=size.rms_norm_eps,
            rope_theta=size.rope_theta,
        )
        layer.self_attn = QwenAttention(
            hidden_size=size.hidden_size,
            num_attention_heads=size.num_attention_heads,
            num_key_value_heads=size.num_key_value_heads,
            rope_theta=size.rope_theta,
            rope_scaling={"mrope_section": list(size.mrope_section)},
        )
        layers.append(layer)
    encoder.layers = layers
    encoder.num_hidden_layers = size.num_hidden_layers
    encoder.rotary_emb = QwenRotaryEmbedding(dim=head_dim, base=size.rope_theta)
    encoder.image_token_id = size.image_token_id
    text_encoder = QwenTextEncoder()  # its own 7B encoder is built lazily: never computed
    text_encoder.encoder = encoder
    return text_encoder


def build_vision_tower(size: VisionSize) -> Any:
    from mflux.models.qwen.model.qwen_text_encoder.qwen_vision_transformer import (
        VisionTransformer,
    )

    return VisionTransformer(
        embed_dim=size.hidden_size,
        depth=size.depth,
        num_heads=size.num_heads,
        mlp_ratio=size.intermediate_size / size.hidden_size,
        hidden_size=size.out_hidden_size,
        fullatt_block_indexes=list(size.fullatt_block_indexes),
    )


@contextmanager
def _sized_modules(model_dir: Path) -> Iterator[None]:
    """While mflux's initializer runs, it builds the parts at the folder's sizes."""
    from mflux.models.qwen.model.qwen_transformer.qwen_transformer import QwenTransformer
    from mflux.models.qwen.model.qwen_vae.qwen_vae import QwenVAE
    from mflux.models.qwen.qwen_initializer import QwenImageInitializer

    transformer_args = transformer_size(model_dir)
    encoder_size = text_encoder_size(model_dir)

    def init_models(model: Any) -> None:
        model.vae = QwenVAE()
        overrides = model.model_config.transformer_overrides or {}
        model.transformer = QwenTransformer(**{**overrides, **transformer_args})
        model.text_encoder = build_text_encoder(encoder_size)

    def init_edit_models(model: Any) -> None:
        init_models(model)
        model.text_encoder.encoder.visual = build_vision_tower(encoder_size.vision)

    with (
        mock.patch.object(QwenImageInitializer, "_init_models", staticmethod(init_models)),
        mock.patch.object(
            QwenImageInitializer, "_init_edit_models", staticmethod(init_edit_models)
        ),
    ):
        yield


def load_qwen(model_dir: Path, config_name: str, edits: bool) -> Any:
    """mflux's `QwenImage` (or `QwenImageEdit`) from `model_dir`, at its own sizes."""
    from mflux.models.common.config.model_config import ModelConfig

    config = ModelConfig.from_name(model_name=config_name, base_model=None)
    with _sized_modules(model_dir):
        if edits:
            from mflux.models.qwen.variants.edit.qwen_image_edit import QwenImageEdit

            return QwenImageEdit(model_path=str(model_dir), model_config=config)
        from mflux.models.qwen.variants.txt2img.qwen_image import QwenImage

        return QwenImage(model_path=str(model_dir), model_config=config)
