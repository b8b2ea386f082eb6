"""Schema-driven fuzzing of the whole HTTP API with schemathesis, against a running node (the
scripted engine, the three dialect plugins and the downloader, offline so it never calls the
hub). Every operation of the node's own OpenAPI schema gets valid and invalid requests; none
may be answered with a 5xx, and the node must still serve afterwards.

Bounded: `EXAMPLES` cases per operation and mode, `BUDGET_S` seconds in all (operations left
when the budget is spent are skipped and reported). The generation routes go first, and valid
bodies name the served model so that they reach validation and generation rather than stop at
"unknown model". Hypothesis is derandomized, so a run is repeatable; `pytest -s` prints the
counts.
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

pytestmark = pytest.mark.slow

MODEL = "scripted-echo"
EXAMPLES = 15
BUDGET_S = 100.0
# Routes whose answer never ends by itself (an event stream).
SKIPPED = {("GET", "/events")}
# The same handlers as /api/..., under Ollama's other base URL.
ALIASES = "/ollama/"
FIRST = ("/v1/chat/completions", "/v1/responses", "/v1/messages", "/api/chat", "/api/generate")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    dialects = [exo_api_openai.plugin, exo_api_claude.plugin, exo_api_ollama.plugin]
    plugins = [ScriptedEnginePlugin(), *dialects, exo_download_hf.plugin]
    with running_node(tmp_path_factory.mktemp("fuzz"), plugins, offline=True) as running:
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


def fuzz_operation(operation: Any, mode: GenerationMode, url: str, tally: Counter[str]) -> None:
    strategy = operation.as_strategy(generation_mode=mode)
    if mode == GenerationMode.POSITIVE:
        strategy = strategy.map(_served_model)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def one(case: Any) -> None:
        response = case.call(base_url=url, timeout=30)
        tally["cases"] += 1
        tally[f"{response.status_code // 100}xx"] += 1
        assert response.status_code < 500, (
            f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:500]}\n"
            f"reproduce with: {case.as_curl_command()}"
        )

    try:
        one()
    except Unsatisfiable:
        tally["unsatisfiable"] += 1


def test_no_operation_answers_a_5xx_and_the_node_still_serves(node: RunningNode) -> None:
    schema = schemathesis.openapi.from_url(f"{node.url}/schema/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    operations = [
        op
        for op in operations
        if (op.method.upper(), op.path) not in SKIPPED and not op.path.startswith(ALIASES)
    ]
    operations.sort(key=lambda op: op.path not in FIRST)
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
    assert tally["cases"] >= 100
    assert httpx.get(f"{node.url}/healthz").status_code == 200
    reply = httpx.post(
        f"{node.url}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "still here"}]},
        timeout=30,
    )
    assert reply.status_code == 200
    assert reply.json()["choices"][0]["message"]["content"] == "echo: still here"
