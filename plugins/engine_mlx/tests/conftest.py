"""Shared fixtures of the engine_mlx tests (add fixtures; do not change others' ones).

GGUF fixtures: `tiny_gguf` writes a tiny random llama as llama.cpp would (with its own writer,
the `gguf` package), and `llama_reference` is an independent numpy forward pass over the
tensors as llama.cpp's Python code dequantizes them.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

if TYPE_CHECKING:
    from exo_engine_mlx.family_sweep import TinyFamilies

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, this is a tiny tokenizer for tests",
    "numbers like 12345 and 2026 are split into digits",
    "emoji 🙂🚀 and CJK 東京 日本語 漢字 appear too",
    "def main():\n    return 42\n",
] * 20


@dataclass(frozen=True)
class TinySpec:
    """Shape and encoding of a tiny llama GGUF."""

    weight_type: str = "F32"  # type of the 2-D layer weights and the output head
    embd_type: str = "F32"  # type of token_embd
    tied: bool = False  # no output.weight: the head reuses the embedding
    arch: str = "llama"
    tokenizer_model: str = "gpt2"
    pre: str = "smollm"
    extra_tensor_type: str | None = None  # add one tensor of this raw type (refusal tests)
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 128
    rope_theta: float = 10000.0
    eps: float = 1e-5
    add_bos: bool = False
    seed: int = 0
    overrides: dict[str, Any] = field(default_factory=dict)


def _train_tokenizer() -> tuple[list[str], list[str]]:
    """A small byte-level BPE vocab (tokens by id, merges) trained on a fixed corpus."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(  # type: ignore[assignment]
        [
            pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer)
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf Q/K row permutation (half-split -> interleaved pairs)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, spec: TinySpec) -> Path:
    import gguf

    rng = np.random.default_rng(spec.seed)
    tokens, merges = _train_tokenizer()
    vocab = len(tokens)
    hd = spec.hidden // spec.heads
    w = gguf.GGUFWriter(str(path), spec.arch)
    w.add_block_count(spec.layers)
    w.add_context_length(512)
    w.add_embedding_length(spec.hidden)
    w.add_feed_forward_length(spec.ffn)
    w.add_head_count(spec.heads)
    w.add_head_count_kv(spec.kv_heads)
    w.add_layer_norm_rms_eps(spec.eps)
    w.add_rope_freq_base(spec.rope_theta)
    w.add_rope_dimension_count(hd)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model(spec.tokenizer_model)
    w.add_tokenizer_pre(spec.pre)
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIAL_TOKENS else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_add_bos_token(spec.add_bos)
    w.add_chat_template(CHAT_TEMPLATE)
    for key, value in spec.overrides.items():
        w.add_key_value(key, value, gguf.GGUFValueType.get_type(value))

    def put(name: str, arr: np.ndarray, type_name: str) -> None:
        arr = arr.astype(np.float32)
        if type_name == "F32":
            w.add_tensor(name, arr)
        elif type_name == "F16":
            w.add_tensor(name, arr.astype(np.float16))
        else:
            qtype = gguf.GGMLQuantizationType[type_name]
            w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)

    def dense(rows: int, cols: int) -> np.ndarray:
        return rng.standard_normal((rows, cols)) / np.sqrt(cols)

    put("token_embd.weight", rng.standard_normal((vocab, spec.hidden)), spec.embd_type)
    for i in range(spec.layers):
        p = f"blk.{i}."
        put(p + "attn_norm.weight", 1 + 0.1 * rng.standard_normal(spec.hidden), "F32")
        # Q/K are generated in Hugging Face order and stored permuted, as llama.cpp does.
        put(p + "attn_q.weight", _permute(dense(spec.heads * hd, spec.hidden), spec.heads),
            spec.weight_type)  # fmt: skip
        put(p + "attn_k.weight", _permute(dense(spec.kv_heads * hd, spec.hidden), spec.kv_heads),
            spec.weight_type)  # fmt: skip
        put(p + "attn_v.weight", dense(spec.kv_heads * hd, spec.hidden), spec.weight_type)
        put(p + "attn_output.weight", dense(spec.hidden, spec.heads * hd), spec.weight_type)
        put(p + "ffn_norm.weight", 1 + 0.1 * rng.standard_normal(spec.hidden), "F32")
        put(p + "ffn_gate.weight", dense(spec.ffn, spec.hidden), spec.weight_type)
        put(p + "ffn_up.weight", dense(spec.ffn, spec.hidden), spec.weight_type)
        put(p + "ffn_down.weight", dense(spec.hidden, spec.ffn), spec.weight_type)
    put("output_norm.weight", 1 + 0.1 * rng.standard_normal(spec.hidden), "F32")
    if not spec.tied:
        put("output.weight", dense(vocab, spec.hidden), spec.weight_type)
    if spec.extra_tensor_type is not None:
        qtype = gguf.GGMLQuantizationType[spec.extra_tensor_type]
        block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 255, size=(4, 256 // block * nbytes), dtype=np.uint8)
        w.add_tensor("blk.0.extra.weight", raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ------------------------------------------------------------------ numpy reference


def read_gguf_reference(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Metadata and float64 tensors, dequantized by llama.cpp's own Python code."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    meta: dict[str, Any] = {}
    for key, fld in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = fld.contents()
        meta[key] = value
    tensors: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
        tensors[t.name] = np.asarray(arr, dtype=np.float64).reshape(shape)
    return meta, tensors


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope_half_split(x: np.ndarray, theta: float) -> np.ndarray:
    """Hugging Face RoPE (rotate_half) on (heads, T, head_dim)."""
    _, t, d = x.shape
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.arange(t, dtype=np.float64)[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)
    rot = np.concatenate([-x[..., d // 2 :], x[..., : d // 2]], axis=-1)
    return x * cos + rot * sin


def llama_reference_logits(
    meta: dict[str, Any], tensors: dict[str, np.ndarray], ids: list[int]
) -> np.ndarray:
    """Logits (T, vocab) of a llama GGUF for prompt `ids`, in float64.

    Q/K rows are un-permuted back to Hugging Face order and RoPE is the half-split form, so
    this does not share the converter's `rope_traditional` shortcut.
    """
    n_layers = int(meta["llama.block_count"])
    n_head = int(meta["llama.attention.head_count"])
    n_kv = int(meta.get("llama.attention.head_count_kv", n_head))
    eps = float(meta["llama.attention.layer_norm_rms_epsilon"])
    theta = float(meta.get("llama.rope.freq_base", 10000.0))
    x = tensors["token_embd.weight"][ids]
    t = len(ids)
    mask = np.triu(np.full((t, t), -np.inf), k=1)
    for i in range(n_layers):
        g = lambda n, i=i: tensors[f"blk.{i}.{n}.weight"]  # noqa: E731
        h = _rms_norm(x, g("attn_norm"), eps)
        q = h @ unpermute(g("attn_q"), n_head).T
        k = h @ unpermute(g("attn_k"), n_kv).T
        v = h @ g("attn_v").T
        hd = q.shape[-1] // n_head
        q = _rope_half_split(q.reshape(t, n_head, hd).transpose(1, 0, 2), theta)
        k = _rope_half_split(k.reshape(t, n_kv, hd).transpose(1, 0, 2), theta)
        v = v.reshape(t, n_kv, hd).transpose(1, 0, 2)
        rep = n_head // n_kv
        k, v = np.repeat(k, rep, axis=0), np.repeat(v, rep, axis=0)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + mask
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        o = (p @ v).transpose(1, 0, 2).reshape(t, n_head * hd)
        x = x + o @ g("attn_output").T
        h = _rms_norm(x, g("ffn_norm"), eps)
        gate = h @ g("ffn_gate").T
        x = x + ((gate / (1 + np.exp(-gate))) * (h @ g("ffn_up").T)) @ g("ffn_down").T
    x = _rms_norm(x, tensors["output_norm.weight"], eps)
    head = tensors.get("output.weight", tensors["token_embd.weight"])
    return x @ head.T


# ------------------------------------------------------------- reference BPE tokenizer


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table used by byte-level BPE vocabularies."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table: dict[int, str] = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def reference_bpe(
    text: str, tokens: list[str], merges: list[str], specials: list[str]
) -> list[int]:
    """llama.cpp's algorithm for the `smollm` pre-tokenizer, written plainly.

    Special tokens split the text first; each digit is its own word; the rest is split with
    the GPT-2 regex; each word's bytes are merged greedily by lowest merge rank.
    """
    import regex

    vocab = {t: i for i, t in reversed(list(enumerate(tokens)))}
    ranks = {tuple(m.split(" ")): r for r, m in enumerate(merges)}
    b2u = _bytes_to_unicode()
    ids: list[int] = []
    pattern = "(" + "|".join(regex.escape(s) for s in specials) + ")"
    for part in regex.split(pattern, text) if specials else [text]:
        if part in specials:
            ids.append(vocab[part])
            continue
        for chunk in regex.findall(r"\p{N}|[^\p{N}]+", part):
            for word in regex.findall(_GPT2_SPLIT, chunk):
                syms = [b2u[b] for b in word.encode("utf-8")]
                while len(syms) > 1:
                    pairs = [
                        (ranks.get(pair, 1 << 30), i)
                        for i, pair in enumerate(itertools.pairwise(syms))
                    ]
                    rank, i = min(pairs)
                    if rank == 1 << 30:
                        break
                    syms[i : i + 2] = [syms[i] + syms[i + 1]]
                ids.extend(vocab[s] for s in syms)
    return ids


def gguf_vocab(path: Path) -> tuple[list[str], list[str], list[str]]:
    """(tokens, merges, control tokens) read with llama.cpp's own GGUF reader."""
    import gguf

    fields = gguf.GGUFReader(str(path)).fields
    tokens = list(fields["tokenizer.ggml.tokens"].contents())
    merges = list(fields["tokenizer.ggml.merges"].contents())
    types = list(fields["tokenizer.ggml.token_type"].contents())
    specials = [t for t, ty in zip(tokens, types, strict=True) if ty == 3]
    return tokens, merges, specials


@pytest.fixture(scope="session")
def bpe_reference() -> Callable[[Path, str], list[int]]:
    """(gguf path, text) -> ids from the plain reference BPE on that file's vocabulary."""
    vocabs: dict[Path, tuple[list[str], list[str], list[str]]] = {}

    def run(path: Path, text: str) -> list[int]:
        if path not in vocabs:
            vocabs[path] = gguf_vocab(path)
        return reference_bpe(text, *vocabs[path])

    return run


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory: TinySpec fields as keywords -> path of a GGUF file (cached per spec)."""
    cache: dict[str, Path] = {}
    root = tmp_path_factory.mktemp("tiny_gguf")

    def make(**fields: Any) -> Path:
        spec = TinySpec(**fields)
        key = repr(spec)
        if key not in cache:
            cache[key] = write_tiny_gguf(root / f"tiny-{len(cache)}.gguf", spec)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def llama_reference() -> Callable[[Path, list[int]], np.ndarray]:
    """(gguf path, token ids) -> float64 reference logits (T, vocab)."""

    def run(path: Path, ids: list[int]) -> np.ndarray:
        meta, tensors = read_gguf_reference(path)
        return llama_reference_logits(meta, tensors, ids)

    return run


@pytest.fixture(scope="session")
def tiny_families(tmp_path_factory: pytest.TempPathFactory) -> TinyFamilies:
    """Every family's tiny model (4 layers) and its one-rank generation, each made once per
    session (test_every_family and test_every_family_groups share them)."""
    from exo_engine_mlx.family_sweep import TinyFamilies

    return TinyFamilies(tmp_path_factory.mktemp("tiny_families"))
