"""Limits every generation request must meet, checked once in the core for every API dialect.

Engines trust what passes here: a value out of range (a negative seed, `min_p=5`, a penalty of
-1) would otherwise reach the runner and fail inside a shared batch. Each check names the core
field; a dialect passes `FieldNames` so that the refusal names the field as its caller wrote it
(`options.seed` for Ollama, `stop_sequences` for Anthropic).

The prompt's length is checked against the model's context with an estimate that errs on the
side of accepting: the core holds no tokenizer, so it counts a token for every
`BYTES_PER_TOKEN_BOUND` bytes, more than any real vocabulary averages. The runner, which
tokenizes, refuses what this lets through and caps the answer to the room the prompt leaves.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from exo_core.generation import GenerationParams
from exo_core.model_cards import ModelCard
from exo_core.sampling_defaults import INT_LIMIT, value_problem

FieldNames = Mapping[str, str]
"""A dialect's names for the core's fields ("seed" -> "options.seed"); unnamed fields keep the
core's name."""

SEED_MAX = 2**64 - 1  # MLX keys take an unsigned 64-bit seed
MAX_STOP_SEQUENCES = 16
MAX_STOP_CHARS = 256
MAX_TOP_LOGPROBS = 20
# A model with no known context still gets a ceiling on its answer.
UNKNOWN_CONTEXT_MAX_TOKENS = 2**20
# Byte-level BPE averages about 4 bytes a token on prose; 16 leaves a wide margin, so only a
# prompt that surely cannot fit is refused before it reaches a runner.
BYTES_PER_TOKEN_BOUND = 16


class ParamError(ValueError):
    """A request field out of its range. `field` is the dialect's name for it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field} {problem}")
        self.field = field
        self.problem = problem


def context_length(card: ModelCard) -> int | None:
    """The model's context in tokens, or None when its card does not say (or says nonsense)."""
    n = card.context_length
    return n if n is not None and n > 0 else None


def estimated_prompt_tokens(params: GenerationParams) -> int:
    """A count the real prompt's token count is very unlikely to be below (see module doc)."""
    size = len((params.prompt or "").encode())
    for message in params.messages:
        size += len(message.text().encode()) + len(message.reasoning.encode())
        size += sum(len(c.arguments.encode()) + len(c.name.encode()) for c in message.tool_calls)
    for tool in params.tools:
        size += len(tool.description.encode()) + len(msgspec.json.encode(tool.parameters))
    return size // BYTES_PER_TOKEN_BOUND


def check_params(
    card: ModelCard, params: GenerationParams, names: FieldNames | None = None
) -> None:
    """Raise `ParamError` for the first field of `params` out of range for `card`."""
    dialect = names or {}

    def fail(field: str, problem: str) -> ParamError:
        return ParamError(dialect.get(field, field), problem)

    def within(field: str, value: int, low: int, high: int) -> None:
        if not low <= value <= high:
            raise fail(field, f"must be between {low} and {high}, got {value}")

    s = params.sampling
    for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty"):
        if (problem := value_problem(name, getattr(s, name))) is not None:
            raise fail(name, problem)
    if s.seed is not None:
        within("seed", s.seed, 0, SEED_MAX)
    penalty = s.repetition_penalty
    if penalty is not None and (problem := value_problem("repetition_penalty", penalty)):
        raise fail("repetition_penalty", problem)
    if s.repetition_context_size is not None:
        within("repetition_context_size", s.repetition_context_size, 1, INT_LIMIT)

    within("top_logprobs", params.top_logprobs, 0, MAX_TOP_LOGPROBS)
    if len(params.stop) > MAX_STOP_SEQUENCES:
        raise fail("stop", f"takes at most {MAX_STOP_SEQUENCES} sequences, got {len(params.stop)}")
    for stop in params.stop:
        if not stop:
            raise fail("stop", "must not hold empty strings")
        if len(stop) > MAX_STOP_CHARS:
            raise fail("stop", f"sequences are at most {MAX_STOP_CHARS} characters long")

    context = context_length(card)
    prompt = estimated_prompt_tokens(params)
    if context is not None and prompt >= context:
        raise fail(
            "messages" if params.messages else "prompt",
            f"are too long: about {prompt} tokens or more, and the model's context "
            f"is {context} tokens",
        )
    if params.max_tokens is not None:
        ceiling = context if context is not None else UNKNOWN_CONTEXT_MAX_TOKENS
        if params.max_tokens < 1:
            raise fail("max_tokens", f"must be at least 1, got {params.max_tokens}")
        if params.max_tokens > ceiling:
            what = "the model's context length" if context is not None else "the limit"
            raise fail("max_tokens", f"must be at most {ceiling} ({what}), got {params.max_tokens}")
