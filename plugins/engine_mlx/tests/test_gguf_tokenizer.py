"""Tokenizers built from GGUF byte-level BPE metadata, against a plain reference BPE."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import mlx_lm
import pytest
from tokenizers import Tokenizer

from exo_engine_mlx.gguf import GGUFImportError, import_gguf
from exo_engine_mlx.gguf.reader import read_header
from exo_engine_mlx.gguf.tokenizer import build_tokenizer

TEXTS = [
    "hello world",
    "numbers 12345 and 2026, also 3.14159",
    "emoji 🙂🚀👍🏽 and CJK 東京 日本語 漢字 mixed",
    "  leading spaces\n\nand\ttabs  ",
    "<|im_start|>user\nhi 42<|im_end|>",
    "def main():\n    return 42\n",
    "combining é (e\u0301) and Ωmega",
]


def _tokenizer(path: Path) -> Tokenizer:
    return Tokenizer.from_str(build_tokenizer(read_header(path)).tokenizer_json)


@pytest.mark.parametrize("text", TEXTS)
def test_ids_match_reference_and_round_trip(
    text: str, tiny_gguf: Callable[..., Path], bpe_reference: Callable[[Path, str], list[int]]
) -> None:
    path = tiny_gguf()
    tok = _tokenizer(path)
    ids = tok.encode(text).ids
    assert ids == bpe_reference(path, text)
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_digits_one_by_one(tiny_gguf: Callable[..., Path]) -> None:
    tok = _tokenizer(tiny_gguf())
    pieces = tok.encode("year 2026 and 12345").tokens
    digits = [p for p in pieces if any(c.isdigit() for c in p)]
    assert digits == list("202612345")


def test_specials_are_single_ids(tiny_gguf: Callable[..., Path]) -> None:
    tok = _tokenizer(tiny_gguf())
    assert tok.encode("<|im_start|>").ids == [1]
    assert tok.encode("<|im_end|>").ids == [2]
    assert tok.decode([1, 2], skip_special_tokens=True) == ""


def test_add_bos(tiny_gguf: Callable[..., Path]) -> None:
    tok = _tokenizer(tiny_gguf(add_bos=True))
    assert tok.encode("hello").ids[0] == 1
    assert _tokenizer(tiny_gguf()).encode("hello").ids[0] != 1


def test_llama3_pre_tokenizer_groups_digits_by_three(tiny_gguf: Callable[..., Path]) -> None:
    tok = _tokenizer(tiny_gguf(pre="llama-bpe"))
    enc = tok.encode("12345 東京 🙂")
    assert tok.decode(enc.ids) == "12345 東京 🙂"
    words = [text for text, _ in tok.pre_tokenizer.pre_tokenize_str("12345")]  # type: ignore[union-attr]
    assert words == ["123", "45"]


def test_mlx_lm_tokenizer_agrees(
    tiny_gguf: Callable[..., Path], tmp_path: Path, bpe_reference: Callable[[Path, str], list[int]]
) -> None:
    """Through transformers (as mlx-lm loads it) the ids and decoding are the same."""
    path = tiny_gguf()
    _, wrapper = mlx_lm.load(str(import_gguf(path, tmp_path / "m", "t")))[:2]
    for text in TEXTS:
        ids = wrapper.encode(text, add_special_tokens=False)
        assert ids == bpe_reference(path, text), text
        assert wrapper.decode(ids) == text
    # Streaming detokenization (used while generating) rebuilds multi-byte characters.
    detok = wrapper.detokenizer
    detok.reset()
    for i in wrapper.encode("東京 🙂 12", add_special_tokens=False):
        detok.add_token(i)
    detok.finalize()
    assert detok.text == "東京 🙂 12"


def test_sentencepiece_refused(tiny_gguf: Callable[..., Path]) -> None:
    with pytest.raises(GGUFImportError, match="only byte-level BPE"):
        build_tokenizer(read_header(tiny_gguf(tokenizer_model="llama")))
