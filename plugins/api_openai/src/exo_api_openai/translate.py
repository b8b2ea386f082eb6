"""Chat Completions: request -> `GenerationParams` (the answer: chat_answer.py); and the pieces
the Responses API shares with it (tools, tool choice, thinking, logprobs, usage,
OpenAI's error shape).

Pure functions and small state machines; the HTTP layer lives in routes.py.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

import msgspec
from litestar.exceptions import HTTPException

from exo_api_openai.types import (
    AssistantMessage,
    ChatCompletionRequest,
    DeveloperMessage,
    ImagePart,
    MessageIn,
    RefusalPart,
    SystemMessage,
    TextPart,
    ToolChoice,
    ToolIn,
    ToolMessage,
    UserMessage,
)
from exo_core.plugin import (
    Capability,
    ChatMessage,
    ContentPart,
    GenerationParams,
    InvalidRequest,
    ModelCard,
    ModelNotFound,
    TokenLogprob,
    ToolCall,
    ToolSpec,
    Usage,
)
from exo_core.plugin.dialect import (
    SamplingValues,
    resolve_sampling,
)

# -- shared by Chat Completions and Responses ------------------------------------------------------


T = TypeVar("T")


def convert(value: Any, type_: type[T], where: str) -> T:
    """`msgspec.convert` for part of a body decoded loosely, with errors that name the part."""
    try:
        return msgspec.convert(value, type_)
    except msgspec.ValidationError as e:
        raise InvalidRequest(f"invalid {where}: {e}") from e


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


# -- Chat Completions: the request -----------------------------------------------------------------


def _text(content: str | list[TextPart] | list[TextPart | RefusalPart] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.text if isinstance(p, TextPart) else p.refusal for p in content)


def _user_content(content: str | list[TextPart | ImagePart]) -> str | tuple[ContentPart, ...]:
    if isinstance(content, str):
        return content
    parts: list[ContentPart] = []
    for part in content:
        if isinstance(part, TextPart):
            parts.append(ContentPart(type="text", text=part.text))
        else:
            url = part.image_url if isinstance(part.image_url, str) else part.image_url.url
            parts.append(image(url))
    return tuple(parts)


def message(m: MessageIn) -> ChatMessage:
    name = m.name or ""
    match m:
        case SystemMessage() | DeveloperMessage():
            return ChatMessage(role="system", content=_text(m.content), name=name)
        case UserMessage():
            return ChatMessage(role="user", content=_user_content(m.content), name=name)
        case AssistantMessage():
            calls = tuple(
                ToolCall(
                    id=c.id,
                    name=c.function.name,
                    arguments=arguments_text(c.function.arguments),
                )
                for c in m.tool_calls or []
            )
            return ChatMessage(
                role="assistant",
                content=_text(m.content) or (m.refusal or ""),
                reasoning=m.reasoning_content or m.reasoning or "",
                tool_calls=calls,
                name=name,
            )
        case ToolMessage():
            return ChatMessage(
                role="tool", content=_text(m.content), tool_call_id=m.tool_call_id, name=name
            )


def _refuse_unsupported(req: ChatCompletionRequest) -> None:
    if req.n is not None and req.n != 1:
        raise InvalidRequest(f"n={req.n} is not supported: exo generates one choice per request")
    if req.logit_bias:
        raise InvalidRequest("logit_bias is not supported")
    if req.audio is not None or any(m != "text" for m in req.modalities or []):
        raise InvalidRequest("only text output is supported")
    if req.web_search_options is not None:
        raise InvalidRequest("web search is not supported")
    if req.functions is not None or req.function_call is not None:
        raise InvalidRequest(
            "functions and function_call are deprecated: use tools and tool_choice"
        )
    if req.response_format is not None and req.response_format.type != "text":
        raise InvalidRequest(
            f"response_format '{req.response_format.type}' is not supported (only 'text')"
        )


def field_names(req: ChatCompletionRequest) -> dict[str, str]:
    """The request's names for the core's fields, for refusals that name them."""
    if req.max_completion_tokens is not None:
        return {"max_tokens": "max_completion_tokens"}
    return {}


def to_params(req: ChatCompletionRequest, card: ModelCard) -> GenerationParams:
    _refuse_unsupported(req)
    if not req.messages:
        raise InvalidRequest("messages must not be empty")
    tools = tool_specs(req.tools)
    want_logprobs = bool(req.logprobs)
    if req.top_logprobs and not want_logprobs:
        raise InvalidRequest("top_logprobs needs logprobs: true")
    max_tokens = (
        req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    )
    enable_thinking = thinking(
        card, req.reasoning_effort, req.chat_template_kwargs, req.enable_thinking
    )
    requested = SamplingValues(
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p,
        repetition_penalty=req.repetition_penalty,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
    )
    return GenerationParams(
        messages=tuple(message(m) for m in req.messages),
        tools=tools,
        tool_choice=tool_choice(req.tool_choice, tools),
        max_tokens=max_tokens,
        stop=stop_list(req.stop),
        sampling=resolve_sampling(
            requested,
            card.sampling_defaults,
            enable_thinking,
            seed=req.seed,
            repetition_context_size=req.repetition_context_size,
        ),
        logprobs=want_logprobs,
        top_logprobs=req.top_logprobs or 0,
        enable_thinking=enable_thinking,
        reasoning_effort=effort(req.reasoning_effort),
    )


# -- the error body of every route -----------------------------------------------------------------


def api_error(status: int, message: str, exc: Exception) -> dict[str, Any]:
    """The body for a failure; unknown models and routes carry OpenAI's codes for them."""
    code: str | None = None
    if isinstance(exc, ModelNotFound):
        code = "model_not_found"
    elif isinstance(exc, HTTPException) and status == 404:
        code = "not_found"
    param = exc.param if isinstance(exc, InvalidRequest) else None
    return error_body(status, message, code=code, param=param)
