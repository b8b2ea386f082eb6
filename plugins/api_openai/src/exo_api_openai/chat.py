"""Chat Completions: request -> `GenerationParams`, and chunks -> SSE frames or one completion.

Pure functions and small state machines; the HTTP layer lives in routes.py.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from exo_api_openai import common
from exo_api_openai.types import (
    AssistantMessage,
    ChatCompletionRequest,
    DeveloperMessage,
    ImagePart,
    MessageIn,
    RefusalPart,
    SystemMessage,
    TextPart,
    ToolMessage,
    UserMessage,
)
from exo_core.plugin import (
    ChatMessage,
    Chunk,
    ContentPart,
    ErrorChunk,
    FinishChunk,
    GenerationParams,
    InvalidRequest,
    KeepAliveChunk,
    ModelCard,
    TextChunk,
    ThinkingChunk,
    ToolCall,
    ToolCallChunk,
    ToolCallDeltaChunk,
    Usage,
)
from exo_core.plugin.dialect import (
    GenerationFailed,
    SamplingValues,
    answered,
    finish_failure,
    resolve_sampling,
)

# -- request ---------------------------------------------------------------------------------


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
            parts.append(common.image(url))
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
                    arguments=common.arguments_text(c.function.arguments),
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
    tools = common.tool_specs(req.tools)
    want_logprobs = bool(req.logprobs)
    if req.top_logprobs and not want_logprobs:
        raise InvalidRequest("top_logprobs needs logprobs: true")
    max_tokens = (
        req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    )
    thinking = common.thinking(
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
        tool_choice=common.tool_choice(req.tool_choice, tools),
        max_tokens=max_tokens,
        stop=common.stop_list(req.stop),
        sampling=resolve_sampling(
            requested,
            card.sampling_defaults,
            thinking,
            seed=req.seed,
            repetition_context_size=req.repetition_context_size,
        ),
        logprobs=want_logprobs,
        top_logprobs=req.top_logprobs or 0,
        enable_thinking=thinking,
        reasoning_effort=common.effort(req.reasoning_effort),
    )


# -- responses -------------------------------------------------------------------------------


def _tool_call(index: int, call: ToolCall) -> dict[str, Any]:
    return {
        "index": index,
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


class ChatStream:
    """Renders chunks as `chat.completion.chunk` SSE frames, ending with `data: [DONE]`."""

    def __init__(
        self, model: str, *, include_usage: bool = False, completion_id: str | None = None
    ) -> None:
        self.id = completion_id or common.new_id("chatcmpl-")
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage
        self._calls: dict[str, int] = {}  # each call's index, by id

    def _frame(self, payload: dict[str, Any]) -> str:
        return f"data: {msgspec.json.encode(payload).decode()}\n\n"

    def _chunk(
        self,
        delta: dict[str, Any],
        *,
        finish_reason: str | None = None,
        logprobs: dict[str, Any] | None = None,
    ) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        return self._frame(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [choice],
                **({"usage": None} if self.include_usage else {}),
            }
        )

    def start(self) -> list[str]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def feed(self, chunk: Chunk) -> list[str]:
        match chunk:
            case TextChunk(text=text, logprobs=lps):
                if not text and not lps:
                    return []
                logprobs = {"content": [common.token_logprob(lp) for lp in lps]} if lps else None
                return [self._chunk({"content": text}, logprobs=logprobs)]
            case ThinkingChunk(text=text):
                return [self._chunk({"reasoning_content": text})] if text else []
            case ToolCallDeltaChunk(id=call_id, name=name, arguments=arguments):
                index = self._calls.get(call_id)
                if index is None:  # the call's first chunk: id, type and name
                    index = self._calls[call_id] = len(self._calls)
                    call = ToolCall(id=call_id, name=name, arguments=arguments)
                    return [self._chunk({"tool_calls": [_tool_call(index, call)]})]
                delta = {"index": index, "function": {"arguments": arguments}}
                return [self._chunk({"tool_calls": [delta]})]
            case ToolCallChunk(call=call):
                if call.id in self._calls:  # streamed already, as its deltas
                    return []
                self._calls[call.id] = len(self._calls)
                return [self._chunk({"tool_calls": [_tool_call(self._calls[call.id], call)]})]
            case KeepAliveChunk(prefill_processed=done, prefill_total=total):
                # A comment: clients skip it, people and proxies see the prompt being read.
                return [f": prefill {done}/{total}\n\n" if total else ": keep-alive\n\n"]
            case FinishChunk(finish_reason=reason, usage=usage):
                problem = finish_failure(reason)
                if problem is not None:
                    return self.fail(problem)
                frames = [self._chunk({}, finish_reason=reason.value)]
                if self.include_usage:
                    frames.append(self._usage(usage))
                return [*frames, "data: [DONE]\n\n"]
            case ErrorChunk(message=message):
                return self.fail(message)
            case _:  # image progress and images never reach a text stream
                return []

    def _usage(self, usage: Usage) -> str:
        return self._frame(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": common.chat_usage(usage),
            }
        )

    def fail(self, message: str) -> list[str]:
        """An error after the stream began: an error frame (the OpenAI client raises on it)."""
        return [self._frame(common.error_body(500, message)), "data: [DONE]\n\n"]


def completion(model: str, chunks: list[Chunk], completion_id: str | None = None) -> dict[str, Any]:
    """The `chat.completion` object for a finished generation. Raises `GenerationFailed` for
    one that gave no answer."""
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    logprobs: list[dict[str, Any]] = []
    finish: FinishChunk | None = None
    for chunk in chunks:
        match chunk:
            case TextChunk():
                text.append(chunk.text)
                logprobs.extend(common.token_logprob(lp) for lp in chunk.logprobs)
            case ThinkingChunk():
                reasoning.append(chunk.text)
            case ToolCallChunk():
                call = _tool_call(len(calls), chunk.call)
                del call["index"]
                calls.append(call)
            case ErrorChunk():
                raise GenerationFailed(chunk.message)
            case FinishChunk():
                finish = chunk
            case KeepAliveChunk() | ToolCallDeltaChunk():
                pass
    finish = answered(finish)
    content = "".join(text)
    msg: dict[str, Any] = {
        "role": "assistant",
        "content": content if content or not calls else None,
        "refusal": None,
    }
    if reasoning:
        msg["reasoning_content"] = "".join(reasoning)
    if calls:
        msg["tool_calls"] = calls
    return {
        "id": completion_id or common.new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": msg,
                "logprobs": {"content": logprobs} if logprobs else None,
                "finish_reason": finish.finish_reason.value,
            }
        ],
        "usage": common.chat_usage(finish.usage),
    }
