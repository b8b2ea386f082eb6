"""Fixtures of the api_openai tests: a real node (the scripted engine and this dialect alone) on
a real port, and the official OpenAI client pointed at it."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

import exo_api_openai.plugin
from exo_core.testing.harness import RunningNode, running_node
from exo_core.testing.scripted_engine import ScriptedEnginePlugin


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    plugins = [ScriptedEnginePlugin(), exo_api_openai.plugin]
    with running_node(tmp_path_factory.mktemp("api_openai"), plugins, dialects=False) as node:
        yield node


@pytest.fixture
def oai(node: RunningNode) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{node.url}/v1", api_key="unused", max_retries=0)
