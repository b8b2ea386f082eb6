"""Anthropic Messages: request -> `GenerationParams`, chunks -> SSE events or one message.

Pure functions and a small state machine; the HTTP layer lives in routes.py.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from exo_api_claude.types import (
    Base64Source,
    Block,
    Conversation,
    CountTokensRequest,
    ImageBlock,
    MessageIn,
    MessagesRequest,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolChoiceIn,
    ToolIn,
    ToolResultBlock,
    ToolUseBlock,
)
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
    GenerationFailed,
    SamplingValues,
    answered,
    finish_failure,
    resolve_sampling,
)

# -- request ---------------------------------------------------------------------------------


def _kind(block: Block) -> str:
    return str(type(block).__struct_config__.tag)


def _image(block: ImageBlock) -> ContentPart:
    source = block.source
    if isinstance(source, Base64Source):
        return ContentPart(type="image", image_url=f"data:{source.media_type};base64,{source.data}")
    return ContentPart(type="image", image_url=source.url)


def _parts(blocks: list[TextBlock | ImageBlock]) -> str | tuple[ContentPart, ...]:
    """Text and images; plain text when there are no images."""
    parts = tuple(
        ContentPart(type="text", text=b.text) if isinstance(b, TextBlock) else _image(b)
        for b in blocks
    )
    if all(p.type == "text" for p in parts):
        return "".join(p.text for p in parts)
    return parts


def _tool_result(block: ToolResultBlock) -> ChatMessage:
    content = block.content if isinstance(block.content, str) else _parts(block.content)
    if block.is_error:
        # Chat templates have no error flag: say it in the text, so the model still sees it.
        prefix = ContentPart(type="text", text="Error: ")
        content = f"Error: {content}" if isinstance(content, str) else (prefix, *content)
    return ChatMessage(role="tool", content=content, tool_call_id=block.tool_use_id)


def _user(message: MessageIn, where: str) -> list[ChatMessage]:
    """Tool results become tool messages (first, as Anthropic requires them to be); the rest of
    the turn becomes one user message."""
    if isinstance(message.content, str):
        return [ChatMessage(role="user", content=message.content)]
    results: list[ChatMessage] = []
    rest: list[TextBlock | ImageBlock] = []
    for j, block in enumerate(message.content):
        match block:
            case ToolResultBlock():
                results.append(_tool_result(block))
            case TextBlock() | ImageBlock():
                rest.append(block)
            case _:
                raise InvalidRequest(
                    f"{where}.content[{j}]: a user turn cannot hold '{_kind(block)}'"
                )
    if rest or not results:
        results.append(ChatMessage(role="user", content=_parts(rest)))
    return results


def _assistant(message: MessageIn, where: str) -> ChatMessage:
    if isinstance(message.content, str):
        return ChatMessage(role="assistant", content=message.content)
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    for j, block in enumerate(message.content):
        match block:
            case TextBlock():
                text.append(block.text)
            case ThinkingBlock():
                reasoning.append(block.thinking)
            case RedactedThinkingBlock():
                pass  # opaque to any model but Anthropic's; dropping it changes nothing here
            case ToolUseBlock():
                calls.append(
                    ToolCall(id=block.id, name=block.name, arguments=json.dumps(block.input))
                )
            case _:
                raise InvalidRequest(
                    f"{where}.content[{j}]: an assistant turn cannot hold '{_kind(block)}'"
                )
    return ChatMessage(
        role="assistant",
        content="".join(text),
        reasoning="".join(reasoning),
        tool_calls=tuple(calls),
    )


def messages(req: Conversation) -> tuple[ChatMessage, ...]:
    out: list[ChatMessage] = []
    if req.system:
        system = req.system if isinstance(req.system, str) else "".join(b.text for b in req.system)
        out.append(ChatMessage(role="system", content=system))
    for i, message in enumerate(req.messages):
        where = f"messages[{i}]"
        if message.role == "user":
            out.extend(_user(message, where))
        elif message.role == "system":
            out.append(ChatMessage(role="system", content=_system_text(message, where)))
        else:
            out.append(_assistant(message, where))
    return tuple(out)


def _system_text(message: MessageIn, where: str) -> str:
    if isinstance(message.content, str):
        return message.content
    if any(not isinstance(b, TextBlock) for b in message.content):
        raise InvalidRequest(f"{where}: a system message holds only text blocks")
    return "".join(b.text for b in message.content if isinstance(b, TextBlock))


def tools(specs: list[ToolIn] | None) -> tuple[ToolSpec, ...]:
    out: list[ToolSpec] = []
    for i, tool in enumerate(specs or []):
        if tool.type not in (None, "custom"):
            raise InvalidRequest(f"tools[{i}]: server tools ('{tool.type}') are not supported")
        if tool.input_schema is None:
            raise InvalidRequest(f"tools[{i}]: input_schema is required")
        out.append(
            ToolSpec(
                name=tool.name, description=tool.description or "", parameters=tool.input_schema
            )
        )
    return tuple(out)


def tool_choice(choice: ToolChoiceIn | None, specs: tuple[ToolSpec, ...]) -> str:
    if choice is None or choice.type == "auto":
        return "auto"
    if choice.type == "any":
        return "required"
    if choice.type == "none":
        return "none"
    if not choice.name or choice.name not in {t.name for t in specs}:
        raise InvalidRequest(f"tool_choice names '{choice.name}', which is not among the tools")
    return choice.name


def thinking(req: Conversation, card: ModelCard) -> bool | None:
    """`thinking: enabled` needs a model that can think; `adaptive` leaves it to the model.
    `budget_tokens` is not enforced: thinking counts against `max_tokens` like any output."""
    if req.thinking is None or req.thinking.type == "adaptive":
        return None
    if req.thinking.type == "disabled":
        return False
    if not card.has(Capability.THINKING):
        raise InvalidRequest(f"model '{card.model_id}' does not support extended thinking")
    return True


# Anthropic's names for the core's fields, for refusals that name them.
FIELD_NAMES = {"stop": "stop_sequences"}


def to_params(req: MessagesRequest, card: ModelCard) -> GenerationParams:
    if req.mcp_servers:
        raise InvalidRequest("mcp_servers are not supported")
    if req.container is not None:
        raise InvalidRequest("containers are not supported")
    if req.output_format is not None:
        raise InvalidRequest("output_format (structured outputs) is not supported")
    if not req.messages:
        raise InvalidRequest("messages: at least one message is required")
    specs = tools(req.tools)
    if any(not s for s in req.stop_sequences or []):
        raise InvalidRequest("stop_sequences must not hold empty strings")
    thinks = thinking(req, card)
    requested = SamplingValues(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k)
    return GenerationParams(
        messages=messages(req),
        tools=specs,
        tool_choice=tool_choice(req.tool_choice, specs),
        max_tokens=req.max_tokens,
        stop=tuple(req.stop_sequences or ()),
        sampling=resolve_sampling(requested, card.sampling_defaults, thinks),
        enable_thinking=thinks,
    )


def count_params(req: CountTokensRequest, card: ModelCard) -> GenerationParams:
    """What `count_tokens` asks the model's runner to count: the prompt a Messages request
    with the same conversation would send (system, messages, tools, thinking)."""
    if not req.messages:
        raise InvalidRequest("messages: at least one message is required")
    specs = tools(req.tools)
    return GenerationParams(
        messages=messages(req),
        tools=specs,
        tool_choice=tool_choice(req.tool_choice, specs),
        enable_thinking=thinking(req, card),
    )


# -- response --------------------------------------------------------------------------------


_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_body(status: int, message: str, exc: Exception | None = None) -> dict[str, Any]:
    """Anthropic's error shape, `{"type": "error", "error": {"type", "message"}}` (the type is
    told by the status alone)."""
    kind = _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def new_message_id() -> str:
    """An id of Anthropic's shape: `msg_` and 24 hex digits."""
    return new_id("msg", sep="_", size=24)


def tool_input(arguments: str) -> dict[str, Any]:
    """A tool call's arguments as the object Anthropic sends; text that is not a JSON object is
    kept whole rather than dropped."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"_raw_arguments": arguments}
    return value if isinstance(value, dict) else {"_raw_arguments": arguments}


def stop_reason(finish: FinishChunk) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence): a stop on one of the request's `stop_sequences` (which the
    engine names on the finish chunk) is `stop_sequence`, any other stop `end_turn`."""
    if finish.finish_reason == FinishReason.LENGTH:
        return "max_tokens", None
    if finish.finish_reason == FinishReason.TOOL_CALLS:
        return "tool_use", None
    if finish.stop_sequence is not None:
        return "stop_sequence", finish.stop_sequence
    return "end_turn", None


def usage(u: Usage) -> dict[str, Any]:
    # Anthropic counts cache reads apart from input_tokens.
    return {
        "input_tokens": u.prompt_tokens - u.cached_tokens,
        "output_tokens": u.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_tokens,
    }


def message(model: str, chunks: list[Chunk], message_id: str | None = None) -> dict[str, Any]:
    """The `message` object for a finished generation. Raises `GenerationFailed` for one that
    gave no answer."""
    content: list[dict[str, Any]] = []
    finish: FinishChunk | None = None
    for chunk in chunks:
        last = content[-1] if content else None
        match chunk:
            case TextChunk(text=text):
                if last is not None and last["type"] == "text":
                    last["text"] += text
                elif text:
                    content.append({"type": "text", "text": text})
            case ThinkingChunk(text=text):
                if last is not None and last["type"] == "thinking":
                    last["thinking"] += text
                else:
                    content.append({"type": "thinking", "thinking": text, "signature": ""})
            case ToolCallChunk(call=call):
                content.append(
                    {
                        "type": "tool_use",
                        "id": call.id,
                        "name": call.name,
                        "input": tool_input(call.arguments),
                    }
                )
            case ErrorChunk(message=problem):
                raise GenerationFailed(problem)
            case FinishChunk():
                finish = chunk
            case KeepAliveChunk() | ToolCallDeltaChunk():
                pass
    finish = answered(finish)
    reason, sequence = stop_reason(finish)
    return {
        "id": message_id or new_message_id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(finish.usage),
    }


class MessageStream:
    """Renders chunks as Anthropic's streaming events (`event:` and `data:` lines)."""

    def __init__(self, model: str, message_id: str | None = None) -> None:
        self.id = message_id or new_message_id()
        self.model = model
        self._index = -1
        self._open: str | None = None  # the type of the content block being streamed
        self._call: str | None = None  # the id of the tool_use block being streamed
        self._streamed: set[str] = set()  # calls whose input went out as deltas

    @staticmethod
    def _event(kind: str, **fields: Any) -> str:
        payload = msgspec.json.encode({"type": kind, **fields}).decode()
        return f"event: {kind}\ndata: {payload}\n\n"

    def start(self) -> list[str]:
        message = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            # Prompt size is known only at the end; message_delta carries the real counts.
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [self._event("message_start", message=message), self._event("ping")]

    def _close(self) -> list[str]:
        if self._open is None:
            return []
        self._open, self._call = None, None
        return [self._event("content_block_stop", index=self._index)]

    def _block(self, kind: str, block: dict[str, Any]) -> list[str]:
        if self._open == kind:
            return []
        frames = self._close()
        self._index += 1
        self._open = kind
        return [*frames, self._event("content_block_start", index=self._index, content_block=block)]

    def _delta(self, delta: dict[str, Any]) -> str:
        return self._event("content_block_delta", index=self._index, delta=delta)

    def feed(self, chunk: Chunk) -> list[str]:
        match chunk:
            case TextChunk(text=text):
                if not text:
                    return []
                frames = self._block("text", {"type": "text", "text": ""})
                return [*frames, self._delta({"type": "text_delta", "text": text})]
            case ThinkingChunk(text=text):
                if not text:
                    return []
                frames = self._block(
                    "thinking", {"type": "thinking", "thinking": "", "signature": ""}
                )
                return [*frames, self._delta({"type": "thinking_delta", "thinking": text})]
            case ToolCallDeltaChunk(id=call_id, name=name, arguments=partial):
                frames: list[str] = []
                if self._call != call_id:  # the call's first delta opens its block
                    frames = self._close()
                    block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
                    frames += self._block("tool_use", block)
                    self._call = call_id
                    self._streamed.add(call_id)
                if partial:
                    frames.append(
                        self._delta({"type": "input_json_delta", "partial_json": partial})
                    )
                return frames
            case ToolCallChunk(call=call):
                if call.id in self._streamed:  # its input went out as deltas: the block ends
                    return self._close() if self._call == call.id else []
                frames = self._close()
                block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
                frames += self._block("tool_use", block)
                frames.append(
                    self._delta({"type": "input_json_delta", "partial_json": call.arguments})
                )
                return [*frames, *self._close()]
            case KeepAliveChunk():
                return [self._event("ping")]
            case FinishChunk(finish_reason=finish_reason, usage=u):
                problem = finish_failure(finish_reason)
                if problem is not None:
                    return self.fail(problem)
                reason, sequence = stop_reason(chunk)
                delta = {"stop_reason": reason, "stop_sequence": sequence}
                return [
                    *self._close(),
                    self._event("message_delta", delta=delta, usage=usage(u)),
                    self._event("message_stop"),
                ]
            case ErrorChunk(message=problem):
                return self.fail(problem)
            case _:  # image progress and images never reach a text stream
                return []

    def fail(self, message: str) -> list[str]:
        """An error after the stream began: Anthropic's `error` event (its client raises)."""
        body = error_body(500, message)
        return [self._event("error", error=body["error"])]
