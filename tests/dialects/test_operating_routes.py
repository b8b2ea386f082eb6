"""Operating routes on a real node (scripted engine): `/metrics` during traffic and its
counters, and `POST /v1/cancel/{id}` from a second connection."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from exo_api_openai.chat_answer import ChatStream
from exo_core.events import DownloadProgressed, IndexedEvent, RunnerStatusChanged
from exo_core.generation import KeepAliveChunk
from exo_core.ids import InstanceId, ModelId, NodeId, RunnerId, TaskId
from exo_core.metrics import LogCounters
from exo_core.state import DownloadProgress, DownloadStatus, RunnerInfo, RunnerStatus, State
from exo_core.testing.harness import running_node
from exo_core.testing.scripted_engine import ScriptedEnginePlugin
from exo_core.testing.waiting import wait_until

from .support import Cluster


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a node's /metrics, parsed by prometheus_client's own parser."""
    response = httpx.get(f"{url}/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def total(samples: dict[tuple[str, Any], float], name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= set(ls))


def test_runner_failures_and_restarts_are_counted(tmp_path: Path) -> None:
    """A runner that fails to load is restarted (after a back-off): both are monotonic
    counters, beside the gauge of failures in a row; a one-node cluster won its campaign."""
    with running_node(tmp_path, [ScriptedEnginePlugin(fail_load=True)], dialects=False) as node:
        placed = httpx.post(f"{node.url}/instance", json={"model_id": "scripted-echo"}, timeout=10)
        assert placed.status_code == 201, placed.text
        restarted = lambda: total(scrape(node.url), "exo_runner_restarts_total") >= 1  # noqa: E731
        wait_until(restarted, timeout=60, interval=0.02)
        after = scrape(node.url)
    assert total(after, "exo_runner_failures_total", model="scripted-echo") >= 1
    assert total(after, "exo_runner_restarts_total", model="scripted-echo") >= 1
    assert total(after, "exo_election_campaigns_total", outcome="won") >= 1
    assert total(after, "exo_elections_total") >= 1


def test_log_counters_count_transitions_only() -> None:
    counters = LogCounters()
    node, model = NodeId("node-a"), ModelId("m")

    def runner(status: RunnerStatus) -> IndexedEvent:
        info = RunnerInfo(
            runner_id=RunnerId("r"), instance_id=InstanceId("i"), node_id=node, status=status
        )
        return IndexedEvent(index=0, term=1, event=RunnerStatusChanged(runner=info))

    def download(status: DownloadStatus) -> IndexedEvent:
        progress = DownloadProgress(node_id=node, model_id=model, status=status)
        return IndexedEvent(index=0, term=1, event=DownloadProgressed(progress=progress))

    statuses = ["loading", "failed", "failed", "loading", "ready", "failed", "stopped"]
    for status in statuses:
        counters.observe(runner(RunnerStatus(status)), State())
    for status in ["ongoing", "failed", "failed", "ongoing", "failed"]:
        counters.observe(download(DownloadStatus(status)), State())
    assert counters.runner_failures == {(node, ""): 2}
    assert counters.runner_restarts == {(node, ""): 1}
    assert counters.download_failures == {(node, "m"): 2}
    assert not any(f.samples for f in counters.families({NodeId("elsewhere")}))


def test_metrics_count_requests_tokens_and_latency(cluster: Cluster, oai: openai.OpenAI) -> None:
    before = scrape(cluster.url)
    reply = oai.chat.completions.create(
        model="scripted-echo", messages=[{"role": "user", "content": "one two three"}]
    )
    assert reply.usage is not None
    httpx.post(f"{cluster.url}/v1/messages", json={"model": "nope"}, timeout=10)
    after = scrape(cluster.url)

    def moved(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    route = {"dialect": "openai", "route": "/v1/chat/completions", "status": "200"}
    assert moved("exo_http_requests_total", **route) == 1
    assert moved("exo_http_requests_total", dialect="anthropic", status="400") >= 1
    assert moved("exo_generation_tokens_total", model="scripted-echo") == (
        reply.usage.completion_tokens
    )
    assert moved("exo_prompt_tokens_total", model="scripted-echo") == reply.usage.prompt_tokens
    assert moved("exo_time_to_first_token_seconds_count", model="scripted-echo") == 1
    assert moved("exo_generations_total", model="scripted-echo", finish_reason="stop") == 1
    # State figures: this node is the master of a one-node cluster with a ready runner.
    assert total(after, "exo_is_master") == 1
    assert total(after, "exo_runners", model="scripted-echo", status="ready") >= 1
    assert total(after, "exo_eventlog_last_index") > total(before, "exo_eventlog_last_index")
    assert total(after, "exo_node_memory_total_bytes") > 0
    # No label value is a prompt or an id.
    for _, labels in after:
        for _key, value in labels:
            assert "one two" not in value and not value.startswith(("task", "chatcmpl"))


def test_cancel_from_another_connection_ends_the_stream(slow_cluster: Cluster) -> None:
    client = openai.OpenAI(base_url=f"{slow_cluster.url}/v1", api_key="-", max_retries=0)
    words = " ".join(f"w{i}" for i in range(200))
    stream = client.chat.completions.create(
        model="scripted-echo",
        messages=[{"role": "user", "content": words}],
        stream=True,
    )
    first = next(iter(stream))
    received: list[str] = []
    ended = threading.Event()

    def drain() -> None:
        try:
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    received.append(chunk.choices[0].delta.content)
        except openai.APIError:
            pass  # the stream reports the cancellation in-band
        ended.set()

    threading.Thread(target=drain, daemon=True).start()
    answer = httpx.post(f"{slow_cluster.url}/v1/cancel/{first.id}", timeout=10)
    assert answer.status_code == 200, answer.text
    cancelled_at = len(received)
    # Tokens come every 0.2 s: the stream ends within a step or two of the cancel.
    assert ended.wait(timeout=2), "the stream kept going after the cancel"
    assert len(received) - cancelled_at <= 2
    wait_until(lambda: slow_cluster.tasks() == 0, interval=0.02)
    again = httpx.post(f"{slow_cluster.url}/v1/cancel/{first.id}", timeout=10)
    assert again.status_code == 404
    assert httpx.post(f"{slow_cluster.url}/v1/cancel/nope", timeout=10).status_code == 404


def test_cancel_by_anthropic_message_id(slow_cluster: Cluster) -> None:
    started = time.monotonic()
    with httpx.stream(
        "POST",
        f"{slow_cluster.url}/v1/messages",
        json={
            "model": "scripted-echo",
            "max_tokens": 500,
            "stream": True,
            "messages": [{"role": "user", "content": " ".join(["w"] * 200)}],
        },
        timeout=30,
    ) as response:
        lines = response.iter_lines()
        message_id = ""
        for line in lines:
            if line.startswith("data:") and '"message_start"' in line:
                message_id = line.split('"id":"')[1].split('"')[0]
                break
        assert message_id.startswith("msg_")
        cancel = httpx.post(f"{slow_cluster.url}/v1/cancel/{message_id}", timeout=10)
        assert cancel.status_code == 200
        for _ in lines:
            pass
    assert time.monotonic() - started < 10  # 200 tokens would take 40 s


def test_ollama_alias_paths_answer_like_their_main_path(cluster: Cluster) -> None:
    body = {
        "model": "scripted-echo",
        "messages": [{"role": "user", "content": "hi there"}],
        "stream": False,
    }
    main = httpx.post(f"{cluster.url}/api/chat", json=body, timeout=10).json()
    for alias in ("/ollama/api/api/chat", "/ollama/api/v1/chat"):
        got = httpx.post(f"{cluster.url}{alias}", json=body, timeout=10)
        assert got.status_code == 200, alias
        assert got.json()["message"] == main["message"]
    tags = httpx.get(f"{cluster.url}/api/tags", timeout=10).json()
    for alias in ("/ollama/api/api/tags", "/ollama/api/v1/tags"):
        assert httpx.get(f"{cluster.url}{alias}", timeout=10).json() == tags
    for probe in ("/ollama", "/ollama/", "/ollama/api/version"):
        assert httpx.head(f"{cluster.url}{probe}", timeout=10).status_code == 200, probe
    oai = openai.OpenAI(base_url=f"{cluster.url}/ollama/v1", api_key="-", max_retries=0)
    reply = oai.chat.completions.create(
        model="scripted-echo", messages=[{"role": "user", "content": "hi there"}]
    )
    assert reply.choices[0].message.content == main["message"]["content"]


def test_bench_route_gives_exactly_max_tokens_and_stats(cluster: Cluster) -> None:
    body = {
        "model": "scripted-echo",
        "messages": [{"role": "user", "content": "two words"}],
        "max_tokens": 9,
    }
    got = httpx.post(f"{cluster.url}/bench/chat/completions", json=body, timeout=30)
    assert got.status_code == 200, got.text
    answer = got.json()
    stats = answer["generation_stats"]
    assert answer["usage"]["completion_tokens"] == stats["generation_tokens"] == 9
    assert stats["prompt_tokens"] == answer["usage"]["prompt_tokens"]
    assert stats["prefix_cache_hit"] == "none"
    refused = httpx.post(
        f"{cluster.url}/bench/chat/completions", json={**body, "stream": True}, timeout=30
    )
    assert refused.status_code == 400 and "stream" in refused.json()["error"]["message"]
    no_limit = {k: v for k, v in body.items() if k != "max_tokens"}
    assert (
        httpx.post(f"{cluster.url}/bench/chat/completions", json=no_limit, timeout=30).status_code
        == 400
    )


def test_runner_stages_and_their_timing_are_in_state(cluster: Cluster, oai: openai.OpenAI) -> None:
    oai.chat.completions.create(
        model="scripted-echo", messages=[{"role": "user", "content": "warm"}], max_tokens=2
    )
    runners = httpx.get(f"{cluster.url}/state/runners", timeout=10).json()
    ready = [r for r in runners.values() if r["status"] in ("ready", "running")]
    assert ready
    for runner in ready:
        assert runner["since"] > 0
        assert "warming_up" in runner["stage_seconds"]
        assert all(seconds >= 0 for seconds in runner["stage_seconds"].values())


def test_prefill_progress_is_an_sse_comment_in_chat_streams() -> None:
    stream = ChatStream("m")
    progress = KeepAliveChunk(task_id=TaskId("t"), prefill_processed=2048, prefill_total=6000)
    assert stream.feed(progress) == [": prefill 2048/6000\n\n"]
    assert stream.feed(KeepAliveChunk(task_id=TaskId("t"))) == [": keep-alive\n\n"]


def test_the_openapi_schema_lists_the_operating_routes(cluster: Cluster) -> None:
    schema = httpx.get(f"{cluster.url}/schema/openapi.json", timeout=30)
    assert schema.status_code == 200, schema.text
    paths = schema.json()["paths"]
    for path in ("/metrics", "/v1/cancel/{command_id}", "/bench/chat/completions"):
        assert path in paths
