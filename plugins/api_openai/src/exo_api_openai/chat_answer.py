"""Chat Completions' answer: chunks -> `chat.completion.chunk` SSE frames (`ChatStream`) or one
`chat.completion` object (`completion`)."""

from __future__ import annotations

import time
from typing import Any

import msgspec

from exo_api_openai.translate import chat_usage, error_body, token_logprob
from exo_core.plugin import (
    Chunk,
    ErrorChunk,
    FinishChunk,
    KeepAliveChunk,
    TextChunk,
    ThinkingChunk,
    ToolCall,
    ToolCallChunk,
    ToolCallDeltaChunk,
    Usage,
    new_id,
)
from exo_core.plugin.dialect import GenerationFailed, answered, finish_failure


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
        self.id = completion_id or new_id("chatcmpl", size=24)
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
                logprobs = {"content": [token_logprob(lp) for lp in lps]} if lps else None
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
                "usage": chat_usage(usage),
            }
        )

    def fail(self, message: str) -> list[str]:
        """An error after the stream began: an error frame (the OpenAI client raises on it)."""
        return [self._frame(error_body(500, message)), "data: [DONE]\n\n"]


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
                logprobs.extend(token_logprob(lp) for lp in chunk.logprobs)
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
        "id": completion_id or new_id("chatcmpl", size=24),
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
        "usage": chat_usage(finish.usage),
    }
