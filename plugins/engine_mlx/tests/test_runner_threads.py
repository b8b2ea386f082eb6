"""A runner sizes its threads from the cores it may use (its affinity mask), not the machine's.

A child process pinned to one core loads a quantized model as a runner does: exo's kernels then
run one thread and the fast BLAS (when there is one) one thread, so one step never asks for more
threads than it has cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import exo_mlx_cpu_kernels as kernels
from exo_core.plugin.engine import blas_threads, runner_env
from exo_engine_mlx.gguf import import_gguf

CHILD = """
import json, os, sys
import exo_mlx_cpu_kernels as kernels
from exo_core.plugin.engine import blas_threads
from exo_engine_mlx.loading import load_model
load_model(sys.argv[1])
print(json.dumps({
    "cores": len(os.sched_getaffinity(0)),
    "kernel_threads": kernels.num_threads(),
    "blas_threads": blas_threads(),
}))
"""

pytestmark = [
    pytest.mark.skipif(not kernels.available(), reason="kernels not built"),
    pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no affinity masks here"),
]


def test_a_runner_pinned_to_one_core_runs_one_thread(
    tiny_gguf: Callable[..., Path], tmp_path: Path
) -> None:
    src = tiny_gguf(weight_type="Q4_0", embd_type="Q8_0", tied=True)
    model_dir = import_gguf(src, tmp_path / "m", "tiny")

    def pin() -> None:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

    # The runner's environment, less the BLAS thread count: the pinned child decides it.
    env = {k: v for k, v in runner_env().items() if not k.endswith("_NUM_THREADS")}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(model_dir)],
        env=env,
        preexec_fn=pin,
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"cores": 1, "kernel_threads": 1, "blas_threads": 1}
    # Unpinned, this process sizes the same way from its own mask.
    assert blas_threads() == max(1, len(os.sched_getaffinity(0)) - 1)
