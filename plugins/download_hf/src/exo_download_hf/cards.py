"""Model cards: where a card's weights are on the hub, the built-in cards shipped in resources/,
and custom cards built from a hub repo's config.json.
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exo_core.plugin import Capability, ModelCard, ModelId
from exo_core.plugin.cards import card_config_problem, load_catalogue
from exo_download_hf.chat_format import ChatFormat
from exo_download_hf.hub import RemoteFile

SOURCE_PREFIX = "hf:"
WEIGHT_SUFFIX = ".safetensors"

# Model types whose mlx-lm implementation can shard itself for tensor parallelism (it defines
# `shard(group)` in mlx-lm 0.32); other families run pipelined only.
TENSOR_PARALLEL_TYPES = frozenset(
    {
        "deepseek_v2",
        "deepseek_v3",
        "glm4_moe",
        "gpt_oss",
        "llama",
        "minimax",
        "ministral3",
        "qwen2",
        "qwen3",
        "qwen3_5",
        "qwen3_moe",
    }
)


@dataclass(frozen=True)
class HubRef:
    repo_id: str
    revision: str = "main"


def hub_ref(card: ModelCard) -> HubRef | None:
    """Where the card's files are on the hub: `hf:<repo>` or `hf:<repo>@<revision>`.

    A card without a source names its repo by its id. Other schemes (`embedded:`, `local:`...)
    are not the hub's, so None."""
    if not card.source:
        return HubRef(card.model_id)
    if not card.source.startswith(SOURCE_PREFIX):
        return None
    repo, _, revision = card.source[len(SOURCE_PREFIX) :].partition("@")
    return HubRef(repo, revision or "main")


def ref_for(model_id: str, card: ModelCard | None) -> HubRef | None:
    """The repo of a model: its card's, or for a model without a card, its id."""
    return hub_ref(card) if card is not None else HubRef(model_id)


# -- built-in cards ---------------------------------------------------------------------------


def card_dir(package: Path | None = None) -> Path | None:
    """resources/model_cards: inside the package in a wheel (force-included by hatch), or at
    the workspace root above the package in an editable install."""
    package = package or Path(str(importlib.resources.files("exo_download_hf")))
    packaged = package / "model_cards"
    if packaged.is_dir():
        return packaged
    for parent in package.resolve().parents:
        candidate = parent / "resources" / "model_cards"
        if candidate.is_dir():
            return candidate
    return None


def builtin_cards() -> list[ModelCard]:
    found = card_dir()
    return load_catalogue(found) if found is not None else []


# -- custom cards from config.json ------------------------------------------------------------


class CardError(ValueError):
    """The repo's config.json lacks what a card needs; the message says what."""


def _first_int(config: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _quantization(config: dict[str, Any]) -> str:
    # MLX conversions write `quantization: {bits, group_size}`; transformers writes
    # `quantization_config: {quant_method, bits}`.
    for key in ("quantization", "quantization_config"):
        block = config.get(key)
        if isinstance(block, dict):
            bits = block.get("bits")
            if isinstance(bits, int):
                return f"{bits}bit"
            method = block.get("quant_method") or block.get("mode")
            if isinstance(method, str):
                return method
    return "none"


# How the weights are stored, not the model: the card's `quantization` sums these up, and in
# some repos they are most of config.json (a line for each layer quantized differently).
WEIGHT_FORMAT_KEYS = frozenset({"quantization", "quantization_config"})


def _card_config(config: dict[str, Any]) -> dict[str, Any]:
    """What the card carries of config.json. Which keys an engine reads to judge a placement
    is the engine's business, so the card keeps the whole file when it fits the card's bound,
    else the file less its weight-format blocks, else nothing (placement then leaves a split
    to the runner's own check)."""
    model = {k: v for k, v in config.items() if k not in WEIGHT_FORMAT_KEYS}
    return next((c for c in (config, model) if card_config_problem(c) is None), {})


def card_from_config(
    repo_id: str,
    config: dict[str, Any],
    files: tuple[RemoteFile, ...] | list[RemoteFile],
    chat: ChatFormat | None = None,
) -> ModelCard:
    """A custom card from a hub repo's config.json and its file sizes, with the parsers and
    capabilities `chat` found in its tokenizer files.

    Multimodal configs nest the language model's figures under `text_config`; the family is the
    top-level `model_type`. Storage is the size of the safetensors weights. The card carries
    config.json itself too (see `_card_config`), for engines to judge a placement by."""
    text = config.get("text_config")
    text = text if isinstance(text, dict) else config
    n_layers = _first_int(text, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    hidden = _first_int(text, "hidden_size", "n_embd", "d_model", "dim")
    heads = _first_int(text, "num_attention_heads", "n_head", "num_heads")
    kv_heads = _first_int(text, "num_key_value_heads", "n_kv_heads", "num_kv_heads") or heads
    family = config.get("model_type") or text.get("model_type")
    missing = [
        name
        for name, value in (("layers", n_layers), ("hidden size", hidden), ("model_type", family))
        if not value
    ]
    if missing or n_layers is None or hidden is None or not isinstance(family, str):
        raise CardError(f"{repo_id}: config.json does not give the {', '.join(missing)}")
    weights = sum(f.size for f in files if f.path.endswith(WEIGHT_SUFFIX))
    if weights == 0:
        raise CardError(f"{repo_id} has no {WEIGHT_SUFFIX} weights")
    chat = chat or ChatFormat()
    capabilities = [Capability.TEXT, *chat.capabilities]
    if isinstance(config.get("vision_config"), dict):
        capabilities.append(Capability.VISION)
    return ModelCard(
        model_id=ModelId(repo_id),
        family=family,
        model_type=family,
        n_layers=n_layers,
        hidden_size=hidden,
        num_key_value_heads=kv_heads,
        storage_size_bytes=weights,
        context_length=_first_int(text, "max_position_embeddings", "n_positions", "seq_length"),
        quantization=_quantization(config),
        supports_tensor=family in TENSOR_PARALLEL_TYPES,
        capabilities=tuple(capabilities),
        source=f"{SOURCE_PREFIX}{repo_id}",
        reasoning_parser=chat.reasoning_parser,
        tool_parser=chat.tool_parser,
        custom=True,
        config=_card_config(config),
    )
