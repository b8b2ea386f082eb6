"""The accuracy policy of int8 activations (EXO_CPU_KERNELS=int8), held on SmolLM2's real
weights over fixed prose and code: top-1 agreement and KL(float || int8) against the float
path, teacher-forced (bounds in `exo_engine_mlx.activation_accuracy` and
plugins/mlx_cpu_kernels/README.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import numpy as np
import pytest

import exo_mlx_cpu_kernels as kernels
from exo_engine_mlx.activation_accuracy import (
    MAX_MEAN_KL,
    MIN_TOP1,
    TEXTS,
    agreement,
    teacher_forced_logits,
)
from exo_engine_mlx.cpu_kernels import (
    INT8_BATCH_MIN_ROWS,
    int8_activations,
    int8_min_rows,
    use_kernels,
)
from exo_engine_mlx.embedded import embedded_gguf_path
from exo_engine_mlx.fused_linear import FusedLinear, fuse_linears
from exo_engine_mlx.gguf import import_gguf
from exo_engine_mlx.prefix_cache import common_prefix


def test_agreement_measures_flips_and_divergence() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((50, 100)) * 3
    same = agreement(logits, logits.copy())
    assert same.top1 == 1.0 and same.max_kl == pytest.approx(0.0, abs=1e-12)
    assert not same.breaches()
    # Drift: every position's logits moved by noise the size of the logits themselves.
    drifted = agreement(logits, logits + rng.standard_normal(logits.shape) * 3)
    assert drifted.top1 < MIN_TOP1 and drifted.mean_kl > MAX_MEAN_KL
    assert len(drifted.breaches()) == 3
    assert common_prefix([1, 2, 3, 4], [1, 2, 9, 4]) == 2 and common_prefix([1], [1, 2]) == 1


def test_mode_selection() -> None:
    # The default: int8 on every call where the CPU has AVX-512 VNNI, float elsewhere.
    auto = 1 if kernels.available() and kernels.vnni() else None
    assert int8_min_rows({}) == auto and int8_min_rows({"EXO_CPU_KERNELS": "auto"}) == auto
    if kernels.available():
        kernels.force_no_vnni(True)
        try:
            assert int8_min_rows({}) is None
        finally:
            kernels.force_no_vnni(False)
    assert int8_min_rows({"EXO_CPU_KERNELS": "float"}) is None
    assert int8_min_rows({"EXO_CPU_KERNELS": "off"}) is None
    assert int8_min_rows({"EXO_CPU_KERNELS": " INT8 "}) == 1
    assert int8_min_rows({"EXO_CPU_KERNELS": "int8-batch"}) == INT8_BATCH_MIN_ROWS == 2
    assert int8_activations({"EXO_CPU_KERNELS": "int8-batch"})
    assert not int8_activations({"EXO_CPU_KERNELS": "float"})


@pytest.mark.skipif(not kernels.available(), reason="kernels not built")
@pytest.mark.parametrize("fused", [False, True])
def test_int8_batch_rounds_only_calls_of_many_rows(fused: bool) -> None:
    """`int8-batch`: a one-row call is bit for bit the float mode's, a call of 2+ rows (a
    batched decode step, a prompt chunk) bit for bit the int8 mode's; the head rounds as the
    layers do."""
    x = mx.random.normal((4, 1, 128), key=mx.random.key(3))
    outputs: dict[str, list[np.ndarray]] = {}
    for mode in ("float", "int8", "int8-batch"):
        mx.random.seed(7)
        layers = [nn.QuantizedLinear(128, n, bias=False) for n in (96, 32)]
        head = nn.QuantizedEmbedding(64, 128)
        model = nn.Sequential(*layers, head)
        min_rows = int8_min_rows({"EXO_CPU_KERNELS": mode})
        use_kernels(model, threads=2, int8=min_rows or False)
        assert head.int8_min_rows == min_rows
        joined = fuse_linears(layers)
        assert joined is not None

        def call(
            rows: mx.array, joined: FusedLinear = joined, alone: nn.Module = layers[0]
        ) -> np.ndarray:
            return np.array(mx.concatenate(joined(rows), -1) if fused else alone(rows))

        outputs[mode] = [call(x[:1]), call(x)]
    one_float, many_float = outputs["float"]
    one_int8, many_int8 = outputs["int8"]
    # the modes do differ, at one row and at many
    assert not np.array_equal(one_float, one_int8) and not np.array_equal(many_float, many_int8)
    assert np.array_equal(outputs["int8-batch"][0], one_float)
    assert np.array_equal(outputs["int8-batch"][1], many_int8)


def _models(tmp_path: Path) -> tuple[Any, Any, Any]:
    path = import_gguf(embedded_gguf_path(), tmp_path / "smol", "smollm2")
    float_model, tokenizer = mlx_lm.load(str(path))[:2]
    int8_model = mlx_lm.load(str(path))[0]
    use_kernels(float_model, int8=False)
    use_kernels(int8_model, int8=True)
    return float_model, int8_model, tokenizer


@pytest.mark.smollm
@pytest.mark.slow
@pytest.mark.skipif(not kernels.available(), reason="kernels not built")
@pytest.mark.parametrize("text", sorted(TEXTS))
def test_smollm_int8_within_policy(tmp_path: Path, text: str) -> None:
    float_model, int8_model, tokenizer = _models(tmp_path)
    ids: list[int] = tokenizer.encode(TEXTS[text])
    a = agreement(teacher_forced_logits(float_model, ids), teacher_forced_logits(int8_model, ids))
    assert a.positions == len(ids) > 200
    assert not a.breaches(), a
