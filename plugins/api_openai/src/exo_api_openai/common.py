"""Translation pieces both OpenAI endpoints share: tools, tool choice, thinking, logprobs, usage."""

from __future__ import annotations

import json
import uuid
from typing import Any, TypeVar

import msgspec

from exo_api_openai.types import ToolChoice, ToolIn
from exo_core.plugin import (
    Capability,
    ContentPart,
    InvalidRequest,
    ModelCard,
    TokenLogprob,
    ToolSpec,
    Usage,
)

T = TypeVar("T")


def convert(value: Any, type_: type[T], where: str) -> T:
    """`msgspec.convert` for part of a body decoded loosely, with errors that name the part."""
    try:
        return msgspec.convert(value, type_)
    except msgspec.ValidationError as e:
        raise InvalidRequest(f"invalid {where}: {e}") from e


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def tool_specs(tools: list[ToolIn] | None) -> tuple[ToolSpec, ...]:
    """Tools nested under `function` or flat (the Responses API's shape), as the core's specs."""
    specs: list[ToolSpec] = []
    for i, tool in enumerate(tools or []):
        if tool.type != "function":
            raise InvalidRequest(
                f"tools[{i}]: tools of type '{tool.type}' are not supported (only 'function')"
            )
        fn = tool.function
        name = fn.name if fn else tool.name
        if not name:
            raise InvalidRequest(f"tools[{i}]: a function tool needs a name")
        description = (fn.description if fn else tool.description) or ""
        parameters = (fn.parameters if fn else tool.parameters) or {}
        specs.append(ToolSpec(name=name, description=description, parameters=parameters))
    return tuple(specs)


def tool_choice(choice: ToolChoice | None, tools: tuple[ToolSpec, ...]) -> str:
    """ "auto", "none", "required", or the name of the one function the model must call."""
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise InvalidRequest(
                f"tool_choice must be 'auto', 'none', 'required' or a function, not '{choice}'"
            )
        return choice
    if choice.type != "function":
        raise InvalidRequest(f"tool_choice of type '{choice.type}' is not supported")
    name = choice.function.name if choice.function else choice.name
    if not name:
        raise InvalidRequest("tool_choice names no function")
    if name not in {t.name for t in tools}:
        raise InvalidRequest(f"tool_choice names '{name}', which is not among the tools")
    return name


def thinking(
    card: ModelCard,
    effort: str | None,
    template_kwargs: dict[str, Any] | None,
    enable_thinking: bool | None = None,
) -> bool | None:
    """The thinking switch: from `reasoning_effort` ("none"/"minimal" off, others on), the
    top-level `enable_thinking` (exo's extension) or `chat_template_kwargs.enable_thinking`
    (vLLM's), the later winning; None leaves the model's default.

    Models that cannot think ignore it, which is harmless: they would not think anyway."""
    flag: bool | None = None
    if effort is not None:
        flag = effort not in ("none", "minimal")
    if enable_thinking is not None:
        flag = enable_thinking
    for key, value in (template_kwargs or {}).items():
        if key not in ("enable_thinking", "thinking"):
            raise InvalidRequest(f"chat_template_kwargs.{key} is not supported")
        if not isinstance(value, bool):
            raise InvalidRequest(f"chat_template_kwargs.{key} must be a boolean")
        flag = value
    return flag if card.has(Capability.THINKING) else None


EFFORTS = {"none": "low", "minimal": "low", "low": "low", "medium": "medium", "high": "high",
           "xhigh": "high"}  # fmt: skip


def effort(value: str | None) -> str | None:
    """OpenAI's reasoning effort as the levels reasoning templates know (gpt-oss's Harmony has
    low, medium and high; "none"/"minimal" are its lowest, "xhigh" its highest)."""
    if value is None:
        return None
    if value not in EFFORTS:
        raise InvalidRequest(f"reasoning effort must be one of {', '.join(EFFORTS)}")
    return EFFORTS[value]


def stop_list(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if len(stops) > 4:
        raise InvalidRequest("stop takes at most 4 sequences")
    if any(not s for s in stops):
        raise InvalidRequest("stop sequences must not be empty")
    return stops


def image(url: str) -> ContentPart:
    if not url:
        raise InvalidRequest("an image needs a URL (or a data: URL)")
    return ContentPart(type="image", image_url=url)


def arguments_text(arguments: str | dict[str, Any]) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def token_logprob(lp: TokenLogprob) -> dict[str, Any]:
    """One token's logprob as OpenAI writes it (Chat Completions and Responses agree)."""
    return {
        "token": lp.token,
        "logprob": lp.logprob,
        "bytes": list(lp.token.encode()),
        "top_logprobs": [
            {"token": t.token, "logprob": t.logprob, "bytes": list(t.token.encode())}
            for t in lp.top
        ],
    }


def chat_usage(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def error_body(
    status: int, message: str, *, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
