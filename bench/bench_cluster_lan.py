"""Inference across a network: a pipeline over two exo nodes in network namespaces with 1 ms
a hop (exo_core.testing.network), beside the same model on one of them.

    sudo .venv/bin/python bench/bench_cluster_lan.py [--delay-ms 1] [--rate-mbit 0]
        [--tokens 64] [--streams 1,8] [--rounds 3] [--unpinned] [--llamacpp]

Needs root (namespaces). The two nodes find each other by mDNS on the emulated switch. Each
round places the model on one node, then as a two-node pipeline (then, with `--llamacpp`,
starts llama.cpp's split), so the systems alternate and a burst of load from elsewhere on the
machine hits all of them alike; the figures printed are medians over the rounds. For each
placement the same greedy request is streamed through node 1's OpenAI endpoint, alone and as
N concurrent streams (`--streams`). Printed: whether the text equals one node's, TTFT,
decode tok/s (one stream: its chunks after the first over their time; N streams: all their
chunks after each one's first, over the time from the first of those to the last), and the
bytes per token that crossed host 0's link while one stream decoded (its TAP device's
counters, less the idle rate of the link measured just before: campaigns and telemetry).

**Pinned by default.** On a machine with fewer cores than it emulates hosts, the hosts would
share every core. So each host runs on its own core (host i on CPU i mod the CPUs this
process may use, by `taskset`, inherited by the runners it starts): the one-node figure is
one one-core machine, the pipeline two one-core machines. `--unpinned` lets every process
run anywhere (then the two "machines" share all the cores, and the pipeline's two ranks
compete with each other).

`--llamacpp` adds llama.cpp's RPC split as the yardstick: `rpc-server` in both hosts (each
pinned as that host's exo), `llama-server --rpc` in host 0 using both, on the same model's
GGUF, built by bench/llamacpp_build.py with -DGGML_RPC=ON (about 13 minutes on 2 cores, once;
cached). Never asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx

from exo_core.testing.linkemu import LinkSpec
from exo_core.testing.network import EmulatedNetwork, emulated_network, exo_on_network
from exo_core.testing.processes import ExoProcess, runners_ready, wait_joined, wait_until

MODEL = "SmolLM2-135M-Instruct"
PROMPT = "Write a short story about a lighthouse keeper."
RPC_PORT = 50052
LLAMA_PORT = 8080


@dataclass
class Streamed:
    text: str
    ttft_s: float
    chunks: int
    first: float  # perf_counter of the first chunk
    last: float  # perf_counter of the last chunk


@dataclass
class Run:
    text: str
    ttft_s: float
    tok_s: float
    bytes_per_token: float
    # streams -> aggregate decode tok/s of that many concurrent streams
    concurrent: dict[int, float]


def link_bytes(net: EmulatedNetwork, host: int) -> int:
    """Bytes received and sent by host's TAP device (its only link to the other hosts)."""
    ns = net.hosts[host].namespace
    tap = f"{ns.rsplit('-', 1)[0]}t{host}"  # as exo_core.testing.network names them
    stats = f"/sys/class/net/{tap}/statistics"
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "cat", f"{stats}/rx_bytes", f"{stats}/tx_bytes"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sum(int(v) for v in out.split())


def stream(url: str, tokens: int, model: str = MODEL) -> Streamed:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
    }
    started = time.perf_counter()
    first = last = 0.0
    parts: list[str] = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            delta = choices[0].get("delta", {}).get("content")
            if delta:
                last = time.perf_counter()
                first = first or last
                parts.append(delta)
    return Streamed("".join(parts), first - started, len(parts), first, last)


def concurrent_tok_s(url: str, tokens: int, streams: int) -> float:
    """Aggregate decode tok/s of `streams` greedy streams started together."""
    results: list[Streamed] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            results.append(stream(url, tokens))
        except BaseException as e:  # reported after the join
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    span = max(r.last for r in results) - min(r.first for r in results)
    decoded = sum(r.chunks - 1 for r in results)
    return decoded / span if span > 0 else 0.0


def measure_url(net: EmulatedNetwork, url: str, tokens: int, streams: list[int], idle: bool) -> Run:
    """One warmed-up system at `url`: one stream (with the link's bytes), then each count."""
    stream(url, 4)  # warm: the first request pays for compiling the step
    idle_rate = 0.0
    if idle:
        idle_from, idle_at = link_bytes(net, 0), time.perf_counter()
        time.sleep(3.0)
        idle_rate = (link_bytes(net, 0) - idle_from) / (time.perf_counter() - idle_at)
    before, started = link_bytes(net, 0), time.perf_counter()
    one = stream(url, tokens)
    crossed = link_bytes(net, 0) - before - idle_rate * (time.perf_counter() - started)
    decode = one.last - one.first
    return Run(
        one.text,
        one.ttft_s,
        (one.chunks - 1) / decode if decode > 0 else 0.0,
        max(0.0, crossed) / max(1, one.chunks),
        {n: concurrent_tok_s(url, tokens, n) for n in streams if n > 1},
    )


@contextmanager
def placed(node: ExoProcess, count: int) -> Iterator[None]:
    body = {"model_id": MODEL, "sharding": "pipeline", "min_nodes": count}
    reply = httpx.post(f"{node.url}/instance", json=body, timeout=120)
    reply.raise_for_status()
    instance_id = str(reply.json()["instance_id"])
    try:
        wait_until(lambda: runners_ready(node, instance_id), timeout=600)
        shards = node.get(f"/instance/{instance_id}")["shards"]
        assert len(shards) == count, shards
        yield
    finally:
        httpx.delete(f"{node.url}/instance/{instance_id}", timeout=60)
        wait_until(lambda: instance_id not in node.state()["instances"], timeout=60)


def exo_run(
    net: EmulatedNetwork, nodes: list[ExoProcess], count: int, tokens: int, streams: list[int]
) -> Run:
    with placed(nodes[0], count):
        return measure_url(net, nodes[1].url, tokens, streams, idle=True)


def llamacpp_binaries() -> tuple[Path, Path] | None:
    """(llama-server, rpc-server) of the cached RPC build, or None with why."""
    sys.path.insert(0, str(Path(__file__).parent))
    import llamacpp_build

    server = llamacpp_build.build_server(rpc=True)
    if server is None:
        print("llama.cpp RPC: no build (see above)")
        return None
    rpc = llamacpp_build.rpc_server(server)
    if rpc is None:
        print(f"llama.cpp RPC: no rpc-server beside {server}")
        return None
    return server, rpc


def llamacpp_run(
    net: EmulatedNetwork, binaries: tuple[Path, Path], tokens: int, streams: list[int], logs: Path
) -> Run | None:
    """llama.cpp's RPC split over the same two hosts: an rpc-server in each (the layers split
    between them), llama-server in host 0 driving both; None (with its log's tail) if it did
    not come up."""
    from exo_engine_mlx.embedded import embedded_gguf_path

    server, rpc_server = binaries
    threads = [str(len(h.cpus) or os.cpu_count() or 1) for h in net.hosts]
    log = (logs / "llamacpp.log").open("ab")
    rpcs = [
        net.popen(i, [str(rpc_server), "--host", h.address, "--port", str(RPC_PORT),
                      "-t", threads[i]], stdout=log, stderr=subprocess.STDOUT)
        for i, h in enumerate(net.hosts)
    ]  # fmt: skip
    slots = max([1, *streams])
    endpoints = ",".join(f"{h.address}:{RPC_PORT}" for h in net.hosts)
    llama = net.popen(
        0,
        [str(server), "-m", str(embedded_gguf_path()), "--host", net.hosts[0].api_address,
         "--port", str(LLAMA_PORT), "--rpc", endpoints, "-ngl", "99", "-t", threads[0],
         "--parallel", str(slots), "-c", str(512 * slots)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        url = f"http://{net.hosts[0].api_address}:{LLAMA_PORT}"
        with suppress(TimeoutError):
            wait_until(lambda: _healthy(url) or llama.poll() is not None, timeout=600)
        if not _healthy(url):
            tail = (logs / "llamacpp.log").read_text(errors="replace")[-2000:]
            print(f"llama.cpp RPC did not come up; its log ends:\n{tail}", flush=True)
            return None
        return measure_url(net, url, tokens, streams, idle=False)
    finally:
        for process in (llama, *rpcs):
            process.kill()
            process.wait(timeout=30)
        log.close()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def median_run(runs: list[Run]) -> Run:
    def med(get: Callable[[Run], float]) -> float:
        return statistics.median(get(r) for r in runs)

    counts = runs[0].concurrent.keys()
    return Run(
        runs[0].text,
        med(lambda r: r.ttft_s),
        med(lambda r: r.tok_s),
        med(lambda r: r.bytes_per_token),
        {n: med(lambda r, n=n: r.concurrent[n]) for n in counts},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="Inference across a namespaced network.")
    parser.add_argument("--delay-ms", type=float, default=1.0)
    parser.add_argument("--rate-mbit", type=float, default=0.0, help="0: unlimited")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--streams", default="1,8", help="counts of concurrent streams")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (median)")
    parser.add_argument("--unpinned", action="store_true", help="hosts share every core")
    parser.add_argument("--llamacpp", action="store_true")
    args = parser.parse_args()
    streams = sorted({int(n) for n in args.streams.split(",")})
    binaries = llamacpp_binaries() if args.llamacpp else None
    cpus = sorted(os.sched_getaffinity(0))
    link = LinkSpec(delay_ms=args.delay_ms, rate_mbit=args.rate_mbit)
    systems: dict[str, list[Run]] = {"one": [], "two": [], "llama": []}
    with (
        tempfile.TemporaryDirectory() as tmp,
        emulated_network(2, link) as net,
    ):
        if not args.unpinned:
            for i in range(len(net.hosts)):
                net.pin(i, [cpus[i % len(cpus)]])
        with exo_on_network(net, Path(tmp), extra_args=[["--no-auto-place"]] * 2) as nodes:
            wait_joined(nodes, timeout=300)
            for r in range(args.rounds):
                systems["one"].append(exo_run(net, nodes, 1, args.tokens, streams))
                systems["two"].append(exo_run(net, nodes, 2, args.tokens, streams))
                if binaries is not None:
                    run = llamacpp_run(net, binaries, args.tokens, streams, Path(tmp))
                    if run is not None:
                        systems["llama"].append(run)
                print(f"round {r + 1}: " + _round_line(systems), flush=True)
    _report(args, streams, net_pins=[h.cpus for h in net.hosts], systems=systems)


def _round_line(systems: dict[str, list[Run]]) -> str:
    return ", ".join(
        f"{name} {runs[-1].tok_s:.1f} tok/s "
        + " ".join(f"x{n}: {v:.1f}" for n, v in runs[-1].concurrent.items())
        for name, runs in systems.items()
        if runs
    )


def _report(
    args: argparse.Namespace,
    streams: list[int],
    net_pins: list[tuple[int, ...]],
    systems: dict[str, list[Run]],
) -> None:
    one = median_run(systems["one"])
    two = median_run(systems["two"])
    rows = [("exo, one node", one), ("exo, pipeline over 2", two)]
    llama = median_run(systems["llama"]) if systems["llama"] else None
    if llama is not None:
        rows.append(("llama.cpp RPC over 2", llama))
    rate = f"{args.rate_mbit:g} Mbit/s" if args.rate_mbit else "unlimited rate"
    pins = (
        "unpinned: every host may use every core"
        if args.unpinned
        else "pinned: " + ", ".join(f"host {i} on CPU {list(c)}" for i, c in enumerate(net_pins))
    )
    print(
        f"\n{MODEL}, greedy, {args.tokens} tokens, asked on node 1; {args.delay_ms:g} ms a hop, "
        f"{rate}; {pins}; median of {args.rounds} alternating rounds (machine shared: noisy)"
    )
    many = [n for n in streams if n > 1]
    head = f"{'':<24}{'same text':>10}{'TTFT s':>9}{'tok/s x1':>10}"
    head += "".join(f"{f'tok/s x{n}':>11}" for n in many) + f"{'bytes/token':>13}"
    print(head)
    for name, run in rows:
        same = "yes" if run.text == one.text else "NO"
        line = f"{name:<24}{same:>10}{run.ttft_s:>9.3f}{run.tok_s:>10.1f}"
        line += "".join(f"{run.concurrent[n]:>11.1f}" for n in many)
        print(line + f"{run.bytes_per_token:>13,.0f}")

    def ratios(a: Run, b: Run) -> str:
        parts = [f"x1 {a.tok_s / b.tok_s:.2f}"]
        parts += [f"x{n} {a.concurrent[n] / b.concurrent[n]:.2f}" for n in many]
        return ", ".join(parts)

    print(f"pipeline / one node, tok/s: {ratios(two, one)}; TTFT x{two.ttft_s / one.ttft_s:.2f}")
    if llama is not None:
        print(f"pipeline / llama.cpp RPC, tok/s: {ratios(two, llama)}")
        print(f"llama.cpp RPC / one exo node, tok/s: {ratios(llama, one)}")


if __name__ == "__main__":
    main()
