"""Tiny random-weight models (llama, and the other families mlx-lm runs) with a real byte-level
BPE tokenizer, built in about a second.

Tests use it so the suite stays fast while everything (mlx-lm loading, chat template, batching,
sharding) runs for real. The output head is untied: a random tied model only repeats its input.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from exo_engine_mlx.metal_fallbacks import install as install_metal_fallbacks

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Thinking switched the way DeepSeek V3.1's template switches it: a `thinking` variable (off
# unless given), the answer's header then followed by `<think>` when on and `</think>` when off.
THINKING_SWITCH_TEMPLATE = (
    "{%- if thinking is not defined %}{% set thinking = false %}{% endif -%}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if thinking %}<think>{% else %}</think>{% endif %}{% endif %}"
)
# gpt-oss's Harmony format, as its documentation shows it: a system message with the reasoning
# effort, the tools as a `functions` namespace, calls as messages `to=functions.name` ended by
# `<|call|>`, tool results from `functions.name`; the answer's header is left open. It stands in
# for the model's own template; the engine renders gpt-oss prompts with openai-harmony instead
# (`harmony_prompt.py`), for any vocabulary with these markers.
HARMONY_SPECIALS = (
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
    "<|constrain|>",
)
HARMONY_EOS = ("<|return|>", "<|call|>")
HARMONY_TEMPLATE = (
    "{%- set ns = namespace(fn='') -%}"
    "<|start|>system<|message|>Reasoning: {{ reasoning_effort | default('medium') }}\n\n"
    "# Valid channels: analysis, commentary, final.<|end|>"
    "{%- if tools %}<|start|>developer<|message|># Tools\n\n## functions\n\n"
    "namespace functions {\n{% for t in tools %}"
    "// {{ t.function.description }}\ntype {{ t.function.name }} = "
    "(_: {{ t.function.parameters | tojson }}) => any;\n"
    "{% endfor %}} // namespace functions<|end|>{% endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' and m.tool_calls -%}"
    "{%- for c in m.tool_calls %}{% set ns.fn = c.function.name %}"
    "<|start|>assistant<|channel|>commentary to=functions.{{ c.function.name }} "
    "<|constrain|>json<|message|>{{ c.function.arguments | tojson }}<|call|>{% endfor -%}"
    "{%- elif m.role == 'tool' -%}"
    "<|start|>functions.{{ ns.fn }} to=assistant<|channel|>commentary<|message|>"
    "{{ m.content }}<|end|>"
    "{%- elif m.role == 'assistant' -%}"
    "<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>"
    "{%- else -%}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|start|>assistant{% endif %}"
)
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


# What each family adds to the common tiny config (a few small experts, small low-rank
# attention, short linear-attention heads, so every family builds and runs in about a second):
# one JSON file per `model_type` in `tiny_configs/`, so a family is added without touching
# this module. A key starting with "_" is a comment and is not written into config.json.
TINY_CONFIGS = Path(__file__).parent / "tiny_configs"


def _read_tiny_families() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(TINY_CONFIGS.glob("*.json")):
        entries = json.loads(path.read_text())
        out[path.stem] = {k: v for k, v in entries.items() if not k.startswith("_")}
    return out


TINY_FAMILIES: dict[str, dict[str, Any]] = _read_tiny_families()


def _token_ids(out: Path, tokens: Sequence[str]) -> list[int]:
    """The ids of special tokens in the tokenizer written into `out`."""
    added = json.loads((out / "tokenizer.json").read_text())["added_tokens"]
    ids = {t["content"]: int(t["id"]) for t in added}
    return [ids[t] for t in tokens]


# Gains mlx-lm starts at zero that switch a path of the model off until trained: random
# values, so a tiny model runs what they gate (Talkie's embedding skip into every block,
# Gemma 3n's per-layer inputs), which a pipeline split must carry to later ranks.
ZERO_GAINS = ("embed_skip.a_g", "altup.correct_output_scale")


def make_tiny_model(
    out: Path,
    *,
    model_type: str = "llama",
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
    eos_tokens: Sequence[str] = ("<|im_end|>",),
    overrides: dict[str, Any] | None = None,
) -> Path:
    """Write an MLX model directory of `model_type` (see `TINY_FAMILIES`) that `mlx_lm.load`
    reads, built from mlx-lm's own model class with random weights. Returns `out`.

    `special_tokens`, `chat_template` and `corpus` shape its tokenizer (see
    `make_tiny_tokenizer`), e.g. to give it a family's think and tool-call markers;
    `eos_tokens` are the tokens that end a sequence (gpt-oss ends at `<|return|>` and
    `<|call|>`); `overrides` replace entries of the family's tiny config (a benchmark's
    sliding window). An alias mlx-lm maps to another module (`kimi_k2` -> `deepseek_v3`)
    uses that module's class and, without a file of its own, that module's tiny config; its
    config.json keeps the alias as `model_type`. A multimodal wrapper's `text_config` gets
    the common entries (sizes, layers, vocabulary) it does not set itself."""
    import importlib

    from mlx_lm.utils import MODEL_REMAPPING

    module = MODEL_REMAPPING.get(model_type, model_type)
    own = TINY_FAMILIES.get(model_type, TINY_FAMILIES.get(module))
    if own is None:
        raise ValueError(f"no tiny config for {model_type!r} (have: {', '.join(TINY_FAMILIES)})")
    family = importlib.import_module(f"mlx_lm.models.{module}")
    install_metal_fallbacks()  # so that a test may run what it builds with plain mlx_lm.load
    out.mkdir(parents=True, exist_ok=True)
    vocab = make_tiny_tokenizer(
        out,
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        chat_template=chat_template,
        corpus=corpus,
    )
    common: dict[str, Any] = {
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
    }
    config: dict[str, Any] = {
        "model_type": model_type,
        **common,
        "torch_dtype": "float32",
        **own,
        **(overrides or {}),
    }
    if isinstance(config.get("text_config"), dict):
        config["text_config"] = {**common, **config["text_config"]}
    eos = _token_ids(out, eos_tokens)
    config["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    if config.pop("tiny_hadamard_manifest", False):
        config["modules"] = _hadamard_manifest(config)
    mx.random.seed(seed)
    model = family.Model(family.ModelArgs.from_dict(config))
    # Larger weights than the default init, so the logits have a clear winner. A weight
    # matrix the class starts at zeros (the routers of Nemotron-H, DeepSeek V3, GLM 4 MoE;
    # Talkie's head) gets random values: zeros would tie every expert choice or every logit.
    weights: dict[str, mx.array] = {}
    for name, value in tree_flatten(model.parameters()):
        assert isinstance(value, mx.array)
        if value.dtype == mx.uint32:  # a packed quantized weight: any word is valid codes
            weights[name] = mx.random.randint(0, 1 << 31, value.shape).astype(mx.uint32) * 2
            continue
        if name.endswith(("scales", "biases")) and value.dtype == mx.float16:
            weights[name] = _packed_affine(name, value.shape)
            continue
        if name.endswith(".signs"):  # a Hadamard pack's sign vector: +-1
            weights[name] = mx.where(mx.random.uniform(shape=value.shape) < 0.5, -1.0, 1.0)
            continue
        if value.dtype == mx.uint8:  # BitNet's packed ternary codes: four a byte, each < 3
            weights[name] = _ternary_codes(value.shape)
            continue
        if name.endswith("weight_scale"):  # BitNet's per-layer scale: not 1, so it is tested
            weights[name] = mx.random.uniform(0.5, 2.0, value.shape)
            continue
        if value.ndim == 2 and not name.endswith("bias") and not mx.any(value).item():
            value = mx.random.normal(value.shape) * value.shape[-1] ** -0.5
        elif name.endswith(ZERO_GAINS) and not mx.any(value).item():
            value = mx.random.normal(value.shape) * 0.5
        weights[name] = (value * 4 if value.ndim == 2 else value).astype(mx.float32)
    text = config.get("text_config")  # a wrapper's embedding and head are its text model's
    rows = (text if isinstance(text, dict) else config)["vocab_size"]
    _zero_rows_past(weights, vocab, int(rows))
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def _zero_rows_past(weights: dict[str, mx.array], tokens: int, rows: int) -> None:
    """A family whose config sets a vocabulary larger than the tokenizer's (phi3small writes
    -inf into fixed ids past 100255 of its logits: a smaller table would be written past
    its end; a wrapper's text_config may set an even one for a tensor split: qwen3_5,
    muse_spark) gets zero embedding and head rows for the ids no token has: their logits are
    0, under the real tokens' best, so greedy text stays inside the tokenizer."""
    if rows <= tokens:
        return
    for name, value in weights.items():
        if value.ndim == 2 and value.shape[0] == rows:
            weights[name] = mx.concatenate([value[:tokens], mx.zeros_like(value[tokens:])])


def _ternary_codes(shape: tuple[int, ...]) -> mx.array:
    fields = mx.random.randint(0, 3, (4, *shape)).astype(mx.uint8)
    return sum((fields[k] << (2 * k) for k in range(4)), mx.zeros(shape, mx.uint8))


def _hadamard_manifest(config: dict[str, Any]) -> list[dict[str, Any]]:
    """A Hadamard pack's module manifest (prism_hadamard_qwen35): every bias-free linear and
    embedding of the Qwen 3.5 text model whose input width takes 2-bit groups of 128, rotated
    in blocks of 512 where the width allows (0: not rotated)."""
    import mlx.nn as nn
    from mlx_lm.models import qwen3_5

    model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict({**config, "model_type": "qwen3_5"}))
    records = []
    for path, module in model.language_model.named_modules():
        if not isinstance(module, (nn.Linear, nn.Embedding)) or "bias" in module:
            continue
        width = int(module.weight.shape[1])
        if width % 128 == 0:
            block = 512 if width % 512 == 0 else 0
            embedding = isinstance(module, nn.Embedding)
            records.append(
                {"path": path, "embedding": embedding, "dtype": "float16", "block": block}
            )
    return records


def _packed_affine(name: str, shape: tuple[int, ...]) -> mx.array:
    """Scales (or biases) of a random 2-bit affine layer with groups of 128, drawn apart: a
    scale s of the generic init's size for its input width, a bias near -1.5 s (codes 0-3
    roughly centred on 0)."""
    width = shape[-1] * 128
    scale = mx.random.uniform(0.5, 1.5, shape) * 4 * width**-0.5
    return (scale if name.endswith("scales") else -1.5 * scale).astype(mx.float16)
