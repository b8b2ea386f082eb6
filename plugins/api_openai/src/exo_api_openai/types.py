"""Request bodies of the OpenAI dialect, as msgspec Structs.

Unknown fields are ignored (clients send many optional ones); a known field with a wrong type is
a 400 that names it. Fields we cannot honour are declared so that translation can refuse them
when they would change the answer.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class _Body(msgspec.Struct, kw_only=True):
    pass


# -- shared ---------------------------------------------------------------------------------


class FunctionDef(_Body, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolIn(_Body, kw_only=True):
    """A tool, nested (`{type, function: {...}}`, Chat Completions) or flat (`{type, name, ...}`,
    the Responses API); translation normalises both."""

    type: str = "function"
    function: FunctionDef | None = None
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(_Body, kw_only=True):
    name: str


class ToolChoiceIn(_Body, kw_only=True):
    """`{type: function, function: {name}}` (Chat Completions) or `{type: function, name}`."""

    type: str = "function"
    function: NamedFunction | None = None
    name: str | None = None


ToolChoice = str | ToolChoiceIn


# -- Chat Completions -----------------------------------------------------------------------


class ImageURL(_Body, kw_only=True):
    url: str
    detail: str | None = None


class TextPart(msgspec.Struct, kw_only=True, tag_field="type", tag="text"):
    text: str


class ImagePart(msgspec.Struct, kw_only=True, tag_field="type", tag="image_url"):
    image_url: ImageURL | str


class RefusalPart(msgspec.Struct, kw_only=True, tag_field="type", tag="refusal"):
    refusal: str


class FunctionCallIn(_Body, kw_only=True):
    name: str
    # A JSON object as text; some clients send the object itself.
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(_Body, kw_only=True):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallIn


class _Message(msgspec.Struct, kw_only=True, tag_field="role"):
    name: str | None = None


class SystemMessage(_Message, kw_only=True, tag="system"):
    content: str | list[TextPart]


class DeveloperMessage(_Message, kw_only=True, tag="developer"):
    content: str | list[TextPart]


class UserMessage(_Message, kw_only=True, tag="user"):
    content: str | list[TextPart | ImagePart]


class AssistantMessage(_Message, kw_only=True, tag="assistant"):
    content: str | list[TextPart | RefusalPart] | None = None
    tool_calls: list[ToolCallIn] | None = None
    # Thinking sent back by clients that keep it (vLLM and DeepSeek name it differently).
    reasoning_content: str | None = None
    reasoning: str | None = None
    refusal: str | None = None


class ToolMessage(_Message, kw_only=True, tag="tool"):
    content: str | list[TextPart]
    tool_call_id: str


MessageIn = SystemMessage | DeveloperMessage | UserMessage | AssistantMessage | ToolMessage


class StreamOptions(_Body, kw_only=True):
    include_usage: bool = False


class ResponseFormat(_Body, kw_only=True):
    type: str


class ChatCompletionRequest(_Body, kw_only=True):
    model: str
    messages: list[MessageIn]
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[ToolIn] | None = None
    tool_choice: ToolChoice | None = None
    reasoning_effort: str | None = None
    response_format: ResponseFormat | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # Not supported; refused unless neutral (empty, absent).
    logit_bias: dict[str, float] | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    # The deprecated spelling of tools; refused with a pointer rather than dropped.
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    # Common extensions (vLLM, llama.cpp): extra sampling knobs and the thinking switch.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    repetition_context_size: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # exo's own spelling of the thinking switch (chat_template_kwargs wins when both are set).
    enable_thinking: bool | None = None


# -- Responses ------------------------------------------------------------------------------


class Reasoning(_Body, kw_only=True):
    effort: str | None = None
    summary: str | None = None


class TextFormat(_Body, kw_only=True):
    format: ResponseFormat | None = None


class ResponsesRequest(_Body, kw_only=True):
    model: str
    # A string, or a list of items; items are converted one by one (see responses.py) so that
    # messages without a `type` and unknown item types get precise errors.
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    stream: bool = False
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    include: list[str] | None = None
    tools: list[ToolIn] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning: Reasoning | None = None
    text: TextFormat | None = None
    metadata: dict[str, str] | None = None
    # exo's extensions: the thinking switch (reasoning.effort says it too; this wins), and
    # sampling and stopping knobs the Responses API lacks.
    enable_thinking: bool | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    # Not supported (we keep no responses or conversations); refused when set.
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None
    prompt: dict[str, Any] | None = None


class InputText(msgspec.Struct, kw_only=True, tag_field="type", tag="input_text"):
    text: str


class OutputText(msgspec.Struct, kw_only=True, tag_field="type", tag="output_text"):
    text: str


class InputImage(msgspec.Struct, kw_only=True, tag_field="type", tag="input_image"):
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None


class Refusal(msgspec.Struct, kw_only=True, tag_field="type", tag="refusal"):
    refusal: str


ContentIn = InputText | OutputText | InputImage | Refusal


class MessageItem(_Body, kw_only=True):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentIn]


class FunctionCallItem(_Body, kw_only=True):
    call_id: str
    name: str
    arguments: str = "{}"


class FunctionCallOutputItem(_Body, kw_only=True):
    call_id: str
    output: str | list[ContentIn]


class ReasoningText(_Body, kw_only=True):
    text: str


class ReasoningItem(_Body, kw_only=True):
    summary: list[ReasoningText] = msgspec.field(default_factory=list)
    content: list[ReasoningText] | None = None
