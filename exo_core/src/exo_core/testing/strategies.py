"""Hypothesis strategies for events over small id pools, so that events collide and interact."""

from __future__ import annotations

from hypothesis import strategies as st

from exo_core.events import (
    DownloadDeleted,
    DownloadProgressed,
    Event,
    InstanceCreated,
    InstanceDeleted,
    MasterElected,
    ModelCardAdded,
    ModelCardRemoved,
    NodeTelemetry,
    NodeTimedOut,
    RunnerStatusChanged,
    TaskCreated,
    TaskStatusChanged,
    TopologyReported,
)
from exo_core.generation import ChatMessage, GenerationParams
from exo_core.ids import InstanceId, ModelId, NodeId, RunnerId, TaskId
from exo_core.model_cards import ModelCard
from exo_core.state import (
    DownloadProgress,
    DownloadStatus,
    Instance,
    NodeResources,
    RunnerInfo,
    RunnerStatus,
    ShardAssignment,
    Task,
    TaskStatus,
)

nodes = st.sampled_from([NodeId(f"n{i}") for i in range(3)])
models = st.sampled_from([ModelId(f"m{i}") for i in range(2)])
instances = st.sampled_from([InstanceId(f"i{i}") for i in range(3)])
tasks = st.sampled_from([TaskId(f"t{i}") for i in range(4)])
small = st.integers(min_value=0, max_value=1 << 40)
text = st.text(max_size=20)

resources = st.builds(
    NodeResources,
    memory_total=small,
    memory_available=small,
    cpu_count=st.integers(0, 64),
    cpu_percent=st.floats(0, 100),
    engines=st.lists(st.sampled_from(["mlx", "scripted"]), max_size=2).map(tuple),
)
cards = st.builds(
    ModelCard,
    model_id=models,
    family=st.just("llama"),
    n_layers=st.integers(1, 80),
    hidden_size=st.integers(1, 8192),
    storage_size_bytes=small,
)


@st.composite
def instance(draw: st.DrawFn) -> Instance:
    instance_id = draw(instances)
    members = draw(st.lists(nodes, min_size=1, max_size=3, unique=True))
    shards = tuple(
        ShardAssignment(
            node_id=n,
            runner_id=RunnerId(f"{instance_id}-r{k}"),
            rank=k,
            world_size=len(members),
            start_layer=k,
            end_layer=k + 1,
        )
        for k, n in enumerate(members)
    )
    return Instance(
        instance_id=instance_id, model_id=draw(models), sharding="pipeline", shards=shards
    )


@st.composite
def runner(draw: st.DrawFn) -> RunnerInfo:
    instance_id = draw(instances)
    return RunnerInfo(
        runner_id=RunnerId(f"{instance_id}-r{draw(st.integers(0, 2))}"),
        instance_id=instance_id,
        node_id=draw(nodes),
        status=draw(st.sampled_from(list(RunnerStatus))),
        error=draw(st.none() | text),
    )


@st.composite
def task(draw: st.DrawFn) -> Task:
    return Task(
        task_id=draw(tasks),
        instance_id=draw(instances),
        model_id=draw(models),
        origin_node=draw(nodes),
        params=GenerationParams(messages=(ChatMessage(role="user", content=draw(text)),)),
    )


progress = st.builds(
    DownloadProgress,
    node_id=nodes,
    model_id=models,
    status=st.sampled_from(list(DownloadStatus)),
    downloaded_bytes=small,
    total_bytes=small,
)

events: st.SearchStrategy[Event] = st.one_of(
    st.builds(MasterElected, node_id=nodes, term=st.integers(1, 9)),
    st.builds(
        NodeTelemetry,
        node_id=nodes,
        hostname=text,
        resources=resources,
        timestamp=st.floats(0, 2e9),
    ),
    st.builds(NodeTimedOut, node_id=nodes),
    st.builds(TopologyReported, node_id=nodes, peers=st.lists(nodes, max_size=3).map(tuple)),
    st.builds(ModelCardAdded, card=cards),
    st.builds(ModelCardRemoved, model_id=models),
    st.builds(DownloadProgressed, progress=progress),
    st.builds(DownloadDeleted, node_id=nodes, model_id=models),
    st.builds(InstanceCreated, instance=instance()),
    st.builds(InstanceDeleted, instance_id=instances, reason=text),
    st.builds(RunnerStatusChanged, runner=runner()),
    st.builds(TaskCreated, task=task()),
    st.builds(
        TaskStatusChanged,
        task_id=tasks,
        status=st.sampled_from(list(TaskStatus)),
        error=st.none() | text,
    ),
)
