"""What a peer may say: every message bound to its authenticated sender and to its role. Pure.

The transport tells who sent each message (libp2p: the noise handshake for requests, signed
gossip for broadcasts; the cluster key keeps machines without it off the network altogether).
These checks bind what a message claims to that sender:

* a campaign, a replication ack, a vote request and a command speak for their sender only;
* a report carries facts about its sender only: its telemetry, topology, downloads, its own
  runners, and the status of tasks it runs as rank 0; and its telemetry must be plausible
  (`exo_core.trust.resources_refusal`: placement trusts it);
* generated chunks come only from rank 0 of the task's instance;
* a master's claim counts only when the votes of its term back it (`master_claim_backed`),
  and nobody votes while it follows (or is) a live master: a peer's claims cannot depose a
  working master;
* candidates are ranked among members (nodes in the replicated state), so an outsider that
  claims forced mastership cannot make the members wait for it, no candidate copies an
  outsider's log before taking over, and no member votes for an outsider while members are
  in reach.

What this does not stop: a peer that holds the cluster key and lies about its own log can win
an election once the master is gone; and a member sees the prompts of the instances placed on
it. The cluster key is the trust boundary (docs/security.md says what it admits).

Each check returns None when the message is allowed, else the reason in words, for the log
and for the refusal the sender gets.
"""

from __future__ import annotations

from exo_core.commands import CommandEnvelope, ReportEvents, SubmitTask
from exo_core.events import (
    DownloadDeleted,
    DownloadProgressed,
    Event,
    NodeTelemetry,
    RunnerStatusChanged,
    TaskStatusChanged,
    TopologyReported,
)
from exo_core.ids import InstanceId, NodeId
from exo_core.state import DownloadProgress, State
from exo_core.trust import resources_refusal
from exo_core.wire import Campaign, Replicated, VoteRequest


def speaks_for_itself(sender: str, message: Campaign | Replicated | VoteRequest) -> str | None:
    """A campaign, ack or vote request names its sender as the node it is about."""
    claimed = message.candidate if isinstance(message, VoteRequest) else message.node_id
    if claimed == sender:
        return None
    return f"a {type(message).__name__} from {sender} speaks for {claimed}"


def is_member(node_id: str, state: State) -> bool:
    """Whether `node_id` counts in elections: a member of the cluster, or anyone while the
    cluster has no members yet (it is being formed)."""
    return not state.nodes or node_id in state.nodes


def command_refusal(sender: str, envelope: CommandEnvelope, state: State) -> str | None:
    """Commands come from their origin; a submitted task's chunks go to its sender; reports
    carry facts about the sender only."""
    if envelope.origin != sender:
        return f"a command from {sender} claims to come from {envelope.origin}"
    match envelope.command:
        case SubmitTask(task=task) if task.origin_node != sender:
            return f"{sender} submitted a task whose answer goes to {task.origin_node}"
        case ReportEvents(events=events):
            for event in events:
                reason = report_refusal(sender, event, state)
                if reason is not None:
                    return reason
        case _:
            pass
    return None


def report_refusal(sender: str, event: Event, state: State) -> str | None:
    """Whether `sender` may report `event` as a fact it observed itself."""
    name = type(event).__name__
    match event:
        case NodeTelemetry(node_id=about, resources=claimed) if about == sender:
            known = state.nodes.get(NodeId(sender))
            problem = resources_refusal(known.resources if known else None, claimed)
            return (
                None if problem is None else f"{sender} reported implausible resources: {problem}"
            )
        case (
            NodeTelemetry(node_id=about)
            | TopologyReported(node_id=about)
            | DownloadDeleted(node_id=about)
            | DownloadProgressed(progress=DownloadProgress(node_id=about))
        ):
            return None if about == sender else f"{sender} reported {name} about {about}"
        case RunnerStatusChanged(runner=runner):
            if runner.node_id != sender:
                return f"{sender} reported the status of a runner on {runner.node_id}"
            instance = state.instances.get(runner.instance_id)
            if instance is None:
                return None  # a late report (see `is_stale`)
            shard = instance.shard_on(NodeId(sender))
            if shard is None or shard.runner_id != runner.runner_id:
                return f"{sender} reported runner {runner.runner_id}, which is not its own"
            return None
        case TaskStatusChanged(task_id=task_id):
            task = state.tasks.get(task_id)
            if task is None:
                return None  # ended already (see `is_stale`)
            instance = state.instances.get(task.instance_id)
            if instance is None or instance.leader.node_id != sender:
                return f"{sender} reported the status of task {task_id}, which its rank 0 runs"
            return None
        case _:
            return f"{sender} reported {name}, which no node reports about itself"


def is_stale(event: Event, state: State) -> bool:
    """A report about a runner or task that is gone: true once, meaningless now (the master
    leaves it out of the log rather than refusing the report it came with)."""
    match event:
        case RunnerStatusChanged(runner=runner):
            return runner.instance_id not in state.instances
        case TaskStatusChanged(task_id=task_id):
            return task_id not in state.tasks
        case _:
            return False


def chunk_refusal(sender: str, instance_id: InstanceId | None, state: State) -> str | None:
    """Chunks of a task come from rank 0 of its instance (None: nobody here waits for it,
    so the chunk is dropped anyway)."""
    if instance_id is None:
        return None
    instance = state.instances.get(instance_id)
    if instance is None:
        return f"chunks from {sender} for instance {instance_id}, which is gone"
    if instance.leader.node_id != sender:
        return f"chunks from {sender}, which is not rank 0 of instance {instance_id}"
    return None


def vote_refusal(
    sender: str, request: VoteRequest, live_master: NodeId | None, *, may_lead: bool
) -> str | None:
    """Reasons to refuse a vote before looking at terms and logs: a forged candidate, a live
    master that this node follows (a peer that lost touch with it, or claims anything, must
    not depose it: it would only win by disrupting a working cluster), or a candidate that
    may not lead (`may_lead`: an outsider while members are in reach, the election's own
    rule). A vote for an outsider would make this node follow it, and take its log."""
    reason = speaks_for_itself(sender, request)
    if reason is not None:
        return reason
    if live_master is not None and live_master != request.candidate:
        return f"I follow {live_master}, which is alive"
    if not may_lead:
        return f"{request.candidate} is not a member, and members are in reach"
    return None


def master_claim_backed(claim: Campaign, me: Campaign, heard: list[Campaign], members: int) -> bool:
    """Whether a master's claim is backed by the votes that won its term: this node's own vote
    for it, or the votes that a majority of the cluster's members announce in their campaigns
    (each campaign is bound to its sender, so a claimant cannot speak for its voters)."""
    if not claim.is_master:
        return False
    if me.voted_term == claim.term and me.voted_for == claim.node_id:
        return True
    voters = {
        c.node_id
        for c in [me, *heard]
        if c.voted_term == claim.term and c.voted_for == claim.node_id
    }
    return len(voters) > members // 2
