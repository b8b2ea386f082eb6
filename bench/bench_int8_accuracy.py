"""How far int8 activations (EXO_CPU_KERNELS=int8) move a model from float32 activations.

Reads real text (English prose and Python code, `exo_engine_mlx.activation_accuracy`) through
the model twice, kernels with float activations and kernels with int8 activations everywhere
(the output head too), teacher-forced over the same tokens in 64-token chunks (each kernel call
stays on the kernels). Prints per text: top-1 agreement, mean / p99 / max KL(float || int8) in
nats, and how many tokens of a greedy continuation (64 tokens after the text's first 48) the
two write alike.

SmolLM2-135M has real weights: its figures are the accuracy policy's. The 1B shape
(bench/bench_model_1b.py) has random weights: its distributions are near-uniform noise, so its
KL is tiny and its top-1 agreement is about how often int8 rounding flips a near-tie among
nearly equal logits, i.e. a stress of the arithmetic on the 1B's widths, not of text quality.

    .venv/bin/python bench/bench_int8_accuracy.py [--models smollm2 1b] [--tokens 0]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import mlx_lm
from mlx_lm.sample_utils import make_sampler

from exo_engine_mlx.activation_accuracy import (
    TEXTS,
    agreement,
    teacher_forced_logits,
)
from exo_engine_mlx.cpu_kernels import simd, use_kernels
from exo_engine_mlx.prefix_cache import common_prefix

PROMPT_TOKENS = 48
CONTINUATION = 64


def _model_dir(name: str, scratch: Path) -> Path:
    if name == "smollm2":
        from exo_engine_mlx.embedded import embedded_gguf_path
        from exo_engine_mlx.gguf import import_gguf

        return import_gguf(embedded_gguf_path(), scratch / "smollm2", "smollm2")
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_model_1b import CACHE, ONE_B, ensure_imported

    from exo_core.plugin.cards import check_model_id
    from exo_engine_mlx.gguf.cli import default_out_dir

    models = CACHE / "models"
    ensure_imported(models, ONE_B)
    return default_out_dir(check_model_id(ONE_B.model_id), models)


def _load(path: Path, int8: bool) -> tuple[Any, Any]:
    model, tokenizer = mlx_lm.load(str(path))[:2]
    use_kernels(model, int8=int8)
    return model, tokenizer


def _greedy(model: Any, tokenizer: Any, ids: list[int]) -> list[int]:
    return [
        r.token
        for r in mlx_lm.stream_generate(
            model, tokenizer, ids, max_tokens=CONTINUATION, sampler=make_sampler(0.0)
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["smollm2", "1b"])
    parser.add_argument("--tokens", type=int, default=0, help="cut each text (0: whole)")
    args = parser.parse_args()
    print(f"kernels: {simd()}; int8 everywhere (the head too) vs float32 activations")
    header = f"{'model':8} {'text':6} {'pos':>4} {'top-1':>7} {'mean KL':>9} {'p99 KL':>9}"
    print(header + f" {'max KL':>9} {'greedy same':>12} {'s':>5}  policy (SmolLM2's)")
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models:
            path = _model_dir(name, Path(scratch))
            float_model, tokenizer = _load(path, int8=False)
            int8_model, _ = _load(path, int8=True)
            for text_name, text in TEXTS.items():
                start = time.perf_counter()
                ids: list[int] = tokenizer.encode(text)
                ids = ids[: args.tokens] if args.tokens else ids
                a = agreement(
                    teacher_forced_logits(float_model, ids), teacher_forced_logits(int8_model, ids)
                )
                prompt = ids[:PROMPT_TOKENS]
                same = common_prefix(
                    _greedy(float_model, tokenizer, prompt), _greedy(int8_model, tokenizer, prompt)
                )
                print(
                    f"{name:8} {text_name:6} {a.positions:4d} {a.top1:7.3f} {a.mean_kl:9.2e} "
                    f"{a.p99_kl:9.2e} {a.max_kl:9.2e} {same:5d} / {CONTINUATION:<4d}"
                    f" {time.perf_counter() - start:5.1f}  {'; '.join(a.breaches()) or 'within'}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
