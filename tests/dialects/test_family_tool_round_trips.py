# ruff: noqa: RUF001  (DeepSeek's markers are fullwidth characters by design)
"""A tool round trip (call, result, final answer) per family, through the official clients.

The node runs the real engine pieces in process: a tiny model loaded by mlx-lm with the
family's tokenizer (its markers as special tokens, its template naming the format), the batch
engine, and the family's parser on the engine's side. Random weights cannot write a tool call,
so the model's logits are scripted (`ScriptedOutput`): everything after the logits is real.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import anyio
import mlx_lm
import ollama
import openai
import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from exo_core.engine import Engine, Runner, RunnerSpec, StatusReporter
from exo_core.generation import Chunk, ErrorChunk, FinishChunk, GenerationParams
from exo_core.hookspecs import hookimpl
from exo_core.ids import ModelId, TaskId
from exo_core.model_cards import Capability, ModelCard
from exo_core.state import RunnerStatus, Task
from exo_core.testing.harness import running_node
from exo_engine_mlx.batching import BatchEngine
from exo_engine_mlx.output import opens_thinking
from exo_engine_mlx.prompt import encode, render
from exo_engine_mlx.testing import ScriptedOutput
from exo_engine_mlx.tiny_model import (
    HARMONY_EOS,
    HARMONY_SPECIALS,
    HARMONY_TEMPLATE,
    THINKING_SWITCH_TEMPLATE,
    make_tiny_model,
)

from .support import DIALECTS

ANSWER = "It is sunny in Paris."
THOUGHT = "The user wants weather."
BASE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class Family:
    name: str
    specials: tuple[str, ...]
    marker: str
    call: Callable[[str, dict[str, Any]], str]
    # The final answer as the family writes it (Harmony puts it on the final channel).
    answer: Callable[[str], str] = lambda text: text
    model_type: str = "llama"
    template: str | None = None  # None: the common template, marked with `marker`
    eos: tuple[str, ...] = ("<|im_end|>",)
    # Several calls in one turn, where the format writes them together.
    calls: Callable[[list[tuple[str, dict[str, Any]]]], str] | None = None


DSML = "｜DSML｜"


def _dsml(block: str, name: str, args: dict[str, Any]) -> str:
    """DeepSeek's DSML block, every value written as a string (as the model often does)."""
    params = "".join(
        f'<{DSML}parameter name="{k}" string="true">{v}</{DSML}parameter>\n'
        for k, v in args.items()
    )
    return (
        f'<{DSML}{block}>\n<{DSML}invoke name="{name}">\n{params}</{DSML}invoke>\n</{DSML}{block}>'
    )


def _toolcall(calls: list[tuple[str, dict[str, Any]]]) -> str:
    """Nemotron-H's block: every call of the turn in one JSON list."""
    listed = [{"name": name, "arguments": args} for name, args in calls]
    return f"<think>The user wants weather.</think><TOOLCALL>{json.dumps(listed)}</TOOLCALL>"


FAMILIES = [
    Family(
        "hermes",
        ("<think>", "</think>", "<tool_call>", "</tool_call>"),
        "<tool_call> {{ tool_call.name }}",
        lambda name, args: (
            f"<think>The user wants weather.</think><tool_call>\n"
            f"{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"
        ),
    ),
    Family(
        "deepseek-v3.1",
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
        lambda name, args: (
            f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{name}<｜tool▁sep｜>"
            f"{json.dumps(args)}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        ),
        # Thinking switched by a `thinking` variable, as V3.1's own template does.
        template=THINKING_SWITCH_TEMPLATE,
    ),
    Family(
        "deepseek-v3.2",
        ("<think>", "</think>"),
        f"<{DSML}function_calls>",
        lambda name, args: _dsml("function_calls", name, args),
    ),
    # V4's block is `tool_calls`; its parameters are V3.2's.
    Family(
        "deepseek-v4",
        ("<think>", "</think>"),
        f"<{DSML}tool_calls>",
        lambda name, args: _dsml("tool_calls", name, args),
    ),
    Family(
        "nemotron-h",
        ("<think>", "</think>", "<TOOLCALL>", "</TOOLCALL>"),
        "<TOOLCALL>",
        lambda name, args: _toolcall([(name, args)]),
        calls=_toolcall,
    ),
    # gpt-oss on a tiny gpt_oss model: the call ends at <|call|>, an end-of-sequence token.
    Family(
        "harmony",
        HARMONY_SPECIALS,
        "",
        lambda name, args: (
            "<|channel|>analysis<|message|>The user wants weather.<|end|>"
            f"<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json"
            f"<|message|>{json.dumps(args)}<|call|>"
        ),
        answer=lambda text: f"<|channel|>final<|message|>{text}<|return|>",
        model_type="gpt_oss",
        template=HARMONY_TEMPLATE,
        eos=HARMONY_EOS,
    ),
]


def _answer(family: Family, params: GenerationParams) -> str:
    """The scripted model: a call to the first tool, or the answer once a tool has replied."""
    if params.messages[-1].role == "tool" or not params.tools:
        return family.answer(ANSWER)
    if params.tools[0].name == FORECAST["name"]:
        return family.call(FORECAST["name"], FORECAST_WRITTEN)
    if params.messages[-1].text() == ASK_BOTH and family.calls is not None:
        return family.calls([(t.name, {"city": "Paris"}) for t in params.tools])
    return family.call(params.tools[0].name, {"city": "Paris"})


class FamilyRunner(Runner):
    """The engine's batch engine in process, one request at a time, on a scripted model."""

    def __init__(self, family: Family, path: str, prompts: list[str]) -> None:
        self.family = family
        self.path = path
        self.prompts = prompts
        self._stop = anyio.Event()

    async def serve(self, report: StatusReporter) -> None:
        report(RunnerStatus.LOADING, None)
        model, self.tokenizer = mlx_lm.load(self.path)
        self.model = ScriptedOutput(model, 0, [])
        self.engine = BatchEngine(self.model, self.tokenizer)
        report(RunnerStatus.READY, None)
        await self._stop.wait()

    async def generate(self, task: Task) -> AsyncIterator[Chunk]:
        params, tokenizer = task.params, self.tokenizer
        rendered = render(tokenizer, params)
        answer = _answer(self.family, params)
        if opens_thinking(rendered, "<think>", "</think>"):  # the model thinks, then answers
            answer = f"{THOUGHT}</think>{answer}"
        script = tokenizer.encode(answer, add_special_tokens=False)
        self.prompts.append(rendered)
        prompt = encode(tokenizer, params, rendered)
        self.model.expect(len(prompt), [*script, *sorted(tokenizer.eos_token_ids)])
        pending = self.engine.submit(task.task_id, params)
        while True:
            for chunk in pending:
                yield chunk
                if isinstance(chunk, FinishChunk | ErrorChunk):
                    return
            await anyio.sleep(0)  # tiny steps: let the API stream between them
            pending = self.engine.step()

    async def cancel(self, task_id: TaskId) -> None:
        self.engine.cancel(task_id)

    async def stop(self) -> None:
        self._stop.set()


class FamilyEngine(Engine):
    name = "family-test"

    def __init__(self, paths: dict[str, Path]) -> None:
        self.paths = paths
        self.prompts: list[str] = []  # every rendered prompt, for the tests to read

    def can_serve(self, card: ModelCard) -> bool:
        return card.source.startswith("family:")

    async def prepare_model(self, card: ModelCard, models_dir: Path) -> Path | None:
        return self.paths[card.source.removeprefix("family:")]

    def create_runner(self, spec: RunnerSpec) -> Runner:
        family = next(f for f in FAMILIES if spec.card.source == f"family:{f.name}")
        return FamilyRunner(family, spec.model_path, self.prompts)


class FamilyPlugin:
    def __init__(self, paths: dict[str, Path]) -> None:
        self.engine = FamilyEngine(paths)

    @hookimpl
    def exo_engines(self) -> list[Engine]:
        return [self.engine]

    @hookimpl
    def exo_model_cards(self) -> list[ModelCard]:
        return [
            ModelCard(
                model_id=ModelId(f"family-{f.name}"),
                family=f.name,
                n_layers=2,
                hidden_size=64,
                num_key_value_heads=2,
                storage_size_bytes=1_000_000,
                capabilities=(Capability.TEXT, Capability.THINKING, Capability.TOOLS),
                source=f"family:{f.name}",
            )
            for f in FAMILIES
        ]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, FamilyEngine]]:
    paths = {}
    for family in FAMILIES:
        paths[family.name] = make_tiny_model(
            tmp_path_factory.mktemp(family.name) / "model",
            model_type=family.model_type,
            special_tokens=family.specials,
            chat_template=family.template or f"{{# {family.marker} #}}{BASE}",
            corpus=[
                family.call("get_weather", {"city": "Paris"}),
                family.call(FORECAST["name"], FORECAST_WRITTEN),
                ANSWER,
                THOUGHT,
                "get_time",
            ],
            eos_tokens=family.eos,
        )
    plugin = FamilyPlugin(paths)
    with running_node(tmp_path_factory.mktemp("node"), [plugin, *DIALECTS]) as node:
        yield node.url, plugin.engine


@pytest.fixture(scope="module")
def url(node: tuple[str, FamilyEngine]) -> str:
    return node[0]


WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
# A tool whose schema types its arguments, and a model that writes every one as a string: the
# client must get them typed (coerced to the schema).
FORECAST: dict[str, Any] = {
    "name": "get_forecast",
    "description": "The forecast for a city",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "metric": {"type": "boolean"},
            "note": {"type": "string"},
        },
    },
}
NOTE = "Bring an umbrella to the Paris weather meeting, the time is now."
FORECAST_WRITTEN = {"city": "Paris", "days": "3", "metric": "true", "note": NOTE}
FORECAST_TYPED = {"city": "Paris", "days": 3, "metric": True, "note": NOTE}
ASK = "What is the weather in Paris?"
ASK_BOTH = "What are the weather and the time in Paris?"
names = [f.name for f in FAMILIES]


@pytest.mark.parametrize("family", names)
@pytest.mark.parametrize("stream", [False, True])
def test_openai_round_trip(url: str, family: str, stream: bool) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": ASK}]
    tools: Any = [{"type": "function", "function": WEATHER}]
    model = f"family-{family}"
    if stream:
        calls: dict[int, dict[str, str]] = {}
        finish = None
        for chunk in client.chat.completions.create(
            model=model, messages=messages, tools=tools, stream=True
        ):
            choice = chunk.choices[0]
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += delta.id or ""
                fn = delta.function
                call["name"] += (fn.name or "") if fn else ""
                call["arguments"] += (fn.arguments or "") if fn else ""
        assert finish == "tool_calls" and len(calls) == 1
        call_id, name, arguments = calls[0]["id"], calls[0]["name"], calls[0]["arguments"]
    else:
        reply = client.chat.completions.create(model=model, messages=messages, tools=tools)
        assert reply.choices[0].finish_reason == "tool_calls"
        message = reply.choices[0].message
        assert message.tool_calls and len(message.tool_calls) == 1
        tool_call: Any = message.tool_calls[0]
        call_id, name, arguments = (
            tool_call.id,
            tool_call.function.name,
            tool_call.function.arguments,
        )
        assert "<" not in (message.content or "")  # no markers leak into the text
    assert name == "get_weather" and json.loads(arguments) == {"city": "Paris"}
    messages += [
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "sunny, 21 C"},
    ]
    final = client.chat.completions.create(model=model, messages=messages, tools=tools)
    assert final.choices[0].message.content == ANSWER
    assert final.choices[0].finish_reason == "stop"


TIME = {
    "name": "get_time",
    "description": "The local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.mark.parametrize("family", [f.name for f in FAMILIES if f.calls is not None])
@pytest.mark.parametrize("stream", [False, True])
def test_openai_two_calls_in_one_turn(url: str, family: str, stream: bool) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": ASK_BOTH}]
    tools: Any = [{"type": "function", "function": f} for f in (WEATHER, TIME)]
    model = f"family-{family}"
    if stream:
        calls: dict[int, dict[str, str]] = {}
        for chunk in client.chat.completions.create(
            model=model, messages=messages, tools=tools, stream=True
        ):
            for delta in chunk.choices[0].delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += delta.id or ""
                fn = delta.function
                call["name"] += (fn.name or "") if fn else ""
                call["arguments"] += (fn.arguments or "") if fn else ""
        found = [calls[i] for i in sorted(calls)]
    else:
        reply = client.chat.completions.create(model=model, messages=messages, tools=tools)
        assert reply.choices[0].finish_reason == "tool_calls"
        assert not reply.choices[0].message.content  # no markers or JSON left as text
        found = [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in reply.choices[0].message.tool_calls or []
            if c.type == "function"
        ]
    assert [(c["name"], json.loads(c["arguments"])) for c in found] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {"city": "Paris"}),
    ]
    assert len({c["id"] for c in found}) == 2


@pytest.mark.parametrize("family", names)
def test_claude_round_trip(url: str, family: str) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    tool: Any = {
        "name": WEATHER["name"],
        "description": WEATHER["description"],
        "input_schema": WEATHER["parameters"],
    }
    messages: list[Any] = [{"role": "user", "content": ASK}]
    model = f"family-{family}"
    reply = client.messages.create(model=model, max_tokens=200, messages=messages, tools=[tool])
    assert reply.stop_reason == "tool_use"
    uses = [b for b in reply.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather"
    assert uses[0].input == {"city": "Paris"}
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in reply.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": uses[0].id, "content": "sunny, 21 C"}
            ],
        },
    ]
    final = client.messages.create(model=model, max_tokens=200, messages=messages, tools=[tool])
    texts = [b.text for b in final.content if b.type == "text"]
    assert texts == [ANSWER] and final.stop_reason == "end_turn"


@pytest.mark.parametrize("family", names)
def test_ollama_round_trip(url: str, family: str) -> None:
    client = ollama.Client(host=url)
    tools: Any = [{"type": "function", "function": WEATHER}]
    messages: list[Any] = [{"role": "user", "content": ASK}]
    model = f"family-{family}"
    reply = client.chat(model=model, messages=messages, tools=tools, stream=False)
    calls = reply.message.tool_calls or []
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert dict(calls[0].function.arguments) == {"city": "Paris"}
    messages += [
        reply.message.model_dump(exclude_none=True),
        {"role": "tool", "content": "sunny, 21 C", "tool_name": "get_weather"},
    ]
    final = client.chat(model=model, messages=messages, tools=tools, stream=False)
    assert final.message.content == ANSWER


# The families whose parsers stream a call's arguments as they are written (the others send a
# call whole, once its block has closed, still as deltas).
STREAMED = {"hermes", "deepseek-v3.1", "deepseek-v3.2", "deepseek-v4", "harmony"}
FORECAST_TOOL: Any = {"type": "function", "function": FORECAST}
ASK_FORECAST: Any = [{"role": "user", "content": "The forecast for Paris, please."}]


def _enough_deltas(family: str, deltas: list[str]) -> None:
    """A streamed family's arguments came in many pieces, not in one."""
    pieces = [d for d in deltas if d]  # the first may be empty: it names the call
    assert len(pieces) >= (5 if family in STREAMED else 1), deltas


@pytest.mark.parametrize("family", names)
def test_openai_chat_gets_arguments_typed_and_streamed(url: str, family: str) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    model = f"family-{family}"
    reply = client.chat.completions.create(
        model=model, messages=ASK_FORECAST, tools=[FORECAST_TOOL]
    )
    whole: Any = (reply.choices[0].message.tool_calls or [])[0]
    assert json.loads(whole.function.arguments) == FORECAST_TYPED
    # openai's stream helper assembles the deltas (and parses them as they come).
    deltas: list[str] = []
    with client.chat.completions.stream(
        model=model, messages=ASK_FORECAST, tools=[FORECAST_TOOL]
    ) as stream:
        for event in stream:
            if event.type == "tool_calls.function.arguments.delta":
                deltas.append(event.arguments_delta)
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    calls: Any = final.choices[0].message.tool_calls or []
    assert len(calls) == 1 and calls[0].function.name == FORECAST["name"]
    assert json.loads(calls[0].function.arguments) == FORECAST_TYPED
    assert "".join(deltas) == calls[0].function.arguments
    _enough_deltas(family, deltas)


@pytest.mark.parametrize("family", names)
def test_openai_responses_get_arguments_typed_and_streamed(url: str, family: str) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    model = f"family-{family}"
    tool: Any = {"type": "function", **FORECAST}
    ask = "The forecast for Paris, please."
    reply = client.responses.create(model=model, input=ask, tools=[tool])
    whole = [item for item in reply.output if item.type == "function_call"]
    assert len(whole) == 1 and json.loads(whole[0].arguments) == FORECAST_TYPED
    deltas: list[str] = []
    done: list[str] = []
    for event in client.responses.create(model=model, input=ask, tools=[tool], stream=True):
        if event.type == "response.function_call_arguments.delta":
            deltas.append(event.delta)
        elif event.type == "response.function_call_arguments.done":
            done.append(event.arguments)
    assert len(done) == 1 and "".join(deltas) == done[0]
    assert json.loads(done[0]) == FORECAST_TYPED
    _enough_deltas(family, deltas)


@pytest.mark.parametrize("family", names)
def test_anthropic_gets_input_typed_and_streamed(url: str, family: str) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    model = f"family-{family}"
    tool: Any = {
        "name": FORECAST["name"],
        "description": FORECAST["description"],
        "input_schema": FORECAST["parameters"],
    }
    ask: Any = [{"role": "user", "content": "The forecast for Paris, please."}]
    reply = client.messages.create(model=model, max_tokens=1024, messages=ask, tools=[tool])
    uses = [b for b in reply.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].input == FORECAST_TYPED
    # anthropic's stream helper assembles the input_json_delta events into the block's input.
    deltas: list[str] = []
    with client.messages.stream(model=model, max_tokens=1024, messages=ask, tools=[tool]) as s:
        for event in s:
            if event.type == "input_json":
                deltas.append(event.partial_json)
        final = s.get_final_message()
    assert final.stop_reason == "tool_use"
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert len(streamed) == 1 and streamed[0].name == FORECAST["name"]
    assert streamed[0].input == FORECAST_TYPED
    assert json.loads("".join(deltas)) == FORECAST_TYPED
    _enough_deltas(family, deltas)


@pytest.mark.parametrize("family", names)
def test_ollama_gets_arguments_typed(url: str, family: str) -> None:
    reply = ollama.Client(host=url).chat(
        model=f"family-{family}", messages=ASK_FORECAST, tools=[FORECAST_TOOL], stream=False
    )
    calls = reply.message.tool_calls or []
    assert len(calls) == 1 and dict(calls[0].function.arguments) == FORECAST_TYPED


def _tokens_until(node: tuple[str, FamilyEngine], family: str, marker: str) -> int:
    """How many tokens the scripted forecast call has before `marker` (to cut it there)."""
    spec = next(f for f in FAMILIES if f.name == family)
    tokenizer = load_tokenizer(node[1].paths[family])
    written = spec.call(FORECAST["name"], FORECAST_WRITTEN)
    return len(tokenizer.encode(written[: written.index(marker)], add_special_tokens=False))


@pytest.mark.parametrize("family", sorted(STREAMED))
def test_a_call_cut_off_by_max_tokens_is_text_and_streams_end_cleanly(
    node: tuple[str, FamilyEngine], family: str
) -> None:
    url, model = node[0], f"family-{family}"
    cut = _tokens_until(node, family, "umbrella")  # inside the note, mid-string
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model=model, messages=ASK_FORECAST, tools=[FORECAST_TOOL], max_tokens=cut
    )
    assert reply.choices[0].finish_reason == "length"
    assert not reply.choices[0].message.tool_calls  # not a call: what the model said, as text
    assert "Bring an" in (reply.choices[0].message.content or "")
    # Streamed, the call's first fragments went out (a preview), then the stream ended.
    finish, arguments = None, ""
    for chunk in client.chat.completions.create(
        model=model, messages=ASK_FORECAST, tools=[FORECAST_TOOL], max_tokens=cut, stream=True
    ):
        finish = chunk.choices[0].finish_reason or finish
        for delta in chunk.choices[0].delta.tool_calls or []:
            arguments += (delta.function.arguments or "") if delta.function else ""
    assert finish == "length" and arguments.startswith('{"city": "Paris"')
    ask = "The forecast for Paris, please."
    tools: Any = [{"type": "function", **FORECAST}]
    response = client.responses.create(model=model, input=ask, tools=tools, max_output_tokens=cut)
    assert response.status == "incomplete"
    assert "function_call" not in [item.type for item in response.output]
    assert "Bring an" in response.output_text
    # anthropic's stream helper reads the unfinished tool_use input without failing.
    claude = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    tool: Any = {"name": FORECAST["name"], "input_schema": FORECAST["parameters"]}
    with claude.messages.stream(
        model=model, max_tokens=cut, messages=ASK_FORECAST, tools=[tool]
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens"


def test_reasoning_effort_reaches_the_harmony_system_message(
    node: tuple[str, FamilyEngine],
) -> None:
    url, engine = node
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    ask: Any = [{"role": "user", "content": ASK}]
    chat = client.chat.completions.create(
        model="family-harmony", messages=ask, reasoning_effort="high"
    )
    assert chat.choices[0].message.content == ANSWER
    assert "Reasoning: high" in engine.prompts[-1]
    reply = client.responses.create(model="family-harmony", input=ASK, reasoning={"effort": "low"})
    assert reply.output_text == ANSWER
    assert "Reasoning: low" in engine.prompts[-1]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="family-harmony",
            messages=ask,
            reasoning_effort="extreme",  # type: ignore[arg-type]
        )


V31 = "family-deepseek-v3.1"
ASKED: Any = [{"role": "user", "content": ASK}]


def _chat(url: str, **control: Any) -> tuple[str, str]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model=V31, messages=ASKED, **control)
    message = reply.choices[0].message
    return (message.model_extra or {}).get("reasoning_content") or "", message.content or ""


def _responses(url: str, effort: Any) -> tuple[str, str]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    reply = client.responses.create(model=V31, input=ASK, reasoning={"effort": effort})
    thought = "".join(
        part.text
        for item in reply.output
        if item.type == "reasoning"
        for part in item.content or []
    )
    return thought, reply.output_text


def _claude(url: str, thinking: Any) -> tuple[str, str]:
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
    reply = client.messages.create(model=V31, max_tokens=2048, messages=ASKED, thinking=thinking)
    thought = "".join(b.thinking for b in reply.content if b.type == "thinking")
    return thought, "".join(b.text for b in reply.content if b.type == "text")


def _ollama(url: str, think: bool) -> tuple[str, str]:
    reply = ollama.Client(host=url).chat(model=V31, messages=ASKED, think=think, stream=False)
    return reply.message.thinking or "", reply.message.content or ""


# Each dialect's thinking control, and whether it turns thinking on (V3.1's default is off).
CONTROLS: dict[str, tuple[Callable[[str], tuple[str, str]], bool]] = {
    "no control": (lambda url: _chat(url), False),
    "openai reasoning_effort high": (lambda url: _chat(url, reasoning_effort="high"), True),
    "openai reasoning_effort none": (lambda url: _chat(url, reasoning_effort="none"), False),
    "openai chat_template_kwargs enable_thinking": (
        lambda url: _chat(url, extra_body={"chat_template_kwargs": {"enable_thinking": True}}),
        True,
    ),
    "openai chat_template_kwargs thinking off": (
        lambda url: _chat(url, extra_body={"chat_template_kwargs": {"thinking": False}}),
        False,
    ),
    "responses reasoning.effort": (lambda url: _responses(url, "medium"), True),
    "claude thinking enabled": (
        lambda url: _claude(url, {"type": "enabled", "budget_tokens": 1024}),
        True,
    ),
    "claude thinking disabled": (lambda url: _claude(url, {"type": "disabled"}), False),
    "ollama think": (lambda url: _ollama(url, True), True),
    "ollama think false": (lambda url: _ollama(url, False), False),
}


@pytest.mark.parametrize("control", CONTROLS)
def test_every_dialects_thinking_control_reaches_a_template_that_names_it_thinking(
    node: tuple[str, FamilyEngine], control: str
) -> None:
    url, engine = node
    ask, thinks = CONTROLS[control]
    thought, text = ask(url)
    assert engine.prompts[-1].endswith("<think>" if thinks else "</think>")
    # Started inside the think block, the parser reads the model's first words as thinking.
    assert (thought, text) == ((THOUGHT if thinks else ""), ANSWER)
