"""A model a running instance uses is not deleted under any name that reaches its folder:
its id, its folder's name, its hub repo; asked on the node that holds it, from another node,
or by a peer's command straight to the master (issue 25, finding 4)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import exo_download_hf.plugin as download_plugin
from exo_core.commands import DeleteDownload
from exo_core.events import InstanceCreated, RunnerStatusChanged
from exo_core.ids import InstanceId, ModelId, NodeId, RunnerId
from exo_core.state import Instance, RunnerInfo, RunnerStatus, ShardAssignment
from exo_core.testing.harness import RunningCluster, RunningNode, running_cluster
from exo_download_hf.testing import HubEnginePlugin, TinyCardPlugin, tiny_hub

MODEL = "org/tiny"
FOLDER = "SmolLM2-135M-Instruct-Q4_1-mlx"


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[RunningCluster]:
    plugins = lambda i: [download_plugin, HubEnginePlugin(), TinyCardPlugin()]  # noqa: E731
    # No workers: the state says what runs where (a worker would start a runner of its own).
    with tiny_hub(monkeypatch), running_cluster(tmp_path, 2, plugins, worker=False) as c:
        yield c


def running_on(cluster: RunningCluster, holder: RunningNode) -> Path:
    """An instance of the tiny model on `holder`, whose runner loads it from a folder that is
    not named after the model (as an engine's converted model is); returns the folder."""
    folder = Path(holder.node.config.models_dir) / FOLDER
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    shard = ShardAssignment(
        node_id=NodeId(holder.node_id), runner_id=RunnerId("r0"), rank=0, world_size=1,
        start_layer=0, end_layer=1,
    )  # fmt: skip
    instance = Instance(
        instance_id=InstanceId("inst"), model_id=ModelId(MODEL), sharding="pipeline",
        shards=(shard,),
    )  # fmt: skip
    runner = RunnerInfo(
        runner_id=RunnerId("r0"), instance_id=InstanceId("inst"), node_id=NodeId(holder.node_id),
        status=RunnerStatus.READY, model_path=str(folder),
    )  # fmt: skip
    master = next(n.node for n in cluster.nodes if n.node.master is not None)
    assert master.master is not None
    events = [InstanceCreated(instance=instance), RunnerStatusChanged(runner=runner)]
    cluster.nodes[0].call(master.master.commit, events)
    cluster.wait(lambda: all("r0" in n.node.state.runners for n in cluster.nodes))
    return folder


@pytest.mark.parametrize("name", [MODEL, "org--tiny", FOLDER])
def test_a_model_in_use_is_not_deleted_by_any_of_its_names(
    cluster: RunningCluster, name: str
) -> None:
    holder, other = cluster.nodes
    folder = running_on(cluster, holder)
    for asker in (holder, other):  # locally, and from another node
        answer = httpx.delete(f"{asker.url}/download/{holder.node_id}/{name}")
        assert answer.status_code == 409, answer.text
        assert "in use" in answer.json()["detail"] and "inst" in answer.json()["detail"]
    # A peer's command straight to the master is refused as well.
    command = DeleteDownload(node_id=NodeId(holder.node_id), model_id=ModelId(name))
    result = other.call(other.node.send_command, command)
    assert result.status == 409, result
    assert (folder / "model.safetensors").exists()
