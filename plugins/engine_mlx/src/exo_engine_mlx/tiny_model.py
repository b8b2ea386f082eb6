"""A tiny random-weight llama with a real byte-level BPE tokenizer, built in about a second.

Tests use it so the suite stays fast while everything (mlx-lm loading, chat template, batching,
sharding) runs for real. The output head is untied: a random tied model only repeats its input.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, this is a tiny model for the exo tests",
    "numbers like 12345 and 2026 are split into digits",
    "emoji 🙂🚀 and CJK 東京 日本語 漢字 appear too",
    "def main():\n    return 42\n",
] * 10


def make_tiny_tokenizer(
    out: Path,
    *,
    vocab_size: int = 400,
    special_tokens: Sequence[str] = (),
    chat_template: str = CHAT_TEMPLATE,
    corpus: Sequence[str] = (),
) -> int:
    """Write a byte-level BPE `tokenizer.json` and `tokenizer_config.json` into `out`, with
    `special_tokens` added after the base ones (a family's think and tool-call markers) and
    its chat template. Returns the vocabulary size."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(  # type: ignore[assignment]
        [
            pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()  # type: ignore[assignment]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[*SPECIAL, *special_tokens],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([*CORPUS, *corpus], trainer)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "chat_template": chat_template,
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return tok.get_vocab_size()


def make_tiny_model(
    out: Path,
    *,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    vocab_size: int = 400,
    seed: int = 0,
    special_tokens: Sequence[str] = (),
    chat_template: str = CHAT_TEMPLATE,
    corpus: Sequence[str] = (),
) -> Path:
    """Write an MLX llama model directory that `mlx_lm.load` reads. Returns `out`.

    `special_tokens`, `chat_template` and `corpus` shape its tokenizer (see
    `make_tiny_tokenizer`), e.g. to give it a family's think and tool-call markers."""
    from mlx_lm.models import llama

    out.mkdir(parents=True, exist_ok=True)
    vocab = make_tiny_tokenizer(
        out,
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        chat_template=chat_template,
        corpus=corpus,
    )
    config = {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "max_position_embeddings": 2048,
        "torch_dtype": "float32",
        "eos_token_id": SPECIAL.index("<|im_end|>"),
    }
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    # Larger weights than the default init, so the logits have a clear winner.
    weights: dict[str, mx.array] = {}
    for name, value in tree_flatten(model.parameters()):
        assert isinstance(value, mx.array)
        weights[name] = (value * 4 if value.ndim == 2 else value).astype(mx.float32)
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out
