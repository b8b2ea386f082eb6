"""The transformer split over two ranks (mx.distributed ring on loopback, one process each)
gives the image one rank gives, on a tiny model with one joint and one single block."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from exo_core.testing.harness import free_port

pytestmark = pytest.mark.slow


def _pixels(path: Path) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(path.read_bytes())).convert("RGB"), dtype=np.int16)


def test_two_ranks_give_the_image_of_one_rank(tmp_path: Path) -> None:
    from exo_engine_mflux.engine import image_runner_env
    from exo_engine_mflux.tiny_model import write_tiny_flux

    model = tmp_path / "split-flux"
    write_tiny_flux(model, joint_blocks=1, single_blocks=1)
    hostfile = tmp_path / "ring.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{free_port()}"] for _ in range(2)]))
    ranks = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "exo_engine_mflux.split_run",
                str(model),
                str(tmp_path / f"rank{r}"),
            ]
            + (["--reference"] if r == 0 else []),
            env=image_runner_env() | {"MLX_HOSTFILE": str(hostfile), "MLX_RANK": str(r)},
        )
        for r in range(2)
    ]
    try:
        assert [p.wait(timeout=250) for p in ranks] == [0, 0]
    finally:
        for p in ranks:
            p.kill()
    reference = _pixels(tmp_path / "rank0-reference.png")
    assert reference.shape == (64, 64, 3) and reference.std() > 0
    timings = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(t["rank"], t["size"], t["blocks"]) for t in timings] == [(0, 2, 1), (1, 2, 1)]
    for r in range(2):  # every rank ends with the same image, within float tolerance
        assert np.abs(_pixels(tmp_path / f"rank{r}.png") - reference).max() <= 2
