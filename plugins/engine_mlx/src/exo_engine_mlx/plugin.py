"""Hook implementations of the MLX engine plugin."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from exo_core.plugin import ModelCard, NodeConfig, hookimpl
from exo_core.plugin.engine import Engine


@hookimpl
def exo_engines(config: NodeConfig) -> list[Engine]:
    from exo_core.plugin.engine import derive_key
    from exo_engine_mlx.engine import MlxEngine

    secret = derive_key(config.cluster_key, f"exo-mlx-ring:{config.namespace}")
    return [MlxEngine(ring_secret=secret, batch=config.batch)]


@hookimpl
def exo_model_cards(config: NodeConfig) -> list[ModelCard]:
    from exo_engine_mlx.cards import embedded_card, imported_cards

    card = embedded_card()
    return [*([card] if card is not None else []), *imported_cards(config.models_dir)]


def _import_gguf(args: argparse.Namespace) -> int:
    """Convert, then leave a card beside the model so that `exo` serves it under its id."""
    import sys

    from exo_core.plugin import UnsafeModelPath
    from exo_core.plugin.cards import check_model_id
    from exo_engine_mlx.cards import card_from_gguf, write_imported_card
    from exo_engine_mlx.gguf import GGUFImportError, import_gguf
    from exo_engine_mlx.gguf.cli import default_out_dir

    try:
        check_model_id(args.model_id)
        out = (
            Path(args.out)
            if args.out
            else default_out_dir(args.model_id, Path(args.data_dir) / "models")
        )
        path = import_gguf(Path(args.file), out, args.model_id)
        card = card_from_gguf(Path(args.file), args.model_id, source=f"local:{path}")
    except (GGUFImportError, UnsafeModelPath, OSError) as e:
        print(f"exo import-gguf: {e}", file=sys.stderr)
        return 2
    write_imported_card(path, card)
    print(f"imported {args.file} as {args.model_id} into {path}")
    return 0


@hookimpl
def exo_cli_commands(subparsers: argparse._SubParsersAction[Any]) -> None:
    sub = subparsers.add_parser(
        "import-gguf", help="convert a llama GGUF file into an MLX model directory"
    )
    sub.add_argument("file", help="the .gguf file")
    sub.add_argument("--model-id", required=True, help="the id to serve the model under")
    sub.add_argument("--out", default="", help="output directory (default: the models directory)")
    sub.set_defaults(func=_import_gguf)
