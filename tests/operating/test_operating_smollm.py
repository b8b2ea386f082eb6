"""Operating a real two-node cluster (two `exo` processes over libp2p, SmolLM2 on the MLX
engine): metrics during traffic, exo's bench route, exact count_tokens, cancel."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exo_core.testing.processes import ExoProcess, exo_processes, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.smollm]

MODEL = "SmolLM2-135M-Instruct"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ExoProcess]]:
    with exo_processes(tmp_path_factory.mktemp("operating"), 2) as nodes:
        try:
            wait_until(joined(nodes), timeout=120)
        except TimeoutError:
            pytest.fail("the exo nodes did not form a cluster:\n" + nodes[-1].log()[-3000:])
        yield nodes


def joined(nodes: list[ExoProcess]) -> Callable[[], bool]:
    return lambda: all(len(n.state()["nodes"]) == 2 and n.get("/healthz")["master"] for n in nodes)


def scrape(node: ExoProcess) -> Samples:
    text = httpx.get(f"{node.url}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= set(ls))


def chat(node: ExoProcess, **extra: Any) -> Any:
    client = openai.OpenAI(base_url=f"{node.url}/v1", api_key="-", timeout=180, max_retries=0)
    return client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name three colours."}],
        temperature=0,
        **extra,
    )


def test_metrics_move_during_traffic_on_two_nodes(nodes: list[ExoProcess]) -> None:
    master = next(n for n in nodes if total(scrape(n), "exo_is_master") == 1)
    follower = next(n for n in nodes if n is not master)
    chat(follower, max_tokens=4)  # places and loads the model
    before = {id(n): scrape(n) for n in nodes}
    errors: list[BaseException] = []

    def traffic() -> None:
        try:
            for _ in range(3):
                chat(follower, max_tokens=8)
        except BaseException as e:
            errors.append(e)

    worker = threading.Thread(target=traffic)
    worker.start()
    during = scrape(follower)  # scraping while requests run answers too
    worker.join(timeout=180)
    assert not errors, errors
    assert total(during, "exo_peers_connected") == 1
    after = {id(n): scrape(n) for n in nodes}

    def moved(node: ExoProcess, name: str, **labels: str) -> float:
        return total(after[id(node)], name, **labels) - total(before[id(node)], name, **labels)

    route = {"dialect": "openai", "route": "/v1/chat/completions", "status": "200"}
    assert moved(follower, "exo_http_requests_total", **route) == 3
    assert moved(master, "exo_http_requests_total", **route) == 0
    assert moved(follower, "exo_generation_tokens_total", model=MODEL) > 0
    assert moved(follower, "exo_prompt_tokens_total", model=MODEL) > 0
    assert moved(follower, "exo_time_to_first_token_seconds_count", model=MODEL) == 3
    assert moved(follower, "exo_time_per_output_token_seconds_count", model=MODEL) == 3
    assert moved(follower, "exo_command_duration_seconds_count", command="SubmitTask") == 3
    # The master reports the cluster: both nodes' memory, every runner.
    on_master = after[id(master)]
    reported = {dict(ls)["node"] for (n, ls) in on_master if n == "exo_node_memory_total_bytes"}
    assert len(reported) == 2
    assert total(on_master, "exo_cluster_nodes") == 2
    assert total(on_master, "exo_runners", model=MODEL, status="ready") >= 1
    assert total(on_master, "exo_elections_total") >= 1
    # A follower reports only itself.
    mine = {dict(ls)["node"] for (n, ls) in after[id(follower)] if n == "exo_node_cpu_count"}
    assert len(mine) <= 1


def test_bench_route_measures_exactly_max_tokens(nodes: list[ExoProcess]) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say yes."}],
        "max_tokens": 48,
        "temperature": 0,
    }
    url = f"{nodes[0].url}/bench/chat/completions"
    answer = httpx.post(url, json=body, timeout=180).json()
    stats = answer["generation_stats"]
    # "Say yes." would end long before 48 tokens: end-of-sequence is banned.
    assert answer["usage"]["completion_tokens"] == stats["generation_tokens"] == 48
    assert answer["choices"][0]["finish_reason"] == "length"
    assert stats["prompt_tokens"] == answer["usage"]["prompt_tokens"] > 0
    assert stats["prompt_tps"] > 0 and stats["generation_tps"] > 0
    assert stats["time_to_first_token_s"] > 0 and stats["peak_memory_bytes"] > 0
    assert stats["prefix_cache_hit"] == "none" and stats["cached_tokens"] == 0
    # Off unless asked: the same prompt again still misses; asked twice, it hits.
    assert httpx.post(url, json=body, timeout=180).json()["generation_stats"]["cached_tokens"] == 0
    cached = {**body, "use_prefix_cache": True}
    httpx.post(url, json=cached, timeout=180)
    again = httpx.post(url, json=cached, timeout=180).json()["generation_stats"]
    assert again["prefix_cache_hit"] in ("exact", "partial") and again["cached_tokens"] > 0


def test_count_tokens_is_the_engines_count(nodes: list[ExoProcess]) -> None:
    client = anthropic.Anthropic(base_url=nodes[1].url, api_key="-", timeout=180, max_retries=0)
    conversation: dict[str, Any] = {
        "model": MODEL,
        "system": "You are terse.",
        "messages": [
            {"role": "user", "content": "Hello there"},
            {"role": "assistant", "content": "Hi."},
            {"role": "user", "content": "What is 2+2? Answer with a digit."},
        ],
    }
    counted = client.messages.count_tokens(**conversation)
    reply = client.messages.create(max_tokens=2, **conversation)
    # Anthropic's input_tokens leaves out what was read from the prompt cache (a prefix an
    # earlier request of this module stored): count_tokens counts the whole prompt.
    read = reply.usage.cache_read_input_tokens or 0
    assert counted.input_tokens == reply.usage.input_tokens + read > 20


def test_cancel_from_another_connection(nodes: list[ExoProcess]) -> None:
    client = openai.OpenAI(base_url=f"{nodes[0].url}/v1", api_key="-", timeout=180)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a very long story about a dragon."}],
        max_tokens=2000,
        stream=True,
    )
    first = next(iter(stream))
    assert httpx.post(f"{nodes[1].url}/v1/cancel/nope", timeout=10).status_code == 404
    # The other node, not the one streaming, cancels it by the id the response carries.
    cancelled = httpx.post(f"{nodes[1].url}/v1/cancel/{first.id}", timeout=10)
    assert cancelled.status_code == 200, cancelled.text
    with pytest.raises(openai.APIError):
        for _ in stream:
            pass
    wait_until(lambda: not nodes[0].state()["tasks"] and not nodes[1].state()["tasks"], timeout=10)
    gone = httpx.post(f"{nodes[0].url}/v1/cancel/{first.id}", timeout=10)
    assert gone.status_code == 404


def test_claude_code_turns_reuse_the_prefix_cache(nodes: list[ExoProcess]) -> None:
    """Claude Code moves cache_control to the newest message and varies metadata each turn;
    neither reaches the prompt, so the second turn reuses the first one's prefix."""
    client = anthropic.Anthropic(base_url=nodes[0].url, api_key="-", timeout=180, max_retries=0)
    system: Any = [
        {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}
    ]
    first_user: Any = {
        "role": "user",
        "content": [
            {"type": "text", "text": "List three fruits.", "cache_control": {"type": "ephemeral"}}
        ],
    }
    first = client.messages.create(
        model=MODEL, max_tokens=12, system=system, messages=[first_user],
        metadata={"user_id": "session-1"},
    )  # fmt: skip
    answer = "".join(b.text for b in first.content if b.type == "text")
    second = client.messages.create(
        model=MODEL, max_tokens=4, system=system,
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "List three fruits."}]},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": [{"type": "text", "text": "And one vegetable.", "cache_control": {"type": "ephemeral"}}]},
        ],
        metadata={"user_id": "session-2"},
    )  # fmt: skip
    assert (second.usage.cache_read_input_tokens or 0) >= first.usage.input_tokens - 1
