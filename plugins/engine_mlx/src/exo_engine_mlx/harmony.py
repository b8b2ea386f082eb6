"""gpt-oss's Harmony output, read by openai-harmony's `StreamableParser` as the model streams it.

A Harmony answer is a run of messages: `<|channel|>analysis<|message|>...<|end|>` (thinking),
`<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}`
ended by `<|call|>` (a tool call), `<|channel|>final<|message|>...` ended by `<|return|>` (the
answer). `<|call|>` and `<|return|>` are end-of-sequence tokens, so a stream may simply end there.

The engine's parsers see decoded text, not token ids, so the text is encoded with the package's
own o200k_harmony encoding and fed to its parser token by token. For a real gpt-oss tokenizer
these are the model's own special tokens; a tiny test tokenizer with the same markers reads the
same. What is left here is glue: which message becomes thinking, text or a tool call.
"""

from __future__ import annotations

import json

from openai_harmony import HarmonyEncoding, HarmonyError, Message, Role, StreamableParser

from exo_core.plugin import (
    Chunk,
    TaskId,
    TextChunk,
    ThinkingChunk,
    ToolCall,
    ToolCallChunk,
    ToolCallDeltaChunk,
    new_id,
)
from exo_core.plugin.parsers import ArgumentStream, OutputParser, ToolCallParseError, tool_call
from exo_engine_mlx.harmony_encoding import harmony_encoding

START, MESSAGE, END = "<|start|>", "<|message|>", "<|end|>"
MESSAGE_ENDS = (END, "<|call|>", "<|return|>")
# The markers a model writes; text is encoded with these (and no other) special tokens, so the
# encoder skips its check over all ~1,100 reserved ones (~20 µs a chunk instead of ~400).
MARKERS = frozenset(
    (START, "<|channel|>", MESSAGE, *MESSAGE_ENDS, "<|constrain|>", "<|endoftext|>")
)
_LONGEST = max(map(len, MARKERS))


def marker_start(text: str) -> int:
    """Where a marker that may be split across chunks begins at the end of `text` (its length
    when none does): that part is held back until the next chunk."""
    at = text.find("<", max(0, len(text) - _LONGEST + 1))
    while at >= 0:
        tail = text[at:]
        if any(m.startswith(tail) and m != tail for m in MARKERS):
            return at
        at = text.find("<", at + 1)
    return len(text)


def read_call(recipient: str, body: str) -> ToolCall | None:
    """A call to `functions.name` with a JSON body, or None when the body is not JSON."""
    name = recipient.removeprefix("functions.")
    try:
        return tool_call(name, json.loads(body) if body.strip() else {})
    except (ValueError, ToolCallParseError):
        return None


class HarmonyParser(OutputParser):
    """Harmony messages to chunks: analysis is thinking, a message to a recipient is a tool
    call (when the request offered tools), everything else (final, commentary) is text. Text
    the package refuses (the model left the format) is shown as the model wrote it."""

    def __init__(
        self, tools: bool, prompt: str = "", encoding: HarmonyEncoding | None = None
    ) -> None:
        self._encoding = encoding or harmony_encoding()
        self._tools = tools
        self._ids = {m: self._encode(m)[0] for m in (START, MESSAGE, *MESSAGE_ENDS)}
        self._ends = {self._ids[m] for m in MESSAGE_ENDS}
        self._held = ""
        self._in_content = False
        self._opened = False  # whether the answer has opened any message yet
        self._header: list[int] = []  # the tokens of the header being read
        self._failed = False  # the model left the format: the rest is text
        self._call: tuple[str, ArgumentStream] | None = None  # the call being streamed
        # The template leaves the answer's header open (`<|start|>assistant`), or even its
        # thinking (`...<|channel|>analysis<|message|>`): the parser starts there.
        at = prompt.rfind(START)
        opened = at >= 0 and not any(end in prompt[at:] for end in MESSAGE_ENDS)
        self._parser = StreamableParser(self._encoding, None if opened else Role.ASSISTANT)
        if opened:
            self._feed(TaskId(""), prompt[at:])
            self._opened, self._header = False, []

    @property
    def thinking(self) -> bool:
        parser = self._parser
        return (
            self._in_content
            and parser.current_channel == "analysis"
            and not parser.current_recipient
        )

    @property
    def messages(self) -> list[Message]:
        """The messages of the answer so far, as openai-harmony read them."""
        return self._parser.messages

    def _encode(self, text: str) -> list[int]:
        return self._encoding.encode(text, allowed_special=MARKERS, disallowed_special=())

    def _is_call(self, recipient: str | None) -> bool:
        return self._tools and bool(recipient)

    def _content(self, task_id: TaskId) -> list[Chunk]:
        delta = self._parser.last_content_delta
        recipient = self._parser.current_recipient
        if self._is_call(recipient):
            return self._call_delta(task_id, recipient or "", delta or "")
        if not delta:
            return []
        if self.thinking:
            return [ThinkingChunk(task_id=task_id, text=delta)]
        return [TextChunk(task_id=task_id, text=delta)]

    def _call_delta(self, task_id: TaskId, recipient: str, delta: str) -> list[Chunk]:
        """A call's arguments as they are written (the JSON normalised as it streams)."""
        out: list[Chunk] = []
        name = recipient.removeprefix("functions.")
        if self._call is None:
            self._call = (new_id("call"), ArgumentStream())
            out.append(ToolCallDeltaChunk(task_id=task_id, id=self._call[0], name=name))
        call_id, stream = self._call
        text = stream.feed(delta)
        if text:
            out.append(ToolCallDeltaChunk(task_id=task_id, id=call_id, name=name, arguments=text))
        return out

    def _closed(self, task_id: TaskId) -> list[Chunk]:
        """The message that just ended: a tool call, when it was one."""
        self._in_content = False
        streamed, self._call = self._call, None
        message = self._parser.messages[-1]
        if not self._is_call(message.recipient):
            return []
        body = "".join(getattr(c, "text", "") for c in message.content)
        call = read_call(message.recipient or "", body)
        if call is None:  # not a call after all (cut off mid-JSON): say what the model said
            return [TextChunk(task_id=task_id, text=body)]
        if streamed is None:
            return [ToolCallChunk(task_id=task_id, call=call)]
        call_id, stream = streamed
        rest = stream.finish()
        last: list[Chunk] = []
        if rest:
            last.append(
                ToolCallDeltaChunk(task_id=task_id, id=call_id, name=call.name, arguments=rest)
            )
        whole = ToolCall(id=call_id, name=call.name, arguments=stream.text)
        return [*last, ToolCallChunk(task_id=task_id, call=whole)]

    def _token(self, task_id: TaskId, token: int) -> list[Chunk]:
        out: list[Chunk] = []
        if token == self._ids[START] and self._in_content:
            # A new message inside one: the model skipped `<|end|>` (the package would read
            # the header as content); end the open message first.
            out = self._token(task_id, self._ids[END])
        return [*out, *self._step(task_id, token)]

    def _step(self, task_id: TaskId, token: int) -> list[Chunk]:
        self._parser.process(token)
        if token in self._ends:
            return self._closed(task_id) if self._in_content else []
        if self._in_content:
            return self._content(task_id)
        self._header.append(token)
        if token == self._ids[MESSAGE]:
            self._in_content, self._opened, self._header = True, True, []
        return []

    def _feed(self, task_id: TaskId, text: str) -> list[Chunk]:
        if self._failed:
            return [TextChunk(task_id=task_id, text=text)] if text else []
        out: list[Chunk] = []
        tokens = self._encode(text)
        for i, token in enumerate(tokens):
            try:
                out.extend(self._token(task_id, token))
            except HarmonyError:
                self._failed = True
                rest = self._encoding.decode(tokens[i:])
                return [*out, TextChunk(task_id=task_id, text=rest)]
        return out

    def feed(self, chunk: TextChunk) -> list[Chunk]:
        text = self._held + chunk.text
        cut = marker_start(text)
        self._held = text[cut:]
        return self._feed(chunk.task_id, text[:cut])

    def finish(self, task_id: str) -> list[Chunk]:
        # The stream ends at `<|call|>` or `<|return|>` (end-of-sequence tokens, not in the
        # text): the open message ends with it. A call cut off mid-JSON comes back as text.
        task = TaskId(task_id)
        held, self._held = self._held, ""
        out = self._feed(task, held)
        if self._failed:
            return out
        try:
            self._parser.process_eos()
        except HarmonyError:  # the stream ended inside a header
            if not self._opened:  # the model never spoke Harmony: show what it said
                out.append(TextChunk(task_id=task, text=self._encoding.decode(self._header)))
            return out
        return [*out, *self._closed(task)] if self._in_content else out
