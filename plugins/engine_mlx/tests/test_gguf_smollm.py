"""The real embedded SmolLM2-135M GGUF: logits against the numpy reference, tokenizer.

Logit tolerance: the reference runs in float64 on the same dequantized weights (dequantized
by llama.cpp's Python code); MLX runs in float32 through 30 layers. Measured max |diff| /
max |logit| ~1e-6; we assert 1e-4, with identical top-1 at every position.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest

from exo_engine_mlx.embedded import embedded_gguf_path
from exo_engine_mlx.gguf import gguf_model_card_fields, import_gguf

pytestmark = pytest.mark.smollm

REL_TOL = 1e-4
TEXTS = [
    "The year 2026 has 365 days; 12345 + 678 = 13023.",
    "Emoji 🙂🚀👍🏽 and CJK 東京 日本語, accents café naïve.",
    "<|im_start|>user\nWhat is 7*6?<|im_end|>\n",
    "def f(x):\n    return x ** 2  # square\n",
]


@pytest.fixture(scope="module")
def smollm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t0 = time.perf_counter()
    out = import_gguf(embedded_gguf_path(), tmp_path_factory.mktemp("smol") / "m", "smollm2")
    print(f"SmolLM2 conversion: {time.perf_counter() - t0:.2f} s")
    return out


def test_logits_match_reference(
    smollm_dir: Path, llama_reference: Callable[[Path, list[int]], np.ndarray]
) -> None:
    model, tokenizer = mlx_lm.load(str(smollm_dir))[:2]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    ids = tokenizer.encode(prompt, add_special_tokens=False)[-24:]
    got = np.array(model(mx.array([ids]))[0].astype(mx.float32)).astype(np.float64)
    ref = llama_reference(embedded_gguf_path(), ids)
    rel = np.abs(got - ref).max() / np.abs(ref).max()
    kl = float(_kl(ref, got).max())
    print(f"SmolLM2 logits: rel max diff {rel:.2e}, max KL {kl:.2e} over {len(ids)} positions")
    assert rel < REL_TOL
    assert (got.argmax(-1) == ref.argmax(-1)).all()


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    lp, lq = _log_softmax(p_logits), _log_softmax(q_logits)
    return (np.exp(lp) * (lp - lq)).sum(-1)


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_on_real_vocab(
    smollm_dir: Path, text: str, bpe_reference: Callable[[Path, str], list[int]]
) -> None:
    _, tokenizer = mlx_lm.load(str(smollm_dir))[:2]
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids == bpe_reference(embedded_gguf_path(), text)
    assert tokenizer.decode(ids) == text
    pieces = tokenizer._tokenizer.convert_ids_to_tokens(ids)
    assert all(len(p) == 1 for p in pieces if any(c.isdigit() for c in p))
    assert len(ids) < len(text.encode())  # merges apply: fewer ids than bytes


def test_known_tokens(smollm_dir: Path) -> None:
    _, tokenizer = mlx_lm.load(str(smollm_dir))[:2]
    assert tokenizer.encode("<|im_start|>", add_special_tokens=False) == [1]
    assert tokenizer.eos_token_id == 2
    pieces = tokenizer._tokenizer.convert_ids_to_tokens(
        tokenizer.encode("Hello world", add_special_tokens=False)
    )
    assert pieces == ["Hello", "Ġworld"]


def test_card_fields() -> None:
    card = gguf_model_card_fields(embedded_gguf_path())
    assert (card.n_layers, card.hidden_size, card.n_heads, card.n_kv_heads) == (30, 576, 9, 3)
    assert card.vocab_size == 49152
    assert 130e6 < card.n_params < 140e6
