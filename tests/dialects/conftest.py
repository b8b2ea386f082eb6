"""Fixtures for the dialect suite: real nodes (scripted engine, the three dialect plugins) on
real ports, and the official clients pointed at them."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import ollama
import openai
import pytest

from exo_core.testing.harness import running_node
from exo_core.testing.scripted_engine import ScriptedEnginePlugin

from .support import DIALECTS, Cluster


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    engine = ScriptedEnginePlugin()
    with running_node(tmp_path_factory.mktemp("dialects"), [engine, *DIALECTS]) as node:
        yield Cluster(node, engine)


@pytest.fixture(scope="package")
def slow_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Tokens every 0.2 s, and keep-alives after 0.1 s of silence (10 s in production)."""
    engine = ScriptedEnginePlugin(delay_s=0.2)
    with running_node(
        tmp_path_factory.mktemp("slow"), [engine, *DIALECTS], keepalive_s=0.1
    ) as node:
        yield Cluster(node, engine)


@pytest.fixture
def oai(cluster: Cluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture
def claude(cluster: Cluster) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=cluster.url, api_key="unused", max_retries=0)


@pytest.fixture
def olla(cluster: Cluster) -> ollama.Client:
    return ollama.Client(host=cluster.url)
