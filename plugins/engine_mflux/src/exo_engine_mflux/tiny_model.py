"""A small random-weight FLUX.1 model in mflux's own saved layout, for tests and benchmarks
(`--family qwen-image` / `qwen-image-edit`: `tiny_qwen`'s).

There are no image weights on the test machines, so this writes what `mflux-save` would write
(one directory per component, safetensors shards carrying `mflux_version` metadata, and the
two tokenizers), with only the block counts cut down. mflux's loader then reads it like any
saved model. The transformer keeps FLUX.1's 3072-wide blocks (mflux hard-codes them); the
encoders keep only what the engine loads (see `pipeline._trim_encoders`); the VAE is narrowed
(`VAE_SHRINK`: mflux reads its widths from the weights) so that 256x256 decodes in seconds.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

# Small vocabularies: the text encoders' embedding tables shrink with them.
_T5_PIECES = [*"abcdefghijklmnopqrstuvwxyz0123456789.,!?'-"]
MFLUX_VERSION = "0.24.0"


def _clip_tokenizer_json() -> dict[str, object]:
    """A byte-level BPE without merges: every character is one token, as CLIPTokenizer wants.

    The end-of-text token has the highest id, as in CLIP: mflux pools at the argmax id."""
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab: dict[str, int] = {}
    for char in alphabet:
        vocab[char] = len(vocab)
        vocab[char + "</w>"] = len(vocab)
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return {"model": {"type": "BPE", "vocab": vocab, "merges": []}, "size": len(vocab)}


def _t5_vocab() -> list[tuple[str, float]]:
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    pieces += [(p, -3.0) for p in _T5_PIECES]
    pieces += [("\u2581" + p, -2.5) for p in _T5_PIECES]
    return pieces


def _write_tokenizers(root: Path, t5_max_length: int) -> tuple[int, int]:
    """Write tokenizer/ (CLIP) and tokenizer_2/ (T5); return their vocabulary sizes."""
    from tokenizers import Tokenizer, models

    clip = _clip_tokenizer_json()
    clip_dir = root / "tokenizer"
    clip_dir.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE(vocab=clip["model"]["vocab"], merges=[], end_of_word_suffix="</w>"))  # type: ignore[index]
    bpe.save(str(clip_dir / "tokenizer.json"))
    (clip_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "CLIPTokenizer",
                "bos_token": "<|startoftext|>",
                "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>",
                "unk_token": "<|endoftext|>",
                "model_max_length": 77,
            }
        )
    )
    t5_dir = root / "tokenizer_2"
    t5_dir.mkdir(parents=True, exist_ok=True)
    vocab = _t5_vocab()
    Tokenizer(models.Unigram(vocab, unk_id=2)).save(str(t5_dir / "tokenizer.json"))
    (t5_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "T5Tokenizer",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<pad>",
                "extra_ids": 0,
                "model_max_length": t5_max_length,
            }
        )
    )
    return int(clip["size"]), len(vocab)  # type: ignore[arg-type]


def save_component(root: Path, subdir: str, params: dict[str, mx.array]) -> int:
    path = root / subdir
    path.mkdir(parents=True, exist_ok=True)
    meta = {"quantization_level": "None", "mflux_version": MFLUX_VERSION}
    mx.save_safetensors(str(path / "0.safetensors"), params, meta)
    index = {"metadata": meta, "weight_map": dict.fromkeys(params, "0.safetensors")}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    return sum(v.nbytes for v in params.values())


def randomized(
    params: dict[str, mx.array],
    seed: int,
    scale: float = 0.02,
    is_scale: Callable[[str, mx.array], bool] | None = None,
) -> dict[str, mx.array]:
    """Small random weights (norm scales stay 1): the activations neither vanish nor explode.

    1-D weights are taken for norm scales, and so is any tensor `is_scale` names. Stored in bf16, as hub weights are (half the bytes to write); the engine runs them in fp32."""
    # Drawing 300M normal values costs ~1 min on two busy cores: values are cut from one
    # pool of 1M draws instead, at a different offset for each tensor.
    rng = np.random.default_rng(seed)
    pool = rng.standard_normal(1 << 20, dtype=np.float32) * scale
    out: dict[str, mx.array] = {}
    for name, value in sorted(params.items()):
        if value.ndim == 1 or (is_scale is not None and is_scale(name, value)):
            out[name] = mx.ones(value.shape) if name.endswith("weight") else mx.zeros(value.shape)
        else:
            shifted = np.roll(pool, int(rng.integers(pool.size)))
            out[name] = mx.array(np.resize(shifted, value.shape))
        out[name] = out[name].astype(mx.bfloat16)
        mx.eval(out[name])
    return out


# The VAE's channel widths (128, 256, 512) shrink by this factor, to at least 32 (its group
# norms have 32 groups). mflux takes the widths from the weights, and a full-width VAE takes
# ~100 s to decode 256x256 on two busy cores.
VAE_SHRINK = 8
_VAE_WIDTHS = (128, 256, 512)


def _narrow_vae(params: dict[str, mx.array], shrink: int) -> dict[str, mx.array]:
    """The VAE's parameters with every channel width divided by `shrink` (latent and RGB
    channels and kernel sizes stay)."""
    if shrink <= 1:
        return params

    def width(d: int) -> int:
        return max(32, d // shrink) if d in _VAE_WIDTHS else d

    return {name: mx.zeros(tuple(width(d) for d in v.shape)) for name, v in params.items()}


def write_tiny_flux(
    root: Path,
    *,
    joint_blocks: int = 0,
    single_blocks: int = 1,
    clip_layers: int = 1,
    t5_blocks: int = 0,
    t5_max_length: int = 16,
    seed: int = 0,
    guidance_embeds: bool = False,
    vae_shrink: int = VAE_SHRINK,
) -> dict[str, int]:
    """Write the model into `root`; return the bytes of each component."""
    from mflux.models.common.config.model_config import ModelConfig
    from mflux.models.flux.model.flux_text_encoder.clip_encoder.clip_encoder import CLIPEncoder
    from mflux.models.flux.model.flux_text_encoder.t5_encoder.t5_encoder import T5Encoder
    from mflux.models.flux.model.flux_transformer.transformer import Transformer
    from mflux.models.flux.model.flux_vae.vae import VAE

    clip_vocab, t5_vocab = _write_tokenizers(root, t5_max_length)
    config = ModelConfig.dev() if guidance_embeds else ModelConfig.schnell()
    sizes: dict[str, int] = {}

    # Modules are built lazily by MLX: parameters left out below are never materialized.
    transformer = Transformer(config, joint_blocks, single_blocks)
    sizes["transformer"] = save_component(
        root, "transformer", randomized(dict(tree_flatten(transformer.parameters())), seed)
    )
    vae = _narrow_vae(dict(tree_flatten(VAE().parameters())), vae_shrink)
    sizes["vae"] = save_component(root, "vae", randomized(vae, seed + 1))

    clip = dict(tree_flatten(CLIPEncoder().parameters()))
    clip = {
        k: v
        for k, v in clip.items()
        if not k.startswith("text_model.encoder.layers.") or int(k.split(".")[3]) < clip_layers
    }
    clip["text_model.embeddings.token_embedding.weight"] = mx.zeros((clip_vocab, 768))
    sizes["clip_encoder"] = save_component(root, "text_encoder", randomized(clip, seed + 2))

    t5 = dict(tree_flatten(T5Encoder().parameters()))
    t5 = {
        k: v
        for k, v in t5.items()
        if not k.startswith("t5_blocks.") or int(k.split(".")[1]) < t5_blocks
    }
    t5["shared.weight"] = mx.zeros((t5_vocab, 4096))
    sizes["t5_encoder"] = save_component(root, "text_encoder_2", randomized(t5, seed + 3))
    return sizes


def write_tiny_model_with_card(root: Path, model_id: str, **kwargs: int | bool) -> Path:
    """The tiny model plus its exo card (`exo-image-card.json`), so that `exo` serves it as
    `model_id` when `root` is in its models directory."""
    from exo_engine_mflux.cards import local_flux_card, write_card

    sizes = write_tiny_flux(root, **kwargs)  # type: ignore[arg-type]
    blocks = int(kwargs.get("joint_blocks", 0)) + int(kwargs.get("single_blocks", 1))
    write_card(root, local_flux_card(root, model_id, sizes, blocks=blocks))
    return root


FAMILIES = ("flux1-schnell", "qwen-image", "qwen-image-edit")


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="write a tiny random-weight image model")
    parser.add_argument("out", help="the model directory (e.g. <exo data dir>/models/tiny-flux)")
    parser.add_argument("--model-id", default="tiny-flux")
    parser.add_argument("--family", choices=FAMILIES, default="flux1-schnell")
    parser.add_argument("--joint-blocks", type=int, default=0, help="FLUX.1 only")
    parser.add_argument("--single-blocks", type=int, default=1, help="FLUX.1 only")
    args = parser.parse_args()
    out = Path(args.out)
    if args.family == "flux1-schnell":
        write_tiny_model_with_card(
            out, args.model_id, joint_blocks=args.joint_blocks, single_blocks=args.single_blocks
        )
    else:
        from exo_engine_mflux.tiny_qwen import write_tiny_qwen_with_card

        write_tiny_qwen_with_card(out, args.model_id, edit=args.family == "qwen-image-edit")
    print(f"wrote {args.model_id} ({args.family}) to {out}")


if __name__ == "__main__":
    main()
