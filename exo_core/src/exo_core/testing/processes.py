"""Real `exo` processes on loopback for integration tests, each with its own ports and data.

    with exo_processes(tmp_path, 3) as nodes:
        httpx.get(f"{nodes[0].url}/state")

Node i listens for the transport on 127.0.0.1 and bootstraps to every earlier node; mDNS is
off (it skips loopback anyway).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from exo_core.testing.harness import free_port
from exo_core.testing.waiting import wait_until


@dataclass
class ExoProcess:
    index: int
    api_port: int
    libp2p_port: int
    data_dir: Path
    args: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    host: str = "127.0.0.1"  # where its API and transport listen
    launcher: tuple[str, ...] = ()  # run through this (e.g. `ip netns exec NS`)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.api_port}"

    @property
    def bootstrap_addr(self) -> str:
        return f"/ip4/{self.host}/tcp/{self.libp2p_port}"

    def start(
        self, env: dict[str, str] | None = None, preexec: Callable[[], None] | None = None
    ) -> None:
        """Start the process; `preexec` runs in the child before exo (e.g. to set limits)."""
        log = open(self.log_path, "ab")  # noqa: SIM115 (the child writes it until it ends)
        self.process = subprocess.Popen(
            [*self.launcher, sys.executable, "-m", "exo_core.cli", *self.args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            preexec_fn=preexec,
        )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=30)

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets but answers nothing until `resume`."""
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGCONT)

    def get(self, path: str, timeout: float = 5.0) -> Any:
        return httpx.get(f"{self.url}{path}", timeout=timeout).json()

    def state(self) -> Any:
        return self.get("/state")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def wait_joined(
    nodes: Sequence[ExoProcess], engine: str | None = None, timeout: float = 120
) -> None:
    """Until every node's state holds all of them, each reporting `engine` (or any engine)."""

    def joined() -> bool:
        for node in nodes:
            state = node.state()
            if len(state["nodes"]) != len(nodes):
                return False
            engines = [n["resources"]["engines"] for n in state["nodes"].values()]
            if not all(engine in e if engine else e for e in engines):
                return False
        return True

    try:
        wait_until(joined, timeout=timeout)
    except TimeoutError as e:
        log = nodes[-1].log()[-3000:]
        raise TimeoutError(f"the exo nodes did not form a cluster:\n{log}") from e


def runners_ready(node: ExoProcess, instance_id: str) -> bool:
    """Whether every shard of the instance has a ready runner, as `node` sees it."""
    instance: dict[str, Any] = node.get(f"/instance/{instance_id}")
    shards, runners = instance.get("shards", []), instance.get("runners", {})
    return bool(shards) and all(
        runners.get(s["runner_id"], {}).get("status") == "ready" for s in shards
    )


@contextlib.contextmanager
def exo_processes(
    root: Path,
    count: int,
    extra_args: Sequence[Sequence[str]] = (),
    env: dict[str, str] | None = None,
    namespace: str = "test-cluster",
    after_start: Callable[[ExoProcess], None] | None = None,
    preexec: Callable[[], None] | None = None,
) -> Iterator[list[ExoProcess]]:
    """`count` exo processes over libp2p on loopback, each bootstrapped to the ones before it.
    `after_start` is called with each node once it is started, before the next one starts
    (e.g. to let a node become master before the others join); `preexec` runs in each child
    before exo starts (e.g. `resource.setrlimit`)."""
    nodes: list[ExoProcess] = []
    try:
        for i in range(count):
            api_port, libp2p_port = free_port(), free_port()
            data = root / f"node{i}"
            data.mkdir(parents=True, exist_ok=True)
            args = [
                "--api-port", str(api_port), "--data-dir", str(data), "--namespace", namespace,
                "--listen-host", "127.0.0.1", "--libp2p-port", str(libp2p_port), "--no-mdns",
            ]  # fmt: skip
            peers = ",".join(n.bootstrap_addr for n in nodes)
            if peers:
                args += ["--bootstrap-peers", peers]
            if i < len(extra_args):
                args += list(extra_args[i])
            node = ExoProcess(i, api_port, libp2p_port, data, args, root / f"node{i}.log")
            node.start(env, preexec)
            nodes.append(node)
            if after_start is not None:
                after_start(node)
        yield nodes
    finally:
        for node in nodes:
            node.kill(signal.SIGINT)
