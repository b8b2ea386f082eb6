"""Convert a llama-architecture GGUF into an MLX model directory `mlx_lm.load` reads.

Weights are taken exactly as `mx.load(gguf)` returns them: Q4_0/Q4_1/Q8_0 arrive as MLX
affine triplets (weight, scales, biases; group 32), F32/F16 as plain arrays. Two changes, both
exact: F16 tensors and the fp16 scales/biases are upcast to float32, because the CPU backend
must never compute in fp16 (10x slower and the hidden state would follow the scale dtype).

Q and K stay in llama.cpp's permuted row order; `rope_traditional: true` applies RoPE to
interleaved pairs, which is what that permutation encodes, so the logits match a reference
that un-permutes the rows and uses the half-split RoPE.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .reader import GGUFHeader, GGUFImportError, read_header

# MLX and `tokenizers` are imported where a conversion runs: a node reads cards' fields from
# GGUF headers at start-up and never converts in its own process (see embedded.py).
if TYPE_CHECKING:
    import mlx.core as mx

    from .tokenizer import TokenizerFiles

CONVERTER_VERSION = 1
MARKER_FILE = "exo_gguf_import.json"

SUPPORTED_TYPES = {"F32", "F16", "Q4_0", "Q4_1", "Q8_0"}
_BITS = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}
_GROUP_SIZE = 32  # ggml's block size for all three quantized types

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.([a-z_]+)\.weight")


@dataclass(frozen=True)
class ModelCardFields:
    architecture: str
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    context_length: int
    n_params: int
    size_bytes: int  # the GGUF file
    dense_fp32_bytes: int  # all weights dequantized to float32

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def module_name(gguf_name: str) -> str:
    """mlx-lm module path for a GGUF tensor name without its `.weight` suffix."""
    if gguf_name.endswith(".weight"):
        base = gguf_name.removesuffix(".weight")
        if base in _GLOBAL_NAMES:
            return _GLOBAL_NAMES[base]
        m = _BLOCK_RE.fullmatch(gguf_name)
        if m and m.group(2) in _BLOCK_NAMES:
            return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}"
    raise GGUFImportError(f"unexpected tensor {gguf_name!r} for a llama model")


def check_supported(header: GGUFHeader) -> None:
    """Refuse what the converter cannot map faithfully, with the reason."""
    arch = header.architecture
    if arch != "llama":
        raise GGUFImportError(f"unsupported architecture {arch!r}: only 'llama' can be imported")
    if int(header.get("llama.expert_count", 0) or 0) > 0:
        raise GGUFImportError("mixture-of-experts llama models are not supported")
    bad = sorted({t.type_name for t in header.tensors} - SUPPORTED_TYPES)
    if bad:
        raise GGUFImportError(
            f"unsupported tensor type(s) {', '.join(bad)}: supported are "
            f"{', '.join(sorted(SUPPORTED_TYPES))} (re-quantize to Q4_0, Q4_1 or Q8_0)"
        )
    names = {t.name for t in header.tensors}
    if "rope_freqs.weight" in names:
        raise GGUFImportError("Llama 3 style RoPE frequency scaling (rope_freqs) is not supported")
    scaling = header.get("llama.rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise GGUFImportError(f"unsupported RoPE scaling {scaling!r}")
    for t in header.tensors:
        module_name(t.name)
    if "token_embd.weight" not in names:
        raise GGUFImportError("missing token_embd.weight")


def _dims(header: GGUFHeader) -> dict[str, Any]:
    hidden = int(header.require("llama.embedding_length"))
    heads = int(header.require("llama.attention.head_count"))
    head_dim = int(header.get("llama.attention.key_length", hidden // heads))
    rope_dim = int(header.get("llama.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise GGUFImportError(f"partial RoPE ({rope_dim} of {head_dim} dims) is not supported")
    embd = next(t for t in header.tensors if t.name == "token_embd.weight")
    return {
        "hidden_size": hidden,
        "num_hidden_layers": int(header.require("llama.block_count")),
        "intermediate_size": int(header.require("llama.feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(header.get("llama.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "vocab_size": embd.shape[0],
        "max_position_embeddings": int(header.get("llama.context_length", 2048)),
    }


def build_config(header: GGUFHeader, eos_ids: list[int], bos_id: int | None) -> dict[str, Any]:
    names = {t.name: t for t in header.tensors}
    config: dict[str, Any] = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        **_dims(header),
        "rms_norm_eps": float(header.get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(header.get("llama.rope.freq_base", 10000.0)),
        # llama.cpp's converter permuted Q/K rows into interleaved pairs: see module doc.
        "rope_traditional": True,
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }
    if header.get("llama.rope.scaling.type") == "linear":
        config["rope_scaling"] = {
            "type": "linear",
            "factor": float(header.require("llama.rope.scaling.factor")),
        }
    if eos_ids:
        config["eos_token_id"] = eos_ids[0] if len(eos_ids) == 1 else eos_ids
    if bos_id is not None:
        config["bos_token_id"] = bos_id
    quantized = [t for t in header.tensors if t.type_name in _BITS]
    if quantized:
        # Per-module entries: types can differ (SmolLM2: Q8_0 embedding, Q4_1 elsewhere).
        most = max(_BITS.values(), key=lambda b: sum(_BITS[t.type_name] == b for t in quantized))
        quant: dict[str, Any] = {"group_size": _GROUP_SIZE, "bits": most, "mode": "affine"}
        for t in quantized:
            quant[module_name(t.name)] = {
                "group_size": _GROUP_SIZE,
                "bits": _BITS[t.type_name],
                "mode": "affine",
            }
        config["quantization"] = quant
        config["quantization_config"] = quant
    return config


def convert_weights(gguf_path: Path, header: GGUFHeader) -> dict[str, mx.array]:
    """GGUF tensors renamed to mlx-lm's names; fp16 upcast to fp32 (exact)."""
    import mlx.core as mx

    raw = mx.load(str(gguf_path))
    if not isinstance(raw, dict):
        raise GGUFImportError(f"{gguf_path.name}: mx.load returned no tensor dict")
    out: dict[str, mx.array] = {}
    for t in header.tensors:
        prefix = t.name.removesuffix(".weight")
        target = module_name(t.name)
        parts = ("weight", "scales", "biases") if t.type_name in _BITS else ("weight",)
        for part in parts:
            key = f"{prefix}.{part}" if part != "weight" else t.name
            if key not in raw:
                raise GGUFImportError(f"mx.load did not return {key!r}")
            arr = raw[key]
            if arr.dtype in (mx.float16, mx.bfloat16):
                arr = arr.astype(mx.float32)
            out[f"{target}.{part}"] = arr
    return out


def card_fields(header: GGUFHeader, size_bytes: int) -> ModelCardFields:
    dims = _dims(header)
    n_params = sum(t.n_elements for t in header.tensors)
    return ModelCardFields(
        architecture=header.architecture,
        n_layers=dims["num_hidden_layers"],
        hidden_size=dims["hidden_size"],
        n_heads=dims["num_attention_heads"],
        n_kv_heads=dims["num_key_value_heads"],
        vocab_size=dims["vocab_size"],
        context_length=dims["max_position_embeddings"],
        n_params=n_params,
        size_bytes=size_bytes,
        dense_fp32_bytes=4 * n_params,
    )


def gguf_model_card_fields(gguf_path: Path) -> ModelCardFields:
    """Model-card fields of a llama GGUF, from its header alone (milliseconds)."""
    gguf_path = Path(gguf_path)
    header = read_header(gguf_path)
    if header.architecture != "llama":
        raise GGUFImportError(f"unsupported architecture {header.architecture!r}")
    return card_fields(header, gguf_path.stat().st_size)


def _write_dir(
    gguf_path: Path, header: GGUFHeader, tok: TokenizerFiles, tmp: Path, model_id: str
) -> None:
    import mlx.core as mx

    config = build_config(header, tok.eos_token_ids, tok.bos_token_id)
    weights = convert_weights(gguf_path, header)
    mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    (tmp / "tokenizer.json").write_text(tok.tokenizer_json)
    (tmp / "tokenizer_config.json").write_text(
        json.dumps(tok.tokenizer_config, indent=2, ensure_ascii=False)
    )
    marker = {
        "model_id": model_id,
        "source": gguf_path.name,
        "source_size": gguf_path.stat().st_size,
        "converter_version": CONVERTER_VERSION,
        "card": card_fields(header, gguf_path.stat().st_size).as_dict(),
    }
    # Written last: its presence inside a renamed directory means a complete import.
    (tmp / MARKER_FILE).write_text(json.dumps(marker, indent=2))


def import_gguf(gguf_path: Path, out_dir: Path, model_id: str) -> Path:
    """Convert `gguf_path` into the MLX model directory `out_dir` and return it.

    The directory is written under a temporary name beside `out_dir` and renamed into place,
    so a reader never sees a half-written model. An existing `out_dir` is replaced.
    Raises GGUFImportError for files it cannot convert faithfully.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if out_dir.is_symlink() or (
        out_dir.exists() and read_marker(out_dir) is None and any(out_dir.iterdir())
    ):
        # Replacing means deleting: only ever an earlier import, never someone's directory.
        raise GGUFImportError(
            f"{out_dir} exists and is not an earlier import (no {MARKER_FILE}): "
            "not replacing it; choose another --out or --model-id"
        )
    from .tokenizer import build_tokenizer

    header = read_header(gguf_path)
    check_supported(header)
    tok = build_tokenizer(header)  # refuses unsupported tokenizers before anything is written
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        _write_dir(gguf_path, header, tok, tmp, model_id)
        for f in tmp.iterdir():
            with f.open("rb") as fh:
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}-{time.monotonic_ns()}")
            out_dir.rename(old)
            tmp.rename(out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def read_marker(model_dir: Path) -> dict[str, Any] | None:
    """The import marker of a complete converted directory, or None."""
    try:
        data = json.loads((Path(model_dir) / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
