"""Families with a layer stack that the engine's pipeline cannot cut, and why (read from the
family's mlx-lm code). `families.family_support` shows the reason in the README's table and
in placement's refusal; an entry goes once the family splits (test_families checks that no
entry names a family that splits)."""

from __future__ import annotations

# model_type (mlx-lm's module name) -> why no pipeline split, in a phrase.
WHY_NO_PIPELINE: dict[str, str] = {
    "iquestloopcoder": (
        "its forward runs the whole layer stack twice (the second loop reads the first "
        "loop's keys and values of each layer), so the hidden state would have to go round "
        "the ranks twice; the engine passes it one way, first rank to last"
    ),
}
