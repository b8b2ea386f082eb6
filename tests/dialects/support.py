"""Helpers the dialect tests share."""

from __future__ import annotations

from dataclasses import dataclass

import exo_api_claude.plugin
import exo_api_ollama.plugin
import exo_api_openai.plugin
from exo_core.testing.harness import RunningNode
from exo_core.testing.scripted_engine import ScriptedEnginePlugin

DIALECTS = [exo_api_openai.plugin, exo_api_claude.plugin, exo_api_ollama.plugin]


@dataclass
class Cluster:
    node: RunningNode
    engine: ScriptedEnginePlugin

    @property
    def url(self) -> str:
        return self.node.url

    def cancellations(self) -> int:
        return sum(len(r._cancelled) for r in self.engine.engine.runners)

    def tasks(self) -> int:
        return len(self.node.node.state.tasks)
