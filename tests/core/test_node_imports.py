"""A node imports no heavy library it does not use: every installed plugin is loaded, and the
engines, the model libraries and the client's terminal UI stay out of the node's process (the
embedded model's conversion runs in a child process: engine_mlx's test_embedded_apart.py).

The libraries named here are each megabytes resident (MLX, tokenizers, huggingface_hub's API
client, rich, ...): the runners and the `exo` client commands import them, the node must not.
A real `exo` process reports its own imports (`PYTHONPROFILEIMPORTTIME`) into its log.
"""

from __future__ import annotations

import re
from pathlib import Path

from exo_core.testing.processes import exo_processes, wait_joined

HEAVY = (
    "mlx",
    "mlx_lm",
    "mflux",
    "transformers",
    "torch",
    "tokenizers",
    "numpy",
    "PIL",
    "rich",
    "huggingface_hub.hf_api",
)
_IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \| *([\w.]+)$", re.M)


def heavy_imports(log: str) -> list[str]:
    names = set(_IMPORTED.findall(log))
    assert "exo_core.plugin_host" in names  # the log does hold the node's imports
    return sorted(n for n in names if n in HEAVY or n.split(".")[0] in HEAVY[:-1])


def test_a_started_node_has_imported_no_heavy_library(tmp_path: Path) -> None:
    with exo_processes(tmp_path, 1, env={"PYTHONPROFILEIMPORTTIME": "1"}) as (node,):
        wait_joined([node], engine="mlx")
        assert heavy_imports(node.log()) == []
