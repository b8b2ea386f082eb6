"""Model cards: what the cluster knows about a model before loading it.

Behaviour is decided from a card's fields (family, capabilities, reasoning dialect), never by
matching substrings of model ids.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import msgspec

from exo_core.exo_card_format import from_exo_card, is_exo_card
from exo_core.ids import ModelId
from exo_core.sampling_defaults import SamplingDefaults


class Capability(StrEnum):
    """What a model can do beyond plain text (thinking, tools, vision, ...); a card lists them."""

    TEXT = "text"
    THINKING = "thinking"
    THINKING_TOGGLE = "thinking_toggle"
    TOOLS = "tools"
    VISION = "vision"
    IMAGE_EDIT = "image_edit"
    # exo's two other capability names: a coding model, and an image generator.
    CODE = "code"
    IMAGE_GEN = "image_gen"


# How a model's chat template treats earlier turns' thinking (exo's `reasoning_dialect`):
# "post_last_user" keeps only the thinking after the last user message, "tool_conditional"
# keeps it while tool calls continue a turn, "suffix" / "channel" put it after the answer or
# in a channel of its own (Harmony); "none" for a model that does not think.
ReasoningDialect = Literal["none", "post_last_user", "tool_conditional", "suffix", "channel"]


class ModelTask(StrEnum):
    """The kind of job a model does (text generation, image generation, image editing)."""

    TEXT_GENERATION = "text_generation"
    # Text to image, and image editing (an input image and a prompt to an image).
    IMAGE_GENERATION = "image_generation"
    IMAGE_EDIT = "image_edit"


IMAGE_TASKS = frozenset({ModelTask.IMAGE_GENERATION, ModelTask.IMAGE_EDIT})


# Cards travel in the cluster state and between peers: the config a card carries is bounded.
MAX_CARD_CONFIG_BYTES = 8192


def card_config_problem(config: dict[str, Any]) -> str | None:
    """Why `config` cannot be a card's `config`, or None. It must encode to at most
    `MAX_CARD_CONFIG_BYTES` of JSON and be plain JSON data: a peer sends msgpack, whose bytes,
    extension values and non-string keys the API's JSON (`GET /state`) would not show as sent."""
    if not config:
        return None
    try:
        encoded = msgspec.json.encode(config)
    except (TypeError, ValueError, OverflowError, RecursionError):
        return "config holds a value that is not JSON data"
    if len(encoded) > MAX_CARD_CONFIG_BYTES:
        return (
            f"config encodes to {len(encoded)} bytes of JSON, more than the "
            f"{MAX_CARD_CONFIG_BYTES} a card may carry"
        )
    try:
        same = msgspec.json.decode(encoded) == config
    except (msgspec.DecodeError, RecursionError):
        same = False
    return None if same else "config holds a value that is not JSON data"


class ModelComponent(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One part of a multi-part model (an image model's text encoders, transformer, VAE)."""

    name: str
    storage_size_bytes: int
    # The component whose blocks a pipeline can split over several nodes (the transformer).
    splittable: bool = False
    n_blocks: int = 0


class VisionConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where a text model's vision tower comes from (exo's `[vision]` table)."""

    image_token_id: int
    # The vision tower's architecture (e.g. "kimi_vl"), not the text model's.
    model_type: str
    # The repo holding the vision weights ("" : the model's own repo).
    weights_repo: str = ""
    image_token: str | None = None
    processor_repo: str | None = None


class ModelCard(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything placement, workers and API dialects need to know about one model."""

    model_id: ModelId
    family: str
    # The architecture as a model's config.json names it (`model_type`, e.g. "qwen3_moe"):
    # engines decide from it how the model can be split. Empty when not known.
    model_type: str = ""
    # Transformer shape, for splitting a model over nodes. A model that is not split (an
    # engine with no layers to speak of) keeps the defaults: one layer, not tensor parallel.
    n_layers: int = 1
    hidden_size: int = 0
    num_key_value_heads: int | None = None
    storage_size_bytes: int
    # Tokens the model attends to (prompt and answer together); None when unknown, and then
    # only generic limits apply to a request.
    context_length: int | None = None
    quantization: str = "none"
    base_model: str = ""
    supports_tensor: bool = False
    tasks: tuple[ModelTask, ...] = (ModelTask.TEXT_GENERATION,)
    capabilities: tuple[Capability, ...] = (Capability.TEXT,)
    # Where the weights come from: "hf:<repo>" (a hub repo), "local:<dir>", or an engine's own
    # scheme such as "embedded:<name>" for weights shipped inside a Python package.
    source: str = ""
    # Parser names for output (thinking blocks, tool calls); see the output parser hook.
    reasoning_parser: str | None = None
    tool_parser: str | None = None
    reasoning_dialect: ReasoningDialect = "none"
    # An image model that runs a negative prompt beside the prompt (classifier-free guidance):
    # each step costs two passes.
    uses_cfg: bool = False
    vision: VisionConfig | None = None
    trust_remote_code: bool = False
    custom: bool = False
    # The parts of a multi-part model, with their sizes; empty for a single-part model.
    components: tuple[ModelComponent, ...] = ()
    # Keys of the model's config.json that engines read to judge a placement, as the hub has
    # them (a hybrid model's layer pattern): the core treats them as opaque. At most
    # `MAX_CARD_CONFIG_BYTES` of JSON.
    config: dict[str, Any] = {}
    # The sampling the model's makers recommend, for requests that leave a field out (see
    # `exo_core.sampling_defaults`).
    sampling_defaults: SamplingDefaults = SamplingDefaults()

    def __post_init__(self) -> None:
        # Raised here, a decoder (a card file, a peer's message) refuses the card with it.
        if (problem := card_config_problem(self.config)) is not None:
            raise ValueError(f"{self.model_id}: {problem}")

    def has(self, capability: Capability) -> bool:
        return capability in self.capabilities

    @property
    def makes_images(self) -> bool:
        return any(t in IMAGE_TASKS for t in self.tasks)


class ModelCardError(ValueError):
    """A card file is malformed; the message names the file and the field."""


def load_card_file(path: Path) -> ModelCard:
    """A card from a TOML file in this project's format or in exo's own (see
    `exo_card_format`)."""
    try:
        data = tomllib.loads(path.read_text())
        if is_exo_card(data):
            data = from_exo_card(data)
        return msgspec.convert(data, ModelCard)
    except (tomllib.TOMLDecodeError, msgspec.ValidationError, ValueError) as e:
        raise ModelCardError(f"{path}: {e}") from e


def load_card_dir(directory: Path) -> list[ModelCard]:
    """Every `*.toml` card under `directory`, sorted by file name."""
    return [load_card_file(p) for p in sorted(directory.glob("**/*.toml"))]


def index_cards(cards: Iterable[ModelCard]) -> dict[ModelId, ModelCard]:
    """Cards by id; a later card with the same id replaces an earlier one."""
    return {card.model_id: card for card in cards}
