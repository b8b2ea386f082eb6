"""Placing a model by request: `POST /instance`, and `exo -m MODEL` once the node is up.

Both go through `place_model`, so a model placed at start is placed exactly as the native API
would place it (pipeline over as few nodes as fit, the master's choice of nodes).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Protocol

import anyio
from loguru import logger

from exo_core.commands import CommandResult, PlaceInstance
from exo_core.ids import InstanceId, ModelId, NodeId
from exo_core.state import Sharding, State

if TYPE_CHECKING:
    from exo_core.commands import Command
    from exo_core.config import NodeConfig
    from exo_core.model_cards import ModelCard
    from exo_core.replica import Replica


class PlacingNode(Protocol):
    """What placing a model by request uses of the node (the node implements it)."""

    @property
    def config(self) -> NodeConfig: ...
    @property
    def state(self) -> State: ...
    @property
    def replica(self) -> Replica: ...
    def card(self, model_id: str) -> ModelCard | None: ...
    async def wait_reported(self) -> bool: ...
    async def send_command(self, command: Command, timeout: float = 30.0) -> CommandResult: ...


# How long `-m` waits between tries while the cluster has no master to take the command.
RETRY_S = 5.0


async def place_model(
    node: PlacingNode,
    model_id: str,
    sharding: Sharding = "pipeline",
    min_nodes: int = 1,
    instance_id: InstanceId | None = None,
    *,
    node_ids: tuple[NodeId, ...] = (),
    nodes: tuple[NodeId, ...] = (),
    exclude_nodes: tuple[NodeId, ...] = (),
) -> CommandResult:
    """Have the master place an instance of `model_id` (this node's card travels with the
    command, for a master that lacks the plugin the card comes from). `node_ids`: nodes the
    placement must include (exo's field); `nodes`: only these; `exclude_nodes`: never these,
    with this node's `--exclude-node` list added."""
    command = PlaceInstance(
        model_id=ModelId(model_id),
        sharding=sharding,
        min_nodes=min_nodes,
        instance_id=instance_id,
        card=node.card(model_id),
        node_ids=node_ids,
        nodes=nodes,
        exclude_nodes=tuple(
            dict.fromkeys([*exclude_nodes, *(NodeId(n) for n in node.config.exclude_nodes)])
        ),
    )
    await node.wait_reported()  # a node that just started: its engines first
    return await node.send_command(command)


def start_instance_id(model_id: str) -> InstanceId:
    """The id `-m` gives its instance: the same on every node, so that when several nodes of a
    cluster start with the same `-m` at once, the master places the first and refuses the
    others (an id it holds already) instead of placing the model once per node."""
    return InstanceId(f"inst-{hashlib.sha256(model_id.encode()).hexdigest()[:24]}")


def already_placed(state: State, model_id: str) -> bool:
    """Whether the cluster runs an instance of `model_id` already (a restarted node finds the
    one it placed last time in its log, and places no second)."""
    return any(i.model_id == model_id for i in state.instances.values())


async def place_at_start(node: PlacingNode, model_id: str) -> None:
    """`exo -m MODEL`: place MODEL once this node is in a cluster with a master, unless an
    instance of it runs already. A refusal (unknown model, no room) is logged; the node runs on."""
    while True:
        # This node in state first: its view of the cluster (instances placed before it
        # joined) has caught up with the master's by then.
        await node.wait_reported()
        if already_placed(node.state, model_id):
            logger.info(f"-m {model_id}: an instance of it is running already")
            return
        instance_id = start_instance_id(model_id)
        try:
            result = await place_model(node, model_id, instance_id=instance_id)
        except TimeoutError:
            logger.info(f"-m {model_id}: no master yet; trying again in {RETRY_S:.0f}s")
            await anyio.sleep(RETRY_S)
            continue
        if result.ok:
            logger.info(f"-m {model_id}: placed instance {result.instance_id}")
        elif result.status == 409 and await _shows(node, instance_id):
            logger.info(f"-m {model_id}: another node placed it just now")
        else:
            logger.error(f"-m {model_id}: could not place it: {result.message}")
        return


async def _shows(node: PlacingNode, instance_id: InstanceId, timeout: float = 5.0) -> bool:
    """Whether this node's state holds `instance_id` within `timeout` (it may lag the master's)."""
    with anyio.move_on_after(timeout):
        while instance_id not in node.state.instances:
            await node.replica.wait_change()
        return True
    return False
