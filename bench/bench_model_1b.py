"""A 1B-shaped llama with random weights in Q4_0, for benches that need a bigger model than the
embedded SmolLM2 (no download: the machines reach no model hub).

    uv run python bench/bench_model_1b.py     # writes (or finds) the GGUF and prints its path

Llama-3.2-1B's shape (hidden 2048, 16 layers, FFN 8192, 32 heads, 8 KV heads, tied embedding)
with SmolLM2's tokenizer (copied from the embedded GGUF, so the vocabulary is 49152, not
128256: ~1.07 B parameters). Every 2-D weight is Q4_0, quantized by the `gguf` package's numpy
code, the norms F32. Written once (~600 MB, a minute or two) under ~/.cache/exo/bench/; llama.cpp
and exo both load this same file. The text it writes is noise: it is for timing only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

CACHE = Path.home() / ".cache" / "exo" / "bench"
NAME = "llama-1b-shape-random-q4_0-v1.gguf"
MODEL_ID = "bench/llama-1b-random-q4_0"
HIDDEN, LAYERS, FFN, HEADS, KV_HEADS = 2048, 16, 8192, 32, 8


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


def _write(path: Path, tokenizer_source: Path) -> None:
    import gguf

    rng = np.random.default_rng(0)
    q4_0 = gguf.GGMLQuantizationType.Q4_0
    head_dim = HIDDEN // HEADS
    vocab = int(gguf.GGUFReader(str(tokenizer_source)).fields["llama.vocab_size"].contents())
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("llama-1b-shape-random")
    w.add_block_count(LAYERS)
    w.add_context_length(8192)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(500000.0)
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    _copy_tokenizer(w, tokenizer_source)

    def weight(name: str, rows: int, cols: int) -> None:
        arr = rng.standard_normal((rows, cols), dtype=np.float32) / np.float32(np.sqrt(cols))
        w.add_tensor(name, gguf.quants.quantize(arr, q4_0), raw_dtype=q4_0)

    def norm(name: str) -> None:
        w.add_tensor(name, (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))

    weight("token_embd.weight", vocab, HIDDEN)
    for i in range(LAYERS):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight")
        weight(p + "attn_q.weight", HEADS * head_dim, HIDDEN)
        weight(p + "attn_k.weight", KV_HEADS * head_dim, HIDDEN)
        weight(p + "attn_v.weight", KV_HEADS * head_dim, HIDDEN)
        weight(p + "attn_output.weight", HIDDEN, HEADS * head_dim)
        norm(p + "ffn_norm.weight")
        weight(p + "ffn_gate.weight", FFN, HIDDEN)
        weight(p + "ffn_up.weight", FFN, HIDDEN)
        weight(p + "ffn_down.weight", HIDDEN, FFN)
    norm("output_norm.weight")  # no output.weight: the head is the tied embedding
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def ensure_gguf() -> Path:
    """The cached GGUF, written first when missing (one writer at a time)."""
    from exo_engine_mlx.embedded import embedded_gguf_path

    path = CACHE / NAME
    with _locked(CACHE / f"{NAME}.lock"):
        if not path.exists():
            print(f"writing {path} (random 1B-shaped llama, Q4_0; once)", flush=True)
            partial = path.with_suffix(".partial")
            _write(partial, embedded_gguf_path())
            os.replace(partial, path)
    return path


def ensure_imported(models_dir: Path) -> str:
    """The GGUF imported as exo's `import-gguf` does (MLX weights + a card) under `models_dir`;
    returns the model id to request."""
    from exo_core.plugin.cards import check_model_id
    from exo_engine_mlx.cards import card_from_gguf, write_imported_card
    from exo_engine_mlx.gguf import import_gguf
    from exo_engine_mlx.gguf.cli import default_out_dir

    source = ensure_gguf()
    out = default_out_dir(check_model_id(MODEL_ID), models_dir)
    with _locked(models_dir / f"{NAME}.lock"):
        if not (out / "config.json").exists():
            print(f"importing {source.name} into {out} (once)", flush=True)
            path = import_gguf(source, out, MODEL_ID)
            write_imported_card(path, card_from_gguf(source, MODEL_ID, source=f"local:{path}"))
    return MODEL_ID


if __name__ == "__main__":
    print(ensure_gguf())
