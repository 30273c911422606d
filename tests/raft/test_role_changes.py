"""Every change of role is an effect of the core, ``RoleChanged``, with the cause the core knows:
what the node's story and metrics and the simulator's checker read, instead of comparing the
core's state before and after a step and guessing why from the call that took it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from quorum_node.raft.messages import BeginQuorumEpochResponse
from quorum_node.raft.quorum_state import RoleChanged, TransitionCause
from quorum_node.raft.state import RaftState
from quorum_node.raft.types import Errors

if TYPE_CHECKING:
    from context import RaftTestContext

    MakeCtx = Callable[..., RaftTestContext]

Cause = TransitionCause
S = RaftState


def _changes(ctx: RaftTestContext) -> list[RoleChanged]:
    """The role changes of every step so far, in order."""
    return [change for effects in ctx.history for change in effects.role_changes]


def _path(ctx: RaftTestContext) -> list[tuple[RaftState, RaftState, int, Cause]]:
    return [(c.before, c.after, c.epoch, c.cause) for c in _changes(ctx)]


def test_an_election_reports_each_role_with_its_cause(make_ctx: MakeCtx) -> None:
    ctx = make_ctx(1, [1, 2, 3])
    assert _changes(ctx) == []  # starting up is no change
    ctx.become_leader()
    assert _path(ctx) == [
        (S.UNATTACHED, S.PROSPECTIVE, 0, Cause.ELECTION_TIMEOUT),
        (S.PROSPECTIVE, S.CANDIDATE, 1, Cause.PRE_VOTE_GRANTED),
        (S.CANDIDATE, S.LEADER, 1, Cause.ELECTED),
    ]
    elected = _changes(ctx)[-1]
    assert (elected.leader_id, elected.previous_epoch, elected.previous_leader_id) == (1, 1, None)


def test_a_lone_voter_elects_itself_in_one_step(make_ctx: MakeCtx) -> None:
    ctx = make_ctx(1, [1])
    assert _path(ctx) == [
        (S.UNATTACHED, S.PROSPECTIVE, 0, Cause.LONE_VOTER),
        (S.PROSPECTIVE, S.CANDIDATE, 1, Cause.PRE_VOTE_GRANTED),
        (S.CANDIDATE, S.LEADER, 1, Cause.ELECTED),
    ]
    # The role changes of a step are durable with it: its election state is in the same effects.
    assert ctx.history[0].persist is not None and ctx.history[0].persist.epoch == 1


def test_a_peer_in_a_higher_epoch_is_named(make_ctx: MakeCtx) -> None:
    ctx = make_ctx(1, [1, 2, 3])
    ctx.deliver_request(3, ctx.begin_quorum_request(3, 4))
    assert _changes(ctx) == [RoleChanged(S.UNATTACHED, S.FOLLOWER, 4, 3, Cause.HIGHER_EPOCH,
                                         0, None, peer=3)]


def test_a_granted_vote_is_persisted_but_no_role_change(make_ctx: MakeCtx) -> None:
    ctx = make_ctx(1, [1, 2, 3])
    ctx.deliver_request(2, ctx.vote_request(2, 1, 0, 0))
    assert _changes(ctx) == [RoleChanged(S.UNATTACHED, S.UNATTACHED, 1, None, Cause.HIGHER_EPOCH,
                                         0, None, peer=2)]
    ctx.assert_persisted(1, voted=2)


def test_fetch_timeout_and_resigned_leader_are_told_apart(make_ctx: MakeCtx) -> None:
    """Both end in a poll once the fetch timer runs out: the cause says which it was."""
    ctx = make_ctx(1, [1, 2, 3])
    ctx.deliver_request(2, ctx.begin_quorum_request(2, 1))
    ctx.advance(ctx.config.fetch_timeout_ms * 2)
    timed_out = _changes(ctx)[-1]
    assert (timed_out.after, timed_out.cause, timed_out.previous_leader_id) == (
        S.PROSPECTIVE, Cause.FETCH_TIMEOUT, 2)

    ctx = make_ctx(1, [1, 2, 3])
    ctx.deliver_request(2, ctx.begin_quorum_request(2, 1))
    ctx.deliver_request(2, ctx.end_quorum_request(2, 1, successors=[3, 1]))
    assert ctx.state() is S.FOLLOWER  # second in line: it waits its back-off first
    ctx.advance(ctx.config.election_backoff_max_ms)
    resigned = _changes(ctx)[-1]
    assert (resigned.before, resigned.after, resigned.cause, resigned.previous_leader_id) == (
        S.FOLLOWER, S.PROSPECTIVE, Cause.LEADER_RESIGNED, 2)


def test_a_leader_resigns_for_a_reason(make_ctx: MakeCtx) -> None:
    ctx = make_ctx(1, [1, 2, 3])
    epoch = ctx.become_leader()
    ctx.advance(ctx.config.check_quorum_timeout_ms)
    assert _path(ctx)[-1] == (S.LEADER, S.RESIGNED, epoch, Cause.CHECK_QUORUM)

    ctx = make_ctx(1, [1, 2, 3])
    epoch = ctx.become_leader()
    for request in ctx.pending_requests():
        ctx.deliver_response(request, BeginQuorumEpochResponse(
            error_code=Errors.NONE, leader_id=1, leader_epoch=epoch))
    ctx.core.begin_shutdown(ctx.now_ms)
    ctx.collect()
    assert _path(ctx)[-1] == (S.LEADER, S.RESIGNED, epoch, Cause.SHUTDOWN)
    # Then the epoch it led ends only once a successor announces itself.
    ctx.deliver_request(2, ctx.begin_quorum_request(2, epoch + 1))
    assert _changes(ctx)[-1] == RoleChanged(S.RESIGNED, S.FOLLOWER, epoch + 1, 2,
                                            Cause.HIGHER_EPOCH, epoch, 1, peer=2)
