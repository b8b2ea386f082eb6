"""The Qwen-Image adapter builds mflux's modules at the sizes of the model folder's config files:
a full model's configs give exactly mflux's own modules, a tiny model's give tiny ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlx.utils import tree_flatten

from exo_engine_mflux.qwen import (
    TextEncoderSize,
    build_text_encoder,
    build_vision_tower,
    text_encoder_size,
    transformer_size,
)

# The published configs of Qwen/Qwen-Image (transformer/, text_encoder/), the keys read here.
QWEN_IMAGE_TRANSFORMER = {
    "_class_name": "QwenImageTransformer2DModel",
    "attention_head_dim": 128,
    "axes_dims_rope": [16, 56, 56],
    "guidance_embeds": False,
    "in_channels": 64,
    "joint_attention_dim": 3584,
    "num_attention_heads": 24,
    "num_layers": 60,
    "out_channels": 16,
    "patch_size": 2,
}
QWEN25_VL_7B_TEXT = {
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"mrope_section": [16, 24, 24], "rope_type": "default", "type": "default"},
    "rope_theta": 1000000.0,
    "vocab_size": 152064,
}
QWEN25_VL_7B_VISION = {
    "depth": 32,
    "fullatt_block_indexes": [7, 15, 23, 31],
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "out_hidden_size": 3584,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
}


def _write(model_dir: Path, text_encoder: dict[str, object]) -> Path:
    for sub, config in (("transformer", QWEN_IMAGE_TRANSFORMER), ("text_encoder", text_encoder)):
        (model_dir / sub).mkdir(parents=True, exist_ok=True)
        (model_dir / sub / "config.json").write_text(json.dumps(config))
    return model_dir


def _shapes(module: object) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in tree_flatten(module.parameters())}  # type: ignore[attr-defined]


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "text_config"])
def test_a_full_models_configs_build_mflux_own_modules(tmp_path: Path, nested: bool) -> None:
    """(MLX builds lazily: the 7B's shapes are compared, no weight is computed.)"""
    from mflux.models.qwen.model.qwen_text_encoder.qwen_text_encoder import QwenTextEncoder
    from mflux.models.qwen.model.qwen_text_encoder.qwen_vision_transformer import (
        VisionTransformer,
    )
    from mflux.models.qwen.model.qwen_transformer.qwen_transformer import QwenTransformer

    text = {"text_config": QWEN25_VL_7B_TEXT} if nested else dict(QWEN25_VL_7B_TEXT)
    model_dir = _write(
        tmp_path, {**text, "image_token_id": 151655, "vision_config": QWEN25_VL_7B_VISION}
    )
    assert text_encoder_size(model_dir) == TextEncoderSize()
    size = text_encoder_size(model_dir)
    assert _shapes(build_text_encoder(size)) == _shapes(QwenTextEncoder())
    assert _shapes(build_vision_tower(size.vision)) == _shapes(VisionTransformer())
    assert _shapes(QwenTransformer(**transformer_size(model_dir))) == _shapes(QwenTransformer())


def test_a_folder_without_configs_gets_mflux_defaults(tmp_path: Path) -> None:
    assert transformer_size(tmp_path) == {}
    assert text_encoder_size(tmp_path) == TextEncoderSize()


def test_the_tiny_model_is_small_in_every_part(tmp_path: Path) -> None:
    from exo_engine_mflux.tiny_qwen import write_tiny_qwen

    sizes = write_tiny_qwen(tmp_path, edit=True)
    assert set(sizes) == {"transformer", "text_encoder", "vae"}
    assert sum(sizes.values()) < 8_000_000, sizes  # the full model: ~58 GB
    encoder = text_encoder_size(tmp_path)
    assert (encoder.vocab_size, encoder.hidden_size, encoder.num_hidden_layers) == (263, 64, 1)
    assert transformer_size(tmp_path)["num_layers"] == 2
