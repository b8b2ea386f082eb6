"""What a card, a peer's claim or a deletion from the cluster may do on this node. Pure.

The cluster key admits a machine to the cluster; it does not make it the operator of the
others (see docs/security.md). So a member can do no more through the cluster than the HTTP
API of its own node could, and each node decides locally what runs on it:

* a built-in card (a node's own, from its plugins) is never replaced by a card from the
  cluster, on the master (`builtin_card_refusal`) or on any node (the built-in wins there);
* a model's own Python code (`trust_remote_code`) runs only for models this node's operator
  allowed (`--trust-remote-code MODEL`), whatever a card says (`card_to_run`);
* a `local:` source of a card from the cluster resolves inside this node's models
  directories only (`card_to_run`);
* claimed resources must be plausible: available memory within the total, a total that does
  not jump from one report to the next, and within what a machine can have
  (`resources_refusal`);
* a model is in use under every name that reaches its folder (`instances_using`);
* the operator can pin a placement to named nodes and exclude others (`placement_view`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from pathlib import Path, PurePosixPath

import msgspec

from exo_core.ids import InstanceId, ModelId, NodeId
from exo_core.model_cards import ModelCard
from exo_core.state import Instance, NodeResources, State

LOCAL_SOURCE = "local:"
HUB_SOURCE = "hf:"
# More memory than any machine an OS reports today (x86-64 with 5-level paging addresses
# 4 PiB; the largest shipping machines hold tens of TiB): a claim above it is a lie.
MAX_PLAUSIBLE_MEMORY = 64 << 40
# A machine's total memory is fixed while it runs; reports may differ by rounding and by
# memory the kernel reserves (a few %), never by more.
TOTAL_MEMORY_DRIFT = 0.05


class RunRefused(Exception):
    """This node will not run a card as given; the message says why and what to do."""


def builtin_card_refusal(card: ModelCard, builtin: Collection[ModelId]) -> str | None:
    """Why a card from the cluster may not be added: it would replace a built-in card."""
    if card.model_id in builtin:
        return f"{card.model_id} is a built-in model: its card cannot be replaced"
    return None


def _inside(path: Path, roots: Iterable[Path]) -> bool:
    real = path.resolve()
    return any(real != r.resolve() and real.is_relative_to(r.resolve()) for r in roots)


def local_path(source: str, roots: tuple[Path, ...]) -> Path:
    """The directory a cluster card's `local:<dir>` names, inside one of `roots` (the node's
    models directories, the first the default). A relative `<dir>` is looked up in each root;
    an absolute one must lie inside one once symlinks are followed."""
    given = source.removeprefix(LOCAL_SOURCE)
    if not given or not roots:
        raise RunRefused(f"'{source}' names no directory inside this node's models directories")
    path = Path(given)
    if not path.is_absolute():
        parts = PurePosixPath(given).parts
        if ".." in parts:
            raise RunRefused(f"'{source}' leads out of this node's models directories")
        found = [r / path for r in roots if (r / path).exists()]
        path = found[0] if found else roots[0] / path
    if not _inside(path, roots):
        dirs = ", ".join(str(r) for r in roots)
        raise RunRefused(
            f"'{source}' is outside this node's models directories ({dirs}): a card from the "
            "cluster may only name a model directory inside them"
        )
    return path


def card_to_run(
    card: ModelCard,
    *,
    own: bool,
    roots: tuple[Path, ...],
    remote_code: Collection[str],
) -> ModelCard:
    """The card as this node runs it, or `RunRefused`.

    `own`: the card is this node's own (a plugin's card, which its operator installed), not
    one that came through the cluster. `remote_code`: the models whose own Python code this
    node's operator allows (`--trust-remote-code`)."""
    allowed = card.model_id in remote_code
    if card.trust_remote_code and not allowed:
        raise RunRefused(
            f"{card.model_id} asks to run the model's own Python code (trust_remote_code); "
            f"this node runs it only for models its operator allows: start exo with "
            f"--trust-remote-code {card.model_id} to allow it"
        )
    source = card.source
    if source.startswith(LOCAL_SOURCE) and not own:
        source = LOCAL_SOURCE + str(local_path(source, roots))
    if source == card.source and allowed == card.trust_remote_code:
        return card
    return msgspec.structs.replace(card, source=source, trust_remote_code=allowed)


def resources_refusal(previous: NodeResources | None, claimed: NodeResources) -> str | None:
    """Why a node's report of its own resources is not plausible, or None.

    Placement trusts these numbers, so a member that inflates them attracts every model (and
    the prompts sent to it). What a machine can have bounds them; the node's earlier reports
    bound how they change."""
    fields = {
        "memory_total": claimed.memory_total,
        "memory_available": claimed.memory_available,
        "disk_total": claimed.disk_total,
        "disk_available": claimed.disk_available,
        "cpu_count": claimed.cpu_count,
    }
    negative = [name for name, value in fields.items() if value < 0]
    if negative:
        return f"negative {', '.join(negative)}"
    if claimed.memory_total > MAX_PLAUSIBLE_MEMORY:
        return f"memory_total {claimed.memory_total} is more than any machine has"
    if claimed.memory_available > claimed.memory_total:
        return (
            f"memory_available {claimed.memory_available} exceeds memory_total "
            f"{claimed.memory_total}"
        )
    if claimed.disk_available > claimed.disk_total:
        return f"disk_available {claimed.disk_available} exceeds disk_total {claimed.disk_total}"
    if previous is not None and previous.memory_total > 0:
        change = abs(claimed.memory_total - previous.memory_total) / previous.memory_total
        if change > TOTAL_MEMORY_DRIFT:
            return (
                f"memory_total jumped from {previous.memory_total} to {claimed.memory_total}: "
                "a machine's memory does not change while it runs (a machine that got more "
                "memory is a new node to the cluster once it was gone for the node timeout)"
            )
    return None


def folder_name(name: str) -> str:
    """The directory a model or repo id becomes below a models directory (`org/name` is
    `org--name`, as exo has always named them)."""
    return name.replace("/", "--")


def folder_names(
    instance: Instance, card: ModelCard | None, state: State, node: NodeId
) -> set[str]:
    """Every directory name under which `instance`'s model may be on disk at `node`: its id,
    its hub repo's, and the directories that node reported for it (a download's path, the
    folder its runner loaded)."""
    names = {folder_name(instance.model_id)}
    if card is not None and card.source.startswith(HUB_SOURCE):
        names.add(folder_name(card.source.removeprefix(HUB_SOURCE).partition("@")[0]))
    download = state.downloads.get(node, {}).get(instance.model_id)
    paths = [download.path if download is not None else None]
    shard = instance.shard_on(node)
    if shard is not None and (runner := state.runners.get(shard.runner_id)) is not None:
        paths.append(runner.model_path)
    names.update(PurePosixPath(p).name for p in paths if p)
    return names


def instances_using(
    state: State, node: NodeId, name: str, card: Callable[[ModelId], ModelCard | None]
) -> list[InstanceId]:
    """The instances on `node` whose model a deletion naming `name` would reach: by model id,
    by folder name, or by the hub repo of the card it names (an alias)."""
    wanted = {folder_name(name)}
    named = card(ModelId(name))
    if named is not None and named.source.startswith(HUB_SOURCE):
        wanted.add(folder_name(named.source.removeprefix(HUB_SOURCE).partition("@")[0]))
    return [
        i.instance_id
        for i in state.instances.values()
        if i.shard_on(node) is not None
        and (i.model_id == name or folder_names(i, card(i.model_id), state, node) & wanted)
    ]


def placement_view(
    state: State, only: Collection[NodeId] = (), exclude: Collection[NodeId] = ()
) -> State:
    """State as placement may see it: only the nodes named in `only` (all when empty), none
    of those in `exclude`."""
    if not only and not exclude:
        return state
    nodes = {
        node_id: info
        for node_id, info in state.nodes.items()
        if (not only or node_id in only) and node_id not in exclude
    }
    return msgspec.structs.replace(state, nodes=nodes)
