"""The generation task every API dialect translates to, and the chunks that come back.

Dialects build `GenerationParams` from their own request types and render `Chunk`s in their own
wire format; no dialect type crosses into the core. Chunks travel on the data plane (runner to
node to the API that holds the request) and never enter the replicated log.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

import msgspec

from exo_core.ids import TaskId


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """A function call the model made: the call's id, the tool's name and its arguments (a
    JSON object, as text)."""

    id: str
    name: str
    arguments: str  # a JSON object, as text


class ContentPart(msgspec.Struct, frozen=True, kw_only=True):
    """One part of a multi-part message. `type` is "text" or "image"."""

    type: Literal["text", "image"]
    text: str = ""
    image_url: str = ""


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One message of a conversation: its role, its text or content parts, the reasoning
    and tool calls an assistant turn carried, and the tool call a tool turn answers."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | tuple[ContentPart, ...] = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    name: str = ""

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if p.type == "text")

    def has_images(self) -> bool:
        return not isinstance(self.content, str) and any(p.type == "image" for p in self.content)


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A function the model may call, described by a JSON schema."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """How the next token is drawn (temperature, top-p, top-k, min-p, penalties, seed)."""

    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float | None = None
    repetition_context_size: int | None = None
    # OpenAI's additive penalties on the tokens generated so far: `presence_penalty` once for
    # every token that appeared, `frequency_penalty` times the number of times it appeared.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


class GenerationParams(msgspec.Struct, frozen=True, kw_only=True):
    """A text generation request, independent of any API dialect."""

    messages: tuple[ChatMessage, ...] = ()
    # A raw prompt is used as is, without a chat template (Ollama's /api/generate raw mode).
    prompt: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: Literal["auto", "none", "required"] | str = "auto"
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    sampling: SamplingParams = SamplingParams()
    logprobs: bool = False
    top_logprobs: int = 0
    enable_thinking: bool | None = None
    # How hard a reasoning model thinks ("low", "medium", "high"), for templates that take it
    # (gpt-oss writes it into its Harmony system message); None leaves the model's default.
    reasoning_effort: str | None = None
    # Count the prompt's tokens (chat template and tools included) and generate nothing: the
    # engine answers one `FinishChunk` whose usage has `prompt_tokens` (exact count_tokens).
    count_only: bool = False
    # Never end at end-of-sequence, so that exactly `max_tokens` come out (benchmarks).
    ignore_eos: bool = False
    # Look the prompt up in (and store it into) the runner's prefix cache.
    prefix_cache: bool = True


class FinishReason(StrEnum):
    """Why a generation stopped."""

    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool_calls"
    CANCELLED = "cancelled"
    ERROR = "error"


class TopLogprob(msgspec.Struct, frozen=True):
    """One alternative token and its log-probability."""

    token: str
    logprob: float


class TokenLogprob(msgspec.Struct, frozen=True, kw_only=True):
    """A generated token's log-probability, with the most likely alternatives when asked."""

    token: str
    logprob: float
    top: tuple[TopLogprob, ...] = ()


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Token counts of a generation (prompt, completion, cached and reasoning tokens)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # Of the completion tokens, those the model spent thinking (inside its think block).
    reasoning_tokens: int = 0
    prompt_tps: float = 0.0
    generation_tps: float = 0.0
    time_to_first_token_s: float = 0.0
    # The most memory the runner held so far (its peak), in bytes; 0 when unknown.
    peak_memory_bytes: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class TextChunk(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Generated text (with its tokens' log-probabilities when they were asked for)."""

    task_id: TaskId
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


class ThinkingChunk(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Generated reasoning: text inside the model's thinking block."""

    task_id: TaskId
    text: str


class ToolCallChunk(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A complete tool call the model made."""

    task_id: TaskId
    call: ToolCall


class ToolCallDeltaChunk(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """A tool call as the model writes it: its id and name, and the next fragment of its
    arguments' JSON text. The whole call follows as a `ToolCallChunk` with the same id (and
    the fragments joined as its arguments); a call the model never finished (cut off by
    `max_tokens`) has no `ToolCallChunk`. Streamed answers render the deltas, collected ones
    the whole call."""

    task_id: TaskId
    id: str
    name: str
    arguments: str = ""


class FinishChunk(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The last chunk of a successful (or cancelled, or length-capped) generation."""

    task_id: TaskId
    finish_reason: FinishReason
    usage: Usage = Usage()
    # The stop string that ended the generation, when one did.
    stop_sequence: str | None = None


class ErrorChunk(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The last chunk of a failed generation."""

    task_id: TaskId
    message: str


class KeepAliveChunk(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Nothing new yet (a long prefill); dialects send their own keep-alive.

    An engine that prefills in steps sends one per step with its progress (`prefill_total` > 0):
    `prefill_processed` of `prefill_total` prompt tokens are done."""

    task_id: TaskId
    prefill_processed: int = 0
    prefill_total: int = 0


class ProgressChunk(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Step `step` of `total` is done (an image model's denoising steps) for image `index`."""

    task_id: TaskId
    step: int
    total: int
    index: int = 0


class ImageChunk(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """An encoded image: a partial one while denoising, then the final one, for image `index`
    of the request (see `exo_core.images`)."""

    task_id: TaskId
    index: int
    data: bytes
    format: Literal["png", "jpeg", "webp"] = "png"
    width: int = 0
    height: int = 0
    partial: bool = False
    # Which partial image this is (0-based); unused for a final image.
    partial_index: int = 0
    seed: int | None = None


Chunk = (
    TextChunk
    | ThinkingChunk
    | ToolCallChunk
    | ToolCallDeltaChunk
    | FinishChunk
    | ErrorChunk
    | KeepAliveChunk
    | ProgressChunk
    | ImageChunk
)
"""Anything a generation streams: text, thinking, tool calls, progress, images, keep-alives,
then one `FinishChunk` or `ErrorChunk`."""
TERMINAL_CHUNKS = (FinishChunk, ErrorChunk)
