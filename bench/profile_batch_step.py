"""Where an 8-stream decode step and the 8 prompts' prefill of the embedded SmolLM2 go, in a
runner-like process (no server; the runner's fast BLAS preloaded through `runner_env`).

    uv run python bench/profile_batch_step.py [--streams 8] [--steps 48] [--rounds 2]

1. A/B in one process, alternating rounds: `BatchEngine` with N identical greedy requests
   (the bench prompt), decode steps timed in wall time and CPU time of the whole process, with
   the compiled step's row work (norms, rotary, SwiGLU, residual adds) as separate MLX ops
   ("unfolded", EXO_FUSE_ROW_WORK=off) and folded into the kernel calls for all N rows
   ("folded"); the greedy texts of the two are printed side by side (equal up to float32
   rounding, so a near-tie may flip a token).
2. The pieces of one step, each timed alone on the engine's own batch cache: the forward
   without the head, the head, the vocabulary-wide normalisation, the per-layer attention (old;
   new as MLX ops; new as the kernels' primitive unless EXO_FUSED_ATTENTION=off), the cache
   update.
3. The prefill of N prompts of ~45 tokens: the forward with cpu_kernels' choice of kernel or
   dequantize + BLAS per layer (its cost model) and with the kernels for every layer, then the
   dequantize calls and the sgemm calls alone (what the BLAS threads can speed up).
Medians; never asserts on time. On a loaded machine read the CPU columns.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CHILD = "EXO_PROFILE_CHILD"
PROMPT = "Write a short story about a robot who learns to paint."


def _timed(fn: Callable[[], Any], reps: int) -> tuple[float, float]:
    """Median wall and process-CPU milliseconds of fn() (one warm-up call first)."""
    fn()
    wall, cpu = [], []
    for _ in range(reps):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3


def _line(name: str, ms: tuple[float, float]) -> None:
    print(f"  {name:52s} wall {ms[0]:8.1f} ms   cpu {ms[1]:8.1f} ms", flush=True)


def profile(streams: int, steps: int, rounds: int) -> None:
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.models.base import create_causal_mask

    import exo_mlx_cpu_kernels as kernels
    from exo_core.plugin import ChatMessage, GenerationParams, SamplingParams, TaskId, TextChunk
    from exo_engine_mlx import compiled_step, cpu_kernels
    from exo_engine_mlx.batching import BatchEngine
    from exo_engine_mlx.embedded import ensure_embedded_model
    from exo_engine_mlx.loading import load_model

    with tempfile.TemporaryDirectory() as tmp:
        model, tokenizer = load_model(str(ensure_embedded_model(Path(tmp))))
    new_attention = compiled_step.decode_attention

    def old_attention(q: mx.array, k: mx.array, v: mx.array, *, scale: float, mask: Any) -> Any:
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)

    def engine(mode: str, max_tokens: int) -> BatchEngine:
        # The compiled blocks read EXO_FUSE_ROW_WORK when they trace: trace again per mode.
        os.environ["EXO_FUSE_ROW_WORK"] = "off" if mode == "unfolded" else "auto"
        for layer in model.model.layers:
            if getattr(layer, "_graphs", None) is not None:
                object.__delattr__(layer, "_graphs")
        e = BatchEngine(model, tokenizer, max_concurrent=streams)
        for i in range(streams):
            messages = (ChatMessage(role="user", content=PROMPT),)
            greedy = SamplingParams(temperature=0)
            e.submit(
                TaskId(str(i)),
                GenerationParams(messages=messages, max_tokens=max_tokens, sampling=greedy),
            )
        return e

    modes = ("unfolded", "folded")
    print(
        f"== 1. decode step, {streams} streams, {steps} tokens, {' vs '.join(modes)}, alternating"
    )
    figures: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    texts: dict[str, dict[str, str]] = {}
    for r in range(rounds):
        for mode in modes:
            e = engine(mode, steps)
            out: dict[str, str] = {}
            wall, cpu = [], []
            while e.active:
                start, start_cpu = time.perf_counter(), time.process_time()
                for c in e.step():
                    if isinstance(c, TextChunk):
                        out[c.task_id] = out.get(c.task_id, "") + c.text
                wall.append(time.perf_counter() - start)
                cpu.append(time.process_time() - start_cpu)
            step = (statistics.median(wall[3:]) * 1e3, statistics.median(cpu[3:]) * 1e3)
            figures[mode].append(step)
            texts[mode] = out
            _line(f"round {r} {mode}: median step (load {os.getloadavg()[0]:.1f})", step)
    for mode, got in figures.items():
        wall = statistics.median(w for w, _ in got)
        cpu = statistics.median(c for _, c in got)
        _line(f"{mode}: median of rounds ({streams / wall * 1e3:.1f} tok/s)", (wall, cpu))
    same = sum(texts[modes[0]].get(t) == text for t, text in texts[modes[1]].items())
    print(f"  greedy texts identical {' vs '.join(modes)}: {same} of {streams}")

    print(f"== 2. pieces of one step, {streams} rows (engine state after 8 steps)")
    e = engine("folded", 400)
    for _ in range(8):
        e.step()
    generator = e._generator
    assert isinstance(generator, BatchGenerator)  # several slots: not the one-stream generator
    batch: Any = generator._generation_batch
    cache, x = batch.prompt_cache, batch._next_tokens[:, None]
    mx.eval(x)
    _line("engine step (whole)", _timed(e.step, 10))
    _line("model forward, no head", _timed(lambda: mx.eval(model.model(x, cache=cache)), 10))
    hidden = model.model(x, cache=cache)
    mx.eval(hidden)
    head = model.model.embed_tokens.as_linear
    _line("head (tied embedding)", _timed(lambda: mx.eval(head(hidden)), 10))
    logits = head(hidden)[:, -1, :]
    mx.eval(logits)
    norm = lambda: mx.eval(logits - mx.logsumexp(logits, axis=-1, keepdims=True))  # noqa: E731
    _line("logsumexp normalisation (skipped for greedy rows)", _timed(norm, 10))
    layer, c0 = model.model.layers[0], cache[0]
    graphs = getattr(layer, "_graphs", None)
    if graphs is not None:
        q, k, v = graphs.before_cache(model.model.embed_tokens(x), c0.offset)
        keys, values = c0.update_and_fetch(k, v)
        mask = create_causal_mask(1, offset=c0._idx - 1, left_padding=c0.left_padding)
        mx.eval(q, keys, values, mask)
        scale = layer.self_attn.scale
        for name, fn, fused in (
            ("old", old_attention, "off"),
            ("new, MLX ops", new_attention, "off"),
            ("new", new_attention, os.environ.get("EXO_FUSED_ATTENTION", "auto")),
        ):

            def layers(fn: Callable[..., Any] = fn) -> None:
                mx.eval([fn(q, keys, values, scale=scale, mask=mask) for _ in range(30)])

            setting = os.environ.get("EXO_FUSED_ATTENTION")
            os.environ["EXO_FUSED_ATTENTION"] = fused  # the kernel's primitive, or not
            _line(f"attention x30 layers, {name} (keys {keys.shape[2]})", _timed(layers, 5))
            os.environ.pop("EXO_FUSED_ATTENTION")
            if setting is not None:
                os.environ["EXO_FUSED_ATTENTION"] = setting

    print(f"== 3. prefill of {streams} prompts x 45 tokens")
    from mlx_lm.models.cache import BatchKVCache

    tokens = mx.random.randint(0, 40000, (streams, 45))

    def forward() -> None:
        fresh = [BatchKVCache([0] * streams) for _ in model.layers]
        model(tokens, cache=fresh)
        mx.eval([c.state for c in fresh])

    chosen = cpu_kernels.dequantize_pays_here
    never = lambda rows, out, inp, bits: False  # noqa: E731
    for name, pays in (
        ("cost model (BLAS for a prompt)", chosen),
        ("kernels for every layer", never),
    ):
        cpu_kernels.dequantize_pays_here = pays
        _line(f"prefill forward (no head), {name}", _timed(forward, 2))
    cpu_kernels.dequantize_pays_here = chosen
    linears = [
        m for _, m in model.named_modules() if isinstance(m, cpu_kernels.KernelQuantizedLinear)
    ]

    def dense(m: Any) -> Any:
        return kernels.dequantize(m["weight"], m["scales"], m["biases"], m.group_size, m.bits)

    _line(
        f"dequantize {len(linears)} linears",
        _timed(lambda: mx.eval([dense(m) for m in linears]), 2),
    )
    weights = [dense(m) for m in linears]
    mx.eval(weights)
    rows = {w.shape[1]: mx.random.normal((streams * 45, w.shape[1])) for w in weights}
    mx.eval(list(rows.values()))
    gemm = lambda: [mx.eval(rows[w.shape[1]] @ w.T) for w in weights]  # noqa: E731
    flops = sum(2 * streams * 45 * w.shape[0] * w.shape[1] for w in weights)
    _line(f"sgemm alone, same layers ({flops / 1e9:.0f} GFLOP)", _timed(gemm, 2))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if os.environ.get(CHILD):
        profile(args.streams, args.steps, args.rounds)
        return
    from exo_core.plugin.engine import runner_env

    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    env = {**runner_env(), CHILD: "1"}
    print(f"BLAS: {env.get('EXO_BLAS_ACTIVE', 'none')}, threads {env.get('OPENBLAS_NUM_THREADS')}")
    subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=env, check=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
