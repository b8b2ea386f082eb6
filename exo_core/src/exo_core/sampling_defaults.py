"""A model's own sampling defaults (its card's `sampling_defaults`), and the sampling a request
gets once its omitted fields are filled from them.

Model makers publish the settings their model is meant to run with (Qwen 3: temperature 0.6,
top_p 0.95, top_k 20 while thinking; 0.7 / 0.8 without), and exo's cards carry them in the
same shape as here: a flat table, optionally with a `thinking` and a `non_thinking` table.
A request's own value always wins; then the table for the request's thinking mode (`thinking`
when thinking is on, `non_thinking` when off), then the flat table, then exo's built-in
defaults. With no switch in the request (the model thinks or not as it always does) the flat
table applies, as in exo.

`value_problem` holds every sampling field's range once: a card's defaults are checked with it
when the card is read, and `exo_core.validation` checks a request's fields with it.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from exo_core.generation import SamplingParams

# OpenAI's range for presence_penalty and frequency_penalty.
PENALTY_LIMIT = 2.0
# Integers larger than this are refused outright (they would not even fit the log's encoding).
INT_LIMIT = 2**31 - 1


def value_problem(field: str, value: float) -> str | None:
    """What is wrong with `value` for the sampling field `field` (None when it is in range)."""
    if field == "top_k":
        return (
            None if 0 <= value <= INT_LIMIT else f"must be between 0 and {INT_LIMIT}, got {value}"
        )
    if not math.isfinite(value):
        return f"must be a finite number, got {value}"
    if field == "temperature" and value < 0:
        return f"must not be negative, got {value}"
    if field == "top_p" and not 0 < value <= 1:
        return f"must be in (0, 1], got {value}"
    if field == "min_p" and not 0 <= value <= 1:
        return f"must be in [0, 1], got {value}"
    if field == "repetition_penalty" and value <= 0:
        return f"must be positive, got {value}"
    if field in ("presence_penalty", "frequency_penalty") and abs(value) > PENALTY_LIMIT:
        return f"must be between -{PENALTY_LIMIT:g} and {PENALTY_LIMIT:g}, got {value}"
    return None


class SamplingValues(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Sampling settings, each None where not set (a request's, or one table of a card)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    def check(self) -> None:
        """Raise ValueError for the first value out of its range."""
        for field in SamplingValues.__struct_fields__:
            value = getattr(self, field)
            if value is not None and (problem := value_problem(field, value)) is not None:
                raise ValueError(f"sampling_defaults.{field} {problem}")


class SamplingDefaults(SamplingValues, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A card's defaults: the flat values, and those for thinking on and off where they differ."""

    thinking: SamplingValues | None = None
    non_thinking: SamplingValues | None = None

    def __post_init__(self) -> None:
        # Raised here, a decoder (a card file, a peer's message) refuses the card with it.
        for values in (self, self.thinking, self.non_thinking):
            if values is not None:
                SamplingValues.check(values)


_VALUE_FIELDS = SamplingValues.__struct_fields__


def from_exo_table(table: Any) -> dict[str, Any]:
    """exo's `[sampling_defaults]` table (with its `thinking`/`non_thinking` sub-tables) as
    this project's field; keys exo may add later are left out rather than refuse the card."""
    if not isinstance(table, dict):
        return {}
    out: dict[str, Any] = {k: v for k, v in table.items() if k in _VALUE_FIELDS}
    for mode in ("thinking", "non_thinking"):
        sub = table.get(mode)
        if isinstance(sub, dict):
            out[mode] = {k: v for k, v in sub.items() if k in _VALUE_FIELDS}
    return {"sampling_defaults": out} if out else {}


def resolve_sampling(
    requested: SamplingValues,
    defaults: SamplingDefaults,
    thinking: bool | None,
    *,
    seed: int | None = None,
    repetition_context_size: int | None = None,
) -> SamplingParams:
    """The sampling a request runs with: each field the request's own value, else the card's
    for the request's thinking mode, else the card's flat value, else the built-in default."""
    mode = {True: defaults.thinking, False: defaults.non_thinking, None: None}[thinking]
    layers = [v for v in (requested, mode, defaults) if v is not None]
    built_in = SamplingParams()
    chosen: dict[str, Any] = {}
    for field in _VALUE_FIELDS:
        value = next((getattr(v, field) for v in layers if getattr(v, field) is not None), None)
        chosen[field] = getattr(built_in, field) if value is None else value
    return SamplingParams(seed=seed, repetition_context_size=repetition_context_size, **chosen)
