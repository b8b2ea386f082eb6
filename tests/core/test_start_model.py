"""`exo -m MODEL`: the model is placed once the node is up, once per cluster."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from loguru import logger

from exo_core.start_model import start_instance_id
from exo_core.testing.harness import running_cluster, running_node
from exo_core.testing.processes import wait_until
from exo_core.testing.scripted_engine import ScriptedEnginePlugin


@pytest.fixture
def said() -> Iterator[list[str]]:
    """What the nodes log, line by line."""
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="INFO")
    yield lines
    logger.remove(sink)


def _about(lines: list[str], model: str) -> list[str]:
    return [line for line in lines if f"-m {model}:" in line]


def test_several_nodes_started_with_the_same_model_place_it_once(
    tmp_path: Path, said: list[str]
) -> None:
    plugins = lambda i: [ScriptedEnginePlugin()]  # noqa: E731
    with running_cluster(tmp_path, 3, plugins, start_model="scripted-echo") as cluster:
        # Every node's attempt is answered: placed, or refused as placed already.
        cluster.wait(lambda: len(_about(said, "scripted-echo")) == 3, timeout=30)
        cluster.wait(cluster.converged)
        state = cluster.nodes[0].node.state
        assert list(state.instances) == [start_instance_id("scripted-echo")]
        assert sum("placed instance" in line for line in _about(said, "scripted-echo")) == 1


def test_an_unknown_model_is_reported_and_the_node_runs_on(tmp_path: Path, said: list[str]) -> None:
    with running_node(tmp_path, [ScriptedEnginePlugin()], start_model="no-such-model") as n:
        wait_until(lambda: _about(said, "no-such-model"), timeout=30)
        assert "could not place it" in _about(said, "no-such-model")[0]
        assert not n.node.state.instances
        assert not n.future.done()
