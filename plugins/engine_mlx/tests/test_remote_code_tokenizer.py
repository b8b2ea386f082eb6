"""A card that trusts its repo's code loads a tokenizer the repo ships as Python (Kimi K2's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exo_engine_mlx.loading import load_model
from exo_engine_mlx.tiny_model import make_tiny_model

OWN_TOKENIZER = """from transformers import PreTrainedTokenizerFast


class OwnTokenizer(PreTrainedTokenizerFast):
    pass
"""


def _model_with_its_own_tokenizer(path: Path) -> Path:
    model = make_tiny_model(path)
    (model / "tokenization_own.py").write_text(OWN_TOKENIZER)
    config_file = model / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "OwnTokenizer"
    config["auto_map"] = {"AutoTokenizer": [None, "tokenization_own.OwnTokenizer"]}
    config_file.write_text(json.dumps(config))
    return model


def test_a_trusted_card_loads_the_repos_own_tokenizer(tmp_path: Path) -> None:
    model = _model_with_its_own_tokenizer(tmp_path / "own")
    _, tokenizer = load_model(str(model), trust_remote_code=True)
    assert type(tokenizer._tokenizer).__name__ == "OwnTokenizer"
    assert tokenizer.encode("hello") == tokenizer._tokenizer.encode("hello")


def test_without_trust_the_repos_code_is_not_run(tmp_path: Path) -> None:
    model = _model_with_its_own_tokenizer(tmp_path / "own")
    with pytest.raises(ValueError, match="custom code"):
        load_model(str(model))
