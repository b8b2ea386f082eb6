"""Request bodies of the Ollama dialect, as msgspec Structs.

Unknown fields and options are ignored, as Ollama itself does; options that would change the
answer and that exo cannot honour are declared so that translation can refuse them.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class FunctionCallIn(msgspec.Struct, kw_only=True):
    name: str
    # Ollama sends an object; accept a JSON string too.
    arguments: dict[str, Any] | str = msgspec.field(default_factory=dict)


class ToolCallIn(msgspec.Struct, kw_only=True):
    function: FunctionCallIn
    id: str | None = None


class MessageIn(msgspec.Struct, kw_only=True):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[str] | None = None  # base64, without a data: prefix
    thinking: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class FunctionDef(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolIn(msgspec.Struct, kw_only=True):
    type: str = "function"
    function: FunctionDef


class Options(msgspec.Struct, kw_only=True):
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    num_predict: int | None = None
    stop: str | list[str] | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # Sampling exo does not implement: refused unless neutral. Resource knobs (num_ctx,
    # num_gpu, num_thread...) are not declared: ignoring them changes no answer.
    mirostat: int | None = None
    typical_p: float | None = None
    tfs_z: float | None = None


Think = bool | Literal["low", "medium", "high"]


class _Generation(msgspec.Struct, kw_only=True):
    model: str
    format: str | dict[str, Any] | None = None
    options: Options | None = None
    stream: bool = True
    keep_alive: str | float | None = None
    think: Think | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class ChatRequest(_Generation, kw_only=True):
    messages: list[MessageIn] = msgspec.field(default_factory=list)
    tools: list[ToolIn] | None = None


class GenerateRequest(_Generation, kw_only=True):
    prompt: str = ""
    system: str | None = None
    images: list[str] | None = None
    raw: bool = False
    # Not supported; refused when set.
    suffix: str | None = None
    template: str | None = None
    context: list[int] | None = None


class ShowRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    name: str | None = None  # the older spelling
    verbose: bool = False
