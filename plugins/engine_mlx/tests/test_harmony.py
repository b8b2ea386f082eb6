"""gpt-oss through openai-harmony: its encoding loaded offline, its parser reading the answer,
its renderer writing the prompt.

The recorded outputs of `test_output_families.py` and the dialect round trips cover the
families' common cases through a tiny tokenizer; here the package is driven directly.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from openai_harmony import HarmonyError, Message, Role

from exo_core.plugin import (
    ChatMessage,
    Chunk,
    GenerationParams,
    TaskId,
    TextChunk,
    ThinkingChunk,
    ToolCall,
    ToolCallChunk,
    ToolSpec,
)
from exo_engine_mlx.harmony import HarmonyParser
from exo_engine_mlx.harmony_encoding import BASE_VAR, VOCAB_FILE, VOCAB_SHA256, load_encoding
from exo_engine_mlx.prompt import render

TASK = TaskId("task")
CALL = (
    "<|channel|>analysis<|message|>Paris, then Rome.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}'
)


def test_the_vocabulary_is_unpacked_checked_and_loaded_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(BASE_VAR, raising=False)
    (tmp_path / VOCAB_FILE).write_bytes(b"a torn write")
    encoding = load_encoding(tmp_path)
    assert hashlib.sha256((tmp_path / VOCAB_FILE).read_bytes()).hexdigest() == VOCAB_SHA256
    assert BASE_VAR not in os.environ  # set for the load only
    # gpt-oss's own token ids (o200k_harmony), so a real tokenizer's ids are these.
    ids = encoding.encode("<|start|><|message|><|end|><|call|>", allowed_special="all")
    assert ids == [200006, 200008, 200007, 200012]


def test_a_vocabulary_folder_the_user_set_is_the_one_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs = str(tmp_path / "theirs")
    monkeypatch.setenv(BASE_VAR, theirs)
    with pytest.raises(HarmonyError):  # their folder is empty: not silently replaced
        load_encoding(tmp_path / "ours")
    assert os.environ[BASE_VAR] == theirs and not (tmp_path / "ours").exists()


def feed(parser: HarmonyParser, pieces: list[str]) -> list[Chunk]:
    out: list[Chunk] = []
    for piece in pieces:
        out.extend(parser.feed(TextChunk(task_id=TASK, text=piece)))
    return [*out, *parser.finish(TASK)]


def joined(chunks: list[Chunk], kind: type) -> str:
    return "".join(c.text for c in chunks if isinstance(c, kind))


def test_the_package_reads_the_messages_and_streams_their_deltas() -> None:
    parser = HarmonyParser(True, "<|start|>user<|message|>hi<|end|><|start|>assistant")
    # Markers split across chunks, as a stop-string check may hold them back.
    pieces = [CALL[i : i + 3] for i in range(0, len(CALL), 3)]
    out = feed(parser, pieces)
    thinking = [c for c in out if isinstance(c, ThinkingChunk)]
    assert len(thinking) > 1 and joined(out, ThinkingChunk) == "Paris, then Rome."
    calls = [c.call for c in out if isinstance(c, ToolCallChunk)]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    # openai-harmony's messages: the header's recipient and content type as the package read it.
    analysis, call = parser.messages
    assert isinstance(call, Message) and call.author.role == Role.ASSISTANT
    assert (analysis.channel, call.channel) == ("analysis", "commentary")
    assert (call.recipient, call.content_type) == ("functions.get_weather", "<|constrain|>json")


def test_text_outside_the_format_is_shown_as_the_model_wrote_it() -> None:
    out = feed(HarmonyParser(False, "<|start|>assistant"), ["just text, no header"])
    assert joined(out, TextChunk) == "just text, no header"
    out = feed(
        HarmonyParser(False, "<|start|>assistant"),
        ["<|channel|>final<|message|>Hi.", "<|end|>then prose"],
    )
    assert joined(out, TextChunk) == "Hi.then prose"
    # A message started without ending the last one: its header is never content.
    out = feed(
        HarmonyParser(False, "<|start|>assistant"),
        ["<|channel|>analysis<|message|>Hmm.<|start|>assistant<|channel|>final<|message|>Hi."],
    )
    assert joined(out, ThinkingChunk) == "Hmm." and joined(out, TextChunk) == "Hi."


WEATHER = ToolSpec(name="get_weather", description="The weather in a city",
                   parameters={"type": "object", "properties": {"city": {"type": "string"}}})  # fmt: skip


class HarmonyVocabulary:
    """A gpt-oss tokenizer as far as the prompt renderer asks: its vocabulary has Harmony's
    markers; its chat template would fail if it were used."""

    chat_template = "{{ raise_exception('the template is not used for gpt-oss') }}"

    def get_vocab(self) -> dict[str, int]:
        markers = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>")
        return {m: i for i, m in enumerate(markers)}


def test_the_prompt_keeps_effort_tools_every_call_and_its_result() -> None:
    calls = (
        ToolCall(id="a", name="get_weather", arguments='{"city": "Paris"}'),
        ToolCall(id="b", name="get_time", arguments='{"city": "Rome"}'),
    )
    params = GenerationParams(
        messages=(
            ChatMessage(role="system", content="Be brief."),
            ChatMessage(role="user", content="Weather in Paris, time in Rome?"),
            ChatMessage(role="assistant", reasoning="Two tools.", tool_calls=calls),
            ChatMessage(role="tool", tool_call_id="a", content="sunny"),
            ChatMessage(role="tool", tool_call_id="b", content="noon"),
        ),
        tools=(WEATHER,),
        reasoning_effort="high",
    )
    prompt = render(HarmonyVocabulary(), params)
    assert "Reasoning: high" in prompt
    assert "# Instructions\n\nBe brief." in prompt and "type get_weather = " in prompt
    assert "<|channel|>analysis<|message|>Two tools.<|end|>" in prompt
    for name, args, result in (("get_weather", "Paris", "sunny"), ("get_time", "Rome", "noon")):
        assert f"to=functions.{name}<|channel|>commentary <|constrain|>json" in prompt
        assert f'{{"city": "{args}"}}<|call|>' in prompt
        assert f"<|start|>functions.{name} to=assistant<|channel|>commentary<|message|>" \
            f"{result}<|end|>" in prompt  # fmt: skip
    assert prompt.endswith("<|start|>assistant")
