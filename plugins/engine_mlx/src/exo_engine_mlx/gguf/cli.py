"""`exo import-gguf FILE --model-id ID [--out DIR]`: the core wires this as a subcommand."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from exo_core.plugin import UnsafeModelPath
from exo_core.plugin.cards import check_model_id, model_path

from .convert import import_gguf
from .reader import GGUFImportError


def default_out_dir(model_id: str, models_dir: Path) -> Path:
    """Where a model is imported: a strict child of `models_dir` (UnsafeModelPath otherwise)."""
    # Model ids may contain "/" (org/name); one directory level keeps listing simple.
    return model_path(models_dir, check_model_id(model_id).replace("/", "--"))


def import_gguf_cli(argv: Sequence[str] | None = None, models_dir: Path | None = None) -> int:
    """Parse `argv` (without the subcommand), convert, print the result; return an exit code.

    `models_dir` is where the output goes unless `--out` is given (the core passes its own).
    """
    parser = argparse.ArgumentParser(
        prog="exo import-gguf", description="Convert a llama GGUF file into an MLX model."
    )
    parser.add_argument("file", type=Path, help="the .gguf file")
    parser.add_argument("--model-id", required=True, help="id to register the model under")
    parser.add_argument("--out", type=Path, default=None, help="output directory")
    args = parser.parse_args(list(argv) if argv is not None else None)
    base = models_dir if models_dir is not None else Path.home() / ".exo" / "models"
    t0 = time.perf_counter()
    try:
        out = args.out if args.out is not None else default_out_dir(args.model_id, base)
        path = import_gguf(args.file, out, args.model_id)
    except (GGUFImportError, UnsafeModelPath) as e:
        print(f"exo import-gguf: {e}", file=sys.stderr)
        return 2
    print(f"imported {args.file} as {args.model_id} into {path} ({time.perf_counter() - t0:.1f} s)")
    return 0
