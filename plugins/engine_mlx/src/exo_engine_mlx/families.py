"""What the engine can do with each model architecture mlx-lm runs, read from mlx-lm's code.

For a `model_type` (the `model_type` of a model's config.json, which names its module in
`mlx_lm.models`), `family_support` says how the engine splits it: a pipeline through mlx-lm's
own `pipeline()` ("mlx-lm"), through the engine's layer slicing ("layers"), or not at all; and
whether mlx-lm can shard it tensor-parallel (`shard()`). Nothing is listed by hand, so a new
mlx-lm release brings its new families with it. `python -m exo_engine_mlx.families` prints the
table the plugin's README shows.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import pkgutil
from dataclasses import dataclass
from functools import cache

from exo_engine_mlx.distributed.slicing_families import PIPELINE_MODEL_TYPES, SLICED_MODEL_TYPES
from exo_engine_mlx.distributed.slicing_hybrid import OWN_PIPELINE
from exo_engine_mlx.tiny_unbuildable import UNBUILDABLE


@dataclass(frozen=True)
class FamilySupport:
    model_type: str
    runs: bool
    pipeline: str | None  # "mlx-lm", "layers" or None
    tensor: bool
    why_not: str = ""  # why the architecture does not run at all
    why_no_pipeline: str = ""  # why its layer stack cannot be cut, where known
    why_no_tensor: str = ""  # why its shard() gives wrong results, where it has one

    def refusal(self, sharding: str, ranks: int = 2) -> str | None:
        """Why a placement with `sharding` over `ranks` nodes cannot run, or None."""
        if not self.runs:  # on one node too: a card may name a family mlx-lm lacks
            return f"{self.model_type}: {self.why_not}"
        if ranks <= 1:
            return None  # one node runs every architecture mlx-lm runs
        if sharding == "pipeline" and self.pipeline is None:
            why = f" ({self.why_no_pipeline})" if self.why_no_pipeline else ""
            return f"{self.model_type}: pipeline parallel is not supported here{why}"
        if sharding == "tensor" and not self.tensor:
            if self.why_no_tensor:
                return f"{self.model_type}: tensor parallel is not supported here ({self.why_no_tensor})"
            return f"{self.model_type}: tensor parallel needs mlx-lm's shard(), which it lacks"
        return None


# Families with a layer stack the engine cannot cut, and why, read from the family's mlx-lm
# code (model_type, mlx-lm's module name -> a phrase): the README table's pipeline cell and
# placement's refusal say it. A family without an entry and without a tiny model that runs
# here says why it was not tried (`tiny_unbuildable`); test_families checks every "no" says why.
WHY_NO_PIPELINE: dict[str, str] = {}

# Families whose mlx-lm shard() exists but cannot give the one-rank result (mlx-lm's module
# name -> why): placement refuses their tensor splits with the reason.
WHY_NO_TENSOR: dict[str, str] = {
    "prism_hadamard_qwen35": (
        "mlx.nn's shard_linear rebuilds its Hadamard layers as plain quantized ones, dropping "
        "their input rotation, and shard() splits the row-parallel layers' 128-groups as if "
        "the pack were any quantized model"
    ),
}


def _why_no_pipeline(model_type: str) -> str:
    why = WHY_NO_PIPELINE.get(module_name(model_type))
    if why is not None:
        return why
    if model_type in UNBUILDABLE:
        return "not tried: no tiny model of it runs on this machine (tiny_unbuildable.py says why)"
    return ""


def module_name(model_type: str) -> str:
    """The mlx-lm module that runs `model_type` (some types are aliases: kimi_k2, mistral)."""
    from mlx_lm.utils import MODEL_REMAPPING

    return MODEL_REMAPPING.get(model_type, model_type)


@cache
def family_support(model_type: str) -> FamilySupport:
    name = module_name(model_type)
    try:
        # Some modules print install hints on import: keep them out of our output.
        with contextlib.redirect_stdout(io.StringIO()):
            module = importlib.import_module(f"mlx_lm.models.{name}")
    except (Exception, SystemExit) as e:  # a module that needs a package not installed here
        missing = isinstance(e, ModuleNotFoundError) and e.name == f"mlx_lm.models.{name}"
        why = (
            "mlx-lm cannot load it: the installed mlx-lm has no model for this architecture"
            if missing
            else f"mlx-lm cannot load it ({e!r})"
        )
        return FamilySupport(model_type, False, None, False, why)
    model = getattr(module, "Model", None)
    if model is None:
        return FamilySupport(model_type, False, None, False, "mlx-lm has no model class for it")
    from mlx_lm.models.pipeline import PipelineMixin

    # The module's model stack carries mlx-lm's PipelineMixin (defined there or imported, or
    # in the module of a model class it extends, as qwen3_5_moe extends qwen3_5, or in the
    # text family a multimodal wrapper imports, as qwen2_vl builds a qwen2 model); the runner
    # finds that part at load time (`distributed.pipeline._mixin_part`). A wrapper the engine
    # slices itself (mistral3: a llama text model mostly, ministral3 in some) is "layers".
    sliced = name in PIPELINE_MODEL_TYPES or name in SLICED_MODEL_TYPES
    modules = {inspect.getmodule(cls) for cls in inspect.getmro(model)} - {None}
    if not sliced:
        modules |= {
            obj
            for obj in vars(module).values()
            if inspect.ismodule(obj) and obj.__name__.startswith("mlx_lm.models.")
        }
    mixin = name in OWN_PIPELINE or any(
        inspect.isclass(obj) and issubclass(obj, PipelineMixin) and obj is not PipelineMixin
        for m in modules
        for obj in vars(m).values()
    )
    pipeline = "mlx-lm" if mixin else "layers" if sliced else None
    why_no_tensor = WHY_NO_TENSOR.get(name, "")
    tensor = callable(getattr(model, "shard", None)) and not why_no_tensor
    why = _why_no_pipeline(model_type) if pipeline is None else ""
    return FamilySupport(
        model_type, True, pipeline, tensor, why_no_pipeline=why, why_no_tensor=why_no_tensor
    )


def all_model_types() -> list[str]:
    """Every model_type mlx-lm knows: its model modules and their aliases."""
    import mlx_lm.models
    from mlx_lm.utils import MODEL_REMAPPING

    skip = {"base", "cache", "pipeline", "rope_utils", "switch_layers", "activations"}
    modules = {
        m.name
        for m in pkgutil.iter_modules(mlx_lm.models.__path__)
        if m.name not in skip and not m.name.startswith("_")
    }
    return sorted(modules | set(MODEL_REMAPPING), key=str.lower)


def markdown_table() -> str:
    names = {"mlx-lm": "yes (mlx-lm's pipeline)", "layers": "yes (layer slicing)", None: "no"}
    rows = ["| architecture | pipeline | tensor |", "|---|---|---|"]
    for model_type in all_model_types():
        s = family_support(model_type)
        if s.runs:
            alias = module_name(model_type)
            shown = f"`{model_type}`" + (f" (as `{alias}`)" if alias != model_type else "")
            pipeline = names[s.pipeline] + (f": {s.why_no_pipeline}" if s.why_no_pipeline else "")
            tensor = (
                "yes" if s.tensor else "no" + (f": {s.why_no_tensor}" if s.why_no_tensor else "")
            )
            rows.append(f"| {shown} | {pipeline} | {tensor} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
