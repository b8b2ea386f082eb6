"""The Responses API: request -> `GenerationParams`, and chunks -> typed `response.*` events.

One state machine (`ResponseBuilder`) serves both modes: streaming sends the events it returns,
non-streaming feeds every chunk and keeps only the final response object.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from exo_api_openai import translate
from exo_api_openai.types import (
    ContentIn,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputImage,
    InputText,
    MessageItem,
    OutputText,
    ReasoningItem,
    ResponsesRequest,
)
from exo_core.plugin import (
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
    TextChunk,
    ThinkingChunk,
    ToolCall,
    ToolCallChunk,
    ToolCallDeltaChunk,
    ToolSpec,
    Usage,
    new_id,
)
from exo_core.plugin.dialect import (
    UNFINISHED,
    GenerationFailed,
    SamplingValues,
    finish_failure,
    resolve_sampling,
)

LOGPROBS_INCLUDE = "message.output_text.logprobs"

# -- request ---------------------------------------------------------------------------------


def _content(content: str | list[ContentIn], where: str) -> str | tuple[ContentPart, ...]:
    if isinstance(content, str):
        return content
    parts: list[ContentPart] = []
    for j, part in enumerate(content):
        match part:
            case InputText() | OutputText():
                parts.append(ContentPart(type="text", text=part.text))
            case InputImage():
                if part.image_url is None:
                    raise InvalidRequest(
                        f"{where}.content[{j}]: only image_url images are supported"
                    )
                parts.append(translate.image(part.image_url))
            case _:
                parts.append(ContentPart(type="text", text=part.refusal))
    if all(p.type == "text" for p in parts):
        return "".join(p.text for p in parts)
    return tuple(parts)


def _plain(content: str | tuple[ContentPart, ...], where: str) -> str:
    if isinstance(content, str):
        return content
    if any(p.type != "text" for p in content):
        raise InvalidRequest(f"{where}: only user messages may hold images")
    return "".join(p.text for p in content)


def input_messages(req: ResponsesRequest) -> list[ChatMessage]:
    """`instructions` and `input` as chat messages. Function calls join the assistant turn
    before them; reasoning items attach to the next assistant turn."""
    messages: list[ChatMessage] = []
    if req.instructions:
        messages.append(ChatMessage(role="system", content=req.instructions))
    if isinstance(req.input, str):
        messages.append(ChatMessage(role="user", content=req.input))
        return messages
    reasoning = ""
    for i, item in enumerate(req.input):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            m = translate.convert(item, MessageItem, where)
            content = _content(m.content, where)
            if m.role == "user":
                messages.append(ChatMessage(role="user", content=content))
            elif m.role == "assistant":
                text = _plain(content, where)
                messages.append(ChatMessage(role="assistant", content=text, reasoning=reasoning))
                reasoning = ""
            else:
                messages.append(ChatMessage(role="system", content=_plain(content, where)))
        elif kind == "function_call":
            c = translate.convert(item, FunctionCallItem, where)
            call = ToolCall(id=c.call_id, name=c.name, arguments=c.arguments)
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant" and not reasoning:
                messages[-1] = msgspec.structs.replace(last, tool_calls=(*last.tool_calls, call))
            else:
                messages.append(
                    ChatMessage(role="assistant", tool_calls=(call,), reasoning=reasoning)
                )
                reasoning = ""
        elif kind == "function_call_output":
            o = translate.convert(item, FunctionCallOutputItem, where)
            output = (
                o.output if isinstance(o.output, str) else _plain(_content(o.output, where), where)
            )
            messages.append(ChatMessage(role="tool", content=output, tool_call_id=o.call_id))
        elif kind == "reasoning":
            r = translate.convert(item, ReasoningItem, where)
            reasoning += "".join(t.text for t in (r.content or r.summary))
        else:
            raise InvalidRequest(f"{where}: input items of type '{kind}' are not supported")
    return messages


def _refuse_unsupported(req: ResponsesRequest) -> None:
    if req.previous_response_id is not None:
        raise InvalidRequest(
            "previous_response_id is not supported: exo keeps no responses; send the whole input"
        )
    if req.conversation is not None:
        raise InvalidRequest("conversation is not supported: send the whole input")
    if req.background:
        raise InvalidRequest("background responses are not supported")
    if req.prompt is not None:
        raise InvalidRequest("prompt templates are not supported")
    fmt = req.text.format if req.text is not None else None
    if fmt is not None and fmt.type != "text":
        raise InvalidRequest(f"text.format '{fmt.type}' is not supported (only 'text')")


# The Responses API's names for the core's fields, for refusals that name them.
FIELD_NAMES = {"max_tokens": "max_output_tokens", "messages": "input"}


def to_params(req: ResponsesRequest, card: ModelCard) -> GenerationParams:
    _refuse_unsupported(req)
    messages = input_messages(req)
    if not any(m.role != "system" for m in messages):
        raise InvalidRequest("input must not be empty")
    tools = translate.tool_specs(req.tools)
    effort = req.reasoning.effort if req.reasoning is not None else None
    thinking = translate.thinking(card, effort, None, req.enable_thinking)
    requested = SamplingValues(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k)
    return GenerationParams(
        messages=tuple(messages),
        tools=tools,
        tool_choice=translate.tool_choice(req.tool_choice, tools),
        max_tokens=req.max_output_tokens,
        stop=translate.stop_list(req.stop),
        sampling=resolve_sampling(requested, card.sampling_defaults, thinking, seed=req.seed),
        logprobs=LOGPROBS_INCLUDE in (req.include or []) or bool(req.top_logprobs),
        top_logprobs=req.top_logprobs or 0,
        enable_thinking=thinking,
        reasoning_effort=translate.effort(effort),
    )


def echo(req: ResponsesRequest, params: GenerationParams) -> dict[str, Any]:
    """Request settings a response object repeats back to the client."""
    choice = params.tool_choice
    return {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "temperature": params.sampling.temperature,
        "top_p": params.sampling.top_p,
        "top_logprobs": req.top_logprobs,
        "tool_choice": choice
        if choice in ("auto", "none", "required")
        else {"type": "function", "name": choice},
        "tools": [_tool(t) for t in params.tools],
        "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
        "text": {"format": {"type": "text"}},
        "metadata": req.metadata or {},
        "store": False,
        "background": False,
        "truncation": "disabled",
        "previous_response_id": None,
    }


def _tool(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
        "strict": False,
    }


# -- response --------------------------------------------------------------------------------


@dataclass
class _OpenItem:
    """The output item being streamed: a message (output_text) or reasoning (reasoning_text)."""

    kind: str
    id: str
    index: int
    text: list[str] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


class ResponseBuilder:
    """Chunks in, `response.*` events out (as SSE frames); `response` is the object so far."""

    def __init__(self, model: str, settings: dict[str, Any], *, logprobs: bool = False) -> None:
        self.response: dict[str, Any] = {
            "id": new_id("resp", sep="_", size=24),
            "object": "response",
            "created_at": int(time.time()),
            "status": "in_progress",
            "model": model,
            "output": [],
            "usage": None,
            "error": None,
            "incomplete_details": None,
            **settings,
        }
        self.error: str | None = None
        self._logprobs = logprobs
        self._seq = 0
        self._open: _OpenItem | None = None
        # Function calls being streamed, by call id: (output index, item, arguments so far).
        self._calls: dict[str, tuple[int, dict[str, Any], list[str]]] = {}

    def _event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return f"event: {kind}\ndata: {msgspec.json.encode(payload).decode()}\n\n"

    def start(self) -> list[str]:
        return [
            self._event("response.created", response=self.response),
            self._event("response.in_progress", response=self.response),
        ]

    def _add(self, item: dict[str, Any]) -> tuple[int, str]:
        index = len(self.response["output"])
        self.response["output"].append(item)
        return index, self._event("response.output_item.added", output_index=index, item=item)

    def _part(self, item: _OpenItem) -> dict[str, Any]:
        text = "".join(item.text)
        if item.kind == "message":
            part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
            if self._logprobs:
                part["logprobs"] = item.logprobs
            return part
        return {"type": "reasoning_text", "text": text}

    def _item(self, item: _OpenItem, status: str) -> dict[str, Any]:
        parts = [self._part(item)] if status == "completed" else []
        if item.kind == "message":
            return {
                "type": "message",
                "id": item.id,
                "status": status,
                "role": "assistant",
                "content": parts,
            }
        return {
            "type": "reasoning",
            "id": item.id,
            "summary": [],
            "content": parts,
            "status": status,
        }

    def _open_item(self, kind: str) -> list[str]:
        if self._open is not None and self._open.kind == kind:
            return []
        frames = self._close()
        item = _OpenItem(
            kind=kind, id=new_id("msg" if kind == "message" else "rs", sep="_", size=24), index=0
        )
        index, added = self._add(self._item(item, "in_progress"))
        item.index = index
        self._open = item
        empty = self._part(item)
        frames += [
            added,
            self._event(
                "response.content_part.added",
                item_id=item.id,
                output_index=index,
                content_index=0,
                part=empty,
            ),
        ]
        return frames

    def _close(self) -> list[str]:
        item, self._open = self._open, None
        if item is None:
            return []
        part = self._part(item)
        done = self._item(item, "completed")
        self.response["output"][item.index] = done
        where = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        if item.kind == "message":
            text_done = self._event(
                "response.output_text.done", **where, text=part["text"], logprobs=item.logprobs
            )
        else:
            text_done = self._event("response.reasoning_text.done", **where, text=part["text"])
        return [
            text_done,
            self._event("response.content_part.done", **where, part=part),
            self._event("response.output_item.done", output_index=item.index, item=done),
        ]

    def _text(self, kind: str, text: str, logprobs: list[dict[str, Any]]) -> list[str]:
        frames = self._open_item(kind)
        item = self._open
        assert item is not None
        item.text.append(text)
        item.logprobs.extend(logprobs)
        where = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        if kind == "message":
            frames.append(
                self._event("response.output_text.delta", **where, delta=text, logprobs=logprobs)
            )
        else:
            frames.append(self._event("response.reasoning_text.delta", **where, delta=text))
        return frames

    def _open_call(self, call_id: str, name: str) -> list[str]:
        """Opens the call's `function_call` item when it is new."""
        if call_id in self._calls:
            return []
        frames = self._close()
        item: dict[str, Any] = {
            "type": "function_call",
            "id": new_id("fc", sep="_", size=24),
            "call_id": call_id,
            "name": name,
            "arguments": "",
            "status": "in_progress",
        }
        index, added = self._add(item)
        self._calls[call_id] = (index, item, [])
        return [*frames, added]

    def _arguments(self, call_id: str, delta: str) -> list[str]:
        index, item, arguments = self._calls[call_id]
        if not delta:
            return []
        arguments.append(delta)
        where = {"item_id": item["id"], "output_index": index}
        return [self._event("response.function_call_arguments.delta", **where, delta=delta)]

    def _call(self, call: ToolCall) -> list[str]:
        """The whole call: its arguments (those not streamed yet), then the item done."""
        frames = self._open_call(call.id, call.name)
        streamed = "".join(self._calls[call.id][2])
        if not streamed:
            frames += self._arguments(call.id, call.arguments)
        index, item, _ = self._calls.pop(call.id)
        done = {**item, "arguments": call.arguments, "status": "completed"}
        self.response["output"][index] = done
        where = {"item_id": item["id"], "output_index": index}
        return [
            *frames,
            self._event(
                "response.function_call_arguments.done",
                **where,
                arguments=call.arguments,
                name=call.name,
            ),
            self._event("response.output_item.done", output_index=index, item=done),
        ]

    def _unfinished_calls(self) -> list[str]:
        """Calls the model never finished (cut off): their items end incomplete."""
        frames: list[str] = []
        for index, item, arguments in self._calls.values():
            done = {**item, "arguments": "".join(arguments), "status": "incomplete"}
            self.response["output"][index] = done
            frames.append(self._event("response.output_item.done", output_index=index, item=done))
        self._calls.clear()
        return frames

    def feed(self, chunk: Chunk) -> list[str]:
        match chunk:
            case TextChunk(text=text, logprobs=lps):
                if not text and not lps:
                    return []
                return self._text("message", text, [translate.token_logprob(lp) for lp in lps])
            case ThinkingChunk(text=text):
                return self._text("reasoning", text, []) if text else []
            case ToolCallDeltaChunk(id=call_id, name=name, arguments=delta):
                return [*self._open_call(call_id, name), *self._arguments(call_id, delta)]
            case ToolCallChunk(call=call):
                return self._call(call)
            case KeepAliveChunk():
                return [": keep-alive\n\n"]
            case FinishChunk(finish_reason=reason, usage=usage):
                problem = finish_failure(reason)
                if problem is not None:
                    return self.fail(problem)
                frames = [*self._close(), *self._unfinished_calls()]
                self.response["usage"] = _usage(usage)
                if reason == FinishReason.LENGTH:
                    self.response["status"] = "incomplete"
                    self.response["incomplete_details"] = {"reason": "max_output_tokens"}
                    return [*frames, self._event("response.incomplete", response=self.response)]
                self.response["status"] = "completed"
                return [*frames, self._event("response.completed", response=self.response)]
            case ErrorChunk(message=message):
                return self.fail(message)
            case _:  # image progress and images never reach a text stream
                return []

    def fail(self, message: str) -> list[str]:
        self.error = message
        frames = [*self._close(), *self._unfinished_calls()]
        self.response["status"] = "failed"
        self.response["error"] = {"code": "server_error", "message": message}
        return [*frames, self._event("response.failed", response=self.response)]


def build(builder: ResponseBuilder, chunks: list[Chunk]) -> dict[str, Any]:
    """The final response object for a finished generation. Raises `GenerationFailed` for one
    that gave no answer."""
    for chunk in chunks:
        builder.feed(chunk)
    if builder.error is not None:
        raise GenerationFailed(builder.error)
    if builder.response["status"] == "in_progress":
        raise GenerationFailed(UNFINISHED)
    # A call cut off (a stream showed it as an incomplete item) is no call: its text is there.
    output = builder.response["output"]
    builder.response["output"] = [
        item
        for item in output
        if not (item["type"] == "function_call" and item["status"] == "incomplete")
    ]
    return builder.response
