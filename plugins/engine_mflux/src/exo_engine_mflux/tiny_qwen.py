"""A tiny random-weight Qwen-Image (or Qwen-Image-Edit) in mflux's saved layout.

Every part is small, not only the block count: the transformer's width and depth and the
text encoder's sizes are written into `transformer/config.json` and `text_encoder/config.json`
(the files a hub model has), which `exo_engine_mflux.qwen` builds mflux's modules from; the
tokenizer is byte-level with Qwen's special tokens (a 263-token embedding instead of 152064);
the VAE is narrowed (mflux reads its widths from the weights). A 64x64 image then takes well
under a second a step on two busy cores, where full-width parts took minutes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from exo_core.plugin import ModelTask
from exo_engine_mflux.tiny_model import randomized, save_component

# Qwen's special tokens, after the 256 byte-level tokens (the edit model's tokenizer finds the
# image placeholder by name; the text encoder by `image_token_id` in its config).
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# The VAE's widths (96, 192, 384 and the multiples its convolutions take) shrink by this:
# 8, 16, 32 wide, its 3D convolutions encode and decode 64x64 in a fraction of a second.
VAE_SHRINK = 12
# The random weights' spread: about 1/sqrt(width), so that the prompt visibly changes the
# image (at FLUX's tiny model's 0.02 two prompts differed by one level in a few pixels).
WEIGHT_SCALE = 0.06
_VAE_BASE_WIDTH = 96

# The transformer keeps mflux's head size (its rotary embedding covers 128 dimensions).
TRANSFORMER_CONFIG: dict[str, Any] = {
    "_class_name": "QwenImageTransformer2DModel",
    "attention_head_dim": 128,
    "axes_dims_rope": [16, 56, 56],
    "in_channels": 64,
    "joint_attention_dim": 64,
    "num_attention_heads": 1,
    "num_layers": 2,
    "out_channels": 16,
    "patch_size": 2,
}
TEXT_ENCODER_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
    "num_key_value_heads": 1,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    # Doubled, the sections cover the 32-wide heads (Qwen2.5-VL-7B: 16, 24, 24 of 128).
    "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]},
    "vision_config": {
        "depth": 1,
        "hidden_size": 32,
        "num_heads": 2,
        "intermediate_size": 64,
        "out_hidden_size": 64,
        "fullatt_block_indexes": [0],
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
    },
}


def _write_tokenizer(root: Path) -> dict[str, int]:
    """tokenizer/: a byte-level BPE without merges (every byte one token), Qwen's specials."""
    from tokenizers import pre_tokenizers

    vocab = {char: i for i, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    specials = {token: len(vocab) + i for i, token in enumerate(SPECIAL_TOKENS)}
    directory = root / "tokenizer"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.json").write_text(json.dumps(vocab))
    (directory / "merges.txt").write_text("#version: 0.2\n")
    added = {
        str(i): {"content": token, "special": True, "normalized": False}
        for token, i in specials.items()
    }
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "Qwen2Tokenizer",
                "added_tokens_decoder": added,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "model_max_length": 4096,
            }
        )
    )
    return {**vocab, **specials}


def _narrow_vae(params: dict[str, mx.array], shrink: int) -> dict[str, mx.array]:
    """Every width that is a multiple of the VAE's base width, divided by `shrink` (the
    latent, RGB and kernel sizes stay)."""

    def width(d: int) -> int:
        return d // shrink if d % _VAE_BASE_WIDTH == 0 else d

    return {name: mx.zeros(tuple(width(d) for d in v.shape)) for name, v in params.items()}


def _is_scale(name: str, value: mx.array) -> bool:
    """A norm's scale (the VAE keeps its as (C, 1, 1, 1)): it stays 1."""
    return "norm" in name.rsplit(".", 2)[-2] and value.size == max(value.shape)


def _weights(module: Any) -> dict[str, mx.array]:
    """A module's parameters without the rotary embeddings' frequency tables (computed, not
    loaded)."""
    flat = dict(tree_flatten(module.parameters()))
    return {k: v for k, v in flat.items() if not k.endswith("inv_freq")}


def write_tiny_qwen(
    root: Path, *, edit: bool = False, seed: int = 0, vae_shrink: int = VAE_SHRINK
) -> dict[str, int]:
    """Write the model into `root`; return the bytes of each component (the card's names)."""
    from mflux.models.qwen.model.qwen_transformer.qwen_transformer import QwenTransformer
    from mflux.models.qwen.model.qwen_vae.qwen_vae import QwenVAE

    from exo_engine_mflux.qwen import (
        build_text_encoder,
        build_vision_tower,
        text_encoder_size,
        transformer_size,
    )

    vocab = _write_tokenizer(root)
    encoder_config = {
        **TEXT_ENCODER_CONFIG,
        "vocab_size": len(vocab),
        "image_token_id": vocab["<|image_pad|>"],
        "video_token_id": vocab["<|video_pad|>"],
        "vision_start_token_id": vocab["<|vision_start|>"],
    }
    for subdir, config in (("transformer", TRANSFORMER_CONFIG), ("text_encoder", encoder_config)):
        (root / subdir).mkdir(parents=True, exist_ok=True)
        (root / subdir / "config.json").write_text(json.dumps(config, indent=1))

    # Built by the same code the runner loads them with (MLX builds lazily: nothing of the
    # initial values is computed).
    transformer = QwenTransformer(**transformer_size(root))
    encoder_size = text_encoder_size(root)
    text_encoder = build_text_encoder(encoder_size)
    if edit:
        text_encoder.encoder.visual = build_vision_tower(encoder_size.vision)
    vae = _narrow_vae(dict(tree_flatten(QwenVAE().parameters())), vae_shrink)
    sizes: dict[str, int] = {}
    for name, params, offset in (
        ("transformer", _weights(transformer), 0),
        ("text_encoder", _weights(text_encoder), 1),
        ("vae", vae, 2),
    ):
        sizes[name] = save_component(
            root, name, randomized(params, seed + offset, scale=WEIGHT_SCALE, is_scale=_is_scale)
        )
    return sizes


def write_tiny_qwen_with_card(root: Path, model_id: str, *, edit: bool = False) -> Path:
    """The tiny model plus its exo card, served as `model_id` from a node's models directory:
    Qwen-Image generates, Qwen-Image-Edit edits (as their hub cards say)."""
    from exo_engine_mflux.cards import local_image_card, write_card

    sizes = write_tiny_qwen(root, edit=edit)
    card = local_image_card(
        root,
        model_id,
        sizes,
        blocks=int(TRANSFORMER_CONFIG["num_layers"]),
        family="qwen-image-edit" if edit else "qwen-image",
        tasks=(ModelTask.IMAGE_EDIT,) if edit else (ModelTask.IMAGE_GENERATION,),
        hidden_size=int(TRANSFORMER_CONFIG["num_attention_heads"])
        * int(TRANSFORMER_CONFIG["attention_head_dim"]),
        uses_cfg=True,
    )
    write_card(root, card)
    return root
