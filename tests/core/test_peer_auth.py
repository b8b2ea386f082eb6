"""The pure checks that bind peer messages to their sender and role (`exo_core.peer_auth`)."""

from __future__ import annotations

import msgspec
import pytest

from exo_core.commands import AddModelCard, CommandEnvelope, ReportEvents, SubmitTask
from exo_core.election import Election, new_term
from exo_core.events import (
    DownloadProgressed,
    Event,
    IndexedEvent,
    InstanceCreated,
    MasterElected,
    ModelCardAdded,
    NodeTelemetry,
    NodeTimedOut,
    RunnerStatusChanged,
    TaskCreated,
    TaskStatusChanged,
    TopologyReported,
)
from exo_core.generation import GenerationParams
from exo_core.ids import CommandId, InstanceId, ModelId, NodeId, RunnerId, TaskId
from exo_core.peer_auth import (
    chunk_refusal,
    command_refusal,
    is_stale,
    master_claim_backed,
    report_refusal,
    speaks_for_itself,
    vote_refusal,
)
from exo_core.reducer import replay
from exo_core.state import (
    DownloadProgress,
    DownloadStatus,
    Instance,
    NodeResources,
    RunnerInfo,
    RunnerStatus,
    ShardAssignment,
    State,
    Task,
    TaskStatus,
)
from exo_core.terms import MAX_TERM, has_successor, term_round
from exo_core.testing.peer_fuzz import forged_card
from exo_core.wire import (
    Campaign,
    EventBatch,
    Replicated,
    VoteRequest,
    decode_response,
    encode_catch_up,
)

A, B = NodeId("a"), NodeId("b")
INSTANCE = InstanceId("inst")


def shard(node: NodeId, rank: int) -> ShardAssignment:
    return ShardAssignment(
        node_id=node,
        runner_id=RunnerId(f"r{rank}"),
        rank=rank,
        world_size=2,
        start_layer=rank,
        end_layer=rank + 1,
    )


def task(origin: NodeId = B) -> Task:
    return Task(
        task_id=TaskId("t"),
        instance_id=INSTANCE,
        model_id=ModelId("m"),
        origin_node=origin,
        params=GenerationParams(),
    )


def cluster() -> State:
    """Nodes a and b; instance `inst` with rank 0 on a and rank 1 on b; task `t` on it."""
    instance = Instance(
        instance_id=INSTANCE, model_id=ModelId("m"), sharding="pipeline", shards=(shard(A, 0), shard(B, 1))
    )  # fmt: skip
    events: list[Event] = [
        NodeTelemetry(node_id=n, hostname=n, resources=NodeResources(), timestamp=1.0)
        for n in (A, B)
    ]
    events += [InstanceCreated(instance=instance), TaskCreated(task=task())]
    return replay([IndexedEvent(index=i, term=1, event=e) for i, e in enumerate(events)])


def envelope(origin: NodeId, *events: Event) -> CommandEnvelope:
    return CommandEnvelope(
        command_id=CommandId("c"), origin=origin, command=ReportEvents(events=events)
    )


def runner(node: NodeId, runner_id: str) -> RunnerStatusChanged:
    return RunnerStatusChanged(
        runner=RunnerInfo(
            runner_id=RunnerId(runner_id),
            instance_id=INSTANCE,
            node_id=node,
            status=RunnerStatus.READY,
        )
    )


def campaign(
    node: NodeId,
    *,
    term: int,
    voted_for: NodeId | None,
    master: bool = False,
    voted_term: int | None = None,
) -> Campaign:
    return Campaign(
        node_id=node,
        term=term,
        force_master=False,
        priority=0,
        seniority=0,
        commands_seen=0,
        is_master=master,
        voted_term=term if voted_term is None else voted_term,
        voted_for=voted_for,
    )


def test_a_message_speaks_only_for_its_sender() -> None:
    assert speaks_for_itself("a", Replicated(node_id=A, index=1, term=1)) is None
    assert speaks_for_itself("b", Replicated(node_id=A, index=1, term=1)) is not None
    request = VoteRequest(term=2, candidate=A, last_term=1, last_index=1)
    assert speaks_for_itself("a", request) is None
    assert "speaks for a" in (speaks_for_itself("b", request) or "")


def test_a_command_comes_from_its_origin_and_answers_its_sender() -> None:
    state = cluster()
    card = AddModelCard(card=forged_card("x"))
    assert command_refusal("a", CommandEnvelope(command_id=CommandId("c"), origin=A, command=card), state) is None  # fmt: skip
    assert command_refusal("b", CommandEnvelope(command_id=CommandId("c"), origin=A, command=card), state)  # fmt: skip
    submit = CommandEnvelope(command_id=CommandId("c"), origin=A, command=SubmitTask(task=task(B)))
    assert "answer goes to b" in (command_refusal("a", submit, state) or "")


def test_a_report_carries_facts_about_its_sender_only() -> None:
    state = cluster()
    own = [
        NodeTelemetry(node_id=A, hostname="a", resources=NodeResources(), timestamp=2.0),
        TopologyReported(node_id=A, peers=(B,)),
        DownloadProgressed(
            progress=DownloadProgress(
                node_id=A, model_id=ModelId("m"), status=DownloadStatus.COMPLETED
            )
        ),
        runner(A, "r0"),
        TaskStatusChanged(task_id=TaskId("t"), status=TaskStatus.RUNNING),  # a runs rank 0
    ]
    for event in own:
        assert report_refusal("a", event, state) is None, event
    assert command_refusal("a", envelope(A, *own), state) is None
    forged: list[Event] = [
        NodeTelemetry(node_id=B, hostname="b", resources=NodeResources(), timestamp=2.0),
        NodeTimedOut(node_id=B),
        ModelCardAdded(card=forged_card("x")),
        MasterElected(node_id=A, term=9),
        runner(B, "r1"),  # b's runner
        runner(A, "r1"),  # in a's name, but b's runner id
        TaskStatusChanged(task_id=TaskId("t"), status=TaskStatus.FAILED),  # b is not rank 0
    ]
    sender = {0: "a", 1: "a", 2: "a", 3: "a", 4: "a", 5: "a", 6: "b"}
    for i, event in enumerate(forged):
        assert report_refusal(sender[i], event, state) is not None, event
    # One forged fact refuses the whole report.
    assert command_refusal("a", envelope(A, own[0], forged[1]), state) is not None


def test_reports_about_runners_and_tasks_that_are_gone_are_stale() -> None:
    state = cluster()
    gone = TaskStatusChanged(task_id=TaskId("old"), status=TaskStatus.COMPLETE)
    assert report_refusal("a", gone, state) is None and is_stale(gone, state)
    assert not is_stale(TaskStatusChanged(task_id=TaskId("t"), status=TaskStatus.RUNNING), state)
    late = RunnerStatusChanged(
        runner=RunnerInfo(
            runner_id=RunnerId("x"), instance_id=InstanceId("gone"), node_id=A,
            status=RunnerStatus.STOPPED,
        )
    )  # fmt: skip
    assert report_refusal("a", late, state) is None and is_stale(late, state)


def test_chunks_come_from_rank_0_of_the_tasks_instance() -> None:
    state = cluster()
    assert chunk_refusal("a", INSTANCE, state) is None
    assert "not rank 0" in (chunk_refusal("b", INSTANCE, state) or "")
    assert chunk_refusal("b", InstanceId("gone"), state) is not None
    assert chunk_refusal("b", None, state) is None  # nobody waits: dropped anyway


def test_no_vote_while_a_live_master_is_followed() -> None:
    request = VoteRequest(term=9, candidate=B, last_term=9, last_index=99)
    assert vote_refusal("b", request, live_master=None, may_lead=True) is None
    assert vote_refusal("b", request, live_master=B, may_lead=True) is None
    assert "I follow a" in (vote_refusal("b", request, live_master=A, may_lead=True) or "")
    assert vote_refusal("a", request, live_master=None, may_lead=True) is not None  # forged
    # A candidate the election would not let run (an outsider while members are in reach):
    # a vote for it would make this node follow it and copy its log.
    assert "not a member" in (vote_refusal("b", request, live_master=None, may_lead=False) or "")


@pytest.mark.anyio
async def test_an_outsider_may_lead_only_while_no_member_is_in_reach() -> None:
    outsider, other = NodeId("mallory"), NodeId("x")

    def election(me: NodeId) -> Election:
        async def nothing(*_: object) -> None:
            return None

        async def never(_: int) -> bool:
            return False

        return Election(
            me=lambda: campaign(me, term=1, voted_for=me),
            broadcast=nothing,
            become_master=never,
            follow=nothing,
            step_down=nothing,
            eligible=lambda node_id: node_id in (A, B),
        )

    member = election(A)
    assert member.may_lead(B) and member.may_lead(A)
    assert not member.may_lead(outsider)  # this node is a member itself
    stranger = election(other)  # not a member: only outsiders in reach, anyone may lead
    stranger.observe(campaign(outsider, term=1, voted_for=outsider))
    assert stranger.may_lead(outsider)
    stranger.observe(campaign(B, term=1, voted_for=B))  # a member in reach: it leads, not them
    assert not stranger.may_lead(outsider) and stranger.may_lead(B)


def test_a_master_claim_is_backed_by_own_vote_or_a_majority_of_announced_votes() -> None:
    c = NodeId("c")
    claim = campaign(A, term=5, voted_for=A, master=True)
    me_voted = campaign(B, term=5, voted_for=A)
    me_elsewhere = campaign(B, term=3, voted_for=B)
    assert master_claim_backed(claim, me_voted, [claim], members=3)
    assert not master_claim_backed(claim, me_elsewhere, [claim], members=3)
    # c announces its vote for a: with a's own, two of three members.
    assert master_claim_backed(claim, me_elsewhere, [claim, campaign(c, term=5, voted_for=A)], 3)
    assert not master_claim_backed(claim, me_elsewhere, [claim, campaign(c, term=5, voted_for=A)], 5)  # fmt: skip
    # A claim in another term, or of a node that is not master, is not backed by these votes.
    assert not master_claim_backed(campaign(A, term=6, voted_for=A, master=True), me_voted, [], 3)
    assert not master_claim_backed(campaign(A, term=5, voted_for=A), me_voted, [], 3)


def test_a_catch_up_answer_fits_its_byte_budget_and_carries_at_least_one_event() -> None:
    events = [
        IndexedEvent(index=i, term=1, event=ModelCardAdded(card=forged_card(f"{i:04}")))
        for i in range(64)
    ]
    whole = decode_response(encode_catch_up(events, 0, 1 << 20))
    assert isinstance(whole, EventBatch) and len(whole.events) == 64
    raw = encode_catch_up(events, 0, 1000)
    part = decode_response(raw)
    assert len(raw) <= 1000 and isinstance(part, EventBatch)
    assert 0 < len(part.events) < 64 and part.events == tuple(events[: len(part.events)])
    one = decode_response(encode_catch_up(events, 0, 1))
    assert isinstance(one, EventBatch) and len(one.events) == 1


def test_a_new_term_is_after_every_vote_but_one_no_honest_node_could_cast() -> None:
    pool = [
        campaign(A, term=3 << 16, voted_for=A, voted_term=4 << 16),
        campaign(B, term=2 << 16, voted_for=None, voted_term=0),
    ]
    assert term_round(new_term(1 << 16, pool, A)) == 5
    assert term_round(new_term(9 << 16, pool, A)) == 10
    # A campaign in the wire's last term (a hostile peer's: no honest vote is cast there).
    forged = [*pool, campaign(B, term=MAX_TERM, voted_for=B)]
    term = new_term(1 << 16, forged, A)
    assert term_round(term) == 5 and has_successor(term)


@pytest.mark.anyio
async def test_a_master_whose_claim_is_backed_again_is_followed_again() -> None:
    # B follows A's claim (A's own vote is a majority of the one member B knows), then hears C
    # and a cluster of three: A's one vote no longer backs the claim, and B counts A lost.
    # Once B has voted in A's term (A asks for missing votes), B follows A again: a loss left
    # standing would make B count candidate turns from it at the next failover and wait for
    # another candidate than the other survivor does (seconds more to fail over).
    c, term = NodeId("c"), 5
    me = campaign(B, term=1, voted_for=None, voted_term=0)
    follows: list[tuple[NodeId, int]] = []

    async def nothing(*_: object) -> None:
        return None

    async def follow(master: NodeId, t: int) -> None:
        follows.append((master, t))

    async def never(_: int) -> bool:
        return False

    election = Election(
        me=lambda: me,
        broadcast=nothing,
        become_master=never,
        follow=follow,
        step_down=nothing,
    )
    claim = campaign(A, term=term, voted_for=A, master=True)
    election.observe(claim)
    await election.evaluate(me)
    assert follows == [(A, term)]
    election.observe(msgspec.structs.replace(campaign(c, term=1, voted_for=None), members=3))
    await election.evaluate(me)
    assert follows == [(A, term)]  # counted lost: the claim is not backed now
    me = campaign(B, term=1, voted_for=A, voted_term=term)
    await election.evaluate(me)
    assert follows == [(A, term), (A, term)]
