"""Fetch-based replication, high watermark, purgatory, check-quorum and heartbeats: catalogue
items 23-32 of kraft-anchor.md section 7.2, plus the fetch validation and HWM rules of section 3.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from quorum_node.raft.messages import (
    BeginQuorumEpochRequest,
    EndQuorumEpochRequest,
    EpochEndOffset,
    FetchRequest,
    FetchResponse,
    VoteRequest,
)
from quorum_node.raft.records import Record, decode_batches
from quorum_node.raft.state import ElectionState, RaftState
from quorum_node.raft.types import Errors, NotLeaderError

if TYPE_CHECKING:
    from context import RaftTestContext

    MakeCtx = Callable[..., RaftTestContext]

T = 1000
FETCH_TIMEOUT = 2000
CHECK_QUORUM = 3000  # 1.5 x fetch timeout
BEGIN_QUORUM_INTERVAL = 1000  # 0.5 x fetch timeout
FETCH_MAX_WAIT = 500


def _leader(make_ctx: MakeCtx, voters: list[int] | None = None, **kwargs: object) -> (
        RaftTestContext):
    """Node 1 elected leader of epoch 1 (LeaderChange at offset 0, flushed)."""
    ctx = make_ctx(1, voters or [1, 2, 3], **kwargs)
    ctx.become_leader()
    return ctx


def _layout(records: bytes) -> list[tuple[int, int, int]]:
    return [(b.base_offset, b.last_offset, b.epoch) for b in decode_batches(records)]


def _fetch(ctx: RaftTestContext, source: int, request: FetchRequest) -> FetchResponse:
    response = ctx.deliver_one(source, request)
    assert isinstance(response, FetchResponse)
    return response


def _append(ctx: RaftTestContext, *values: str) -> tuple[int, int]:
    """Leader: propose, let the linger expire, flush. Returns the (first, last) offsets."""
    offsets = ctx.core.propose(ctx.now_ms, ctx.records(*values))
    ctx.advance(ctx.config.append_linger_ms)
    assert ctx.log.end_offset == offsets[1] + 1
    ctx.flush()
    return offsets


# --- follower reconciliation (items 23, 24) ----------------------------------------------------


@pytest.mark.parametrize(
    ("local", "diverging", "truncated_to"),
    [
        # the follower holds the diverging epoch: min(its end of that epoch, the leader's offset)
        ([(1, 2), (2, 2)], (1, 2), 2),
        # truncation is batch-granular (as Kafka's): the batch holding offset 2 goes whole
        ([(1, 3), (2, 2)], (1, 2), 0),
        # it does not hold it: the end of its largest epoch below it
        ([(1, 2), (3, 2)], (2, 5), 2),
        # epoch 0 (nothing in common): min(leader offset, LEO)
        ([(1, 2)], (0, 0), 0),
    ],
)
def test_follower_log_reconciliation(
    make_ctx: MakeCtx, local: list[tuple[int, int]], diverging: tuple[int, int],
    truncated_to: int,
) -> None:
    """Item 23: a DivergingEpoch answer truncates the follower's log; the next fetch restarts
    from the truncation point with the epoch it now ends with, then catches up."""
    ctx = make_ctx(1, [1, 2, 3], log_epochs=local, election_state=ElectionState(4, 2, None))
    fetch = ctx.take_request(FetchRequest, 2)
    assert isinstance(fetch.message, FetchRequest)
    assert fetch.message.fetch_offset == ctx.log.end_offset
    assert fetch.message.last_fetch_epoch == local[-1][0]
    ctx.deliver_response(fetch, ctx.fetch_response(2, 4, diverging=diverging))
    assert ctx.log.end_offset == truncated_to
    assert ctx.state() is RaftState.FOLLOWER
    # The truncated log is on disk already: the next fetch goes out at once.
    fetch = ctx.take_request(FetchRequest, 2)
    assert isinstance(fetch.message, FetchRequest)
    assert fetch.message.fetch_offset == truncated_to
    assert fetch.message.last_fetch_epoch == ctx.log.last_fetched_epoch()
    # Catch up with the leader's epoch-4 batch.
    ctx.deliver_response(fetch, ctx.fetch_response(
        2, 4, records_bytes=ctx.encoded_batches(truncated_to, [(4, 3)]),
        high_watermark=truncated_to + 3))
    assert ctx.log.end_offset == truncated_to + 3
    assert ctx.log.last_fetched_epoch() == 4
    assert ctx.core.high_watermark == truncated_to + 3


def test_follower_refuses_to_truncate_below_high_watermark(make_ctx: MakeCtx) -> None:
    """Section 3.3: a DivergingEpoch below the follower's high watermark would drop committed
    data. Kafka stops; here the answer is dropped and backed off from (the leader may be the
    broken one), and the follower's fetch timer is not reset by it."""
    ctx = make_ctx(1, [1, 2, 3], log_epochs=[(1, 2), (2, 2)],
                   election_state=ElectionState(4, 2, None))
    fetch = ctx.take_request(FetchRequest, 2)
    ctx.deliver_response(fetch, ctx.fetch_response(2, 4, high_watermark=4))
    assert ctx.core.high_watermark == 4
    fetch = ctx.take_request(FetchRequest, 2)
    ctx.deliver_response(fetch, ctx.fetch_response(2, 4, diverging=(1, 2)))
    assert ctx.log.end_offset == 4
    assert ctx.core.high_watermark == 4
    assert ctx.pending_requests(FetchRequest) == []  # backing off
    ctx.advance(ctx.config.retry_backoff_ms)
    assert len(ctx.pending_requests(FetchRequest)) == 1


def test_leader_immediately_sends_diverging_epoch(make_ctx: MakeCtx) -> None:
    """Item 24: the leader answers an inconsistent (offset, last epoch) at once with the epoch
    and end offset to truncate to, without parking the fetch and without records."""
    ctx = make_ctx(1, [1, 2, 3], log_epochs=[(1, 2), (3, 2)],
                   election_state=ElectionState(3, None, None))
    epoch = ctx.become_leader()
    assert epoch == 4
    assert ctx.log_layout() == [(0, 1, 1), (2, 3, 3), (4, 4, 4)]
    # The follower has epoch 2 at offsets 2-3, which the leader never had.
    response = _fetch(ctx, 2, ctx.fetch_request(2, epoch, 4, 2, max_wait_ms=500))
    assert response.error_code is Errors.NONE
    assert response.diverging_epoch == EpochEndOffset(epoch=1, end_offset=2)
    assert response.records == b""
    assert response.leader_id == 1
    # The follower claims more of epoch 3 than the leader has.
    response = _fetch(ctx, 2, ctx.fetch_request(2, epoch, 6, 3, max_wait_ms=500))
    assert response.diverging_epoch == EpochEndOffset(epoch=3, end_offset=4)
    # A consistent position is answered with records from it.
    response = _fetch(ctx, 2, ctx.fetch_request(2, epoch, 2, 1, max_wait_ms=500))
    assert response.diverging_epoch is None
    assert _layout(response.records) == [(2, 3, 3), (4, 4, 4)]
    # A diverging fetch does not count as the replica's progress.
    assert ctx.core.high_watermark is None


# --- purgatory (item 25) -------------------------------------------------------------------------


def _parked_fetch(ctx: RaftTestContext) -> FetchRequest:
    """Bring voter 2 level with the leader (HWM 1) and park its next fetch."""
    response = _fetch(ctx, 2, ctx.fetch_request(2, 1, 0, 0))
    assert _layout(response.records) == [(0, 0, 1)]
    response = _fetch(ctx, 2, ctx.fetch_request(2, 1, 1, 1))
    assert response.high_watermark == 1  # newer HWM: answered at once
    parked = ctx.fetch_request(2, 1, 1, 1, high_watermark=1)
    assert ctx.deliver_request(2, parked) == []
    return parked


def test_purgatory_fetch_satisfied_by_write(make_ctx: MakeCtx) -> None:
    """Item 25: a parked fetch completes as soon as the leader appends."""
    ctx = _leader(make_ctx)
    _parked_fetch(ctx)
    ctx.core.propose(ctx.now_ms, ctx.records("a", "b"))
    ctx.collect()
    # The disk is idle, so there is nothing to batch with: the records are appended at once.
    (response,) = ctx.take_responses(2)
    assert isinstance(response, FetchResponse)
    assert response.error_code is Errors.NONE
    assert _layout(response.records) == [(1, 2, 1)]


def test_appends_accumulate_while_an_fsync_runs(make_ctx: MakeCtx) -> None:
    """Group commit: records proposed while the previous append is being flushed wait, together,
    until that flush completes (or the linger expires, whichever is first)."""
    ctx = _leader(make_ctx)
    ctx.core.propose(ctx.now_ms, ctx.records("a"))
    ctx.collect()
    assert ctx.log.end_offset == 2  # appended at once, now being flushed
    ctx.core.propose(ctx.now_ms, ctx.records("b"))
    ctx.core.propose(ctx.now_ms, ctx.records("c"))
    ctx.collect()
    assert ctx.log.end_offset == 2
    assert ctx.core.next_deadline_ms() == ctx.now_ms + ctx.config.append_linger_ms
    ctx.flush()  # the flush completes: b and c go out as one batch
    assert ctx.log_layout()[-1] == (2, 3, 1)
    ctx.core.propose(ctx.now_ms, ctx.records("d"))
    ctx.advance(ctx.config.append_linger_ms)  # a slow fsync: the linger caps the wait
    assert ctx.log_layout()[-1] == (4, 4, 1)


def test_proposals_of_one_step_each_get_their_offsets_or_their_refusal(
        make_ctx: MakeCtx) -> None:
    """Several callers' records proposed in one step (``propose_each``): each gets its own
    contiguous offsets, in order, or its own refusal while the others are taken; with the disk
    idle they go to the log as one batch."""
    ctx = _leader(make_ctx)
    too_large = [Record(value=b"x" * (ctx.config.max_batch_bytes + 1))]
    outcomes = ctx.core.propose_each(
        ctx.now_ms, [ctx.records("a"), ctx.records("b", "c"), too_large, ctx.records("d")])
    ctx.collect()
    assert outcomes[0] == (1, 1)
    assert outcomes[1] == (2, 3)
    assert isinstance(outcomes[2], ValueError)
    assert outcomes[3] == (4, 4)
    assert ctx.log_layout()[-1] == (1, 4, 1)
    assert [r.value for b in decode_batches(ctx.log.read(1, 1 << 20)) for r in b.records] == [
        b"a", b"b", b"c", b"d"]


def test_proposals_of_one_step_on_a_follower_are_each_refused(make_ctx: MakeCtx) -> None:
    ctx = make_ctx(2, [1, 2, 3])
    ctx.deliver_one(1, ctx.begin_quorum_request(1, 1))
    outcomes = ctx.core.propose_each(ctx.now_ms, [ctx.records("a"), ctx.records("b")])
    assert all(isinstance(outcome, NotLeaderError) and outcome.leader_id == 1
               for outcome in outcomes)
    assert ctx.log.end_offset == 0


def test_purgatory_fetch_timeout(make_ctx: MakeCtx) -> None:
    """Item 25: a parked fetch with nothing new is answered empty after MaxWaitMs."""
    ctx = _leader(make_ctx)
    _parked_fetch(ctx)
    ctx.advance(FETCH_MAX_WAIT - 1)
    assert ctx.take_responses(2) == []
    ctx.advance(1)
    (response,) = ctx.take_responses(2)
    assert isinstance(response, FetchResponse)
    assert response.error_code is Errors.NONE
    assert response.records == b""
    assert response.high_watermark == 1


def test_long_poll_is_at_most_a_quarter_of_the_fetch_timeout(make_ctx: MakeCtx) -> None:
    """A fetch timeout shorter than the long poll would expire while an idle leader holds the
    follower's Fetch: the leader answers within a quarter of the fetch timeout, and a follower
    asks for no longer a wait."""
    ctx = _leader(make_ctx, fetch_timeout_ms=1000)
    _parked_fetch(ctx)
    ctx.advance(249)
    assert ctx.take_responses(2) == []
    ctx.advance(1)
    (response,) = ctx.take_responses(2)
    assert isinstance(response, FetchResponse) and response.records == b""
    follower = make_ctx(2, [1, 2, 3], fetch_timeout_ms=1000)
    follower.deliver_one(1, follower.begin_quorum_request(1, 1))
    fetches = [sent.message for sent in follower.take_requests(FetchRequest, 1)]
    assert fetches and all(isinstance(fetch, FetchRequest) and fetch.max_wait_ms == 250
                           for fetch in fetches)


def test_purgatory_fetch_completed_by_follower_transition(make_ctx: MakeCtx) -> None:
    """Item 25: losing leadership answers parked fetches with NOT_LEADER_OR_FOLLOWER and the new
    epoch."""
    ctx = _leader(make_ctx)
    _parked_fetch(ctx)
    ctx.deliver_request(3, ctx.vote_request(3, 2, 1, 1))
    assert ctx.state() is RaftState.UNATTACHED
    (response,) = ctx.take_responses(2)
    assert isinstance(response, FetchResponse)
    assert response.error_code is Errors.NOT_LEADER_OR_FOLLOWER
    assert response.leader_epoch == 2
    assert response.leader_id is None


def test_parked_fetch_completed_by_high_watermark_advance(make_ctx: MakeCtx) -> None:
    """Section 3.2 ([T]): a high-watermark advance completes parked fetches."""
    ctx = _leader(make_ctx, [1, 2, 3, 4, 5])
    for voter in (2, 3):
        _fetch(ctx, voter, ctx.fetch_request(voter, 1, 1, 1, max_wait_ms=0))
    assert ctx.core.high_watermark == 1
    _append(ctx, "x")
    # Voter 2 is level with the leader but alone: its fetch waits.
    assert ctx.deliver_request(2, ctx.fetch_request(2, 1, 2, 1, high_watermark=1)) == []
    # Voter 3 catches up too: the HWM moves to 2 and voter 2's parked fetch completes.
    response = _fetch(ctx, 3, ctx.fetch_request(3, 1, 2, 1, high_watermark=1))
    assert response.high_watermark == 2
    (completed,) = ctx.take_responses(2)
    assert isinstance(completed, FetchResponse)
    assert completed.high_watermark == 2
    assert completed.records == b""


def test_high_watermark_linger_sends_the_new_high_watermark_with_the_next_records(
    make_ctx: MakeCtx,
) -> None:
    """With high_watermark_linger_ms, a fetch that only has a newer high watermark to learn
    waits up to the linger for records to carry it along (one message instead of two)."""
    ctx = _leader(make_ctx, [1, 2, 3], high_watermark_linger_ms=5)
    _fetch(ctx, 2, ctx.fetch_request(2, 1, 0, 0))
    # Voter 2 acknowledges offset 1: the high watermark moves to 1, but the answer lingers.
    assert ctx.deliver_request(2, ctx.fetch_request(2, 1, 1, 1)) == []
    assert ctx.core.high_watermark == 1  # the commit itself does not wait
    ctx.core.propose(ctx.now_ms, ctx.records("x"))
    ctx.collect()
    (response,) = ctx.take_responses(2)
    assert isinstance(response, FetchResponse)
    assert _layout(response.records) == [(1, 1, 1)] and response.high_watermark == 1


def test_high_watermark_linger_answers_after_the_linger_without_records(
    make_ctx: MakeCtx,
) -> None:
    ctx = _leader(make_ctx, [1, 2, 3], high_watermark_linger_ms=5)
    _fetch(ctx, 2, ctx.fetch_request(2, 1, 0, 0))
    _fetch(ctx, 3, ctx.fetch_request(3, 1, 0, 0))
    # Voter 3's acknowledgement moves the high watermark to 1, and neither voter knows it yet:
    # both fetches wait 5 ms at most for records to carry it.
    assert ctx.deliver_request(3, ctx.fetch_request(3, 1, 1, 1)) == []
    assert ctx.core.high_watermark == 1
    assert ctx.deliver_request(2, ctx.fetch_request(2, 1, 1, 1)) == []
    assert ctx.core.next_deadline_ms() == ctx.now_ms + 5
    ctx.advance(4)
    assert ctx.take_responses(2) == [] and ctx.take_responses(3) == []
    ctx.advance(1)
    for voter in (2, 3):
        (response,) = ctx.take_responses(voter)
        assert isinstance(response, FetchResponse)
        assert response.records == b"" and response.high_watermark == 1


# --- leader acknowledgement, check-quorum, heartbeats (items 26-29) ------------------------------


def test_fetch_should_be_treated_as_leader_acknowledgement(make_ctx: MakeCtx) -> None:
    """Item 26: a voter that fetches has acknowledged the epoch: no BeginQuorumEpoch again while
    it keeps fetching, even though it never answered the first one."""
    ctx = make_ctx(1, [1, 2, 3], fetch_timeout_ms=10_000)  # heartbeat every 5000 ms
    ctx.expire_election_timer()
    ctx.grant_pre_votes(2)
    ctx.grant_votes(2)
    assert ctx.state() is RaftState.LEADER
    start = ctx.now_ms
    assert {r.destination for r in ctx.take_requests(BeginQuorumEpochRequest)} == {2, 3}
    _fetch(ctx, 2, ctx.fetch_request(2, 1, 0, 0))
    ctx.advance(2000)  # both BeginQuorumEpoch requests time out
    assert ctx.take_requests(BeginQuorumEpochRequest) == []
    ctx.advance_to(start + 4000)
    _fetch(ctx, 2, ctx.fetch_request(2, 1, 1, 1, max_wait_ms=0))
    ctx.advance_to(start + 5000)
    assert {r.destination for r in ctx.take_requests(BeginQuorumEpochRequest)} == {3}


def test_leader_should_resign_leadership_if_not_get_fetch_request_from_majority_voters(
    make_ctx: MakeCtx,
) -> None:
    """Item 27: with 5 voters the leader needs fetches from 2 others within 1.5 x fetch timeout;
    otherwise it resigns (same epoch, nothing persisted) and sends EndQuorumEpoch."""
    ctx = _leader(make_ctx, [1, 2, 3, 4, 5])
    start = ctx.now_ms
    ctx.advance(1000)
    _fetch(ctx, 2, ctx.fetch_request(2, 1, 1, 1, max_wait_ms=0))  # one voter is not enough
    ctx.advance_to(start + CHECK_QUORUM - 1)
    assert ctx.state() is RaftState.LEADER
    effects = ctx.advance(1)
    assert ctx.state() is RaftState.RESIGNED
    assert ctx.core.epoch == 1
    assert effects.persist is None
    ctx.assert_persisted(1, leader_id=1, voted=1)
    end_quorum = ctx.take_requests(EndQuorumEpochRequest)
    assert {r.destination for r in end_quorum} == {2, 3, 4, 5}
    message = end_quorum[0].message
    assert isinstance(message, EndQuorumEpochRequest)
    assert [s.replica_id for s in message.preferred_successors] == [2, 3, 4, 5]


def test_leader_keeps_leadership_while_a_majority_fetches(make_ctx: MakeCtx) -> None:
    """Item 27 (counterpart): fetches from a majority reset the check-quorum timer."""
    ctx = _leader(make_ctx, [1, 2, 3, 4, 5])
    start = ctx.now_ms
    ctx.advance(2000)
    _fetch(ctx, 2, ctx.fetch_request(2, 1, 1, 1, max_wait_ms=0))
    _fetch(ctx, 3, ctx.fetch_request(3, 1, 1, 1, max_wait_ms=0))
    ctx.advance_to(start + 2000 + CHECK_QUORUM - 1)
    assert ctx.state() is RaftState.LEADER
    ctx.advance(1)
    assert ctx.state() is RaftState.RESIGNED


def test_leader_should_not_resign_leadership_if_only_one_voters(make_ctx: MakeCtx) -> None:
    """Item 28: a single-voter leader has no quorum to check and never resigns."""
    ctx = make_ctx(1, [1])
    for _ in range(10):
        ctx.advance(CHECK_QUORUM)
        assert ctx.state() is RaftState.LEADER
    assert ctx.core.epoch == 1
    assert ctx.pending_requests() == []
    # Nor does it ask to be polled again at once: an idle lone leader must not spin.
    assert ctx.core.next_deadline_ms() > ctx.now_ms


def test_begin_quorum_epoch_heartbeat(make_ctx: MakeCtx) -> None:
    """Item 29: BeginQuorumEpoch goes to every voter at election and then, every fetch.timeout/2,
    to each voter that has not fetched within that period."""
    ctx = make_ctx(1, [1, 2, 3])
    ctx.expire_election_timer()
    ctx.grant_pre_votes(2)
    ctx.grant_votes(2)
    start = ctx.now_ms

    def answer_heartbeats(expected: set[int]) -> None:
        requests = ctx.take_requests(BeginQuorumEpochRequest)
        assert {r.destination for r in requests} == expected
        for request in requests:
            assert isinstance(request.message, BeginQuorumEpochRequest)
            assert request.message.leader_epoch == 1
            assert request.message.leader_id == 1
            assert request.message.voter_id == request.destination
            ctx.deliver_response(request, ctx.begin_quorum_response(1, 1))

    answer_heartbeats({2, 3})
    ctx.advance_to(start + BEGIN_QUORUM_INTERVAL - 1)
    answer_heartbeats(set())
    ctx.advance_to(start + BEGIN_QUORUM_INTERVAL)
    answer_heartbeats({2, 3})
    ctx.advance_to(start + 1500)
    _fetch(ctx, 2, ctx.fetch_request(2, 1, 0, 0))  # voter 2 is alive: no heartbeat needed
    ctx.advance_to(start + 2000)
    answer_heartbeats({3})
    ctx.advance_to(start + 2499)
    answer_heartbeats(set())
    ctx.advance_to(start + 2500)  # voter 2's last fetch is now fetch.timeout/2 old
    answer_heartbeats({2})


# --- high watermark (items 30, 31 and section 3.4) ---------------------------------------------


def test_handle_commit_callback_fires_after_follower_high_watermark_advances(
    make_ctx: MakeCtx,
) -> None:
    """Item 30: a follower's committed prefix is bounded by the HWM the leader sends, which
    lags the records it replicates."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, 2, None))
    fetch = ctx.take_request(FetchRequest, 2)
    ctx.deliver_response(fetch, ctx.fetch_response(
        2, 2, records_bytes=ctx.encoded_batches(0, [(2, 3)]), high_watermark=None))
    assert ctx.log.end_offset == 3
    assert ctx.core.high_watermark is None  # replicated, not committed
    ctx.flush()
    fetch = ctx.take_request(FetchRequest, 2)
    assert isinstance(fetch.message, FetchRequest)
    assert fetch.message.fetch_offset == 3
    assert fetch.message.high_watermark is None
    ctx.deliver_response(fetch, ctx.fetch_response(2, 2, high_watermark=2))
    assert ctx.core.high_watermark == 2
    fetch = ctx.take_request(FetchRequest, 2)
    assert isinstance(fetch.message, FetchRequest)
    assert fetch.message.high_watermark == 2  # so the leader answers as soon as it moves
    ctx.deliver_response(fetch, ctx.fetch_response(2, 2, high_watermark=3))
    assert ctx.core.high_watermark == 3


def test_follower_high_watermark_is_capped_by_its_log_end(make_ctx: MakeCtx) -> None:
    """Section 3.3: follower HWM = min(local LEO, leader HWM)."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, 2, None))
    fetch = ctx.take_request(FetchRequest, 2)
    ctx.deliver_response(fetch, ctx.fetch_response(
        2, 2, records_bytes=ctx.encoded_batches(0, [(2, 2)]), high_watermark=10))
    assert ctx.log.end_offset == 2
    assert ctx.core.high_watermark == 2
    ctx.flush()
    fetch = ctx.take_request(FetchRequest, 2)
    ctx.deliver_response(fetch, ctx.fetch_response(
        2, 2, records_bytes=ctx.encoded_batches(2, [(2, 3)]), high_watermark=10))
    assert ctx.core.high_watermark == 5


def test_handle_leader_change_fires_after_listener_reaches_epoch_start_offset(
    make_ctx: MakeCtx,
) -> None:
    """Item 31 (as far as the core goes: it has no listener API): a new leader's epoch starts at
    its LEO, where it writes the LeaderChange record; it exposes no high watermark until that
    record is on a majority, so a state machine gating on HWM > epoch_start_offset is safe."""
    ctx = make_ctx(1, [1, 2, 3], log_epochs=[(1, 3)], election_state=ElectionState(1, None, None))
    ctx.expire_election_timer()
    ctx.grant_pre_votes(2)
    ctx.grant_votes(2)
    assert ctx.state() is RaftState.LEADER
    assert ctx.core.epoch == 2
    assert ctx.core.epoch_start_offset == 3
    assert ctx.log_layout() == [(0, 2, 1), (3, 3, 2)]
    assert ctx.log.batches[-1].is_control
    first, last = ctx.core.propose(ctx.now_ms, ctx.records("a"))
    assert (first, last) == (4, 4)
    ctx.flush()
    assert ctx.core.high_watermark is None
    _fetch(ctx, 2, ctx.fetch_request(2, 2, 4, 2, max_wait_ms=0))
    assert ctx.core.high_watermark == 4


def test_leader_has_no_high_watermark_until_leader_change_is_on_a_majority(
    make_ctx: MakeCtx,
) -> None:
    """Section 3.4: data of older epochs on a majority does not commit anything; only the
    LeaderChange of the current epoch on a majority gives the leader an HWM."""
    ctx = make_ctx(1, [1, 2, 3], log_epochs=[(1, 3)], election_state=ElectionState(1, None, None))
    epoch = ctx.become_leader()
    assert epoch == 2
    assert ctx.core.epoch_start_offset == 3
    response = _fetch(ctx, 2, ctx.fetch_request(2, epoch, 3, 1))  # holds 0-2, not the LeaderChange
    assert response.high_watermark is None
    assert _layout(response.records) == [(3, 3, 2)]
    assert ctx.core.high_watermark is None
    response = _fetch(ctx, 2, ctx.fetch_request(2, epoch, 4, 2))
    assert response.high_watermark == 4
    assert ctx.core.high_watermark == 4


def test_leader_high_watermark_never_decreases(make_ctx: MakeCtx) -> None:
    """Section 3.4 (KAFKA-16530, KAFKA-12181): voters reporting smaller offsets (they lost their
    disks) do not lower the HWM, and that is not an error."""
    ctx = _leader(make_ctx)
    _append(ctx, "a", "b", "c")
    for voter in (2, 3):
        _fetch(ctx, voter, ctx.fetch_request(voter, 1, 4, 1, max_wait_ms=0))
    assert ctx.core.high_watermark == 4
    # Both now hold only the LeaderChange: a majority at 1, still past the epoch start (0).
    response = _fetch(ctx, 2, ctx.fetch_request(2, 1, 1, 1, max_wait_ms=0))
    assert response.high_watermark == 4
    response = _fetch(ctx, 3, ctx.fetch_request(3, 1, 1, 1, max_wait_ms=0))
    assert response.high_watermark == 4
    assert _layout(response.records) == [(1, 3, 1)]
    assert ctx.core.high_watermark == 4
    assert ctx.state() is RaftState.LEADER


def test_leader_counts_only_its_flushed_offset(make_ctx: MakeCtx) -> None:
    """The leader's own progress is its flushed offset, not its LEO."""
    ctx = make_ctx(1, [1, 2, 3])
    ctx.expire_election_timer()
    ctx.grant_pre_votes(2)
    ctx.grant_votes(2)
    assert ctx.last_effects.flush is True
    assert ctx.core.flushed_offset == 0
    # Voter 2 has the LeaderChange; the leader has not flushed it: 1 of 3.
    response = _fetch(ctx, 2, ctx.fetch_request(2, 1, 1, 1, max_wait_ms=0))
    assert response.high_watermark is None
    assert ctx.core.high_watermark is None
    ctx.flush()
    assert ctx.core.flushed_offset == 1
    assert ctx.core.high_watermark == 1
    # Same with data appended later.
    ctx.core.propose(ctx.now_ms, ctx.records("a", "b"))
    ctx.advance(ctx.config.append_linger_ms)
    assert ctx.last_effects.flush is True
    _fetch(ctx, 2, ctx.fetch_request(2, 1, 3, 1, max_wait_ms=0))
    _fetch(ctx, 3, ctx.fetch_request(3, 1, 1, 1, max_wait_ms=0))
    assert ctx.core.high_watermark == 1
    _fetch(ctx, 3, ctx.fetch_request(3, 1, 3, 1, max_wait_ms=0))
    assert ctx.core.high_watermark == 3  # two remote voters suffice


def test_observer_fetches_do_not_count_for_high_watermark(make_ctx: MakeCtx) -> None:
    """Section 3.4: observer LEOs never count."""
    ctx = _leader(make_ctx, observer_ids=[7])
    response = _fetch(ctx, 7, ctx.fetch_request(7, 1, 1, 1, max_wait_ms=0))
    assert response.error_code is Errors.NONE
    assert ctx.core.high_watermark is None


def test_follower_only_fetches_once_its_log_is_flushed(make_ctx: MakeCtx) -> None:
    """A follower's FetchOffset acknowledges durable data: no fetch until the flush is done."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, 2, None))
    fetch = ctx.take_request(FetchRequest, 2)
    effects = ctx.deliver_response(fetch, ctx.fetch_response(
        2, 2, records_bytes=ctx.encoded_batches(0, [(2, 2)]), high_watermark=None))
    assert effects.flush is True
    assert ctx.pending_requests(FetchRequest) == []
    ctx.advance(100)
    assert ctx.pending_requests(FetchRequest) == []
    ctx.flush()
    fetch = ctx.take_request(FetchRequest, 2)
    assert isinstance(fetch.message, FetchRequest)
    assert fetch.message.fetch_offset == 2
    assert fetch.message.last_fetch_epoch == 2


def test_follower_has_one_fetch_in_flight(make_ctx: MakeCtx) -> None:
    """Section 3.1: exactly one fetch in flight; a new one once it is answered or timed out."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, 2, None),
                   fetch_timeout_ms=5000, request_timeout_ms=1500)
    assert len(ctx.take_requests(FetchRequest, 2)) == 1
    ctx.advance(1499)
    assert ctx.pending_requests(FetchRequest) == []
    ctx.advance(1)
    assert len(ctx.take_requests(FetchRequest, 2)) == 1


# --- epoch fencing and validation of Fetch -------------------------------------------------------


def test_fetch_epoch_fencing_at_leader(make_ctx: MakeCtx) -> None:
    """Section 3.2: an older epoch is FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH; both
    carry the leader's id and epoch and no records."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(4, None, None))
    epoch = ctx.become_leader()
    response = _fetch(ctx, 2, ctx.fetch_request(2, epoch - 1, 0, 0))
    assert response.error_code is Errors.FENCED_LEADER_EPOCH
    assert (response.leader_id, response.leader_epoch) == (1, epoch)
    assert response.records == b""
    response = _fetch(ctx, 2, ctx.fetch_request(2, epoch + 1, 0, 0))
    assert response.error_code is Errors.UNKNOWN_LEADER_EPOCH
    assert (response.leader_id, response.leader_epoch) == (1, epoch)
    assert ctx.state() is RaftState.LEADER
    assert ctx.core.high_watermark is None  # neither counted as progress


def test_fetch_at_non_leader_is_not_leader_or_follower(make_ctx: MakeCtx) -> None:
    """Section 3.2: a fetch of the current epoch at a follower names the leader (this is how
    observers find it)."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(4, 3, None), observer_ids=[5])
    response = _fetch(ctx, 5, ctx.fetch_request(5, 4, 0, 0))
    assert response.error_code is Errors.NOT_LEADER_OR_FOLLOWER
    assert (response.leader_id, response.leader_epoch) == (3, 4)
    response = _fetch(ctx, 5, ctx.fetch_request(5, 3, 0, 0))
    assert response.error_code is Errors.FENCED_LEADER_EPOCH
    response = _fetch(ctx, 5, ctx.fetch_request(5, 5, 0, 0))
    assert response.error_code is Errors.UNKNOWN_LEADER_EPOCH
    assert ctx.state() is RaftState.FOLLOWER
    assert ctx.core.epoch == 4


@pytest.mark.parametrize(
    ("fetch_offset", "last_epoch", "max_wait_ms"),
    [(-1, 0, 500), (0, -1, 500), (0, 0, -1), (3, 2, 500)],  # last epoch > current epoch
)
def test_invalid_fetch_request(
    make_ctx: MakeCtx, fetch_offset: int, last_epoch: int, max_wait_ms: int
) -> None:
    """Section 3.2 step 1: malformed fetches get INVALID_REQUEST."""
    ctx = _leader(make_ctx)
    response = _fetch(ctx, 2, ctx.fetch_request(2, 1, fetch_offset, last_epoch,
                                                max_wait_ms=max_wait_ms))
    assert response.error_code is Errors.INVALID_REQUEST
    assert ctx.core.high_watermark is None


def test_fetch_response_with_higher_epoch_moves_follower(make_ctx: MakeCtx) -> None:
    """Section 4.7: a FENCED_LEADER_EPOCH answer naming a newer leader makes the follower follow
    it; an UNKNOWN_LEADER_EPOCH answer (an older peer) is dropped."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(4, 2, None))
    fetch = ctx.take_request(FetchRequest, 2)
    ctx.deliver_response(fetch, ctx.fetch_response(2, 3, error=Errors.UNKNOWN_LEADER_EPOCH))
    assert (ctx.state(), ctx.core.epoch, ctx.core.leader_id) == (RaftState.FOLLOWER, 4, 2)
    ctx.advance(ctx.config.retry_backoff_ms)
    fetch = ctx.take_request(FetchRequest, 2)
    ctx.deliver_response(fetch, ctx.fetch_response(3, 5, error=Errors.FENCED_LEADER_EPOCH))
    assert (ctx.state(), ctx.core.epoch, ctx.core.leader_id) == (RaftState.FOLLOWER, 5, 3)
    ctx.assert_persisted(5, leader_id=3)
    assert [r.destination for r in ctx.take_requests(FetchRequest)] == [3]


# --- discovery (item 32) -------------------------------------------------------------------------


def test_observer_send_discovery_fetch_after_fetch_timeout(make_ctx: MakeCtx) -> None:
    """Item 32: an observer whose leader stops answering goes Unattached, fetches from a voter
    (the first other one, with ZeroRandom) and follows the leader that voter names."""
    ctx = make_ctx(4, [1, 2, 3], election_state=ElectionState(2, 2, None))
    assert [r.destination for r in ctx.take_requests(FetchRequest)] == [2]
    ctx.advance(FETCH_TIMEOUT)
    assert ctx.state() is RaftState.UNATTACHED
    discovery = ctx.take_request(FetchRequest, 1)
    assert isinstance(discovery.message, FetchRequest)
    assert discovery.message.current_leader_epoch == 2
    assert discovery.message.replica_id == 4
    # Voter 1 follows a new leader, 3, in epoch 3.
    ctx.deliver_response(discovery, ctx.fetch_response(
        3, 3, error=Errors.FENCED_LEADER_EPOCH))
    assert ctx.state() is RaftState.FOLLOWER
    assert (ctx.core.epoch, ctx.core.leader_id) == (3, 3)
    assert [r.destination for r in ctx.take_requests(FetchRequest)] == [3]


def test_observer_rediscovers_same_epoch_leader(make_ctx: MakeCtx) -> None:
    """Item 32: the voter asked may name the same leader (it was only slow): follow it again."""
    ctx = make_ctx(4, [1, 2, 3], election_state=ElectionState(2, 2, None))
    ctx.clear_outbox()
    ctx.advance(FETCH_TIMEOUT)
    discovery = ctx.take_request(FetchRequest, 1)
    ctx.deliver_response(discovery, ctx.fetch_response(
        2, 2, error=Errors.NOT_LEADER_OR_FOLLOWER))
    assert (ctx.state(), ctx.core.epoch, ctx.core.leader_id) == (RaftState.FOLLOWER, 2, 2)
    assert [r.destination for r in ctx.take_requests(FetchRequest)] == [2]


def test_follower_leader_rediscovery_after_request_timeout(make_ctx: MakeCtx) -> None:
    """Item 32 (KAFKA-17030): an unattached voter fetches from a voter to discover the leader
    before its election timer fires, and follows the leader it learns about."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, None, None))
    assert ctx.state() is RaftState.UNATTACHED
    discovery = ctx.take_request(FetchRequest, 2)
    assert isinstance(discovery.message, FetchRequest)
    assert discovery.message.current_leader_epoch == 2
    ctx.deliver_response(discovery, ctx.fetch_response(
        3, 2, error=Errors.NOT_LEADER_OR_FOLLOWER))
    assert ctx.state() is RaftState.FOLLOWER
    assert ctx.core.leader_id == 3
    ctx.assert_persisted(2, leader_id=3)
    assert [r.destination for r in ctx.take_requests(FetchRequest)] == [3]
    assert ctx.pending_requests(VoteRequest) == []


def test_discovery_fetch_answered_by_the_leader_itself(make_ctx: MakeCtx) -> None:
    """Item 32: when the voter asked is the leader, its records are taken at once."""
    ctx = make_ctx(4, [1, 2, 3], election_state=ElectionState(2, None, None))
    discovery = ctx.take_request(FetchRequest, 1)
    ctx.deliver_response(discovery, ctx.fetch_response(
        1, 2, records_bytes=ctx.encoded_batches(0, [(2, 2)]), high_watermark=1))
    assert (ctx.state(), ctx.core.leader_id) == (RaftState.FOLLOWER, 1)
    assert ctx.log.end_offset == 2
    assert ctx.core.high_watermark == 1


def test_fetch_from_voter_id_with_other_directory_counts_as_observer(make_ctx: MakeCtx) -> None:
    """KIP-856 / section 3.4: a fetch from a voter's id with another directory id is an
    observer's: it neither advances the HWM nor satisfies check-quorum."""
    dirs = {1: uuid.UUID(int=1), 2: uuid.UUID(int=2), 3: uuid.UUID(int=3)}
    ctx = make_ctx(1, [1, 2, 3], directory_ids=dirs)
    ctx.become_leader()
    start = ctx.now_ms
    stranger = uuid.UUID(int=99)
    response = _fetch(ctx, 2, ctx.fetch_request(2, 1, 1, 1, max_wait_ms=0, directory_id=stranger))
    assert response.error_code is Errors.NONE
    assert ctx.core.high_watermark is None
    ctx.advance_to(start + CHECK_QUORUM)
    assert ctx.state() is RaftState.RESIGNED


def test_fetch_from_voter_with_its_directory_id_counts(make_ctx: MakeCtx) -> None:
    """Control for the above: the voter's own directory id counts."""
    dirs = {1: uuid.UUID(int=1), 2: uuid.UUID(int=2), 3: uuid.UUID(int=3)}
    ctx = make_ctx(1, [1, 2, 3], directory_ids=dirs)
    ctx.become_leader()
    _fetch(ctx, 2, ctx.fetch_request(2, 1, 1, 1, max_wait_ms=0, directory_id=dirs[2]))
    assert ctx.core.high_watermark == 1


def test_observer_fetches_do_not_satisfy_check_quorum(make_ctx: MakeCtx) -> None:
    """Section 3.5: only voters keep the leader in office."""
    ctx = _leader(make_ctx)
    start = ctx.now_ms
    for t in (500, 1500, 2500):
        ctx.advance_to(start + t)
        _fetch(ctx, 7, ctx.fetch_request(7, 1, 1, 1, max_wait_ms=0))
    ctx.advance_to(start + CHECK_QUORUM)
    assert ctx.state() is RaftState.RESIGNED


def test_new_leader_keeps_local_high_watermark_but_advertises_none(make_ctx: MakeCtx) -> None:
    """Section 3.4: a follower with HWM 2 that becomes leader advertises no HWM until its
    LeaderChange is on a majority; its local HWM never goes backwards meanwhile."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(1, 2, None))
    fetch = ctx.take_request(FetchRequest, 2)
    ctx.deliver_response(fetch, ctx.fetch_response(
        2, 1, records_bytes=ctx.encoded_batches(0, [(1, 2)]), high_watermark=2))
    ctx.flush()
    assert ctx.core.high_watermark == 2
    epoch = ctx.become_leader()
    assert epoch == 2
    assert ctx.core.epoch_start_offset == 2
    response = _fetch(ctx, 3, ctx.fetch_request(3, 2, 0, 0, max_wait_ms=0))
    assert response.high_watermark is None
    assert ctx.core.high_watermark == 2
    response = _fetch(ctx, 3, ctx.fetch_request(3, 2, 3, 2, max_wait_ms=0))
    assert response.high_watermark == 3
    assert ctx.core.high_watermark == 3


# --- the driver contract: next_deadline_ms ---------------------------------------------------


def _assert_no_busy_deadline(ctx: RaftTestContext) -> None:
    """Right after a poll at ``now`` nothing is due at ``now`` any more."""
    ctx.poll()
    assert ctx.core.next_deadline_ms() > ctx.now_ms


def test_next_deadline_follows_the_timers(make_ctx: MakeCtx) -> None:
    """next_deadline_ms() is when the next timer fires: polling then makes progress, and
    never returns a time at which a poll would do nothing."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, 3, None))
    assert ctx.core.next_deadline_ms() == FETCH_TIMEOUT  # fetch timer (= request timeout)
    ctx.advance_to(ctx.core.next_deadline_ms())
    assert ctx.state() is RaftState.PROSPECTIVE
    assert ctx.core.next_deadline_ms() == FETCH_TIMEOUT + T
    _assert_no_busy_deadline(ctx)
    ctx = make_ctx(1, [1, 2, 3])
    ctx.expire_election_timer()
    ctx.grant_pre_votes(2)
    ctx.grant_votes(2)
    ctx.flush()
    _assert_no_busy_deadline(ctx)
    # BeginQuorumEpoch in flight: the next event is their request timeout...
    assert ctx.core.next_deadline_ms() == ctx.now_ms + ctx.config.request_timeout_ms
    for request in ctx.take_requests(BeginQuorumEpochRequest):
        ctx.deliver_response(request, ctx.begin_quorum_response(1, 1))
    # ... once answered, the next heartbeat.
    assert ctx.core.next_deadline_ms() == ctx.now_ms + BEGIN_QUORUM_INTERVAL
    ctx.core.propose(ctx.now_ms, ctx.records("a"))  # appended at once: the disk was idle
    ctx.core.propose(ctx.now_ms, ctx.records("b"))  # waits behind the flush, at most the linger
    assert ctx.core.next_deadline_ms() == ctx.now_ms + ctx.config.append_linger_ms


def test_next_deadline_skips_voters_in_backoff(make_ctx: MakeCtx) -> None:
    """A heartbeat that cannot be sent before a retry back-off ends is not due before then."""
    ctx = make_ctx(1, [1, 2, 3])
    ctx.expire_election_timer()
    ctx.grant_pre_votes(2)
    ctx.grant_votes(2)
    start = ctx.now_ms
    heartbeat = ctx.take_request(BeginQuorumEpochRequest, 2)
    ctx.advance_to(start + BEGIN_QUORUM_INTERVAL - 10)
    ctx.deliver_response(heartbeat, ctx.begin_quorum_response(
        1, 1, error=Errors.BROKER_NOT_AVAILABLE))  # back-off for 20 ms
    ctx.advance_to(start + BEGIN_QUORUM_INTERVAL)
    _assert_no_busy_deadline(ctx)


def test_leader_high_watermark_with_an_even_number_of_voters(make_ctx: MakeCtx) -> None:
    """Section 3.4: with 4 voters the HWM is the third-highest offset (3 of 4 is a majority)."""
    ctx = _leader(make_ctx, [1, 2, 3, 4])
    _fetch(ctx, 2, ctx.fetch_request(2, 1, 1, 1, max_wait_ms=0))
    assert ctx.core.high_watermark is None
    _fetch(ctx, 3, ctx.fetch_request(3, 1, 1, 1, max_wait_ms=0))
    assert ctx.core.high_watermark == 1


def test_failed_fetch_is_retried_after_the_back_off(make_ctx: MakeCtx) -> None:
    """Driver contract: handle_request_failure backs the destination off for retry_backoff_ms."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, 2, None))
    fetch = ctx.take_request(FetchRequest, 2)
    ctx.core.handle_request_failure(ctx.now_ms, 2, fetch.correlation_id)
    ctx.collect()
    assert ctx.pending_requests(FetchRequest) == []
    ctx.advance(ctx.config.retry_backoff_ms - 1)
    assert ctx.pending_requests(FetchRequest) == []
    ctx.advance(1)
    assert len(ctx.take_requests(FetchRequest, 2)) == 1


def test_a_batch_never_outgrows_the_limit(make_ctx: MakeCtx) -> None:
    """Proposals that would together overflow one batch are split at a proposal boundary; one
    proposal larger than a batch is refused and changes nothing."""
    ctx = make_ctx(1, [1, 2, 3], max_batch_bytes=100)
    ctx.become_leader()
    ctx.core.propose(ctx.now_ms, ctx.records("a" * 60))  # appended at once (idle disk)
    ctx.core.propose(ctx.now_ms, ctx.records("b" * 60))
    ctx.core.propose(ctx.now_ms, ctx.records("c" * 60))  # b + c would not fit one batch
    ctx.collect()
    ctx.flush()
    ctx.advance(ctx.config.append_linger_ms)
    assert ctx.log_layout()[-3:] == [(1, 1, 1), (2, 2, 1), (3, 3, 1)]
    end = ctx.log.end_offset
    with pytest.raises(ValueError, match="exceed one batch"):
        ctx.core.propose(ctx.now_ms, ctx.records("d" * 200))
    ctx.advance(ctx.config.append_linger_ms)
    assert ctx.log.end_offset == end
