"""Fixtures of the api_claude tests: a real node (the scripted engine and this dialect alone) on
a real port, and the official Anthropic client pointed at it."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import pytest

import exo_api_claude.plugin
from exo_core.testing.harness import RunningNode, running_node
from exo_core.testing.scripted_engine import ScriptedEnginePlugin


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    plugins = [ScriptedEnginePlugin(), exo_api_claude.plugin]
    with running_node(tmp_path_factory.mktemp("api_claude"), plugins, dialects=False) as node:
        yield node


@pytest.fixture
def claude(node: RunningNode) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=node.url, api_key="unused", max_retries=0)
