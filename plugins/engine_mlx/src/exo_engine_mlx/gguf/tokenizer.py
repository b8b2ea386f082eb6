"""Build a Hugging Face `tokenizers` tokenizer from GGUF byte-level BPE metadata.

Only `tokenizer.ggml.model == "gpt2"` (byte-level BPE) is supported. The pre-tokenizer is
chosen from `tokenizer.ggml.pre`, mirroring the regexes llama.cpp uses for that name; names we
have not mapped are refused rather than guessed, because a wrong split gives plausible but
different ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from .reader import GGUFHeader, GGUFImportError

# llama.cpp token types (llama_token_type / LLAMA_TOKEN_TYPE_*).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = (
    1,
    2,
    3,
    4,
    5,
    6,
)

# Llama 3's split regex (llama.cpp LLAMA_VOCAB_PRE_TYPE_LLAMA3).
_LLAMA3_REGEX = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Pre-tokenizer families by `tokenizer.ggml.pre` name.
_GPT2_NAMES = frozenset({"gpt-2", "gpt2", "mpt", "olmo", "jais"})
_DIGITS_GPT2_NAMES = frozenset(
    {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"}
)
_LLAMA3_NAMES = frozenset({"llama-bpe", "llama3", "llama-v3", "dbrx", "smaug-bpe"})
SUPPORTED_PRE = sorted(_GPT2_NAMES | _DIGITS_GPT2_NAMES | _LLAMA3_NAMES)


@dataclass(frozen=True)
class TokenizerFiles:
    tokenizer_json: str
    tokenizer_config: dict[str, Any]
    eos_token_ids: list[int]
    bos_token_id: int | None


def _pre_tokenizer(pre: str) -> tuple[pre_tokenizers.PreTokenizer, bool]:
    """(pre-tokenizer, ignore_merges) for a llama.cpp pre-tokenizer name."""
    if pre in _GPT2_NAMES:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), False
    if pre in _DIGITS_GPT2_NAMES:
        # llama.cpp runs "\p{N}" first: every digit becomes its own word.
        digits = pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated")
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        return pre_tokenizers.Sequence([digits, byte_level]), False
    if pre in _LLAMA3_NAMES:
        split = pre_tokenizers.Split(Regex(_LLAMA3_REGEX), behavior="isolated")
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        # llama.cpp looks a whole word up in the vocab before merging for this family.
        return pre_tokenizers.Sequence([split, byte_level]), True
    raise GGUFImportError(
        f"unsupported BPE pre-tokenizer {pre!r} (supported: {', '.join(SUPPORTED_PRE)})"
    )


def _token_id(header: GGUFHeader, key: str, n_vocab: int) -> int | None:
    value = header.get(key)
    if value is None:
        return None
    if not 0 <= int(value) < n_vocab:
        raise GGUFImportError(f"{key}={value} is outside the vocabulary (size {n_vocab})")
    return int(value)


def build_tokenizer(header: GGUFHeader) -> TokenizerFiles:
    model = header.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise GGUFImportError(
            f"unsupported tokenizer model {model!r}: only byte-level BPE ('gpt2') is supported"
            + (" (this looks like a SentencePiece tokenizer)" if model == "llama" else "")
        )
    tokens: list[str] = list(header.require("tokenizer.ggml.tokens"))
    merges_raw: list[str] = list(header.require("tokenizer.ggml.merges"))
    n = len(tokens)
    types: list[int] = list(header.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * n)
    if len(types) != n:
        raise GGUFImportError("tokenizer.ggml.token_type and tokenizer.ggml.tokens differ in size")
    # A missing name means a GGUF older than pre-tokenizer names: llama.cpp then falls back to
    # a default; the plain GPT-2 split is the closest byte-level behaviour.
    pre = str(header.get("tokenizer.ggml.pre", "gpt-2"))
    pre_tok, ignore_merges = _pre_tokenizer(pre)

    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        vocab.setdefault(tok, i)  # duplicates: the first id wins, as in llama.cpp's lookup
    merges: list[tuple[str, str]] = []
    for m in merges_raw:
        left, sep, right = m.partition(" ")
        if not sep:
            raise GGUFImportError(f"malformed merge {m!r}")
        merges.append((left, right))

    bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tok
    tok.decoder = decoders.ByteLevel()
    special = [
        AddedToken(t, special=True, normalized=False)
        for t, ty in zip(tokens, types, strict=True)
        if ty == TOKEN_CONTROL
    ]
    user = [
        AddedToken(t, special=False, normalized=False)
        for t, ty in zip(tokens, types, strict=True)
        if ty == TOKEN_USER_DEFINED
    ]
    tok.add_special_tokens(special)
    tok.add_tokens(user)

    bos = _token_id(header, "tokenizer.ggml.bos_token_id", n)
    eos = _token_id(header, "tokenizer.ggml.eos_token_id", n)
    eot = _token_id(header, "tokenizer.ggml.eot_token_id", n)
    unk = _token_id(header, "tokenizer.ggml.unknown_token_id", n)
    pad = _token_id(header, "tokenizer.ggml.padding_token_id", n)
    add_bos = bool(header.get("tokenizer.ggml.add_bos_token", False)) and bos is not None
    add_eos = bool(header.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    if add_bos or add_eos:

        def seq(piece: str, type_id: int) -> list[str]:
            out = [f"{tokens[bos]}:{type_id}"] if add_bos and bos is not None else []
            out.append(f"{piece}:{type_id}")
            return out + ([f"{tokens[eos]}:{type_id}"] if add_eos and eos is not None else [])

        added = [i for i, on in ((bos, add_bos), (eos, add_eos)) if on and i is not None]
        tok.post_processor = processors.TemplateProcessing(
            single=seq("$A", 0),
            pair=seq("$A", 0) + seq("$B", 1),
            special_tokens=[(tokens[i], i) for i in sorted(set(added))],
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)

    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(header.get(f"{header.architecture}.context_length", 2048)),
    }
    for key, tid in (
        ("bos_token", bos),
        ("eos_token", eos),
        ("unk_token", unk),
        ("pad_token", pad),
    ):
        if tid is not None:
            config[key] = tokens[tid]
    template = header.get("tokenizer.chat_template")
    if template:
        config["chat_template"] = str(template)
    eos_ids = [i for i in (eos, eot) if i is not None]
    return TokenizerFiles(
        tokenizer_json=tok.to_str(),
        tokenizer_config=config,
        eos_token_ids=sorted(set(eos_ids)),
        bos_token_id=bos,
    )
