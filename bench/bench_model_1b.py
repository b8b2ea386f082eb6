"""Random-weight llamas in Q4_0 shaped like the models people run, for benches that need bigger
models than the embedded SmolLM2 (no download: the machines reach no model hub).

    .venv/bin/python bench/bench_model_1b.py [1b|7b]   # writes (or finds) the GGUF, prints its path

`ONE_B`: Llama-3.2-1B's shape (hidden 2048, 16 layers, FFN 8192, 32 heads, 8 KV heads, tied
embedding); `SEVEN_B`: Mistral-7B's / Llama-3-8B's (hidden 4096, 32 layers, FFN 14336, 32 heads,
8 KV heads). Both carry SmolLM2's tokenizer (copied from the embedded GGUF, so the vocabulary is
49152: ~1.07 B and ~7.2 B parameters). Every 2-D weight is Q4_0, written directly as random
blocks (a random 4-bit value per weight and one fp16 scale per 32, sized so that a row's output
keeps the input's scale; quantizing normal draws took minutes per billion weights), the norms
F32. Written once under ~/.cache/exo/bench/ (~0.6 GB and ~4 GB; tensors are streamed to the file,
not held in memory); llama.cpp and exo both load the same file. The text it writes is noise:
it is for timing and memory only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CACHE = Path.home() / ".cache" / "exo" / "bench"


@dataclass(frozen=True)
class Shape:
    label: str
    file: str  # under CACHE
    model_id: str  # the id exo serves it under
    hidden: int
    layers: int
    ffn: int
    heads: int
    kv_heads: int
    rope_theta: float


ONE_B = Shape(
    "1B-shaped random llama Q4_0", "llama-1b-shape-random-q4_0-v2.gguf",
    "bench/llama-1b-random-q4_0", 2048, 16, 8192, 32, 8, 500000.0,
)  # fmt: skip
SEVEN_B = Shape(
    "7B-shaped random llama Q4_0", "llama-7b-shape-random-q4_0-v1.gguf",
    "bench/llama-7b-random-q4_0", 4096, 32, 14336, 32, 8, 1000000.0,
)  # fmt: skip
SHAPES = {"1b": ONE_B, "7b": SEVEN_B}


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _copy_tokenizer(writer: object, source: Path) -> None:
    """The tokenizer and chat template of `source`, field by field."""
    import gguf

    assert isinstance(writer, gguf.GGUFWriter)
    for name, field in gguf.GGUFReader(str(source)).fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        sub = field.types[1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), kind, sub_type=sub)


def _random_q4_0(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """A rows x cols Q4_0 tensor as ggml lays it out (per 32 weights: an fp16 scale d, then 16
    bytes of 4-bit values q, weight = d * (q - 8)). Uniform q has variance ~21.25: d makes each
    weight's standard deviation 1/sqrt(cols)."""
    blocks = cols // 32
    scale = np.float16(1 / np.sqrt(cols) / np.sqrt(21.25))
    d = np.full((rows, blocks, 1), scale, dtype=np.float16).view(np.uint8)
    q = rng.integers(0, 256, size=(rows, blocks, 16), dtype=np.uint8)
    return np.concatenate([d, q], axis=2).reshape(rows, blocks * 18)


def _write(path: Path, tokenizer_source: Path, shape: Shape) -> None:
    import gguf

    rng = np.random.default_rng(0)
    q4_0 = gguf.GGMLQuantizationType.Q4_0
    head_dim = shape.hidden // shape.heads
    vocab = int(gguf.GGUFReader(str(tokenizer_source)).fields["llama.vocab_size"].contents())
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(shape.file.removesuffix(".gguf"))
    w.add_block_count(shape.layers)
    w.add_context_length(8192)
    w.add_embedding_length(shape.hidden)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    _copy_tokenizer(w, tokenizer_source)

    # (name, rows, cols) of the Q4_0 weights, None for an F32 norm; the head is the tied embedding.
    tensors: list[tuple[str, int, int | None]] = [("token_embd.weight", vocab, shape.hidden)]
    for i in range(shape.layers):
        p = f"blk.{i}."
        q_rows, kv_rows = shape.heads * head_dim, shape.kv_heads * head_dim
        tensors += [
            (p + "attn_norm.weight", shape.hidden, None),
            (p + "attn_q.weight", q_rows, shape.hidden),
            (p + "attn_k.weight", kv_rows, shape.hidden),
            (p + "attn_v.weight", kv_rows, shape.hidden),
            (p + "attn_output.weight", shape.hidden, q_rows),
            (p + "ffn_norm.weight", shape.hidden, None),
            (p + "ffn_gate.weight", shape.ffn, shape.hidden),
            (p + "ffn_up.weight", shape.ffn, shape.hidden),
            (p + "ffn_down.weight", shape.hidden, shape.ffn),
        ]
    tensors.append(("output_norm.weight", shape.hidden, None))
    for name, rows, cols in tensors:  # the header first: the data is then streamed
        if cols is None:
            w.add_tensor_info(name, (rows,), np.dtype(np.float32), rows * 4)
        else:
            w.add_tensor_info(name, (rows, cols // 32 * 18), np.dtype(np.uint8),
                              rows * cols // 32 * 18, raw_dtype=q4_0)  # fmt: skip
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, rows, cols in tensors:
        if cols is None:
            w.write_tensor_data((1 + 0.1 * rng.standard_normal(rows)).astype(np.float32))
        else:
            w.write_tensor_data(_random_q4_0(rng, rows, cols))
    w.close()


def ensure_gguf(shape: Shape = ONE_B) -> Path:
    """The cached GGUF, written first when missing (one writer at a time)."""
    from exo_engine_mlx.embedded import embedded_gguf_path

    path = CACHE / shape.file
    with _locked(CACHE / f"{shape.file}.lock"):
        if not path.exists():
            print(f"writing {path} ({shape.label}; once)", flush=True)
            partial = path.with_suffix(".partial")
            _write(partial, embedded_gguf_path(), shape)
            os.replace(partial, path)
    return path


def ensure_imported(models_dir: Path, shape: Shape = ONE_B) -> str:
    """The GGUF imported as exo's `import-gguf` does (MLX weights + a card) under `models_dir`;
    returns the model id to request."""
    from exo_core.plugin.cards import check_model_id
    from exo_engine_mlx.cards import card_from_gguf, write_imported_card
    from exo_engine_mlx.gguf import import_gguf
    from exo_engine_mlx.gguf.cli import default_out_dir

    source = ensure_gguf(shape)
    out = default_out_dir(check_model_id(shape.model_id), models_dir)
    with _locked(models_dir / f"{shape.file}.lock"):
        if not (out / "config.json").exists():
            print(f"importing {source.name} into {out} (once)", flush=True)
            path = import_gguf(source, out, shape.model_id)
            card = card_from_gguf(source, shape.model_id, source=f"local:{path}")
            write_imported_card(path, card)
    return shape.model_id


if __name__ == "__main__":
    print(ensure_gguf(SHAPES[sys.argv[1] if len(sys.argv) > 1 else "1b"]))
