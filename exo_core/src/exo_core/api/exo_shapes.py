"""exo's JSON shapes, for the routes exo's clients call (`exo_routes`).

Read from exo's pydantic types (`src/exo/api/types/api.py`, `shared/models/model_cards.py`,
`shared/types/worker/{instances,runners,shards}.py`): exo writes its frozen models (a model
card, an instance, shard metadata, a memory size, the download answers) with camelCase keys
and its plain ones (the answers of the instance routes, previews) with snake_case keys; a
tagged model (an instance, a shard) is `{"ClassName": {...}}`. These functions only
translate this project's types; nothing here decides anything.
"""

from __future__ import annotations

from typing import Any, Literal

from exo_core.model_cards import ModelCard
from exo_core.state import Instance, Sharding

ExoSharding = Literal["Pipeline", "Tensor"]
ExoInstanceMeta = Literal["MlxRing", "MlxJaccl"]

EXO_SHARDING: dict[Sharding, ExoSharding] = {"pipeline": "Pipeline", "tensor": "Tensor"}
_EXO_TASKS = {
    "text_generation": "TextGeneration",
    "image_generation": "TextToImage",
    "image_edit": "ImageToImage",
}


def our_sharding(sharding: Sharding | ExoSharding) -> Sharding:
    """exo's spelling ("Pipeline") or ours ("pipeline"), as ours."""
    return "tensor" if sharding in ("tensor", "Tensor") else "pipeline"


def instance_meta_problem(instance_meta: ExoInstanceMeta) -> str | None:
    """Why exo's `instance_meta` cannot be had here, or None (the ring is the only one)."""
    if instance_meta == "MlxRing":
        return None
    return (
        f"instance_meta {instance_meta} (RDMA over Thunderbolt) is not available in this "
        "cluster: its ranks talk over MLX's ring (instance_meta MlxRing)"
    )


def memory(in_bytes: int) -> dict[str, int]:
    """exo's `Memory`."""
    return {"inBytes": in_bytes}


def exo_card(card: ModelCard) -> dict[str, Any]:
    """A card as exo's `ModelCard` (camelCase). `backends` is empty: each engine here says
    itself which cards it runs."""
    components = [
        {
            "componentName": c.name,
            "componentPath": f"{c.name}/",
            "storageSize": memory(c.storage_size_bytes),
            "nLayers": c.n_blocks or None,
            "canShard": c.splittable,
            "safetensorsIndexFilename": None,
        }
        for c in card.components
    ]
    vision = card.vision
    return {
        "modelId": card.model_id,
        "storageSize": memory(card.storage_size_bytes),
        "nLayers": card.n_layers,
        "hiddenSize": card.hidden_size,
        "supportsTensor": card.supports_tensor,
        "numKeyValueHeads": card.num_key_value_heads,
        "tasks": [_EXO_TASKS[t.value] for t in card.tasks],
        "components": components or None,
        "family": card.family,
        "quantization": "" if card.quantization == "none" else card.quantization,
        "baseModel": card.base_model,
        "capabilities": [c.value for c in card.capabilities],
        "backends": [],
        "reasoningDialect": card.reasoning_dialect,
        "contextLength": card.context_length or 0,
        "usesCfg": card.uses_cfg,
        "trustRemoteCode": card.trust_remote_code,
        "isCustom": card.custom,
        "vision": None
        if vision is None
        else {
            "imageTokenId": vision.image_token_id,
            "modelType": vision.model_type,
            "weightsRepo": vision.weights_repo,
            "imageToken": vision.image_token,
            "processorRepo": vision.processor_repo,
        },
    }


def _host(address: str) -> list[dict[str, Any]]:
    host, _, port = address.rpartition(":")
    return [{"ip": host, "port": int(port)}] if host and port.isdigit() else []


def exo_instance(instance: Instance, card: ModelCard) -> dict[str, Any]:
    """An instance as exo's `MlxRingInstance` (the ring is the only transport here)."""
    shard_type = f"{EXO_SHARDING[instance.sharding]}ShardMetadata"
    exo_model = exo_card(card)
    runner_to_shard = {
        s.runner_id: {
            shard_type: {
                "modelCard": exo_model,
                "deviceRank": s.rank,
                "worldSize": s.world_size,
                "immediateException": False,
                "shouldTimeout": None,
                "startLayer": s.start_layer,
                "endLayer": s.end_layer,
                "nLayers": card.n_layers,
            }
        }
        for s in instance.shards
    }
    leader = _host(instance.leader.ring_address) if instance.shards else []
    return {
        "MlxRingInstance": {
            "instanceId": instance.instance_id,
            "shardAssignments": {
                "modelId": instance.model_id,
                "runnerToShard": runner_to_shard,
                "nodeToRunner": {s.node_id: s.runner_id for s in instance.shards},
            },
            "hostsByNode": {s.node_id: _host(s.ring_address) for s in instance.shards},
            "ephemeralPort": leader[0]["port"] if leader else 0,
        }
    }
