"""Inference across a network: a pipeline over two exo nodes in network namespaces with 1 ms
a hop (exo_core.testing.network), beside the same model on one of them.

    sudo .venv/bin/python bench/bench_cluster_lan.py [--delay-ms 1] [--tokens 64] [--llamacpp]

Needs root (namespaces). The two nodes find each other by mDNS on the emulated switch. For
each placement (one node, then a two-node pipeline) the same greedy request is streamed
through the OpenAI endpoint of node 1; printed: whether the text equals one node's, TTFT,
decode tok/s (streamed chunks after the first over their time) and the bytes per token that
crossed host 0's link while it decoded (its TAP device's counters, less the idle rate of the
same link measured just before: campaigns and telemetry).

`--llamacpp` adds llama.cpp's RPC split as the yardstick: `rpc-server` in host 1, and
`llama-server --rpc` in host 0 on the same model's GGUF, built by bench/llamacpp_build.py
with -DGGML_RPC=ON (about 13 minutes on 2 cores, once; cached). Never asserts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from exo_core.testing.linkemu import LinkSpec
from exo_core.testing.network import EmulatedNetwork, emulated_network, exo_on_network
from exo_core.testing.processes import ExoProcess, runners_ready, wait_joined, wait_until

MODEL = "SmolLM2-135M-Instruct"
PROMPT = "Write a short story about a lighthouse keeper."


@dataclass
class Run:
    text: str
    ttft_s: float
    tok_s: float
    bytes_per_token: float


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


def stream(url: str, tokens: int) -> tuple[str, float, int, float]:
    """(text, TTFT, chunks, seconds from the first chunk to the last)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
    }
    started = time.perf_counter()
    first = last = 0.0
    parts: list[str] = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"].get("content")
            if delta:
                last = time.perf_counter()
                first = first or last
                parts.append(delta)
    return "".join(parts), first - started, len(parts), last - first


def place(node: ExoProcess, count: int) -> str:
    body = {"model_id": MODEL, "sharding": "pipeline", "min_nodes": count}
    reply = httpx.post(f"{node.url}/instance", json=body, timeout=120)
    reply.raise_for_status()
    instance_id = str(reply.json()["instance_id"])
    wait_until(lambda: runners_ready(node, instance_id), timeout=600)
    shards = node.get(f"/instance/{instance_id}")["shards"]
    assert len(shards) == count, shards
    return instance_id


def measure(net: EmulatedNetwork, nodes: list[ExoProcess], count: int, tokens: int) -> Run:
    instance_id = place(nodes[0], count)
    try:
        stream(nodes[1].url, 4)  # warm: the first request pays for compiling the step
        idle_from, idle_at = link_bytes(net, 0), time.perf_counter()
        time.sleep(3.0)
        idle_rate = (link_bytes(net, 0) - idle_from) / (time.perf_counter() - idle_at)
        before, started = link_bytes(net, 0), time.perf_counter()
        text, ttft, chunks, decode = stream(nodes[1].url, tokens)
        crossed = link_bytes(net, 0) - before - idle_rate * (time.perf_counter() - started)
        return Run(
            text,
            ttft,
            (chunks - 1) / decode if decode > 0 else 0.0,
            max(0.0, crossed) / max(1, chunks),
        )
    finally:
        httpx.delete(f"{nodes[0].url}/instance/{instance_id}", timeout=60)
        wait_until(lambda: instance_id not in nodes[0].state()["instances"], timeout=60)


def llamacpp_rpc(net: EmulatedNetwork, tokens: int) -> Run | None:
    """llama.cpp's RPC split of the same model over the same two hosts, or None with why."""
    sys.path.insert(0, str(Path(__file__).parent))
    import llamacpp_build

    binaries = llamacpp_build.build_server(rpc=True)
    if binaries is None:
        print("llama.cpp RPC: no build (see above)")
        return None
    rpc_server = binaries.with_name("rpc-server")
    if not rpc_server.exists():
        print(f"llama.cpp RPC: the build has no {rpc_server.name}")
        return None
    from exo_engine_mlx.embedded import embedded_gguf_path

    port = 8080
    rpc = net.popen(1, [str(rpc_server), "--host", net.hosts[1].address, "--port", "50052"])
    server = net.popen(
        0,
        [str(binaries), "-m", str(embedded_gguf_path()), "--host", net.hosts[0].api_address,
         "--port", str(port), "--rpc", f"{net.hosts[1].address}:50052", "-ngl", "99", "-t", "2"],
    )  # fmt: skip
    try:
        url = f"http://{net.hosts[0].api_address}:{port}"
        wait_until(lambda: httpx.get(f"{url}/health", timeout=2).status_code == 200, timeout=300)
        stream(url, 4)
        before = link_bytes(net, 0)
        text, ttft, chunks, decode = stream(url, tokens)
        crossed = link_bytes(net, 0) - before
        return Run(text, ttft, (chunks - 1) / decode if decode else 0.0, crossed / max(1, chunks))
    finally:
        for process in (server, rpc):
            process.kill()
            process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description="Inference across a namespaced network.")
    parser.add_argument("--delay-ms", type=float, default=1.0)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--llamacpp", action="store_true")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        emulated_network(2, LinkSpec(delay_ms=args.delay_ms)) as net,
        exo_on_network(net, Path(tmp), extra_args=[["--no-auto-place"]] * 2) as nodes,
    ):
        wait_joined(nodes, timeout=300)
        one = measure(net, nodes, 1, args.tokens)
        two = measure(net, nodes, 2, args.tokens)
        rows = [("exo, one node", one), (f"exo, pipeline over 2 ({args.delay_ms:g} ms/hop)", two)]
        if args.llamacpp and (rpc := llamacpp_rpc(net, args.tokens)) is not None:
            rows.append(("llama.cpp RPC over 2", rpc))
    print(f"{MODEL}, greedy, {args.tokens} tokens, asked on node 1 (machine shared: noisy)")
    print(f"{'':<36}{'same text':>10}{'TTFT s':>9}{'tok/s':>8}{'bytes/token':>13}")
    for name, run in rows:
        same = "yes" if run.text == one.text else "NO"
        print(
            f"{name:<36}{same:>10}{run.ttft_s:>9.3f}{run.tok_s:>8.1f}{run.bytes_per_token:>13,.0f}"
        )
    print(
        f"pipeline / one node: tok/s x{two.tok_s / one.tok_s:.2f}, TTFT x{two.ttft_s / one.ttft_s:.2f}"
    )


if __name__ == "__main__":
    main()
