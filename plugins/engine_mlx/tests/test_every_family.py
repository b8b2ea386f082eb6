"""Every architecture of the engine's README table: its tiny model (built from mlx-lm's own
class, read back by the engine's `load_model`) generates with a `BatchEngine` on one rank, and
placement refuses exactly the splits the engine cannot run.

The rows come from `exo_engine_mlx.families` (the code that writes the table), so a family
mlx-lm adds is tested, or fails here until it has a tiny config (`tiny_configs/`) or a reason
in `tiny_unbuildable.UNBUILDABLE`. In-process, one model at a time: the whole table takes
about a minute.
"""

from __future__ import annotations

import pytest

from exo_core.plugin import FinishChunk, Sharding
from exo_engine_mlx.engine import MlxEngine
from exo_engine_mlx.families import all_model_types, family_support
from exo_engine_mlx.family_sweep import TinyFamilies, tiny_card
from exo_engine_mlx.tiny_unbuildable import UNBUILDABLE

ROWS = [t for t in all_model_types() if family_support(t).runs]


def test_the_table_has_every_family() -> None:
    # The README's 137 rows (mlx-lm 0.32): a broken import path would shrink it silently.
    assert len(ROWS) >= 130
    assert {"llama", "qwen3_moe", "deepseek_v3", "gpt_oss", "nemotron_h"} <= set(ROWS)
    # mlx-lm cannot batch their caches; the engine serves them one cache per request
    assert {"llama4", "deepseek_v41", "deepseek_v41_text"} <= set(ROWS)


def test_every_unbuildable_entry_is_a_row() -> None:
    assert set(UNBUILDABLE) <= set(ROWS), "an entry names no row of the table"


@pytest.mark.parametrize("model_type", ROWS)
def test_the_family_generates_on_one_rank(model_type: str, tiny_families: TinyFamilies) -> None:
    if model_type in UNBUILDABLE:
        pytest.skip(f"no tiny {model_type}: {UNBUILDABLE[model_type]}")
    one = tiny_families.one_rank(model_type)
    assert isinstance(one.generated.final, FinishChunk), one.generated.final
    assert one.generated.text, "the tiny model generated nothing"
    # What the table (read from mlx-lm's modules) says is what the loaded model does.
    support = family_support(model_type)
    assert (one.pipeline is None) == (support.pipeline is None), one.pipeline
    assert (one.pipeline == "mlx-lm") == (support.pipeline == "mlx-lm"), one.pipeline
    # (a family whose shard() cannot give one rank's result is refused, and says why)
    assert one.tensor == (support.tensor or bool(support.why_no_tensor))


@pytest.mark.parametrize("model_type", ROWS)
def test_placement_refuses_exactly_what_the_engine_cannot_split(model_type: str) -> None:
    engine = MlxEngine()
    support = family_support(model_type)
    card = tiny_card(model_type)
    shardings: tuple[tuple[Sharding, bool], ...] = (
        ("pipeline", support.pipeline is not None),
        ("tensor", support.tensor),
    )
    for sharding, splits in shardings:
        refusal = engine.sharding_refusal(card, sharding, 2)
        assert (refusal is None) == splits, (sharding, refusal)
        assert refusal is None or refusal.startswith(f"{model_type}: "), refusal
        assert engine.sharding_refusal(card, sharding, 1) is None  # one node runs every family
