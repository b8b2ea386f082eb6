"""Every dialect fills the sampling fields a request leaves out from the model's card (the set
for the request's thinking mode), keeps the fields it sets, and passes the penalties it has."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from exo_api_claude import translate as claude
from exo_api_claude.types import MessagesRequest
from exo_api_ollama import models as ollama_models
from exo_api_ollama import translate as ollama
from exo_api_ollama.types import ChatRequest
from exo_api_openai import responses, translate
from exo_api_openai.types import ChatCompletionRequest, ResponsesRequest
from exo_core.generation import GenerationParams, SamplingParams
from exo_core.sampling_defaults import SamplingDefaults, SamplingValues
from exo_core.testing.scripted_engine import ECHO, THINKER

USER = [{"role": "user", "content": "hi"}]
DEFAULTS = SamplingDefaults(
    temperature=0.6,
    top_p=0.95,
    top_k=20,
    thinking=SamplingValues(temperature=1.0),
    non_thinking=SamplingValues(temperature=0.7, top_p=0.8, presence_penalty=1.5),
)
CARD = msgspec.structs.replace(THINKER, sampling_defaults=DEFAULTS)


def _openai(**body: Any) -> GenerationParams:
    req = msgspec.convert({"model": "m", "messages": USER, **body}, ChatCompletionRequest)
    return translate.to_params(req, CARD)


def _responses(**body: Any) -> GenerationParams:
    req = msgspec.convert({"model": "m", "input": "hi", **body}, ResponsesRequest)
    return responses.to_params(req, CARD)


def _ollama(**body: Any) -> GenerationParams:
    return ollama.chat_params(
        msgspec.convert({"model": "m", "messages": USER, **body}, ChatRequest), CARD
    )


def _claude(**body: Any) -> GenerationParams:
    req = msgspec.convert(
        {"model": "m", "max_tokens": 9, "messages": USER, **body}, MessagesRequest
    )
    return claude.to_params(req, CARD)


def _sampled(p: GenerationParams) -> tuple[float, float, int, float]:
    s = p.sampling
    return s.temperature, s.top_p, s.top_k, s.presence_penalty


@pytest.mark.parametrize("translate", [_openai, _responses, _ollama, _claude])
def test_a_request_that_omits_the_fields_gets_the_cards_defaults(translate: Any) -> None:
    assert _sampled(translate()) == (0.6, 0.95, 20, 0.0)


def test_a_card_without_defaults_leaves_the_built_in_ones() -> None:
    req = msgspec.convert({"model": "m", "messages": USER}, ChatCompletionRequest)
    assert translate.to_params(req, THINKER).sampling == SamplingParams()


@pytest.mark.parametrize(
    ("translate", "off", "on"),
    [
        (_openai, {"enable_thinking": False}, {"enable_thinking": True}),
        (
            _openai,
            {"chat_template_kwargs": {"enable_thinking": False}},
            {"reasoning_effort": "high"},
        ),
        (_responses, {"enable_thinking": False}, {"reasoning": {"effort": "high"}}),
        (_ollama, {"think": False}, {"think": True}),
        (
            _claude,
            {"thinking": {"type": "disabled"}},
            {"thinking": {"type": "enabled", "budget_tokens": 1024}},
        ),
    ],
)
def test_the_thinking_mode_picks_its_set(translate: Any, off: Any, on: Any) -> None:
    assert _sampled(translate(**off)) == (0.7, 0.8, 20, 1.5)
    assert _sampled(translate(**on)) == (1.0, 0.95, 20, 0.0)


def test_explicit_values_win_over_the_card() -> None:
    got = _openai(temperature=0, top_p=0.5, presence_penalty=0.25, frequency_penalty=-1.0)
    s = got.sampling
    assert (s.temperature, s.top_p, s.top_k, s.presence_penalty, s.frequency_penalty) == (
        0,
        0.5,
        20,
        0.25,
        -1.0,
    )
    options = {"temperature": 0.1, "top_k": 3, "presence_penalty": 1, "frequency_penalty": 1.5}
    s = _ollama(options=options).sampling
    assert (s.temperature, s.top_k, s.presence_penalty, s.frequency_penalty) == (0.1, 3, 1, 1.5)
    assert _claude(temperature=0.2, top_k=4).sampling.top_k == 4


def test_top_level_enable_thinking_is_honoured() -> None:
    assert _openai(enable_thinking=False).enable_thinking is False
    assert _openai(enable_thinking=True).enable_thinking is True
    assert _openai().enable_thinking is None
    # chat_template_kwargs (vLLM's spelling) wins over it, and it wins over reasoning_effort.
    both = _openai(enable_thinking=True, chat_template_kwargs={"enable_thinking": False})
    assert both.enable_thinking is False
    assert _openai(enable_thinking=False, reasoning_effort="high").enable_thinking is False
    assert _responses(enable_thinking=False).enable_thinking is False
    # A model that cannot think ignores the switch.
    req = msgspec.convert(
        {"model": "m", "messages": USER, "enable_thinking": True}, ChatCompletionRequest
    )
    assert translate.to_params(req, ECHO).enable_thinking is None


def test_a_non_boolean_enable_thinking_is_refused() -> None:
    with pytest.raises(msgspec.ValidationError, match="enable_thinking"):
        msgspec.convert(
            {"model": "m", "messages": USER, "enable_thinking": "yes"}, ChatCompletionRequest
        )


def test_exos_extra_knobs_on_the_responses_api_and_chat() -> None:
    got = _responses(top_k=7, seed=11, stop=["END"])
    assert (got.sampling.top_k, got.sampling.seed, got.stop) == (7, 11, ("END",))
    chat_params = _openai(repetition_penalty=1.2, repetition_context_size=64)
    assert chat_params.sampling.repetition_context_size == 64


def test_ollama_show_lists_the_cards_defaults_as_parameters() -> None:
    shown = ollama_models.show(CARD, "2026-01-01T00:00:00Z")["parameters"].splitlines()
    assert [line.split() for line in shown] == [
        ["temperature", "0.6"],
        ["top_p", "0.95"],
        ["top_k", "20"],
    ]
    assert ollama_models.show(THINKER, "2026-01-01T00:00:00Z")["parameters"] == ""
