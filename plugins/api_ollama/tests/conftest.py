"""Fixtures of the api_ollama tests: a real node (the scripted engine and this dialect alone) on
a real port, and the official Ollama client pointed at it."""

from __future__ import annotations

from collections.abc import Iterator

import ollama
import pytest

import exo_api_ollama.plugin
from exo_core.testing.harness import RunningNode, running_node
from exo_core.testing.scripted_engine import ScriptedEnginePlugin


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    plugins = [ScriptedEnginePlugin(), exo_api_ollama.plugin]
    with running_node(tmp_path_factory.mktemp("api_ollama"), plugins, dialects=False) as node:
        yield node


@pytest.fixture
def olla(node: RunningNode) -> ollama.Client:
    return ollama.Client(host=node.url)
