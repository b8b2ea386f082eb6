"""A tiny random-weight vision-language model (Gemma 3's layout: mlx-lm's text model, mlx-vlm's
SigLIP tower and projector) with its exo card, for tests and for trying images without a hub.

    python -m exo_engine_mlx.tiny_vision ~/.local/share/exo/models/tiny-vision --model-id tiny-vision
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from exo_core.plugin import Capability, ModelCard, ModelId
from exo_engine_mlx.cards import write_imported_card
from exo_engine_mlx.tiny_model import make_tiny_model

START, END = "<start_of_image>", "<end_of_image>"
# A message's parts in order, an image as Gemma 3's template writes it: its start marker.
VISION_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for p in m['content'] %}{% if p['type'] == 'image' %}" + START + "{% else %}"
    "{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VISION = {
    "model_type": "siglip_vision_model",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "patch_size": 8,
    "image_size": 32,  # 4x4 patches, pooled to 2x2: 4 soft tokens an image
}
TOKENS_PER_IMAGE = 4
_TEXT = {
    "model_type": "gemma3_text",
    "head_dim": 16,
    "query_pre_attn_scalar": 16,
    "sliding_window_pattern": 2,
}


def _token_id(out: Path, token: str) -> int:
    vocab = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    added = json.loads((out / "tokenizer.json").read_text())["added_tokens"]
    return next((t["id"] for t in added if t["content"] == token), vocab.get(token))


def _vision_weights(config: dict[str, Any], seed: int) -> dict[str, mx.array]:
    from mlx_vlm.models.gemma3.config import ModelConfig, TextConfig, VisionConfig
    from mlx_vlm.models.gemma3.gemma3 import Gemma3MultiModalProjector
    from mlx_vlm.models.gemma3.vision import VisionModel

    text = TextConfig.from_dict(config["text_config"])
    vision = VisionConfig.from_dict(config["vision_config"])
    mx.random.seed(seed)
    modules = {
        "vision_tower": VisionModel(vision),
        "multi_modal_projector": Gemma3MultiModalProjector(
            ModelConfig(text_config=text, vision_config=vision, model_type="gemma3")
        ),
    }
    weights: dict[str, mx.array] = {}
    for prefix, module in modules.items():
        for name, value in tree_flatten(module.parameters()):
            assert isinstance(value, mx.array)
            if value.ndim >= 2:  # random, large enough that different images differ clearly
                value = mx.random.normal(value.shape) * value.shape[-1] ** -0.5 * 4
            weights[f"{prefix}.{name}"] = value.astype(mx.float32)
    return weights


def write_tiny_vision(out: Path, model_id: str, *, layers: int = 2, seed: int = 0) -> Path:
    """The model and its card (`exo-card.json`) in `out`; returns `out`."""
    make_tiny_model(
        out,
        model_type="gemma3",
        layers=layers,
        seed=seed,
        special_tokens=(START, END),
        chat_template=VISION_TEMPLATE,
        # Every layer sees the whole prompt (the tiny family's window is 8 tokens), so the
        # image's few soft tokens reach the answer through each layer.
        overrides={"text_config": {**_TEXT, "sliding_window": 1024}},
    )
    config = json.loads((out / "config.json").read_text())
    start, end = _token_id(out, START), _token_id(out, END)
    rows = int(config["text_config"]["vocab_size"])
    config["text_config"]["mm_tokens_per_image"] = TOKENS_PER_IMAGE
    config.update(
        vision_config=VISION,
        boi_token_index=start,
        eoi_token_index=end,
        image_token_index=rows,  # mlx-vlm's soft-token id; exo uses ids past the vocabulary
        mm_tokens_per_image=TOKENS_PER_IMAGE,
    )
    (out / "config.json").write_text(json.dumps(config, indent=1))
    mx.save_safetensors(str(out / "model-vision.safetensors"), _vision_weights(config, seed + 1))
    size = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    card = ModelCard(
        model_id=ModelId(model_id),
        family="gemma3",
        model_type="gemma3",
        n_layers=layers,
        hidden_size=int(config["text_config"]["hidden_size"]),
        num_key_value_heads=int(config["text_config"].get("num_key_value_heads", 2)),
        storage_size_bytes=size,
        context_length=2048,
        capabilities=(Capability.TEXT, Capability.VISION),
        source=f"local:{out}",
    )
    write_imported_card(out, card)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="write a tiny random-weight vision model")
    parser.add_argument("out", help="the model directory (e.g. <exo data dir>/models/tiny-vision)")
    parser.add_argument("--model-id", default="tiny-vision")
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    out = write_tiny_vision(Path(args.out), args.model_id, layers=args.layers)
    print(f"wrote {args.model_id} to {out}")


if __name__ == "__main__":
    main()
