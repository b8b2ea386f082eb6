"""Fast BLAS selection for runner subprocesses, and the dense fp32 fast path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import numpy as np
import pytest
from mlx.utils import tree_flatten

from exo_core.plugin.engine import find_fast_blas, runner_env
from exo_engine_mlx.blas import dense_fp32_bytes, dequantize_model, should_dequantize
from exo_engine_mlx.gguf import gguf_model_card_fields, import_gguf

MakeGGUF = Callable[..., Path]

_CHILD = """
import json, numpy as np, mlx.core as mx
from exo_core.plugin.engine import loaded_blas
rng = np.random.default_rng(0)
a = rng.standard_normal((300, 200)).astype(np.float32)
b = rng.standard_normal((200, 100)).astype(np.float32)
got = np.array(mx.array(a) @ mx.array(b))
err = float(np.abs(got - a.astype(np.float64) @ b.astype(np.float64)).max())
print(json.dumps({"err": err, "blas": loaded_blas()}))
"""


def test_exo_blas_off_adds_nothing() -> None:
    env = runner_env({"EXO_BLAS": "off", "LD_PRELOAD": "/x/other.so", "PATH": "/bin"})
    assert env == {"EXO_BLAS": "off", "LD_PRELOAD": "/x/other.so", "PATH": "/bin"}
    assert find_fast_blas({"EXO_BLAS": "off"}) is None


def test_exo_blas_explicit_path(tmp_path: Path) -> None:
    lib = tmp_path / "libmyblas.so"
    lib.write_bytes(b"")
    env = runner_env({"EXO_BLAS": str(lib), "LD_PRELOAD": "/x/other.so"})
    assert env["LD_PRELOAD"] == f"{lib}:/x/other.so"
    assert env["EXO_BLAS_ACTIVE"] == str(lib)
    with pytest.raises(FileNotFoundError, match="EXO_BLAS"):
        runner_env({"EXO_BLAS": str(tmp_path / "missing.so")})


def test_blas_threads(tmp_path: Path) -> None:
    lib = tmp_path / "libmyblas.so"
    lib.write_bytes(b"")
    env = runner_env({"EXO_BLAS": str(lib), "EXO_BLAS_THREADS": "3"})
    assert env["OPENBLAS_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "3"
    env = runner_env({"EXO_BLAS": str(lib), "OPENBLAS_NUM_THREADS": "5"})
    assert env["OPENBLAS_NUM_THREADS"] == "5"  # the caller's setting wins
    assert int(env["MKL_NUM_THREADS"]) == max(1, (os.cpu_count() or 1) - 1)


def test_fast_blas_subprocess_matmul_is_correct(tmp_path: Path) -> None:
    env = runner_env({**_base_env(tmp_path), "EXO_BLAS": "auto"})
    if "EXO_BLAS_ACTIVE" not in env:
        pytest.skip("no fast BLAS available on this machine")
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["blas"] == env["EXO_BLAS_ACTIVE"]  # really loaded in the child
    assert result["err"] < 1e-3  # fp32 sums of 200 products of N(0,1) values


def _base_env(tmp_path: Path) -> dict[str, str]:
    # Own cache dir: the shim is generated afresh, exercising the generator too.
    return {**os.environ, "EXO_CACHE_DIR": str(tmp_path / "cache")}


@pytest.fixture(scope="module")
def quantized_dir(tiny_gguf: MakeGGUF, tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tiny_gguf(weight_type="Q4_1", embd_type="Q8_0", tied=True)
    return import_gguf(src, tmp_path_factory.mktemp("q") / "m", "tiny-q")


def test_dequantize_model_logits(quantized_dir: Path) -> None:
    model, _ = mlx_lm.load(str(quantized_dir))[:2]
    ids = mx.array([[3, 17, 42, 99, 5, 250, 7]])
    before = np.array(model(ids))
    assert dequantize_model(model) == 1 + 2 * 7  # embedding + 7 linears per layer
    kinds = {type(m) for _, m in model.named_modules()}
    assert nn.QuantizedLinear not in kinds and nn.QuantizedEmbedding not in kinds
    params = [v for _, v in _leaves(model.parameters())]
    assert all(p.dtype == mx.float32 for p in params)
    after = np.array(model(ids))
    rel = np.abs(after - before).max() / np.abs(before).max()
    assert rel < 1e-4, rel


def _leaves(tree: object) -> list[tuple[str, mx.array]]:
    return [(k, v) for k, v in tree_flatten(tree) if isinstance(v, mx.array)]


def test_dense_size_and_should_dequantize(
    quantized_dir: Path, tiny_gguf: MakeGGUF, tmp_path: Path
) -> None:
    card = gguf_model_card_fields(tiny_gguf(weight_type="Q4_1", embd_type="Q8_0", tied=True))
    dense = dense_fp32_bytes(quantized_dir)
    assert dense == card.dense_fp32_bytes
    auto = {"EXO_DENSE": "auto"}
    assert should_dequantize(quantized_dir, 100 * dense, auto)
    assert not should_dequantize(quantized_dir, 2 * dense, auto)  # over 25% of free memory
    assert should_dequantize(quantized_dir, 1, {"EXO_DENSE": "on"})
    assert not should_dequantize(quantized_dir, 10**12, {"EXO_DENSE": "off"})
    f32 = import_gguf(tiny_gguf(), tmp_path / "f32", "tiny-f32")
    assert not should_dequantize(f32, 10**12, auto)  # nothing to dequantize
