"""The core's limits on generation requests (`exo_core.validation`) and the error text that
reaches clients (`exo_core.redact`). Pure functions: no node needed."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from exo_core.generation import ChatMessage, GenerationParams, SamplingParams
from exo_core.model_cards import ModelCard
from exo_core.redact import clean_text, public_message
from exo_core.service import InvalidRequest, validate
from exo_core.testing.scripted_engine import ECHO
from exo_core.validation import (
    MAX_STOP_SEQUENCES,
    SEED_MAX,
    UNKNOWN_CONTEXT_MAX_TOKENS,
    ParamError,
    check_params,
)

CARD = msgspec.structs.replace(ECHO, context_length=1000)
HELLO = (ChatMessage(role="user", content="hello"),)


def params(sampling: dict[str, Any] | None = None, **fields: Any) -> GenerationParams:
    return GenerationParams(messages=HELLO, sampling=SamplingParams(**(sampling or {})), **fields)


BAD: list[tuple[str, GenerationParams]] = [
    ("seed", params({"seed": -1})),
    ("seed", params({"seed": SEED_MAX + 1})),
    ("min_p", params({"min_p": 5.0})),
    ("min_p", params({"min_p": float("nan")})),
    ("top_k", params({"top_k": -1})),
    ("top_k", params({"top_k": 10**30})),
    ("repetition_penalty", params({"repetition_penalty": -1.0})),
    ("repetition_penalty", params({"repetition_penalty": 0.0})),
    ("repetition_context_size", params({"repetition_penalty": 1.1, "repetition_context_size": 0})),
    ("temperature", params({"temperature": -0.5})),
    ("temperature", params({"temperature": float("inf")})),
    ("top_p", params({"top_p": 0.0})),
    ("top_p", params({"top_p": 1.5})),
    ("max_tokens", params(max_tokens=0)),
    ("max_tokens", params(max_tokens=10**30)),
    ("max_tokens", params(max_tokens=2**63)),
    ("max_tokens", params(max_tokens=1001)),
    ("top_logprobs", params(top_logprobs=21)),
    ("stop", params(stop=tuple(f"s{i}" for i in range(MAX_STOP_SEQUENCES + 1)))),
    ("stop", params(stop=("x" * 10_000,))),
    ("stop", params(stop=("",))),
    ("messages", GenerationParams(messages=(ChatMessage(role="user", content="word " * 20_000),))),
    ("prompt", GenerationParams(prompt="word " * 20_000)),
]


@pytest.mark.parametrize(("field", "request_params"), BAD, ids=[f for f, _ in BAD])
def test_each_value_out_of_range_is_refused_naming_its_field(
    field: str, request_params: GenerationParams
) -> None:
    with pytest.raises(ParamError) as refused:
        check_params(CARD, request_params)
    assert refused.value.field == field
    assert str(refused.value).startswith(field)


def test_values_at_the_edges_pass() -> None:
    check_params(
        CARD,
        params(
            {"seed": SEED_MAX, "min_p": 1.0, "top_k": 0, "temperature": 0.0, "top_p": 1.0},
            max_tokens=1000,
            top_logprobs=20,
            stop=tuple(f"s{i}" for i in range(MAX_STOP_SEQUENCES)),
        ),
    )
    check_params(CARD, params({"seed": 0, "repetition_penalty": 0.5}))


def test_a_model_without_a_known_context_still_caps_max_tokens() -> None:
    unknown = msgspec.structs.replace(ECHO, context_length=None)
    check_params(unknown, params(max_tokens=UNKNOWN_CONTEXT_MAX_TOKENS))
    with pytest.raises(ParamError):
        check_params(unknown, params(max_tokens=UNKNOWN_CONTEXT_MAX_TOKENS + 1))
    # No context, no prompt check.
    check_params(unknown, GenerationParams(prompt="word " * 20_000))


@pytest.mark.parametrize(
    ("names", "field", "said"),
    [
        ({"seed": "options.seed"}, "seed", "options.seed"),
        ({"stop": "stop_sequences"}, "stop", "stop_sequences"),
        ({}, "seed", "seed"),
    ],
)
def test_a_refusal_names_the_field_as_the_dialect_spells_it(
    names: dict[str, str], field: str, said: str
) -> None:
    bad = params({"seed": -1}) if field == "seed" else params(stop=("",) * 2)
    with pytest.raises(InvalidRequest) as refused:
        validate(CARD, bad, names)
    assert refused.value.param == said
    assert refused.value.message.startswith(f"{said} ")
    assert refused.value.status == 400


def test_cards_load_their_context_length() -> None:
    card = msgspec.convert(
        {**msgspec.to_builtins(ECHO), "context_length": 8192}, ModelCard, strict=False
    )
    assert card.context_length == 8192


# -- redaction ---------------------------------------------------------------------------------


def test_paths_and_object_reprs_do_not_reach_clients() -> None:
    text = clean_text(
        "No such file: '/home/alice/.local/share/exo/models/x/config.json' "
        "in <exo_engine_mlx.runner.MlxRunner object at 0x7f00deadbeef>\nTraceback (most recent...)"
    )
    assert "/home/alice" not in text and "0x7f" not in text and "Traceback" not in text
    assert "config.json" in text


def test_a_bug_is_named_by_its_kind_only() -> None:
    assert public_message(TypeError("key(): incompatible function arguments")) == (
        "an unexpected TypeError"
    )
    assert public_message(RuntimeError("the ring lost rank 1")) == "the ring lost rank 1"
    assert public_message(ValueError("")) == "an unexpected ValueError"
