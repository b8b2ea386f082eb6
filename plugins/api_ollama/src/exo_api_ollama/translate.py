"""Ollama: requests -> `GenerationParams`, chunks -> NDJSON lines or one object (cards ->
models: models.py).

Pure functions and a small state machine; the HTTP layer lives in routes.py.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec

from exo_api_ollama.types import ChatRequest, GenerateRequest, MessageIn, Options, Think, ToolIn
from exo_core.plugin import (
    Capability,
    ChatMessage,
    Chunk,
    ContentPart,
    ErrorChunk,
    FinishChunk,
    FinishReason,
    GenerationParams,
    InvalidRequest,
    KeepAliveChunk,
    ModelCard,
    SamplingParams,
    TextChunk,
    ThinkingChunk,
    TokenLogprob,
    ToolCall,
    ToolCallChunk,
    ToolSpec,
    Usage,
)
from exo_core.plugin.dialect import (
    UNFINISHED,
    GenerationFailed,
    SamplingValues,
    finish_failure,
    resolve_sampling,
)

# The Ollama API level these routes follow (thinking, tool calls with object arguments,
# tool_name); clients such as Open WebUI read it to decide which features to use.
OLLAMA_VERSION = "0.12.0"

Endpoint = Literal["chat", "generate"]

# -- request ---------------------------------------------------------------------------------

_MAGIC = {"iVBOR": "image/png", "/9j/": "image/jpeg", "R0lG": "image/gif", "UklG": "image/webp"}


def image(data: str) -> ContentPart:
    """Ollama sends images as bare base64; the core wants a URL, so make it a data: URL."""
    if data.startswith("data:"):
        return ContentPart(type="image", image_url=data)
    mime = next((m for prefix, m in _MAGIC.items() if data.startswith(prefix)), "image/png")
    return ContentPart(type="image", image_url=f"data:{mime};base64,{data}")


def _content(text: str, images: list[str] | None) -> str | tuple[ContentPart, ...]:
    if not images:
        return text
    parts = [image(i) for i in images]
    return (ContentPart(type="text", text=text), *parts) if text else tuple(parts)


def _arguments(arguments: dict[str, Any] | str) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def messages(items: list[MessageIn]) -> tuple[ChatMessage, ...]:
    """Ollama's messages as the core's. Ollama tool calls often carry no id and tool results
    name only the tool, so ids are made up and each result is matched to the oldest open call
    of that tool (chat templates that need ids then still pair them right)."""
    out: list[ChatMessage] = []
    open_calls: list[ToolCall] = []
    for i, m in enumerate(items):
        if m.role == "assistant":
            calls = tuple(
                ToolCall(
                    id=c.id or f"call_{i}_{j}",
                    name=c.function.name,
                    arguments=_arguments(c.function.arguments),
                )
                for j, c in enumerate(m.tool_calls or [])
            )
            open_calls.extend(calls)
            out.append(
                ChatMessage(
                    role="assistant",
                    content=_content(m.content, m.images),
                    reasoning=m.thinking or "",
                    tool_calls=calls,
                )
            )
        elif m.role == "tool":
            call = next(
                (c for c in open_calls if c.id == m.tool_call_id or c.name == m.tool_name), None
            )
            if call is not None:
                open_calls.remove(call)
            out.append(
                ChatMessage(
                    role="tool",
                    content=m.content,
                    tool_call_id=m.tool_call_id or (call.id if call else ""),
                    name=m.tool_name or (call.name if call else ""),
                )
            )
        else:
            out.append(ChatMessage(role=m.role, content=_content(m.content, m.images)))
    return tuple(out)


def tools(specs: list[ToolIn] | None) -> tuple[ToolSpec, ...]:
    out: list[ToolSpec] = []
    for i, tool in enumerate(specs or []):
        if tool.type != "function":
            raise InvalidRequest(f"tools[{i}]: tools of type '{tool.type}' are not supported")
        fn = tool.function
        out.append(
            ToolSpec(name=fn.name, description=fn.description or "", parameters=fn.parameters or {})
        )
    return tuple(out)


def _neutral(name: str, value: float | None, neutral: float) -> None:
    if value is not None and value != neutral:
        raise InvalidRequest(f"option {name} is not supported by exo")


# Ollama's names for the core's fields, for refusals that name them.
FIELD_NAMES = {
    "temperature": "options.temperature",
    "top_p": "options.top_p",
    "top_k": "options.top_k",
    "min_p": "options.min_p",
    "seed": "options.seed",
    "repetition_penalty": "options.repeat_penalty",
    "repetition_context_size": "options.repeat_last_n",
    "max_tokens": "options.num_predict",
    "stop": "options.stop",
    "presence_penalty": "options.presence_penalty",
    "frequency_penalty": "options.frequency_penalty",
}


def sampling(
    options: Options | None, card: ModelCard, thinking: bool | None
) -> tuple[SamplingParams, int | None, tuple[str, ...]]:
    """(sampling, max_tokens, stop) from Ollama's options, with the card's defaults for the
    sampling options left out."""
    o = options or Options()
    _neutral("mirostat", o.mirostat, 0)
    _neutral("typical_p", o.typical_p, 1.0)
    _neutral("tfs_z", o.tfs_z, 1.0)
    requested = SamplingValues(
        temperature=o.temperature,
        top_p=o.top_p,
        top_k=o.top_k,
        min_p=o.min_p,
        repetition_penalty=o.repeat_penalty,
        presence_penalty=o.presence_penalty,
        frequency_penalty=o.frequency_penalty,
    )
    context = o.repeat_last_n if o.repeat_last_n and o.repeat_last_n > 0 else None
    params = resolve_sampling(
        requested, card.sampling_defaults, thinking, seed=o.seed, repetition_context_size=context
    )
    # num_predict: -1 is "no limit", -2 "fill the context"; both mean no cap here.
    limit = o.num_predict if o.num_predict is not None and o.num_predict >= 0 else None
    if limit == 0:
        raise InvalidRequest("num_predict must not be 0")
    stop = (o.stop,) if isinstance(o.stop, str) else tuple(o.stop or ())
    return params, limit, stop


def thinking(think: Think | None, card: ModelCard) -> bool | None:
    if think is None:
        return None
    if think is False:
        return False if card.has(Capability.THINKING) else None
    if not card.has(Capability.THINKING):
        raise InvalidRequest(f'"{card.model_id}" does not support thinking')
    return True


def effort(think: Think | None) -> str | None:
    """A `think` level ("low", "medium", "high") is the reasoning effort too (gpt-oss's
    Harmony `Reasoning:`); true/false leave the model's default effort."""
    return think if isinstance(think, str) else None


def _refuse_format(fmt: str | dict[str, Any] | None) -> None:
    if fmt:
        raise InvalidRequest("format (JSON mode and structured outputs) is not supported by exo")


def chat_params(req: ChatRequest, card: ModelCard) -> GenerationParams:
    _refuse_format(req.format)
    thinks = thinking(req.think, card)
    sampled, limit, stop = sampling(req.options, card, thinks)
    return GenerationParams(
        messages=messages(req.messages),
        tools=tools(req.tools),
        max_tokens=limit,
        stop=stop,
        sampling=sampled,
        logprobs=bool(req.logprobs),
        top_logprobs=req.top_logprobs or 0,
        enable_thinking=thinks,
        reasoning_effort=effort(req.think),
    )


def generate_params(req: GenerateRequest, card: ModelCard) -> GenerationParams:
    _refuse_format(req.format)
    if req.suffix:
        raise InvalidRequest("suffix (fill in the middle) is not supported by exo")
    if req.template:
        raise InvalidRequest("template is not supported: exo uses the model's chat template")
    if req.context:
        raise InvalidRequest("context is not supported: send the conversation to /api/chat")
    thinks = thinking(req.think, card)
    sampled, limit, stop = sampling(req.options, card, thinks)
    common: dict[str, Any] = {
        "max_tokens": limit,
        "stop": stop,
        "sampling": sampled,
        "logprobs": bool(req.logprobs),
        "top_logprobs": req.top_logprobs or 0,
        "enable_thinking": thinks,
        "reasoning_effort": effort(req.think),
    }
    if req.raw:
        if req.images:
            raise InvalidRequest("images need the chat template: they cannot go with raw")
        return GenerationParams(prompt=(req.system or "") + req.prompt, **common)
    system = (ChatMessage(role="system", content=req.system),) if req.system else ()
    user = ChatMessage(role="user", content=_content(req.prompt, req.images))
    return GenerationParams(messages=(*system, user), **common)


def is_unload(keep_alive: str | float | None) -> bool:
    """keep_alive 0 (in any unit) asks Ollama to unload the model."""
    if keep_alive is None:
        return False
    if isinstance(keep_alive, int | float):
        return keep_alive == 0
    return keep_alive.strip().rstrip("hms") in ("0", "0.0")


# -- response --------------------------------------------------------------------------------


def now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _logprob(lp: TokenLogprob) -> dict[str, Any]:
    return {
        "token": lp.token,
        "logprob": lp.logprob,
        "top_logprobs": [{"token": t.token, "logprob": t.logprob} for t in lp.top],
    }


def tool_arguments(arguments: str) -> dict[str, Any]:
    """Ollama sends arguments as an object; text that is not one is kept whole, not dropped."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"_raw_arguments": arguments}
    return value if isinstance(value, dict) else {"_raw_arguments": arguments}


def tool_call(index: int, call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "function": {
            "index": index,
            "name": call.name,
            "arguments": tool_arguments(call.arguments),
        },
    }


def _ns(seconds: float) -> int:
    return max(0, int(seconds * 1e9))


def stats(usage: Usage, elapsed_s: float) -> dict[str, Any]:
    """Ollama's counts and durations (nanoseconds) from the core's usage and the wall clock."""
    prompt_s = usage.time_to_first_token_s or (
        usage.prompt_tokens / usage.prompt_tps if usage.prompt_tps else 0.0
    )
    eval_s = (
        usage.completion_tokens / usage.generation_tps
        if usage.generation_tps
        else max(0.0, elapsed_s - prompt_s)
    )
    return {
        "total_duration": _ns(elapsed_s),
        "load_duration": 0,
        "prompt_eval_count": usage.prompt_tokens,
        "prompt_eval_duration": _ns(prompt_s),
        "eval_count": usage.completion_tokens,
        "eval_duration": _ns(eval_s),
    }


def done_reason(reason: FinishReason) -> str:
    return "length" if reason == FinishReason.LENGTH else "stop"


def error_body(status: int, message: str, exc: Exception | None = None) -> dict[str, Any]:
    """Ollama's error shape, `{"error": "..."}` (the status says the rest)."""
    return {"error": message}


class Reply:
    """Chunks as Ollama's objects, for `/api/chat` (a `message`) or `/api/generate` (a
    `response`): `feed` gives NDJSON lines to stream, `result` the one object of a non-streamed
    reply."""

    def __init__(self, model: str, endpoint: Endpoint) -> None:
        self.model = model
        self.endpoint = endpoint
        self._started = time.monotonic()
        self._text: list[str] = []
        self._thinking: list[str] = []
        self._calls: list[dict[str, Any]] = []
        self._logprobs: list[dict[str, Any]] = []
        self.final: dict[str, Any] | None = None
        self.error: str | None = None

    def _object(
        self,
        *,
        text: str = "",
        thinking: str = "",
        calls: list[dict[str, Any]] | None = None,
        logprobs: list[dict[str, Any]] | None = None,
        done: bool = False,
    ) -> dict[str, Any]:
        obj: dict[str, Any] = {"model": self.model, "created_at": now()}
        if self.endpoint == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            obj["message"] = message
        else:
            obj["response"] = text
            if thinking:
                obj["thinking"] = thinking
        if logprobs:
            obj["logprobs"] = logprobs
        obj["done"] = done
        return obj

    @staticmethod
    def _line(obj: dict[str, Any]) -> str:
        return msgspec.json.encode(obj).decode() + "\n"

    def start(self) -> list[str]:
        return []

    def feed(self, chunk: Chunk) -> list[str]:
        match chunk:
            case TextChunk(text=text, logprobs=lps):
                if not text and not lps:
                    return []
                logprobs = [_logprob(lp) for lp in lps]
                self._text.append(text)
                self._logprobs.extend(logprobs)
                return [self._line(self._object(text=text, logprobs=logprobs))]
            case ThinkingChunk(text=text):
                if not text:
                    return []
                self._thinking.append(text)
                return [self._line(self._object(thinking=text))]
            case ToolCallChunk(call=call):
                entry = tool_call(len(self._calls), call)
                self._calls.append(entry)
                return [self._line(self._object(calls=[entry]))]
            case KeepAliveChunk():
                # NDJSON has no comments: an empty message is the harmless way to keep alive.
                return [self._line(self._object())]
            case FinishChunk(finish_reason=reason, usage=usage):
                problem = finish_failure(reason)
                if problem is not None:
                    return self.fail(problem)
                end = {"done_reason": done_reason(reason), **stats(usage, self._elapsed())}
                self.final = {
                    **self._object(
                        text="".join(self._text),
                        thinking="".join(self._thinking),
                        calls=self._calls,
                        logprobs=self._logprobs,
                        done=True,
                    ),
                    **end,
                }
                return [self._line({**self._object(done=True), **end})]
            case ErrorChunk(message=message):
                return self.fail(message)
            case _:  # Ollama sends a call whole (not its deltas); images never come here
                return []

    def _elapsed(self) -> float:
        return time.monotonic() - self._started

    def fail(self, message: str) -> list[str]:
        self.error = message
        return [self._line(error_body(500, message))]

    def result(self, chunks: list[Chunk]) -> dict[str, Any]:
        """The non-streamed reply. Raises `GenerationFailed` for a generation that gave no
        answer."""
        for chunk in chunks:
            self.feed(chunk)
        if self.error is not None:
            raise GenerationFailed(self.error)
        if self.final is None:
            raise GenerationFailed(UNFINISHED)
        return self.final

    def loaded(self, reason: str = "load") -> dict[str, Any]:
        """The reply to an empty request, which only loads the model."""
        return {**self._object(done=True), "done_reason": reason}
