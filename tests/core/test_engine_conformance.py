"""The engine conformance suite on the scripted engine (engine_mlx runs it in its own tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from exo_core.testing import ECHO, ScriptedEngine
from exo_core.testing.engine_conformance import *  # noqa: F403
from exo_core.testing.engine_conformance import EngineCase


@pytest.fixture
def engine_case(tmp_path: Path) -> EngineCase:
    return EngineCase(engine=ScriptedEngine(delay_s=0.01), card=ECHO, model_path=tmp_path)
