"""Prometheus metrics for one node (`GET /metrics`), built with `prometheus_client`.

Each node has its own registry (tests run several nodes in one process). Two kinds of figures:

- counted as they happen: HTTP requests (an ASGI middleware, so every dialect's routes count),
  generations with their tokens, time to first token and time per output token (observed where
  the API node streams a generation), command round trips to the master, this node's election
  campaigns; and, counted from the replicated log as it is applied (`LogCounters`), terms
  begun, runner failures and restarts, and download failures;
- read from the replicated state at scrape time (`StateCollector`): runners, tasks, instances,
  downloads, the event log, peers, and node resources. A node reports itself; the master also
  reports every node of the cluster, so scraping the master alone shows the whole cluster.

Label values are bounded: model ids (the cluster's cards), node ids (its members), route
templates (never raw paths), statuses and finish reasons. Never a prompt, a task or a request id.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from litestar.handlers import HTTPRouteHandler
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from exo_core.events import DownloadProgressed, IndexedEvent, MasterElected, RunnerStatusChanged
from exo_core.generation import FinishReason, Usage
from exo_core.ids import ModelId, NodeId, RunnerId
from exo_core.state import DownloadStatus, RunnerStatus, State

if TYPE_CHECKING:
    from litestar.types import ASGIApp, Message, Receive, Scope, Send

    from exo_core.replica import Replica
    from exo_core.transport.base import Transport


class MeasuredNode(Protocol):
    """What the metrics read of their node at each scrape (the node implements it)."""

    @property
    def node_id(self) -> NodeId: ...
    @property
    def state(self) -> State: ...
    @property
    def replica(self) -> Replica: ...
    @property
    def transport(self) -> Transport: ...
    @property
    def started_at(self) -> float: ...
    @property
    def master(self) -> object | None:
        """This node's master role while it leads, else None."""
        ...


__all__ = [
    "CONTENT_TYPE_LATEST",
    "LogCounters",
    "NodeMetrics",
    "StateCollector",
    "metrics_middleware",
]

# Latencies of a token: from under a millisecond (tiny models) to seconds (huge ones on a CPU).
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# Time to first token includes prefill and, for a cold model, placing and loading it.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)


class NodeMetrics:
    """The counters and histograms a node updates as things happen, and its registry."""

    def __init__(self, node: MeasuredNode) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "exo_http_requests",
            "HTTP requests answered, by API dialect, route template, method and status.",
            ["dialect", "route", "method", "status"],
            registry=r,
        )
        self.request_duration = Histogram(
            "exo_http_request_duration_seconds",
            "Time from a request's arrival to the last byte of its answer (streams included).",
            ["dialect", "route"],
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.generations = Counter(
            "exo_generations",
            "Generations this node's API streamed to an end, by model and finish reason.",
            ["model", "finish_reason"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "exo_prompt_tokens", "Prompt tokens of finished generations.", ["model"], registry=r
        )
        self.generation_tokens = Counter(
            "exo_generation_tokens", "Tokens generated.", ["model"], registry=r
        )
        self.prefix_cache_hits = Counter(
            "exo_prefix_cache_hits",
            "Generations whose prompt was partly or wholly found in a runner's prefix cache.",
            ["model"],
            registry=r,
        )
        self.prefix_cache_tokens = Counter(
            "exo_prefix_cache_tokens",
            "Prompt tokens served from a runner's prefix cache instead of prefilled.",
            ["model"],
            registry=r,
        )
        self.ttft = Histogram(
            "exo_time_to_first_token_seconds",
            "From submitting a generation to its first output, as the API node sees it.",
            ["model"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "exo_time_per_output_token_seconds",
            "Mean time between output tokens after the first, per generation.",
            ["model"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.command_duration = Histogram(
            "exo_command_duration_seconds",
            "Round trip of a command to the master until its events are committed.",
            ["command"],
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.elections = Counter(
            "exo_elections",
            "Terms begun (masters elected), as seen in the replicated log.",
            registry=r,
        )
        self.campaigns = Counter(
            "exo_election_campaigns",
            "Times this node ran for master, by outcome (won: it became master of a term).",
            ["outcome"],
            registry=r,
        )
        self.log_counters = LogCounters()
        ProcessCollector(registry=r)
        r.register(StateCollector(node, self.log_counters))
        node.replica.listen(self._observe)

    def _observe(self, event: IndexedEvent, state: State) -> None:
        if isinstance(event.event, MasterElected):
            self.elections.inc()
        self.log_counters.observe(event, state)

    def observe_generation(
        self,
        model: str,
        reason: FinishReason,
        usage: Usage,
        *,
        first_output_s: float | None,
        last_output_s: float | None,
    ) -> None:
        """Account for one generation that ended (`*_output_s`: seconds since submission)."""
        self.generations.labels(model, reason.value).inc()
        self.prompt_tokens.labels(model).inc(usage.prompt_tokens)
        self.generation_tokens.labels(model).inc(usage.completion_tokens)
        if usage.cached_tokens > 0:
            self.prefix_cache_hits.labels(model).inc()
            self.prefix_cache_tokens.labels(model).inc(usage.cached_tokens)
        if first_output_s is not None:
            self.ttft.labels(model).observe(first_output_s)
            if last_output_s is not None and usage.completion_tokens > 1:
                per_token = (last_output_s - first_output_s) / (usage.completion_tokens - 1)
                self.tpot.labels(model).observe(max(0.0, per_token))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


_NOT_RESTARTED = (RunnerStatus.FAILED, RunnerStatus.STOPPED)


class LogCounters:
    """Counters of what the replicated log says happened, by node and model: runners that
    failed, runners restarted after a failure, downloads that failed. Each counts transitions
    (a status repeated in a later event is not counted again), so the figures only grow."""

    def __init__(self) -> None:
        self.runner_failures: dict[tuple[NodeId, str], int] = {}
        self.runner_restarts: dict[tuple[NodeId, str], int] = {}
        self.download_failures: dict[tuple[NodeId, str], int] = {}
        self._runner_status: dict[RunnerId, RunnerStatus] = {}
        self._download_status: dict[tuple[NodeId, ModelId], DownloadStatus] = {}

    def observe(self, event: IndexedEvent, state: State) -> None:
        match event.event:
            case RunnerStatusChanged(runner=runner):
                before = self._runner_status.get(runner.runner_id)
                self._runner_status[runner.runner_id] = runner.status
                instance = state.instances.get(runner.instance_id)
                key = (runner.node_id, str(instance.model_id) if instance else "")
                if runner.status == RunnerStatus.FAILED and before != RunnerStatus.FAILED:
                    _bump(self.runner_failures, key)
                elif before == RunnerStatus.FAILED and runner.status not in _NOT_RESTARTED:
                    _bump(self.runner_restarts, key)
            case DownloadProgressed(progress=progress):
                where = (progress.node_id, progress.model_id)
                before = self._download_status.get(where)
                self._download_status[where] = progress.status
                if progress.status == DownloadStatus.FAILED and before != DownloadStatus.FAILED:
                    _bump(self.download_failures, (progress.node_id, str(progress.model_id)))
            case _:
                pass

    def families(self, nodes: set[NodeId]) -> Iterator[CounterMetricFamily]:
        """The counters of `nodes` (this node, or every node on the master)."""
        labels = ["node", "model"]
        runner_failures = CounterMetricFamily(
            "exo_runner_failures", "Runners that failed, by node and model.", labels=labels
        )
        restarts = CounterMetricFamily(
            "exo_runner_restarts",
            "Runners started again after a failure, by node and model.",
            labels=labels,
        )
        download_failures = CounterMetricFamily(
            "exo_download_failures", "Model downloads that failed, by node.", labels=labels
        )
        for family, counts in (
            (runner_failures, self.runner_failures),
            (restarts, self.runner_restarts),
            (download_failures, self.download_failures),
        ):
            for (node_id, model), n in sorted(counts.items()):
                if node_id in nodes:
                    family.add_metric([node_id, model], float(n))
            yield family


def _bump(counts: dict[tuple[NodeId, str], int], key: tuple[NodeId, str]) -> None:
    counts[key] = counts.get(key, 0) + 1


class StateCollector(Collector):
    """Figures read from the replicated state (and the transport) at each scrape."""

    def __init__(self, node: MeasuredNode, log_counters: LogCounters) -> None:
        self._node = node
        self._log_counters = log_counters

    def collect(self) -> Iterable[Any]:
        node = self._node
        state = node.state
        me = node.node_id
        is_master = node.master is not None
        # This node alone, or the whole cluster when this node is the master.
        nodes: set[NodeId] = set(state.nodes) | {me} if is_master else {me}
        yield from _cluster(node, state, is_master)
        yield from _eventlog(node, state)
        yield from _resources(state, nodes)
        yield from _runners(state, nodes)
        yield from _tasks(state, nodes)
        yield from _downloads(state, nodes)
        yield from self._log_counters.families(nodes)


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels or [])


def _cluster(node: MeasuredNode, state: State, is_master: bool) -> Iterator[GaugeMetricFamily]:
    master = _gauge("exo_is_master", "1 when this node is the master.")
    master.add_metric([], 1.0 if is_master else 0.0)
    term = _gauge("exo_election_term", "The term of the master this node follows.")
    term.add_metric([], float(state.master.term if state.master else 0))
    peers = _gauge("exo_peers_connected", "Peers this node's transport is connected to.")
    peers.add_metric([], float(len(node.transport.peers())))
    members = _gauge("exo_cluster_nodes", "Nodes in the replicated cluster state.")
    members.add_metric([], float(len(state.nodes)))
    instances = _gauge(
        "exo_instances", "Model instances placed in the cluster.", ["model", "sharding"]
    )
    counts: dict[tuple[str, str], int] = {}
    for instance in state.instances.values():
        key = (str(instance.model_id), instance.sharding)
        counts[key] = counts.get(key, 0) + 1
    for key, n in sorted(counts.items()):
        instances.add_metric(list(key), float(n))
    yield from (master, term, peers, members, instances)


def _eventlog(node: MeasuredNode, state: State) -> Iterator[GaugeMetricFamily]:
    index = _gauge("exo_eventlog_last_index", "Index of the last event applied on this node.")
    index.add_metric([], float(state.last_index))
    size = _gauge("exo_eventlog_size_bytes", "Size of this node's event log file.")
    try:
        size.add_metric([], float(node.replica.log.path.stat().st_size))
    except OSError:
        size.add_metric([], 0.0)
    uptime = _gauge("exo_node_uptime_seconds", "Seconds since this node started.")
    uptime.add_metric([], time.time() - node.started_at)
    yield from (index, size, uptime)


def _resources(state: State, nodes: set[NodeId]) -> Iterator[GaugeMetricFamily]:
    total = _gauge("exo_node_memory_total_bytes", "A node's memory.", ["node"])
    available = _gauge("exo_node_memory_available_bytes", "A node's available memory.", ["node"])
    cpus = _gauge("exo_node_cpu_count", "A node's CPU cores.", ["node"])
    cpu = _gauge("exo_node_cpu_percent", "A node's CPU use, in percent of all cores.", ["node"])
    disk = _gauge("exo_node_disk_available_bytes", "Free disk under a node's data.", ["node"])
    for node_id in sorted(nodes):
        info = state.nodes.get(node_id)
        if info is None:
            continue  # no telemetry yet
        res = info.resources
        total.add_metric([node_id], float(res.memory_total))
        available.add_metric([node_id], float(res.memory_available))
        cpus.add_metric([node_id], float(res.cpu_count))
        cpu.add_metric([node_id], res.cpu_percent)
        disk.add_metric([node_id], float(res.disk_available))
    yield from (total, available, cpus, cpu, disk)


def _runners(state: State, nodes: set[NodeId]) -> Iterator[GaugeMetricFamily]:
    runners = _gauge(
        "exo_runners", "Runners by node, model and status.", ["node", "model", "status"]
    )
    failures = _gauge(
        "exo_runner_consecutive_failures",
        "Failures in a row of a node's runners for a model (the restart back-off's count).",
        ["node", "model"],
    )
    memory = _gauge(
        "exo_runner_memory_bytes",
        "Resident memory of a node's runner processes for a model (node telemetry).",
        ["node", "model"],
    )
    counts: dict[tuple[str, str, str], int] = {}
    failed: dict[tuple[str, str], int] = {}
    resident: dict[tuple[str, str], int] = {}
    for runner_id, runner in state.runners.items():
        if runner.node_id not in nodes:
            continue
        instance = state.instances.get(runner.instance_id)
        model = str(instance.model_id) if instance else ""
        key = (str(runner.node_id), model, runner.status.value)
        counts[key] = counts.get(key, 0) + 1
        pair = (str(runner.node_id), model)
        failed[pair] = failed.get(pair, 0) + runner.failures
        info = state.nodes.get(runner.node_id)
        rss = info.resources.runner_memory.get(runner_id) if info else None
        if rss is not None:
            resident[pair] = resident.get(pair, 0) + rss
    for key, n in sorted(counts.items()):
        runners.add_metric(list(key), float(n))
    for pair, n in sorted(failed.items()):
        failures.add_metric(list(pair), float(n))
    for pair, n in sorted(resident.items()):
        memory.add_metric(list(pair), float(n))
    yield from (runners, failures, memory)


def _tasks(state: State, nodes: set[NodeId]) -> Iterator[GaugeMetricFamily]:
    """Sequences per serving node (the instance's rank 0): running, and waiting to start."""
    tasks = _gauge(
        "exo_sequences",
        "Generations in the cluster by serving node, model and status.",
        ["node", "model", "status"],
    )
    counts: dict[tuple[str, str, str], int] = {}
    for task in state.tasks.values():
        instance = state.instances.get(task.instance_id)
        if instance is None or instance.leader.node_id not in nodes:
            continue
        status = "running" if task.status.value == "running" else "waiting"
        key = (str(instance.leader.node_id), str(task.model_id), status)
        counts[key] = counts.get(key, 0) + 1
    for key, n in sorted(counts.items()):
        tasks.add_metric(list(key), float(n))
    yield tasks


def _downloads(state: State, nodes: set[NodeId]) -> Iterator[GaugeMetricFamily]:
    done = _gauge("exo_download_bytes", "Bytes of a model on a node.", ["node", "model"])
    total = _gauge("exo_download_size_bytes", "Full size of a model's files.", ["node", "model"])
    speed = _gauge(
        "exo_download_speed_bytes_per_second", "Current download speed.", ["node", "model"]
    )
    status = _gauge(
        "exo_downloads",
        "Model downloads by node and status (failed: failures).",
        ["node", "status"],
    )
    counts: dict[tuple[str, str], int] = {}
    for node_id, per_model in sorted(state.downloads.items()):
        if node_id not in nodes:
            continue
        for model_id, progress in sorted(per_model.items()):
            labels = [str(node_id), str(model_id)]
            done.add_metric(labels, float(progress.downloaded_bytes))
            total.add_metric(labels, float(progress.total_bytes))
            speed.add_metric(labels, progress.speed_bytes_per_s)
            key = (str(node_id), progress.status.value)
            counts[key] = counts.get(key, 0) + 1
    for key, n in sorted(counts.items()):
        status.add_metric(list(key), float(n))
    yield from (done, total, speed, status)


# -- HTTP request counting -------------------------------------------------------------------


def _dialect(scope: Scope) -> str:
    """The API a route belongs to: its first OpenAPI tag ("openai", "anthropic", "native"...)."""
    handler = scope.get("route_handler")
    tags = handler.resolve_tags() if isinstance(handler, HTTPRouteHandler) else []
    return tags[0] if tags else "other"


def metrics_middleware(metrics: NodeMetrics) -> Any:
    """An ASGI middleware factory that counts every HTTP request by its route *template*."""

    def factory(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            started = time.perf_counter()
            status = 500

            async def counting_send(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                await send(message)

            try:
                await app(scope, receive, counting_send)
            finally:
                dialect = _dialect(scope)
                route = str(scope.get("path_template") or "unmatched")
                method = str(scope.get("method", ""))
                metrics.requests.labels(dialect, route, method, str(status)).inc()
                metrics.request_duration.labels(dialect, route).observe(
                    time.perf_counter() - started
                )

        return middleware

    return factory
