"""The MLX engine: which cards it serves, where their weights come from, and its runners."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import msgspec

from exo_core.plugin import ModelCard, ModelTask, Sharding
from exo_core.plugin.engine import (
    RING_TOKEN_ENV,
    Engine,
    Runner,
    RunnerSpec,
    derive_key,
    ring_token,
    runner_env,
)
from exo_core.plugin.placement import PlacementOption
from exo_engine_mlx.protocol import RunnerOptions
from exo_engine_mlx.runner import MlxRunner

EMBEDDED_SCHEME = "embedded:"
LOCAL_SCHEME = "local:"


def options_from_env(env: os._Environ[str] | dict[str, str]) -> RunnerOptions:
    defaults = RunnerOptions()
    return RunnerOptions(
        max_concurrent=int(env.get("EXO_MAX_CONCURRENT_REQUESTS", defaults.max_concurrent)),
        dense=env.get("EXO_DENSE", defaults.dense),
        prefix_cache_bytes=int(env.get("EXO_PREFIX_CACHE_BYTES", defaults.prefix_cache_bytes)),
        min_prefix_tokens=int(env.get("EXO_MIN_PREFIX_TOKENS", defaults.min_prefix_tokens)),
        default_max_tokens=int(env.get("EXO_DEFAULT_MAX_TOKENS", defaults.default_max_tokens)),
        prefill_step_size=_prefill_chunk(env, defaults.prefill_step_size),
        warmup=env.get("EXO_RUNNER_WARMUP", "1") != "0",
        group_connect_timeout_s=float(
            env.get("EXO_GROUP_CONNECT_TIMEOUT_S", defaults.group_connect_timeout_s)
        ),
        group_load_timeout_s=float(
            env.get("EXO_GROUP_LOAD_TIMEOUT_S", defaults.group_load_timeout_s)
        ),
        group_step_timeout_s=float(
            env.get("EXO_GROUP_STEP_TIMEOUT_S", defaults.group_step_timeout_s)
        ),
        group_heartbeat_s=float(env.get("EXO_GROUP_HEARTBEAT_S", defaults.group_heartbeat_s)),
    )


def _prefill_chunk(env: os._Environ[str] | dict[str, str], default: int) -> int:
    """EXO_PREFILL_CHUNK (EXO_PREFILL_STEP_SIZE, its earlier name, still read): at least 1."""
    value = env.get("EXO_PREFILL_CHUNK") or env.get("EXO_PREFILL_STEP_SIZE")
    return max(1, int(value)) if value else default


class MlxEngine(Engine):
    name = "mlx"

    def __init__(
        self, ring_secret: bytes = derive_key(None, "exo-mlx-ring"), *, batch: bool = True
    ) -> None:
        # Ranks of a group prove to each other that they hold a token made from this.
        self.ring_secret = ring_secret
        # False (`exo --no-batch`): each runner decodes one request at a time, the others
        # waiting their turn, instead of batching them continuously.
        self.batch = batch

    def can_serve(self, card: ModelCard) -> bool:
        return ModelTask.TEXT_GENERATION in card.tasks and (
            card.source.startswith((EMBEDDED_SCHEME, LOCAL_SCHEME, "hf:"))
        )

    def sharding_refusal(self, card: ModelCard, sharding: Sharding, ranks: int) -> str | None:
        if not card.model_type:
            return None  # an architecture the card does not name is not refused
        from exo_engine_mlx.families import family_support

        return family_support(card.model_type).refusal(sharding, ranks)

    def placement_refusal(self, card: ModelCard, option: PlacementOption) -> str | None:
        refusal = self.sharding_refusal(card, option.sharding, len(option.shares))
        if refusal is not None or option.sharding != "pipeline" or len(option.shares) < 2:
            return refusal
        # Which layers a rank gets matters where only some layers hold a cache (Nemotron-H)
        # or some reuse an earlier layer's keys and values (Gemma 3n / 4): the model's
        # config.json says which, when this node has it or the card carries its keys.
        config = _model_config(card)
        if config is None:
            return None
        from exo_engine_mlx.distributed.slicing_hybrid import cacheless_rank_refusal
        from exo_engine_mlx.distributed.slicing_state import shared_kv_split_refusal
        from exo_engine_mlx.families import module_name

        module = module_name(card.model_type)
        ranges = [(s.start_layer, s.end_layer) for s in option.shares]
        return cacheless_rank_refusal(module, config, ranges) or shared_kv_split_refusal(
            module, config, ranges
        )

    async def prepare_model(self, card: ModelCard, models_dir: Path) -> Path | None:
        if card.source.startswith(LOCAL_SCHEME):
            return Path(card.source.removeprefix(LOCAL_SCHEME))
        if card.source.startswith(EMBEDDED_SCHEME):
            from exo_engine_mlx.embedded import ensure_embedded_model_apart

            return await ensure_embedded_model_apart(models_dir)
        return None  # a hub model: the downloader fetches it

    def create_runner(self, spec: RunnerSpec) -> Runner:
        env = runner_env()
        if spec.shard.world_size > 1:
            env[RING_TOKEN_ENV] = ring_token(self.ring_secret, spec.instance.instance_id)
        return MlxRunner(spec, self.runner_options(os.environ), env)

    def runner_options(self, env: os._Environ[str] | dict[str, str]) -> RunnerOptions:
        options = options_from_env(env)
        return options if self.batch else msgspec.structs.replace(options, max_concurrent=1)


def _model_config(card: ModelCard) -> dict[str, Any] | None:
    """The model's config.json as placement reads it: the local directory's, for a card whose
    weights are one, else the keys the card carries (a hub card's `config`, e.g. Nemotron-H's
    layer pattern); None when neither says anything (the runner still refuses a bad split)."""
    if not card.model_type:
        return None
    if card.source.startswith(LOCAL_SCHEME):
        try:
            config = json.loads(
                (Path(card.source.removeprefix(LOCAL_SCHEME)) / "config.json").read_text()
            )
        except (OSError, ValueError):
            config = None
        if isinstance(config, dict):
            return config
    return dict(card.config) or None
