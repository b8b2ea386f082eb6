"""Model cards and the model directories they name: loading cards, checking a model id and
finding (or removing) a model's files."""

from __future__ import annotations

from exo_core.catalogue import load_catalogue
from exo_core.model_cards import card_config_problem, load_card_file
from exo_core.paths import (
    check_model_id,
    is_safe_model_id,
    model_id_problem,
    model_path,
    remove_model_dir,
)
from exo_core.trust import instances_using

__all__ = [
    "card_config_problem",
    "check_model_id",
    "instances_using",
    "is_safe_model_id",
    "load_card_file",
    "load_catalogue",
    "model_id_problem",
    "model_path",
    "remove_model_dir",
]
