"""What an insider, a broken peer or a fake leader can send, and what the core does with it:
validated before anything changes, refused with Kafka's error codes, and never a reason to stop.
Each test is one of the messages that wedged, stopped or misled a real quorum before."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from quorum_node.raft.leader import MAX_OBSERVERS, OBSERVER_SESSION_TIMEOUT_MS
from quorum_node.raft.messages import (
    BeginQuorumEpochResponse,
    EndQuorumEpochResponse,
    FetchRequest,
    FetchResponse,
    VoteRequest,
    VoteResponse,
)
from quorum_node.raft.records import encode_batch
from quorum_node.raft.state import ElectionState, RaftState
from quorum_node.raft.types import MAX_EPOCH, Errors, RaftInvariantError, ReplicaKey
from quorum_node.raft.voters import voters_record

if TYPE_CHECKING:
    from context import RaftTestContext

    MakeCtx = Callable[..., RaftTestContext]

WEDGE_EPOCH = 2**30  # what once moved a whole quorum out of reach of any later vote


def _follower_of_2(make_ctx: MakeCtx) -> RaftTestContext:
    """Node 1 following leader 2 in epoch 4, with a committed log of 4 records."""
    ctx = make_ctx(1, [1, 2, 3], log_epochs=[(1, 2), (4, 2)],
                   election_state=ElectionState(4, 2, None))
    fetch = ctx.take_request(FetchRequest, 2)
    ctx.deliver_response(fetch, ctx.fetch_response(2, 4, high_watermark=4))
    assert ctx.core.high_watermark == 4
    return ctx


def _unchanged(ctx: RaftTestContext, state: RaftState, epoch: int, leader: int | None) -> None:
    assert (ctx.state(), ctx.core.epoch, ctx.core.leader_id) == (state, epoch, leader)


# --- Vote --------------------------------------------------------------------------------


@pytest.mark.parametrize("pre_vote", [False, True])
def test_vote_from_a_non_voter_moves_nothing(make_ctx: MakeCtx, pre_vote: bool) -> None:
    """The epoch wedge: a Vote from id 7 (no voter) at epoch 2^30 is refused before its epoch
    is adopted; nothing is persisted."""
    ctx = _follower_of_2(make_ctx)
    persisted = ctx.store
    response = ctx.deliver_one(7, ctx.vote_request(7, WEDGE_EPOCH, 0, 0, pre_vote=pre_vote))
    assert isinstance(response, VoteResponse)
    assert response.error_code is Errors.INCONSISTENT_VOTER_SET
    assert response.vote_granted is False
    _unchanged(ctx, RaftState.FOLLOWER, 4, 2)
    assert ctx.store == persisted


def test_a_voter_at_a_huge_epoch_leaves_room_for_the_next_election(make_ctx: MakeCtx) -> None:
    """A voter's Vote at 2^30 is adopted (an epoch is accepted while its successor fits), and
    the next one, 2^30 + 1, is too: no epoch below the bound wedges the quorum."""
    ctx = _follower_of_2(make_ctx)
    ctx.deliver_one(3, ctx.vote_request(3, WEDGE_EPOCH, 4, 4))
    assert ctx.core.epoch == WEDGE_EPOCH
    response = ctx.deliver_one(2, ctx.vote_request(2, WEDGE_EPOCH + 1, 4, 4))
    assert isinstance(response, VoteResponse)
    assert (response.error_code, response.vote_granted) == (Errors.NONE, True)
    assert ctx.core.epoch == WEDGE_EPOCH + 1


def test_vote_at_the_epoch_bound_is_invalid(make_ctx: MakeCtx) -> None:
    ctx = _follower_of_2(make_ctx)
    response = ctx.deliver_one(3, ctx.vote_request(3, MAX_EPOCH, 4, 4))
    assert isinstance(response, VoteResponse)
    assert response.error_code is Errors.INVALID_REQUEST
    _unchanged(ctx, RaftState.FOLLOWER, 4, 2)


def test_vote_from_an_unknown_directory_needs_a_newer_log(make_ctx: MakeCtx) -> None:
    """A configured id under a directory that is not a voter (a replaced disk, or a forgery)
    is refused, unless its log is newer than ours: then it may hold a VotersRecord we have not
    replicated yet, and refusing it could leave no electable replica."""
    dirs = {i: uuid.UUID(int=i) for i in (1, 2, 3)}
    stranger = uuid.UUID(int=99)
    ctx = make_ctx(1, [1, 2, 3], directory_ids=dirs, log_epochs=[(1, 2)],
                   election_state=ElectionState(2, None, None))
    response = ctx.deliver_one(2, ctx.vote_request(2, 3, 1, 2, candidate_directory_id=stranger))
    assert isinstance(response, VoteResponse)
    assert response.error_code is Errors.INCONSISTENT_VOTER_SET
    assert ctx.core.epoch == 2
    response = ctx.deliver_one(2, ctx.vote_request(2, 3, 2, 5, candidate_directory_id=stranger))
    assert isinstance(response, VoteResponse)
    assert (response.error_code, response.vote_granted) == (Errors.NONE, True)
    assert ctx.core.epoch == 3


def test_a_replica_at_the_last_epoch_does_not_campaign_past_it(make_ctx: MakeCtx) -> None:
    """At MAX_EPOCH - 1 (only a peer jumping there gets a quorum there) a won pre-vote starts no
    election whose epoch would be out of bounds; the replica keeps running."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(MAX_EPOCH - 1, None, None))
    ctx.expire_election_timer()
    assert ctx.state() is RaftState.PROSPECTIVE
    ctx.grant_pre_votes(2)
    assert ctx.core.epoch == MAX_EPOCH - 1
    assert ctx.state() is not RaftState.CANDIDATE
    for _ in range(5):
        ctx.expire_election_timer()
    assert ctx.core.epoch == MAX_EPOCH - 1


# --- BeginQuorumEpoch / EndQuorumEpoch ---------------------------------------------------


def test_begin_quorum_epoch_naming_a_non_voter_is_refused(make_ctx: MakeCtx) -> None:
    """BeginQuorumEpoch naming leader 99 (no voter), in a newer epoch: refused, nothing moves
    (it once made a node 'follow 99')."""
    ctx = _follower_of_2(make_ctx)
    response = ctx.deliver_one(99, ctx.begin_quorum_request(99, 5))
    assert isinstance(response, BeginQuorumEpochResponse)
    assert response.error_code is Errors.INCONSISTENT_VOTER_SET
    _unchanged(ctx, RaftState.FOLLOWER, 4, 2)


def test_begin_quorum_epoch_at_the_epoch_bound_is_invalid(make_ctx: MakeCtx) -> None:
    ctx = _follower_of_2(make_ctx)
    response = ctx.deliver_one(3, ctx.begin_quorum_request(3, MAX_EPOCH))
    assert isinstance(response, BeginQuorumEpochResponse)
    assert response.error_code is Errors.INVALID_REQUEST
    _unchanged(ctx, RaftState.FOLLOWER, 4, 2)


def test_begin_quorum_epoch_naming_another_leader_of_our_epoch_is_refused(
    make_ctx: MakeCtx,
) -> None:
    ctx = _follower_of_2(make_ctx)
    response = ctx.deliver_one(3, ctx.begin_quorum_request(3, 4))
    assert isinstance(response, BeginQuorumEpochResponse)
    assert response.error_code is Errors.INVALID_REQUEST
    _unchanged(ctx, RaftState.FOLLOWER, 4, 2)


@pytest.mark.parametrize(("leader", "epoch", "error"), [
    (3, 4, Errors.INVALID_REQUEST),  # a voter, not the leader of epoch 4
    (3, 5, Errors.UNKNOWN_LEADER_EPOCH),  # an epoch not known here (KIP-595)
    (99, 4, Errors.INCONSISTENT_VOTER_SET),  # no voter at all
])
def test_end_quorum_epoch_from_a_non_leader_starts_no_election(
    make_ctx: MakeCtx, leader: int, epoch: int, error: Errors,
) -> None:
    ctx = _follower_of_2(make_ctx)
    response = ctx.deliver_one(leader, ctx.end_quorum_request(leader, epoch, [1]))
    assert isinstance(response, EndQuorumEpochResponse)
    assert response.error_code is error
    ctx.advance(1)
    _unchanged(ctx, RaftState.FOLLOWER, 4, 2)
    assert ctx.pending_requests(VoteRequest) == []


# --- responses ---------------------------------------------------------------------------


def test_a_response_naming_another_leader_of_our_epoch_is_dropped(make_ctx: MakeCtx) -> None:
    """The crash loop: a fetch answer naming leader 3 for epoch 4, whose leader is 2, stopped
    the node (and the conflicting leaders, saved, stopped it at every start). Now it is
    dropped and backed off from."""
    ctx = _follower_of_2(make_ctx)
    fetch = ctx.take_request(FetchRequest, 2)
    ctx.deliver_response(fetch, ctx.fetch_response(3, 4, error=Errors.NOT_LEADER_OR_FOLLOWER))
    _unchanged(ctx, RaftState.FOLLOWER, 4, 2)


def test_invalid_request_answer_is_backed_off_from(make_ctx: MakeCtx) -> None:
    ctx = _follower_of_2(make_ctx)
    fetch = ctx.take_request(FetchRequest, 2)
    ctx.deliver_response(fetch, ctx.fetch_response(2, 4, error=Errors.INVALID_REQUEST))
    _unchanged(ctx, RaftState.FOLLOWER, 4, 2)
    assert ctx.pending_requests(FetchRequest) == []
    ctx.advance(ctx.config.retry_backoff_ms)
    assert len(ctx.pending_requests(FetchRequest)) == 1


def test_a_response_naming_a_non_voter_leader_is_not_followed(make_ctx: MakeCtx) -> None:
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(4, None, None))
    fetch = ctx.take_request(FetchRequest)  # looking for the leader
    ctx.deliver_response(fetch, ctx.fetch_response(99, 5, error=Errors.NOT_LEADER_OR_FOLLOWER))
    assert ctx.core.epoch == 5
    assert ctx.core.leader_id is None
    assert ctx.state() is RaftState.UNATTACHED


def test_a_response_at_the_epoch_bound_is_dropped(make_ctx: MakeCtx) -> None:
    ctx = _follower_of_2(make_ctx)
    fetch = ctx.take_request(FetchRequest, 2)
    ctx.deliver_response(fetch, ctx.fetch_response(3, MAX_EPOCH))
    _unchanged(ctx, RaftState.FOLLOWER, 4, 2)


# --- a fetch answer is validated whole -------------------------------------------------------


def _bad_batches(ctx: RaftTestContext, kind: str) -> bytes:
    end = ctx.log.end_offset
    if kind == "gap":  # the second batch skips an offset
        return ctx.encoded_batches(end, [(4, 1)]) + ctx.encoded_batches(end + 2, [(4, 1)])
    if kind == "backward-epoch":  # epoch 3 after the log's 4
        return ctx.encoded_batches(end, [(3, 1)])
    if kind == "overlap":  # the second batch starts inside the first
        return ctx.encoded_batches(end, [(4, 2)]) + ctx.encoded_batches(end + 1, [(4, 1)])
    if kind == "epoch-above-leader":  # the leader's epoch is 4
        return ctx.encoded_batches(end, [(4, 1), (MAX_EPOCH, 1)])
    if kind == "voters-outside-the-configuration":
        record = voters_record([ReplicaKey(99, uuid.UUID(int=99))])
        return ctx.encoded_batches(end, [(4, 1)]) + encode_batch(end + 1, 4, [record], 0,
                                                                  is_control=True)
    assert kind == "corrupt"
    good = bytearray(ctx.encoded_batches(end, [(4, 2)]))
    good[-1] ^= 0xFF
    return bytes(good)


@pytest.mark.parametrize("kind", ["gap", "backward-epoch", "overlap", "epoch-above-leader",
                                  "voters-outside-the-configuration", "corrupt"])
def test_a_bad_fetch_answer_appends_nothing(make_ctx: MakeCtx, kind: str) -> None:
    """A fake leader's CRC-valid batches with a gap, an overlap, an epoch going backwards or
    above its own, or voters that no configuration names, stopped the followers. Now none of
    the answer is appended, the follower backs off and keeps running; the fetch timer is not
    reset, so a leader that answers only nonsense is replaced by an election."""
    ctx = _follower_of_2(make_ctx)
    fetch = ctx.take_request(FetchRequest, 2)
    deadline = ctx.now_ms + ctx.config.fetch_timeout_ms
    ctx.deliver_response(fetch, ctx.fetch_response(2, 4, records_bytes=_bad_batches(ctx, kind),
                                                   high_watermark=6))
    assert ctx.log.end_offset == 4
    assert ctx.core.high_watermark == 4
    assert ctx.pending_requests(FetchRequest) == []
    ctx.advance_to(deadline + ctx.config.fetch_timeout_ms // 10 + 1)
    assert ctx.state() is RaftState.PROSPECTIVE


def test_a_good_fetch_answer_of_several_batches_is_appended(make_ctx: MakeCtx) -> None:
    ctx = _follower_of_2(make_ctx)
    fetch = ctx.take_request(FetchRequest, 2)
    ctx.deliver_response(fetch, ctx.fetch_response(
        2, 4, records_bytes=ctx.encoded_batches(4, [(4, 1), (4, 2)]), high_watermark=6))
    assert ctx.log.end_offset == 7
    assert ctx.core.high_watermark == 6


def test_a_high_watermark_going_backwards_is_dropped(make_ctx: MakeCtx) -> None:
    ctx = _follower_of_2(make_ctx)
    fetch = ctx.take_request(FetchRequest, 2)
    ctx.deliver_response(fetch, ctx.fetch_response(
        2, 4, records_bytes=ctx.encoded_batches(4, [(4, 1)]), high_watermark=2))
    assert ctx.log.end_offset == 4
    assert ctx.core.high_watermark == 4


# --- who may fetch, and the observer table ---------------------------------------------------


def _leader(make_ctx: MakeCtx) -> RaftTestContext:
    """Node 1 leading voters configured with their directories (a fetch under another
    directory of a voter's id is an observer's)."""
    ctx = make_ctx(1, [1, 2, 3], directory_ids={i: uuid.UUID(int=i) for i in (1, 2, 3)})
    ctx.become_leader()
    return ctx


def test_fetch_from_an_unconfigured_id_is_refused(make_ctx: MakeCtx) -> None:
    ctx = _leader(make_ctx)
    response = ctx.deliver_one(7, ctx.fetch_request(7, ctx.core.epoch, 0, 0, max_wait_ms=0))
    assert isinstance(response, FetchResponse)
    assert response.error_code is Errors.INCONSISTENT_VOTER_SET
    assert response.records == b""
    assert ctx.core.describe_quorum(ctx.now_ms).observers == ()


def test_observer_table_is_capped_and_expires(make_ctx: MakeCtx) -> None:
    """Thousands of fetches, each with a configured id under a new directory, once grew the
    leader's observer table without bound. It keeps at most MAX_OBSERVERS, the stalest
    evicted, and forgets an observer OBSERVER_SESSION_TIMEOUT_MS after its last fetch."""
    # A lone voter: no check-quorum to resign it while the clock jumps.
    ctx = make_ctx(1, [1], directory_ids={1: uuid.UUID(int=1)})
    ctx.flush()
    assert ctx.state() is RaftState.LEADER
    epoch = ctx.core.epoch
    keys = [uuid.UUID(int=1000 + i) for i in range(3 * MAX_OBSERVERS)]
    for directory in keys:
        ctx.now_ms += 1
        ctx.deliver_one(1, ctx.fetch_request(1, epoch, 0, 0, max_wait_ms=0,
                                             directory_id=directory))
    observers = ctx.core.describe_quorum(ctx.now_ms).observers
    assert len(observers) == MAX_OBSERVERS
    assert {row.key.directory_id for row in observers} == set(keys[-MAX_OBSERVERS:])
    ctx.now_ms += OBSERVER_SESSION_TIMEOUT_MS
    ctx.deliver_one(1, ctx.fetch_request(1, epoch, 0, 0, max_wait_ms=0,
                                         directory_id=uuid.UUID(int=5)))
    observers = ctx.core.describe_quorum(ctx.now_ms).observers
    assert [row.key for row in observers] == [ReplicaKey(1, uuid.UUID(int=5))]


# --- start-up ------------------------------------------------------------------------------


def test_a_log_at_the_epoch_bound_is_refused_at_start(make_ctx: MakeCtx) -> None:
    """Batches at MAX_EPOCH (once accepted from a fake leader) left nodes unable to elect after
    every restart: the start now stops with a message saying what to do."""
    with pytest.raises(RaftInvariantError, match="replace the log directory"):
        make_ctx(1, [1, 2, 3], log_epochs=[(1, 2), (MAX_EPOCH, 1)])


def test_a_led_epoch_missing_from_the_log_is_reported(
    make_ctx: MakeCtx, caplog: pytest.LogCaptureFixture,
) -> None:
    """quorum-state says this node led epoch 5, but the log's last batch is of epoch 3: its
    LeaderChange (and maybe what followed) is gone, as when the last segment is deleted."""
    ctx = make_ctx(1, [1, 2, 3], log_epochs=[(1, 2), (3, 2)],
                   election_state=ElectionState(5, 1, None))
    assert "led epoch 5, but the log (ending at 4, epoch 3) holds nothing" in caplog.text
    assert ctx.state() is RaftState.RESIGNED


def test_a_forged_directory_does_not_become_a_voters(make_ctx: MakeCtx) -> None:
    """Voters configured by id only: the leader learns their directories from their fetches
    and writes them down (the bootstrap VotersRecord). A fetch under a voter's id with another
    directory, after the voter's own, is an observer's: once, a flood of such fetches had the
    leader write a made-up directory as a voter's, and that voter was a voter no more."""
    own = {1: uuid.UUID(int=1), 2: uuid.UUID(int=2), 3: uuid.UUID(int=3)}
    forged = uuid.UUID(int=666)
    ctx = make_ctx(1, [1, 2, 3], local_directory_id=own[1])
    epoch = ctx.become_leader()
    ctx.deliver_one(2, ctx.fetch_request(2, epoch, 0, 0, max_wait_ms=0, directory_id=own[2]))
    ctx.deliver_one(2, ctx.fetch_request(2, epoch, 0, 0, max_wait_ms=0, directory_id=forged))
    ctx.deliver_one(1, ctx.fetch_request(1, epoch, 0, 0, max_wait_ms=0, directory_id=forged))
    ctx.deliver_one(3, ctx.fetch_request(3, epoch, 0, 0, max_wait_ms=0, directory_id=own[3]))
    ctx.flush()
    assert ctx.core.bootstrapped
    assert ctx.core.voters == tuple(ReplicaKey(i, own[i]) for i in (1, 2, 3))
    observers = ctx.core.describe_quorum(ctx.now_ms).observers
    assert {row.key for row in observers} == {ReplicaKey(1, forged), ReplicaKey(2, forged)}
