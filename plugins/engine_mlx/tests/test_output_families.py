# ruff: noqa: RUF001  (DeepSeek's markers are fullwidth characters by design)
"""Each family's thinking and tool calls, parsed on the runner's side from its tokenizer.

Every case is a tokenizer with the family's real markers (as special tokens) and a chat
template that names its format, loaded by mlx-lm's own tokenizer loader, which infers the
family's tool parser and think tags. A recorded model output is then tokenized and streamed
token by token through the runner's text stream and `family_parser`, exactly as a generation
is, so tags and arguments arrive split across tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from exo_core.plugin import (
    ChatMessage,
    Chunk,
    FinishChunk,
    GenerationParams,
    TaskId,
    TextChunk,
    ThinkingChunk,
    ToolCallChunk,
    ToolCallDeltaChunk,
    ToolSpec,
)
from exo_engine_mlx.output import family_parser, opens_thinking, tool_format
from exo_engine_mlx.prompt import encode, render
from exo_engine_mlx.testing import ScriptedOutput
from exo_engine_mlx.textstream import TextStream
from exo_engine_mlx.tiny_model import THINKING_SWITCH_TEMPLATE, make_tiny_tokenizer
from exo_engine_mlx.tool_formats import parse_toolcall_list

TASK = TaskId("task")
WEATHER = ToolSpec(
    name="get_weather",
    description="The weather in a city",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
)
BASE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)


@dataclass(frozen=True)
class Family:
    name: str
    parser: str  # the mlx-lm tool parser the tokenizer must be read as
    specials: tuple[str, ...]
    marker: str  # what the family's real template contains, so mlx-lm infers the parser
    output: str  # a recorded answer: thinking, text and two calls
    think: str = "Paris first, then Rome."
    text: str = "Checking both."
    calls: tuple[tuple[str, dict[str, Any]], ...] = (
        ("get_weather", {"city": "Paris", "days": 2}),
        ("get_weather", {"city": "Rome", "days": 1}),
    )
    opens_think: bool = False

    def template(self) -> str:
        generation = "<|im_start|>assistant\n" + ("<think>\n" if self.opens_think else "")
        return (
            f"{{# {self.marker} #}}{BASE}{{% if add_generation_prompt %}}{generation}{{% endif %}}"
        )


THINK = "<think>Paris first, then Rome.</think>"
FAMILIES = [
    Family(
        "qwen3 (hermes JSON)",
        "json_tools",
        ("<think>", "</think>", "<tool_call>", "</tool_call>"),
        "<tool_call> {{ tool_call.name }}",
        THINK + "Checking both."
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
        "</tool_call>\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 1}}\n'
        "</tool_call>",
    ),
    Family(
        "qwen3-coder / qwen3.5 (XML)",
        "qwen3_coder",
        ("<think>", "</think>", "<tool_call>", "</tool_call>"),
        "<tool_call>\n<function=",
        THINK + "Checking both."
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
        "<parameter=days>\n1\n</parameter>\n</function>\n</tool_call>",
    ),
    Family(
        "glm 4.x",
        "glm47",
        (
            "<think>",
            "</think>",
            "<tool_call>",
            "</tool_call>",
            "<arg_key>",
            "</arg_key>",
            "<arg_value>",
            "</arg_value>",
        ),
        "<arg_key>",
        THINK + "Checking both."
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
        "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call>"
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value>"
        "<arg_key>days</arg_key><arg_value>1</arg_value></tool_call>",
    ),
    Family(
        "kimi k2",
        "kimi_k2",
        (
            "<think>",
            "</think>",
            "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>",
            "<|tool_call_begin|>",
            "<|tool_call_end|>",
            "<|tool_call_argument_begin|>",
        ),
        "<|tool_calls_section_begin|>",
        THINK + "Checking both."
        "<|tool_calls_section_begin|>"
        '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris",'
        ' "days": 2}<|tool_call_end|>'
        '<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{"city": "Rome",'
        ' "days": 1}<|tool_call_end|>'
        "<|tool_calls_section_end|>",
    ),
    Family(
        "minimax m2",
        "minimax_m2",
        ("<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>"),
        "<minimax:tool_call>",
        THINK + "Checking both."
        '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris'
        '</parameter>\n<parameter name="days">2</parameter>\n</invoke>\n'
        '<invoke name="get_weather">\n<parameter name="city">Rome</parameter>\n'
        '<parameter name="days">1</parameter>\n</invoke>\n</minimax:tool_call>',
    ),
    Family(
        "mistral / devstral",
        "mistral",
        ("[TOOL_CALLS]", "[ARGS]"),
        "[TOOL_CALLS]",
        'Checking both.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2}'
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome", "days": 1}',
        think="",
    ),
    Family(
        "lfm2 (pythonic)",
        "pythonic",
        ("<think>", "</think>", "<|tool_call_start|>", "<|tool_call_end|>"),
        "<|tool_call_start|>",
        THINK + "Checking both."
        '<|tool_call_start|>[get_weather(city="Paris", days=2), get_weather(city="Rome",'
        " days=1)]<|tool_call_end|>",
    ),
    Family(
        "gemma 4",
        "gemma4",
        ("<|tool_call>", "<tool_call|>", '<|"|>', "<|channel>", "<channel|>"),
        "<|tool_call> <tool_call|>",
        "<|channel>thoughtParis first, then Rome.<channel|>Checking both."
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>'
        '<|tool_call>call:get_weather{city:<|"|>Rome<|"|>,days:1}<tool_call|>',
    ),
    Family(
        "longcat",
        "longcat",
        (
            "<longcat_think>",
            "</longcat_think>",
            "<longcat_tool_call>",
            "</longcat_tool_call>",
            "<longcat_arg_key>",
            "</longcat_arg_key>",
            "<longcat_arg_value>",
            "</longcat_arg_value>",
        ),
        "<longcat_tool_call>",
        "<longcat_think>Paris first, then Rome.</longcat_think>Checking both."
        "<longcat_tool_call>get_weather<longcat_arg_key>city</longcat_arg_key>"
        "<longcat_arg_value>Paris</longcat_arg_value><longcat_arg_key>days</longcat_arg_key>"
        "<longcat_arg_value>2</longcat_arg_value></longcat_tool_call>"
        "<longcat_tool_call>get_weather<longcat_arg_key>city</longcat_arg_key>"
        "<longcat_arg_value>Rome</longcat_arg_value><longcat_arg_key>days</longcat_arg_key>"
        "<longcat_arg_value>1</longcat_arg_value></longcat_tool_call>",
    ),
    Family(
        "deepseek v3.1",
        "deepseek_v3",
        (
            "<think>",
            "</think>",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁call▁end｜>",
            "<｜tool▁sep｜>",
        ),
        "<｜tool▁calls▁begin｜>",
        THINK + "Checking both."
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        '{"city": "Paris", "days": 2}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather'
        '<｜tool▁sep｜>{"city": "Rome", "days": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    ),
    Family(
        "deepseek v3.2 (DSML)",
        "deepseek_v32",
        ("<think>", "</think>"),
        "<｜DSML｜function_calls>",
        THINK + "Checking both.\n\n"
        "<｜DSML｜function_calls>\n"
        '<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n"
        '<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">Rome</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="days" string="false">1</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n"
        "</｜DSML｜function_calls>",
    ),
    Family(
        "deepseek v4 (DSML)",
        "deepseek_v4",
        ("<think>", "</think>"),
        "<｜DSML｜tool_calls>",
        THINK + "Checking both.\n\n"
        "<｜DSML｜tool_calls>\n"
        '<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n"
        '<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">Rome</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="days" string="false">1</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n"
        "</｜DSML｜tool_calls>",
    ),
    # Nemotron Nano 9B v2: every call in one JSON list. The markers are plain text here (the
    # template names them), so they reach the parser split over several tokens.
    Family(
        "nemotron-h (<TOOLCALL> list)",
        "nemotron_toolcall",
        ("<think>", "</think>"),
        "<TOOLCALL>[{{ tool_call.name }}]</TOOLCALL>",
        THINK + "Checking both."
        '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, '
        '{"name": "get_weather", "arguments": {"city": "Rome", "days": 1}}]</TOOLCALL>',
    ),
    Family(
        "deepseek-r1 style (template opens the think block)",
        "json_tools",
        ("<think>", "</think>", "<tool_call>", "</tool_call>"),
        "<tool_call> {{ tool_call.name }}",
        "Paris first, then Rome.</think>Checking both."
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
        "</tool_call>"
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome", "days": 1}}'
        "</tool_call>",
        opens_think=True,
    ),
]


@pytest.fixture(scope="module", params=FAMILIES, ids=[f.name for f in FAMILIES])
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    spec: Family = request.param
    out = tmp_path_factory.mktemp("tok")
    make_tiny_tokenizer(
        out,
        special_tokens=spec.specials,
        chat_template=spec.template(),
        corpus=[spec.output, "get_weather Paris Rome city days"],
    )
    return spec, load_tokenizer(out)


def params(tools: bool = True) -> GenerationParams:
    return GenerationParams(
        messages=(ChatMessage(role="user", content="Weather in Paris and Rome?"),),
        tools=(WEATHER,) if tools else (),
    )


def stream(tokenizer: Any, request: GenerationParams, output: str, stops=()) -> list[Chunk]:
    """What the runner emits for `output`: one token at a time through its text stream."""
    parser = family_parser(tokenizer, request, render(tokenizer, request))
    text = TextStream(tokenizer.detokenizer, stops)
    out: list[Chunk] = []

    def emit(piece: str) -> None:
        if not piece:
            return
        chunk = TextChunk(task_id=TASK, text=piece)
        out.extend(parser.feed(chunk) if parser is not None else [chunk])

    for token in tokenizer.encode(output, add_special_tokens=False):
        emit(text.add(token))
    emit(text.finish())
    if parser is not None:
        out.extend(parser.finish(TASK))
    return out


def joined(chunks: list[Chunk], kind: type) -> str:
    return "".join(c.text for c in chunks if isinstance(c, kind))


def test_mlx_lm_reads_the_family_from_its_tokenizer(family: Any) -> None:
    spec, tokenizer = family
    found = tool_format(tokenizer)
    assert found is not None and found.name == spec.parser


def test_thinking_text_and_every_call_come_out_structured(family: Any) -> None:
    spec, tokenizer = family
    out = stream(tokenizer, params(), spec.output)
    calls = [c.call for c in out if isinstance(c, ToolCallChunk)]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == list(spec.calls)
    assert len({c.id for c in calls}) == len(calls)
    assert joined(out, ThinkingChunk).strip() == spec.think
    assert joined(out, TextChunk).strip() == spec.text


# The formats read as they stream: a call's arguments go out while its block is written.
STREAMED = {"json_tools", "deepseek_v3", "deepseek_v32", "deepseek_v4"}


def test_streamed_formats_send_each_calls_arguments_as_deltas(family: Any) -> None:
    spec, tokenizer = family
    out = stream(tokenizer, params(), spec.output)
    calls = [c.call for c in out if isinstance(c, ToolCallChunk)]
    pieces: dict[str, list[str]] = {}
    for chunk in out:
        if isinstance(chunk, ToolCallDeltaChunk):
            pieces.setdefault(chunk.id, []).append(chunk.arguments)
    if spec.parser not in STREAMED:
        assert not pieces  # read whole once the block closes
        return
    assert {i: "".join(p) for i, p in pieces.items()} == {c.id: c.arguments for c in calls}
    assert all(len([p for p in ps if p]) > 2 for ps in pieces.values())


def test_without_tools_in_the_request_calls_stay_text(family: Any) -> None:
    spec, tokenizer = family
    out = stream(tokenizer, params(tools=False), spec.output)
    assert not any(isinstance(c, ToolCallChunk) for c in out)
    assert "get_weather" in joined(out, TextChunk)


def test_a_truncated_call_is_kept_as_text(family: Any) -> None:
    spec, tokenizer = family
    cut = spec.output[: spec.output.index("Paris", len(spec.think) + 20) + 3]
    out = stream(tokenizer, params(), cut)
    assert not any(isinstance(c, ToolCallChunk) for c in out)
    assert joined(out, TextChunk).endswith("Par")


def test_a_prompt_that_opens_the_think_block_starts_the_parser_inside() -> None:
    assert opens_thinking("<|im_start|>assistant\n<think>\n", "<think>", "</think>")
    assert not opens_thinking("<think>\n\n</think>\n\n", "<think>", "</think>")
    assert not opens_thinking("a <think> b", "<think>", "</think>")
    assert not opens_thinking("no tags", "<think>", "</think>")


@pytest.fixture(scope="module")
def switched(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tokenizer whose template switches thinking with `thinking`, as DeepSeek V3.1's does."""
    out = tmp_path_factory.mktemp("switched")
    make_tiny_tokenizer(
        out,
        special_tokens=("<think>", "</think>"),
        chat_template=THINKING_SWITCH_TEMPLATE,
        corpus=["Paris first, then Rome.</think>Checking both."],
    )
    return load_tokenizer(out)


def thinking(enable: bool | None) -> GenerationParams:
    return msgspec.structs.replace(params(tools=False), enable_thinking=enable)


@pytest.mark.parametrize(
    ("enable", "ending"), [(True, "<think>"), (False, "</think>"), (None, "</think>")]
)
def test_the_thinking_switch_reaches_a_template_that_names_it_thinking(
    switched: Any, enable: bool | None, ending: str
) -> None:
    # None leaves the template's own default (off for V3.1).
    assert render(switched, thinking(enable)).endswith(f"<|im_start|>assistant\n{ending}")


def test_switched_on_thinking_starts_the_parser_inside_the_block(switched: Any) -> None:
    out = stream(switched, thinking(True), "Paris first, then Rome.</think>Checking both.")
    assert joined(out, ThinkingChunk) == "Paris first, then Rome."
    assert joined(out, TextChunk) == "Checking both."
    off = stream(switched, thinking(False), "Checking both.")
    assert not any(isinstance(c, ThinkingChunk) for c in off)
    assert joined(off, TextChunk) == "Checking both."


def test_a_toolcall_block_is_a_list_of_calls_or_one_call() -> None:
    one = '{"name": "f", "arguments": {"x": 1}}'
    assert parse_toolcall_list(f"[{one}, {one}]") == [{"name": "f", "arguments": {"x": 1}}] * 2
    assert parse_toolcall_list(one) == [{"name": "f", "arguments": {"x": 1}}]
    for refused in ("[]", '"f"', "[1]", "not json"):
        with pytest.raises(ValueError):
            parse_toolcall_list(refused)


def test_the_batch_engine_parses_and_counts_reasoning_tokens(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    import mlx_lm

    from exo_engine_mlx.batching import BatchEngine
    from exo_engine_mlx.tiny_model import make_tiny_model

    qwen3 = FAMILIES[0]
    path = make_tiny_model(
        tmp_path_factory.mktemp("thinking") / "model",
        special_tokens=qwen3.specials,
        chat_template=qwen3.template(),
        corpus=[qwen3.output],
    )
    model, tokenizer = mlx_lm.load(str(path))
    thought = tokenizer.encode("<think>Paris first.</think>", add_special_tokens=False)
    answer = tokenizer.encode("It is sunny.", add_special_tokens=False)
    eos = sorted(tokenizer.eos_token_ids)
    request = params(tools=False)
    prompt = len(encode(tokenizer, request, render(tokenizer, request)))
    engine = BatchEngine(ScriptedOutput(model, prompt, [*thought, *answer, *eos]), tokenizer)
    assert engine.submit(TASK, request) == []
    out: list[Chunk] = []
    while engine.active:
        out.extend(engine.step())
    assert joined(out, ThinkingChunk) == "Paris first."
    assert joined(out, TextChunk) == "It is sunny."
    finish = out[-1]
    assert isinstance(finish, FinishChunk)
    assert finish.usage.completion_tokens == len(thought) + len(answer)
    # The open tag and the thinking are reasoning; the close tag ends it.
    assert finish.usage.reasoning_tokens == len(thought) - 1


# gpt-oss (Harmony): thinking on the analysis channel, a preamble on commentary, calls as
# messages to functions (the recipient in the channel part, then in the role part).
HARMONY_OUTPUT = (
    "<|channel|>analysis<|message|>Paris first, then Rome.<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>Checking both.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris", "days": 2}<|call|>'
    "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json"
    '<|message|>{"city": "Rome", "days": 1}<|call|>'
)


@pytest.fixture(scope="module")
def harmony(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from exo_engine_mlx.tiny_model import HARMONY_SPECIALS, HARMONY_TEMPLATE

    out = tmp_path_factory.mktemp("harmony")
    make_tiny_tokenizer(
        out,
        special_tokens=HARMONY_SPECIALS,
        chat_template=HARMONY_TEMPLATE,
        corpus=[HARMONY_OUTPUT, "get_weather Paris Rome city days analysis commentary"],
    )
    return load_tokenizer(out)


def test_harmony_channels_and_calls_come_out_structured(harmony: Any) -> None:
    out = stream(harmony, params(), HARMONY_OUTPUT)
    calls = [c.call for c in out if isinstance(c, ToolCallChunk)]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": 2}),
        ("get_weather", {"city": "Rome", "days": 1}),
    ]
    assert joined(out, ThinkingChunk) == "Paris first, then Rome."
    assert joined(out, TextChunk) == "Checking both."


def test_harmony_calls_stream_their_arguments(harmony: Any) -> None:
    out = stream(harmony, params(), HARMONY_OUTPUT)
    calls = [c.call for c in out if isinstance(c, ToolCallChunk)]
    joined: dict[str, str] = {}
    for chunk in out:
        if isinstance(chunk, ToolCallDeltaChunk):
            assert chunk.name == "get_weather"
            joined[chunk.id] = joined.get(chunk.id, "") + chunk.arguments
    assert joined == {c.id: c.arguments for c in calls} and len(calls) == 2
    assert len([c for c in out if isinstance(c, ToolCallDeltaChunk)]) > 6


def test_harmony_without_tools_or_cut_off_calls_stay_text(harmony: Any) -> None:
    out = stream(harmony, params(tools=False), HARMONY_OUTPUT)
    assert not any(isinstance(c, ToolCallChunk) for c in out)
    assert '"city": "Rome"' in joined(out, TextChunk)
    cut = HARMONY_OUTPUT[: HARMONY_OUTPUT.index('"Par') + 4]
    out = stream(harmony, params(), cut)
    assert not any(isinstance(c, ToolCallChunk) for c in out)
    assert joined(out, TextChunk).endswith('{"city": "Par')


def test_harmony_prompt_opening_the_analysis_channel_starts_in_thinking() -> None:
    from exo_engine_mlx.harmony import HarmonyParser

    parser = HarmonyParser(False, "<|start|>user<|message|>hi<|end|><|start|>assistant"
                           "<|channel|>analysis<|message|>")  # fmt: skip
    assert parser.thinking
    out = parser.feed(TextChunk(task_id=TASK, text="Hmm.<|end|><|start|>assistant"))
    out += parser.feed(TextChunk(task_id=TASK, text="<|channel|>final<|message|>Hi"))
    out += parser.finish(TASK)
    assert joined(out, ThinkingChunk) == "Hmm." and joined(out, TextChunk) == "Hi"


V30 = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    '{"city": "Paris", "days": 2}\n```<｜tool▁call▁end｜>'
    '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Rome"}<｜tool▁call▁end｜>'
    "<｜tool▁calls▁end｜>"
)


@pytest.mark.parametrize("cut", range(len(V30) + 1))
def test_deepseek_v3_calls_stream_wherever_the_text_splits(cut: int) -> None:
    from exo_core.plugin.parsers import ToolBlockParser
    from exo_engine_mlx.tool_formats import FORMATS

    v3 = next(f for f in FORMATS if f.name == "deepseek_v3")
    parser = ToolBlockParser(v3.start, v3.end, lambda text: [], v3.stream)
    out = [*parser.feed(TextChunk(task_id=TASK, text=V30[:cut]))]
    out += parser.feed(TextChunk(task_id=TASK, text=V30[cut:]))
    out += parser.finish(TASK)
    calls = [c.call for c in out if isinstance(c, ToolCallChunk)]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": 2}),
        ("get_weather", {"city": "Rome"}),
    ]
    joined: dict[str, str] = {}
    for chunk in out:
        if isinstance(chunk, ToolCallDeltaChunk):
            joined[chunk.id] = joined.get(chunk.id, "") + chunk.arguments
    assert joined == {c.id: c.arguments for c in calls}
    assert not [c for c in out if isinstance(c, TextChunk)]
