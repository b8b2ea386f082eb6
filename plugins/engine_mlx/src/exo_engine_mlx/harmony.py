"""gpt-oss's Harmony output format, read as the model streams it.

A Harmony answer is a run of messages: `<|channel|>analysis<|message|>...<|end|>` (thinking),
`<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}`
ended by `<|call|>` (a tool call), `<|channel|>final<|message|>...` ended by `<|return|>` (the
answer). The recipient (`to=...`) may sit in the role or the channel part of the header.
`<|call|>` and `<|return|>` are end-of-sequence tokens, so a stream may simply end there.

Why not the `openai-harmony` package: it loads its tokenizer only from the official
`o200k_base.tiktoken` file, checked against a fixed SHA-256 whether it is downloaded or given
through `TIKTOKEN_ENCODINGS_BASE`, so it cannot run offline nor on a test model's vocabulary.
This parser reads the decoded text instead, which any gpt-oss tokenizer (real or tiny) gives.
"""

from __future__ import annotations

import json
import re
from typing import Any

from exo_core.plugin import (
    Chunk,
    OutputParser,
    TaskId,
    TextChunk,
    ThinkingChunk,
    ToolCallChunk,
    ToolCallParseError,
    speaks_harmony,
    split_held,
    tool_call,
)

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
# What ends a message's body (the model may also start the next message directly).
_BODY_ENDS = (END, CALL, RETURN, START)
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([\w-]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


def is_harmony(tokenizer: Any) -> bool:
    """Whether the tokenizer's vocabulary carries Harmony's markers (gpt-oss)."""
    try:
        vocab: Any = tokenizer.get_vocab()
    except Exception:  # a tokenizer without a vocabulary view
        return False
    return speaks_harmony(vocab)


def read_call(recipient: str, body: str) -> list[Any]:
    """A call to `functions.name` with a JSON body (raises when the body is not JSON)."""
    name = recipient.removeprefix("functions.")
    try:
        arguments = json.loads(body) if body.strip() else {}
    except ValueError as e:
        raise ToolCallParseError(f"the arguments of {name} are not JSON: {e}") from e
    return [tool_call(name, arguments)]


class HarmonyParser(OutputParser):
    """Harmony messages to chunks: analysis is thinking, a message to a function is a tool
    call (when the request offered tools), everything else (final, commentary) is text."""

    def __init__(self, tools: bool, prompt: str = "") -> None:
        self._tools = tools
        self._header = ""
        self._in_body = False
        self._channel = ""
        self._recipient = ""
        self._call = ""  # the body of a tool call, read once the message ends
        self._held = ""
        # The template leaves the answer's header open (`<|start|>assistant`): start there.
        at = prompt.rfind(START)
        if at >= 0 and END not in prompt[at:]:
            self.feed(TextChunk(task_id=TaskId(""), text=prompt[at + len(START) :]))

    @property
    def thinking(self) -> bool:
        return self._in_body and self._channel == "analysis" and not self._recipient

    def _open(self) -> None:
        channel = _CHANNEL.search(self._header)
        recipient = _RECIPIENT.search(self._header)
        self._channel = channel.group(1) if channel else ""
        self._recipient = recipient.group(1) if recipient else ""
        self._header, self._in_body, self._call = "", True, ""

    def _is_call(self) -> bool:
        return self._tools and bool(self._recipient)

    def _body(self, task_id: TaskId, text: str) -> list[Chunk]:
        if not text:
            return []
        if self._is_call():
            self._call += text
            return []
        if self.thinking:
            return [ThinkingChunk(task_id=task_id, text=text)]
        return [TextChunk(task_id=task_id, text=text)]

    def _close(self, task_id: TaskId) -> list[Chunk]:
        self._in_body = False
        if not self._is_call():
            return []
        body, self._call = self._call, ""
        try:
            calls = read_call(self._recipient, body)
        except ValueError:  # not a call after all: say what the model said
            return [TextChunk(task_id=task_id, text=body)]
        return [ToolCallChunk(task_id=task_id, call=call) for call in calls]

    def feed(self, chunk: TextChunk) -> list[Chunk]:
        out: list[Chunk] = []
        text, self._held = self._held + chunk.text, ""
        task_id = chunk.task_id
        while text:
            if not self._in_body:
                at = text.find(MESSAGE)
                if at < 0:  # a header is format, never shown: no need to hold it back
                    self._header += text
                    break
                self._header += text[:at]
                text = text[at + len(MESSAGE) :]
                self._open()
                continue
            found = [(i, m) for m in _BODY_ENDS if (i := text.find(m)) >= 0]
            if not found:
                # Hold back what may be the start of a marker split across tokens.
                held = max((split_held(text, m)[1] for m in _BODY_ENDS), key=len)
                self._held = held
                out.extend(self._body(task_id, text[: len(text) - len(held)]))
                break
            at, marker = min(found)
            out.extend(self._body(task_id, text[:at]))
            out.extend(self._close(task_id))
            text = text[at + len(marker) :]
        return out

    def finish(self, task_id: str) -> list[Chunk]:
        # The stream ends at `<|call|>` or `<|return|>` (end-of-sequence tokens, not in the
        # text): the open message ends with it. A call cut off mid-JSON comes back as text.
        held, self._held = self._held, ""
        if not self._in_body:
            return []
        return [*self._body(TaskId(task_id), held), *self._close(TaskId(task_id))]
