"""Every family the engine says it splits: a 2-rank group gives the same greedy tokens as one
rank, pipeline (uneven layers, 1 + 3) and tensor where mlx-lm has shard().

The cases come from `exo_engine_mlx.families` (what placement is told), so a family that
placement would split and the engine cannot fails here. ONE pair of rank processes on a real
`mx.distributed` ring loops over every case (`family_sweep.run_sweep`); each rank loads its
part with the engine's `load_model(path, ShardPlan(...))` and generates with a `BatchEngine`.
The one-rank texts are shared with test_every_family (session fixture). Real runner
subprocesses (the runner's own group loop) are tested on representatives in
test_family_groups.py.
"""

from __future__ import annotations

import pytest

from exo_engine_mlx.families import all_model_types, family_support
from exo_engine_mlx.family_sweep import Case, CaseResult, TinyFamilies, run_sweep
from exo_engine_mlx.tiny_unbuildable import UNBUILDABLE

pytestmark = pytest.mark.slow

CASES = [
    (t, s)
    for t in all_model_types()
    for s, splits in (
        ("pipeline", family_support(t).pipeline is not None),
        ("tensor", family_support(t).tensor),
    )
    if splits and family_support(t).runs
]


def _selected(request: pytest.FixtureRequest) -> list[tuple[str, str]]:
    """The cases this session runs (all of them, or those `-k` picks), in table order."""
    picked = {
        (item.callspec.params["model_type"], item.callspec.params["sharding"])
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.module is request.module
        and hasattr(item, "callspec")
    }
    return [case for case in CASES if case in picked]


@pytest.fixture(scope="module")
def sweep(request: pytest.FixtureRequest, tiny_families: TinyFamilies) -> dict[str, CaseResult]:
    cases: list[Case] = []
    failed: dict[str, CaseResult] = {}
    for model_type, sharding in _selected(request):
        if model_type in UNBUILDABLE:
            continue
        try:
            path = tiny_families.path(model_type)
        except Exception as e:  # reported by its own case; the others still run
            failed[f"{model_type}/{sharding}"] = CaseResult(error=f"no tiny model: {e!r}")
            continue
        cases.append(Case(model_type, sharding, str(path)))  # type: ignore[arg-type]
    return {**run_sweep(cases, timeout_s=900), **failed}


@pytest.mark.parametrize(("model_type", "sharding"), CASES, ids=[f"{t}-{s}" for t, s in CASES])
def test_two_ranks_equal_one(
    sweep: dict[str, CaseResult], tiny_families: TinyFamilies, model_type: str, sharding: str
) -> None:
    if model_type in UNBUILDABLE:
        pytest.skip(f"no tiny {model_type}: {UNBUILDABLE[model_type]}")
    result = sweep[f"{model_type}/{sharding}"]
    assert not result.error, result.error
    one = tiny_families.one_rank(model_type).generated.text
    assert one, "the one-rank reference generated nothing"
    assert result.text == one
