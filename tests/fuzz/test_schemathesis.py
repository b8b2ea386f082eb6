"""Schema-driven fuzzing of the whole HTTP API with schemathesis, against a running node (the
scripted engine, the three dialect plugins and the downloader, online against a stand-in hub,
so that the hub routes run their real code paths and never call the real hub). Every operation
of the node's own OpenAPI schema gets valid and invalid requests: Ollama's aliases under
`/ollama/` too, and `/events` (a stream that never ends: only its status is read). None may be
answered with a 5xx, and the node must still serve afterwards.

Bounded: `EXAMPLES` cases per operation and mode (fewer for the aliases, the same handlers);
every operation must be reached within `BUDGET_S` (about 100 s on a shared 2-core machine).
The generation routes go first, and valid bodies name the served model so that they reach
validation and generation rather than stop at "unknown model". Hypothesis is derandomized, so
a run is repeatable; `pytest -s` prints the counts.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

import exo_api_claude.plugin
import exo_api_ollama.plugin
import exo_api_openai.plugin
import exo_download_hf.plugin
from exo_core.testing.harness import RunningNode, running_node
from exo_core.testing.scripted_engine import ScriptedEnginePlugin
from exo_download_hf.testing import HubStandIn

pytestmark = pytest.mark.slow

MODEL = "scripted-echo"
EXAMPLES = 40
ALIAS_EXAMPLES = 10
BUDGET_S = 240.0
# Routes whose answer never ends by itself (an event stream): only the status is read.
STREAMS = {("GET", "/events")}
# The same handlers as /api/..., under Ollama's other base URL.
ALIASES = "/ollama/"
FIRST = ("/v1/chat/completions", "/v1/responses", "/v1/messages", "/api/chat", "/api/generate")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    dialects = [exo_api_openai.plugin, exo_api_claude.plugin, exo_api_ollama.plugin]
    plugins = [ScriptedEnginePlugin(), *dialects, exo_download_hf.plugin]
    with pytest.MonkeyPatch.context() as env, HubStandIn() as hub:
        hub.add_repo("org/tiny", {"config.json": b"{}", "model.safetensors": b"x"})
        env.setenv("HF_ENDPOINT", hub.url)
        env.delenv("HF_TOKEN", raising=False)
        with running_node(tmp_path_factory.mktemp("fuzz"), plugins) as running:
            yield running


def _served_model(case: Any) -> Any:
    """A valid body names the model the node serves, so it goes past the model lookup."""
    if isinstance(case.body, dict) and "model" in case.body:
        case.body["model"] = MODEL
    return case


def _can_be_invalid(operation: Any) -> bool:
    """Whether a request can break the schema: a body or a query. (Every string is a valid
    path parameter, so an operation with only those has no invalid request.)"""
    if operation.get_request_payload_content_types():
        return True
    return any(p.location != "path" for p in operation.iter_parameters())


def _status(case: Any, url: str) -> tuple[int, str]:
    """Send the case; a stream's status is read and the stream closed."""
    if (case.method.upper(), case.operation.path) in STREAMS:
        kwargs = case.as_transport_kwargs(base_url=url)
        with httpx.stream(
            kwargs["method"], kwargs["url"], params=kwargs.get("params"), timeout=30
        ) as response:
            return response.status_code, ""
    response = case.call(base_url=url, timeout=30)
    return response.status_code, response.text[:500]


def fuzz_operation(operation: Any, mode: GenerationMode, url: str, tally: Counter[str]) -> None:
    strategy = operation.as_strategy(generation_mode=mode)
    if mode == GenerationMode.POSITIVE:
        strategy = strategy.map(_served_model)

    @settings(
        max_examples=ALIAS_EXAMPLES if operation.path.startswith(ALIASES) else EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def one(case: Any) -> None:
        status, text = _status(case, url)
        tally["cases"] += 1
        tally[f"{status // 100}xx"] += 1
        assert status < 500, (
            f"{case.method} {case.formatted_path} -> {status}: {text}\n"
            f"reproduce with: {case.as_curl_command()}"
        )

    try:
        one()
    except Unsatisfiable:
        tally["unsatisfiable"] += 1


def test_no_operation_answers_a_5xx_and_the_node_still_serves(node: RunningNode) -> None:
    schema = schemathesis.openapi.from_url(f"{node.url}/schema/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    operations.sort(key=lambda op: (op.path not in FIRST, op.path.startswith(ALIASES)))
    tally: Counter[str] = Counter()
    skipped: list[str] = []
    started = time.monotonic()
    for operation in operations:
        modes = [GenerationMode.POSITIVE]
        if _can_be_invalid(operation):
            modes.append(GenerationMode.NEGATIVE)
        for mode in modes:
            if time.monotonic() - started > BUDGET_S:
                skipped.append(f"{operation.method.upper()} {operation.path} ({mode.value})")
                continue
            tally["operations"] += mode == GenerationMode.POSITIVE
            fuzz_operation(operation, mode, node.url, tally)
    took = time.monotonic() - started
    print(
        f"schemathesis: {tally['cases']} cases over {tally['operations']} operations in "
        f"{took:.0f} s: {dict(sorted(tally.items()))}; skipped for time: {skipped or 'none'}"
    )
    assert tally["5xx"] == 0
    assert skipped == [], "every operation of the schema is fuzzed"
    assert tally["operations"] == len(operations) and tally["cases"] >= 500
    assert httpx.get(f"{node.url}/healthz").status_code == 200
    reply = httpx.post(
        f"{node.url}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "still here"}]},
        timeout=30,
    )
    assert reply.status_code == 200
    assert reply.json()["choices"][0]["message"]["content"] == "echo: still here"
