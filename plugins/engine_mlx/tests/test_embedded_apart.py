"""A node converts the embedded model in a child process: MLX and `tokenizers` (and the model's
weights) never enter the node's own memory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHECK = """
import sys, anyio
from pathlib import Path
from exo_engine_mlx.embedded import ensure_embedded_model_apart
out = anyio.run(ensure_embedded_model_apart, Path(sys.argv[1]))
again = anyio.run(ensure_embedded_model_apart, Path(sys.argv[1]))  # converted: found at once
assert again == out, (again, out)
heavy = sorted(m for m in ("mlx", "mlx.core", "tokenizers") if m in sys.modules)
print(out, heavy)
"""


def test_the_embedded_model_is_converted_in_a_child_process(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    path, heavy = done.stdout.strip().rsplit(" ", 1)
    assert heavy == "[]"
    assert (Path(path) / "model.safetensors").is_file()
    assert (Path(path) / "exo_gguf_import.json").is_file()
