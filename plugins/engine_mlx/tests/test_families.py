"""What the engine says it can split, and that its README's table says the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from exo_engine_mlx.families import family_support, markdown_table
from exo_engine_mlx.tiny_model import TINY_FAMILIES

README = Path(__file__).parents[1] / "README.md"


def test_the_readme_table_is_the_generated_one() -> None:
    text = README.read_text()
    start = text.index("<!-- families:start -->\n") + len("<!-- families:start -->\n")
    end = text.index("<!-- families:end -->")
    assert text[start:end] == markdown_table(), (
        "regenerate: uv run python -m exo_engine_mlx.families"
    )


@pytest.mark.parametrize(
    ("model_type", "pipeline", "tensor"),
    [
        ("llama", "layers", True),
        ("mistral", "layers", True),  # an alias of llama in mlx-lm
        ("qwen3_moe", "mlx-lm", True),
        ("kimi_k2", "mlx-lm", True),  # an alias of deepseek_v3
        ("qwen3_next", "mlx-lm", False),
        ("gpt_oss", None, True),
        ("minimax_m2", None, True),
    ],
)
def test_support_per_family(model_type: str, pipeline: str | None, tensor: bool) -> None:
    support = family_support(model_type)
    assert support.runs and (support.pipeline, support.tensor) == (pipeline, tensor)


def test_refusals_say_why() -> None:
    assert family_support("qwen3_moe").refusal("pipeline") is None
    gpt = family_support("gpt_oss").refusal("pipeline")
    assert gpt is not None and gpt.startswith("gpt_oss: pipeline parallel")
    nxt = family_support("qwen3_next").refusal("tensor")
    assert nxt is not None and "shard()" in nxt
    unknown = family_support("no_such_model").refusal("pipeline")
    assert unknown is not None and "cannot load" in unknown


def test_every_tiny_family_the_tests_split_is_one_the_engine_says_it_splits() -> None:
    for model_type in TINY_FAMILIES:
        assert family_support(model_type).pipeline is not None, model_type
