"""Request bodies of the Anthropic Messages dialect, as msgspec Structs.

Unknown fields are ignored (`cache_control`, `metadata`, `citations` are harmless); an unknown
content block type is a 400 that names it.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class _Block(msgspec.Struct, kw_only=True, tag_field="type"):
    pass


class TextBlock(_Block, kw_only=True, tag="text"):
    text: str


class Base64Source(msgspec.Struct, kw_only=True, tag_field="type", tag="base64"):
    media_type: str
    data: str


class URLSource(msgspec.Struct, kw_only=True, tag_field="type", tag="url"):
    url: str


class ImageBlock(_Block, kw_only=True, tag="image"):
    source: Base64Source | URLSource


class ToolUseBlock(_Block, kw_only=True, tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Block, kw_only=True, tag="tool_result"):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock] = ""
    is_error: bool = False


class ThinkingBlock(_Block, kw_only=True, tag="thinking"):
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(_Block, kw_only=True, tag="redacted_thinking"):
    data: str


Block = (
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock
)


class MessageIn(msgspec.Struct, kw_only=True):
    # "system" is not Anthropic's, but Claude Code sends it inside messages; it is read as a
    # system message in its place.
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]


class ToolIn(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    # Absent on Anthropic's server tools (`type: web_search_...`), which are refused.
    input_schema: dict[str, Any] | None = None
    type: str | None = None


class ToolChoiceIn(msgspec.Struct, kw_only=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(msgspec.Struct, kw_only=True):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class Conversation(msgspec.Struct, kw_only=True):
    model: str
    messages: list[MessageIn]
    system: str | list[TextBlock] | None = None
    tools: list[ToolIn] | None = None
    tool_choice: ToolChoiceIn | None = None
    thinking: ThinkingConfig | None = None


class MessagesRequest(Conversation, kw_only=True):
    max_tokens: int
    stream: bool = False
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    # Not supported; refused when set.
    mcp_servers: list[Any] | None = None
    container: str | dict[str, Any] | None = None
    output_format: dict[str, Any] | None = None


class CountTokensRequest(Conversation, kw_only=True):
    pass
