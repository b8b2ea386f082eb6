"""Jepsen-style histories for real exo nodes: record every write's result, then check the logs.

    history = History(nodes)
    with history.writers(nodes):          # one client per node, writing until the block ends
        net.partition([0], [1, 2]); time.sleep(20); net.heal_all()
    problems = history.check([read_log(n) for n in nodes])

A write is a command that goes through the replicated log and is acknowledged over HTTP:
`DELETE /download/<peer>/<key>` asks the master for a `DeleteDownload` of a model nobody has,
so it changes nothing but leaves a `DownloadDeleted` event naming a unique key. A 202 answer
is an acknowledgement (the master had it on a majority); any other answer, or none, leaves the
write indeterminate. The check: every node holds the same log, every acknowledged key is in it
exactly once, and no key (acknowledged or not) is in it twice."""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import httpx

from exo_core.testing.processes import ExoProcess

KEY_PREFIX = "history/op-"
_KEY = re.compile(r"history/op-\d+\b")


@dataclass
class Op:
    key: str
    node: int
    start: float
    end: float | None = None
    status: int | None = None  # None: no answer (timeout, connection refused)
    detail: str = ""

    @property
    def acknowledged(self) -> bool:
        return self.status == 202


class History:
    def __init__(self, nodes: Sequence[ExoProcess], timeout: float = 45.0) -> None:
        self.node_ids = [n.get("/node_id")["node_id"] for n in nodes]
        self.ops: list[Op] = []
        self.timeout = timeout
        self._lock = threading.Lock()
        self._ids = itertools.count()

    def write(self, node: ExoProcess) -> Op:
        """One write through `node`, recorded whatever its outcome."""
        op = Op(key=f"{KEY_PREFIX}{next(self._ids)}", node=node.index, start=time.monotonic())
        with self._lock:
            self.ops.append(op)
        peer = self.node_ids[(node.index + 1) % len(self.node_ids)]
        try:
            answer = httpx.delete(f"{node.url}/download/{peer}/{op.key}", timeout=self.timeout)
            op.status, op.detail = answer.status_code, answer.text[:300]
        except httpx.HTTPError as e:
            op.detail = repr(e)
        op.end = time.monotonic()
        return op

    @contextlib.contextmanager
    def writers(self, nodes: Sequence[ExoProcess], pause: float = 0.1) -> Iterator[None]:
        """A client per node writing one command after another until the block ends; the
        writes in flight then finish (up to the timeout) before this returns."""
        stop = threading.Event()

        def client(node: ExoProcess) -> None:
            while not stop.is_set():
                self.write(node)
                stop.wait(pause)

        threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in nodes]
        for t in threads:
            t.start()
        try:
            yield
        finally:
            stop.set()
            for t in threads:
                t.join(self.timeout + 5)

    def acknowledged(self) -> list[Op]:
        return [op for op in self.ops if op.acknowledged]

    def summary(self) -> str:
        counts = Counter(
            "ok" if op.acknowledged else ("no answer" if op.status is None else op.status)
            for op in self.ops
        )
        return ", ".join(f"{k}: {v}" for k, v in counts.items())

    def check(self, logs: Sequence[list[str]]) -> list[str]:
        """What is wrong with the final logs (one list of events per node), given this
        history: an empty list when nothing is."""
        problems = [_difference(0, logs[0], i, log) for i, log in enumerate(logs) if log != logs[0]]
        for i, log in enumerate(logs):
            found = Counter(key for event in log for key in _KEY.findall(event))
            problems += [
                f"node {i}: {key} is in the log {n} times" for key, n in found.items() if n > 1
            ]
            problems += [
                f"node {i}: acknowledged {op.key} (through node {op.node}) is not in the log"
                for op in self.acknowledged()
                if found[op.key] == 0
            ]
        return problems


def _difference(i: int, a: Sequence[str], j: int, b: Sequence[str]) -> str:
    at = next(
        (k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
    x, y = (a[at] if at < len(a) else "-"), (b[at] if at < len(b) else "-")
    return (
        f"node {j}'s log differs from node {i}'s ({len(b)} vs {len(a)} events) from index "
        f"{at}: {y[:400]} vs {x[:400]}"
    )


def read_log(node: ExoProcess, upto: int | None = None, timeout: float = 30.0) -> list[str]:
    """The node's event log up to index `upto` (default: the last its /healthz reports), each
    event as the JSON its /events stream gives. Compare nodes up to one index: a live cluster
    goes on logging (workers report) between two reads."""
    last = int(node.get("/healthz")["last_index"]) if upto is None else upto
    events: list[str] = []
    if last < 0:
        return events
    with httpx.stream("GET", f"{node.url}/events?since=0", timeout=timeout) as stream:
        fields: dict[str, str] = {}
        for line in stream.iter_lines():
            if line:
                name, _, value = line.partition(":")
                fields[name] = value.strip()
                continue
            message, fields = fields, {}
            if "data" not in message:
                continue  # a comment or keep-alive
            index = int(message.get("id", "-1"))
            if index > last:
                break
            data = message["data"]
            kind = message.get("event", "event")
            events.append(_canonical(data) if kind == "event" else f"snapshot {data}")
            if index == last:
                break
    return events


def _canonical(event: str) -> str:
    """The event as every node holds it (the same on all of them): its JSON, keys sorted."""
    try:
        return json.dumps(json.loads(event), sort_keys=True)
    except ValueError:
        return event
