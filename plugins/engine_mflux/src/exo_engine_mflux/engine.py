"""The mflux image engine: which cards it serves, where their weights are, and its runners."""

from __future__ import annotations

import os
from pathlib import Path

from exo_core.blas import runner_env
from exo_core.engine import Engine, Runner, RunnerSpec
from exo_core.model_cards import ModelCard
from exo_core.state import Sharding
from exo_engine_mflux.runner import ImageRunner

LOCAL_SCHEME = "local:"
# Families the runner knows (see `pipeline.FAMILIES`; kept here so the node never imports mflux).
FAMILIES = frozenset({"flux1-schnell", "flux1-dev", "flux1-krea-dev", "flux1-kontext-dev"})


def image_runner_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The core's fast-BLAS environment, without mflux's progress bars in the node's log."""
    env = runner_env(base)
    env.setdefault("TQDM_DISABLE", "1")
    return env


class MfluxEngine(Engine):
    name = "mflux"

    def can_serve(self, card: ModelCard) -> bool:
        return card.makes_images and card.family in FAMILIES

    def sharding_refusal(self, card: ModelCard, sharding: Sharding, ranks: int) -> str | None:
        if ranks > 1 or sharding == "tensor":
            return "an image model runs on one node: splitting its transformer is not built yet"
        return None

    async def prepare_model(self, card: ModelCard, models_dir: Path) -> Path | None:
        if card.source.startswith(LOCAL_SCHEME):
            return Path(card.source.removeprefix(LOCAL_SCHEME))
        return None  # a hub model: the downloader fetches it

    def create_runner(self, spec: RunnerSpec) -> Runner:
        warmup = os.environ.get("EXO_RUNNER_WARMUP", "1") != "0"
        return ImageRunner(spec, image_runner_env(), warmup=warmup)
