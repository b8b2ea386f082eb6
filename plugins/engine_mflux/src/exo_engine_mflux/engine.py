"""The mflux image engine: which cards it serves, where their weights are, and its runners."""

from __future__ import annotations

import os
from pathlib import Path

from exo_core.plugin import ModelCard, Sharding
from exo_core.plugin.engine import (
    RING_TOKEN_ENV,
    Engine,
    Runner,
    RunnerSpec,
    derive_key,
    ring_token,
    runner_env,
)
from exo_engine_mflux.families import FAMILIES, pipeline_family
from exo_engine_mflux.runner import ImageRunner

LOCAL_SCHEME = "local:"


def image_runner_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The core's fast-BLAS environment, without mflux's progress bars in the node's log."""
    env = runner_env(base)
    env.setdefault("TQDM_DISABLE", "1")
    return env


def split_refusal(card: ModelCard, ranks: int) -> str | None:
    """Why `card`'s transformer cannot be split over `ranks` ranks, or None."""
    splittable = [c for c in card.components if c.splittable]
    if not splittable:
        return f"{card.model_id} has no component whose blocks can be split over nodes"
    blocks = splittable[0].n_blocks
    if blocks < ranks:
        return (
            f"{card.model_id}'s {splittable[0].name} has {blocks} block(s): "
            f"too few for {ranks} nodes (one block each at least)"
        )
    return None


class MfluxEngine(Engine):
    name = "mflux"

    def __init__(self, ring_secret: bytes = derive_key(None, "exo-mflux-ring")) -> None:
        # Ranks of a group prove to each other that they hold a token made from this.
        self.ring_secret = ring_secret

    def can_serve(self, card: ModelCard) -> bool:
        return card.makes_images and pipeline_family(card) in FAMILIES

    def sharding_refusal(self, card: ModelCard, sharding: Sharding, ranks: int) -> str | None:
        if sharding == "tensor":
            return f"{card.model_id} is an image model: it has no tensor parallel"
        return split_refusal(card, ranks) if ranks > 1 else None

    async def prepare_model(self, card: ModelCard, models_dir: Path) -> Path | None:
        if card.source.startswith(LOCAL_SCHEME):
            return Path(card.source.removeprefix(LOCAL_SCHEME))
        return None  # a hub model: the downloader fetches it

    def create_runner(self, spec: RunnerSpec) -> Runner:
        warmup = os.environ.get("EXO_RUNNER_WARMUP", "1") != "0"
        env = image_runner_env()
        if spec.shard.world_size > 1:
            env[RING_TOKEN_ENV] = ring_token(self.ring_secret, spec.instance.instance_id)
        connect_s = float(os.environ.get("EXO_GROUP_CONNECT_TIMEOUT_S", "60"))
        return ImageRunner(spec, env, warmup=warmup, connect_timeout_s=connect_s)
