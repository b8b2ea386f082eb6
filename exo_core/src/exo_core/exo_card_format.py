"""Reading model cards written in exo's own card format, so its card files drop in unchanged.

exo's cards (`resources/inference_model_cards/*.toml` there) keep the size in a
`[storage_size] in_bytes` table, name tasks in CamelCase (`TextGeneration`, `TextToImage`,
`ImageToImage`), and carry fields this project keeps elsewhere or not at all (backends).
`from_exo_card` maps the fields with a meaning here (image components, sampling defaults,
the reasoning dialect, the CFG flag and the `[vision]` table included) and leaves the rest
out (`backends`: every engine here says itself what it runs), so a card reads the same model
either way.
"""

from __future__ import annotations

from typing import Any

from exo_core.sampling_defaults import from_exo_table

_TASKS = {
    "TextGeneration": "text_generation",
    "TextToImage": "image_generation",
    "ImageToImage": "image_edit",
}
_CAPABILITIES = {
    "text",
    "thinking",
    "thinking_toggle",
    "tools",
    "vision",
    "image_edit",
    "code",
    "image_gen",
}
_KEPT = ("model_id", "family", "n_layers", "hidden_size", "num_key_value_heads", "base_model")


def is_exo_card(data: dict[str, Any]) -> bool:
    """exo's format has its size in a table; ours has `storage_size_bytes`."""
    return isinstance(data.get("storage_size"), dict) and "storage_size_bytes" not in data


def from_exo_card(data: dict[str, Any]) -> dict[str, Any]:
    """The fields of an exo card, as this project's card fields (validated by the caller)."""
    card: dict[str, Any] = {key: data[key] for key in _KEPT if key in data}
    card["storage_size_bytes"] = data["storage_size"].get("in_bytes")
    card["quantization"] = data.get("quantization") or "none"
    card["supports_tensor"] = bool(data.get("supports_tensor", False))
    card["source"] = f"hf:{data.get('model_id', '')}"
    card.update(_model_facts(data))
    tasks = [str(t) for t in data.get("tasks", ["TextGeneration"])]
    unknown = [t for t in tasks if t not in _TASKS]
    if unknown:
        raise ValueError(f"tasks: unknown task {unknown[0]!r} (known: {', '.join(_TASKS)})")
    card["tasks"] = list(dict.fromkeys(_TASKS[t] for t in tasks))
    capabilities = [c for c in data.get("capabilities", ["text"]) if c in _CAPABILITIES]
    if "ImageToImage" in tasks and "image_edit" not in capabilities:
        capabilities.append("image_edit")
    card["capabilities"] = capabilities
    components = [_component(c) for c in data.get("components", [])]
    if components:
        card["components"] = components
    card.update(from_exo_table(data.get("sampling_defaults")))
    return card


def _model_facts(data: dict[str, Any]) -> dict[str, Any]:
    """exo's context length (0 there: unknown), reasoning dialect, CFG flag and `[vision]`
    table, where the card gives them."""
    facts: dict[str, Any] = {}
    if data.get("context_length"):
        facts["context_length"] = data["context_length"]
    for key in ("reasoning_dialect", "uses_cfg"):
        if key in data:
            facts[key] = data[key]
    vision = data.get("vision")
    if isinstance(vision, dict):
        # exo fills an empty weights repo with the model's own; so does this project.
        facts["vision"] = {**vision, "weights_repo": vision.get("weights_repo") or data["model_id"]}
    return facts


def _component(data: dict[str, Any]) -> dict[str, Any]:
    """An exo `[[components]]` entry as a `ModelComponent` (its path is the engine's concern)."""
    size = data.get("storage_size")
    return {
        "name": data.get("component_name"),
        "storage_size_bytes": size.get("in_bytes") if isinstance(size, dict) else None,
        "splittable": bool(data.get("can_shard", False)),
        "n_blocks": int(data.get("n_layers") or 0),
    }
