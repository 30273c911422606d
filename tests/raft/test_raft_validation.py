"""Request validation shared by every RPC and the durability contract of the effects:
INCONSISTENT_CLUSTER_ID, INVALID_VOTER_KEY, INVALID_REQUEST, quorum-state persisted before the
messages it guards, and the memory-only states (Prospective, Resigned).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from quorum_node.raft.core import OutboundRequest, OutboundResponse
from quorum_node.raft.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochResponse,
    FetchResponse,
    RaftRequest,
    VoteRequest,
    VoteResponse,
)
from quorum_node.raft.state import ElectionState, RaftState
from quorum_node.raft.types import Errors, ReplicaKey

if TYPE_CHECKING:
    from context import RaftTestContext

    MakeCtx = Callable[..., RaftTestContext]

T = 1000


def _requests(ctx: RaftTestContext, cluster_id: str | None) -> dict[str, RaftRequest]:
    """One request of each kind from voter 2, all of a newer epoch (3) than the local one (2), so
    that a request that slipped through validation would visibly move the replica."""
    return {
        "vote": ctx.vote_request(2, 3, 0, 0, cluster_id=cluster_id),
        "pre-vote": ctx.vote_request(2, 3, 0, 0, pre_vote=True, cluster_id=cluster_id),
        "fetch": ctx.fetch_request(2, 3, 0, 0, cluster_id=cluster_id),
        "begin-quorum-epoch": ctx.begin_quorum_request(2, 3, cluster_id=cluster_id),
        "end-quorum-epoch": ctx.end_quorum_request(2, 3, [1], cluster_id=cluster_id),
    }


@pytest.mark.parametrize("kind", ["vote", "pre-vote", "fetch", "begin-quorum-epoch",
                                  "end-quorum-epoch"])
@pytest.mark.parametrize("cluster_id", ["other-cluster", ""])
def test_inconsistent_cluster_id_on_every_request_type(
    make_ctx: MakeCtx, kind: str, cluster_id: str
) -> None:
    """Every RPC from another cluster (an empty id included) gets INCONSISTENT_CLUSTER_ID and
    changes nothing."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, None, None))
    response = ctx.deliver_one(2, _requests(ctx, cluster_id)[kind])
    assert response.error_code is Errors.INCONSISTENT_CLUSTER_ID
    assert (ctx.state(), ctx.core.epoch) == (RaftState.UNATTACHED, 2)
    assert all(e.persist is None for e in ctx.history)


@pytest.mark.parametrize(
    ("kind", "error", "epoch"),
    [
        ("vote", Errors.NONE, 3),
        ("pre-vote", Errors.NONE, 3),
        ("fetch", Errors.UNKNOWN_LEADER_EPOCH, 2),  # leader-only: a newer epoch is unknown here
        ("begin-quorum-epoch", Errors.NONE, 3),
        # KIP-595: an EndQuorumEpoch of an epoch not known here is refused (after the cluster id)
        ("end-quorum-epoch", Errors.UNKNOWN_LEADER_EPOCH, 2),
    ],
)
def test_null_cluster_id_is_accepted(
    make_ctx: MakeCtx, kind: str, error: Errors, epoch: int
) -> None:
    """A request without a cluster id is accepted (older peers, Kafka's rule)."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, None, None))
    response = ctx.deliver_one(2, _requests(ctx, None)[kind])
    assert response.error_code is error
    assert ctx.core.epoch == epoch


def test_inconsistent_cluster_id_at_leader(make_ctx: MakeCtx) -> None:
    """The leader too rejects a fetch of another cluster, and does not count it."""
    ctx = make_ctx(1, [1, 2, 3])
    ctx.become_leader()
    response = ctx.deliver_one(2, ctx.fetch_request(2, 1, 1, 1, cluster_id="x"))
    assert isinstance(response, FetchResponse)
    assert response.error_code is Errors.INCONSISTENT_CLUSTER_ID
    assert response.records == b""
    assert ctx.core.high_watermark is None


# --- voter keys (KIP-856) ----------------------------------------------------------------------

LOCAL_DIR = uuid.UUID(int=1)
DIRS = {1: LOCAL_DIR, 2: uuid.UUID(int=2), 3: uuid.UUID(int=3)}


@pytest.mark.parametrize(
    ("voter_id", "voter_directory_id"),
    [(9, None), (9, LOCAL_DIR), (1, uuid.UUID(int=99))],
)
@pytest.mark.parametrize("pre_vote", [False, True])
def test_invalid_voter_key_on_vote(
    make_ctx: MakeCtx, voter_id: int, voter_directory_id: uuid.UUID | None, pre_vote: bool
) -> None:
    """A (pre-)vote addressed to another replica key gets INVALID_VOTER_KEY and no vote; the
    newer epoch it carries is still adopted (step 5 before step 6)."""
    ctx = make_ctx(1, [1, 2, 3], directory_ids=DIRS, election_state=ElectionState(2, None, None))
    response = ctx.deliver_one(2, ctx.vote_request(
        2, 3, 0, 0, pre_vote=pre_vote, voter_id=voter_id, voter_directory_id=voter_directory_id,
        candidate_directory_id=DIRS[2]))
    assert isinstance(response, VoteResponse)
    assert response.error_code is Errors.INVALID_VOTER_KEY
    assert response.vote_granted is False
    assert ctx.core.epoch == 3
    ctx.assert_persisted(3)  # epoch only: no vote recorded


def test_vote_with_matching_voter_key_is_granted(make_ctx: MakeCtx) -> None:
    """Control for the above: the right (id, directory id) is granted and the vote records the
    candidate's directory id."""
    ctx = make_ctx(1, [1, 2, 3], directory_ids=DIRS, election_state=ElectionState(2, None, None))
    response = ctx.deliver_one(2, ctx.vote_request(
        2, 3, 0, 0, voter_id=1, voter_directory_id=LOCAL_DIR, candidate_directory_id=DIRS[2]))
    assert isinstance(response, VoteResponse)
    assert response.error_code is Errors.NONE
    assert response.vote_granted is True
    ctx.assert_persisted(3, voted=ReplicaKey(2, DIRS[2]))
    # Same id, other directory: a different replica, no second vote.
    response = ctx.deliver_one(2, ctx.vote_request(
        2, 3, 0, 0, voter_id=1, voter_directory_id=LOCAL_DIR,
        candidate_directory_id=uuid.UUID(int=42)))
    assert isinstance(response, VoteResponse)
    assert response.vote_granted is False


def test_invalid_voter_key_on_begin_quorum_epoch(make_ctx: MakeCtx) -> None:
    """BeginQuorumEpoch to another key: the leader is still learned (maybeTransition runs
    first), the answer is INVALID_VOTER_KEY."""
    ctx = make_ctx(1, [1, 2, 3], directory_ids=DIRS, election_state=ElectionState(2, None, None))
    response = ctx.deliver_one(3, ctx.begin_quorum_request(
        3, 3, voter_id=1, voter_directory_id=uuid.UUID(int=99)))
    assert isinstance(response, BeginQuorumEpochResponse)
    assert response.error_code is Errors.INVALID_VOTER_KEY
    assert (ctx.state(), ctx.core.epoch, ctx.core.leader_id) == (RaftState.FOLLOWER, 3, 3)


def test_invalid_voter_key_on_end_quorum_epoch(make_ctx: MakeCtx) -> None:
    """EndQuorumEpoch to another key: INVALID_VOTER_KEY and no election back-off override."""
    ctx = make_ctx(1, [1, 2, 3], directory_ids=DIRS, election_state=ElectionState(2, 3, None))
    response = ctx.deliver_one(3, ctx.end_quorum_request(
        3, 2, [ReplicaKey(1, LOCAL_DIR)], voter_id=2, voter_directory_id=DIRS[2]))
    assert isinstance(response, EndQuorumEpochResponse)
    assert response.error_code is Errors.INVALID_VOTER_KEY
    assert ctx.state() is RaftState.FOLLOWER  # not Prospective at once


def test_begin_quorum_epoch_validation(make_ctx: MakeCtx) -> None:
    """BeginQuorumEpoch: an older epoch is fenced; a leader id equal to ours is invalid."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(4, None, None))
    response = ctx.deliver_one(2, ctx.begin_quorum_request(2, 3))
    assert response.error_code is Errors.FENCED_LEADER_EPOCH
    response = ctx.deliver_one(2, ctx.begin_quorum_request(1, 5))
    assert response.error_code is Errors.INVALID_REQUEST
    assert (ctx.state(), ctx.core.epoch) == (RaftState.UNATTACHED, 4)


def test_begin_quorum_epoch_persisted_with_its_response(make_ctx: MakeCtx) -> None:
    """Unattached -> Follower on BeginQuorumEpoch, persisted in the same effects as the answer."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, None, None))
    response = ctx.deliver_one(3, ctx.begin_quorum_request(3, 2))
    assert response.error_code is Errors.NONE
    assert ctx.last_effects.persist == ElectionState(2, 3, None)
    assert any(isinstance(m, OutboundResponse) for m in ctx.last_effects.messages)


# --- durability of the effects -------------------------------------------------------------------


def test_quorum_state_persisted_before_vote_response(make_ctx: MakeCtx) -> None:
    """The granted vote is in Effects.persist of the very batch that carries the response, so the
    driver (persist first, then send) never lets a vote out before it is durable."""
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, None, None))
    ctx.clear_outbox()
    ctx.core.handle_request(ctx.now_ms, 2, 77, ctx.vote_request(2, 3, 0, 0))
    effects = ctx.core.take_effects()
    assert effects.persist == ElectionState(3, None, ReplicaKey(2))
    responses = [m for m in effects.messages if isinstance(m, OutboundResponse)]
    assert len(responses) == 1
    assert responses[0].correlation_id == 77
    assert isinstance(responses[0].message, VoteResponse)
    assert responses[0].message.vote_granted is True
    # Nothing is left for a later batch.
    assert ctx.core.take_effects().persist is None


def test_candidate_vote_persisted_with_its_vote_requests(make_ctx: MakeCtx) -> None:
    """A Candidate's vote for itself is persisted in the batch that sends its vote requests."""
    ctx = make_ctx(1, [1, 2, 3])
    ctx.expire_election_timer()
    pre_vote = ctx.take_request(VoteRequest, 2)
    ctx.take_requests(VoteRequest)
    effects = ctx.deliver_response(pre_vote, ctx.vote_response(True, 0))
    assert effects.persist == ElectionState(1, None, ReplicaKey(1))
    sent = [m for m in effects.messages if isinstance(m, OutboundRequest)
            and isinstance(m.message, VoteRequest)]
    assert {m.destination for m in sent} == {2, 3}
    assert all(isinstance(m.message, VoteRequest) and not m.message.pre_vote for m in sent)


def test_leader_persisted_with_its_begin_quorum_epoch(make_ctx: MakeCtx) -> None:
    """The new leader's election state is persisted in the batch that announces it."""
    ctx = make_ctx(1, [1, 2, 3])
    ctx.expire_election_timer()
    ctx.grant_pre_votes(2)
    vote = ctx.take_request(VoteRequest, 2)
    effects = ctx.deliver_response(vote, ctx.vote_response(True, 1))
    assert effects.persist == ElectionState(1, 1, ReplicaKey(1))
    assert {m.destination for m in effects.messages if isinstance(m, OutboundRequest)
            and isinstance(m.message, BeginQuorumEpochRequest)} == {2, 3}
    assert effects.flush is True


def test_prospective_and_resigned_never_persist(make_ctx: MakeCtx) -> None:
    """Entering Prospective (from Unattached, Follower or Candidate) and Resigned writes nothing;
    the persisted state is the one of the state they came from."""
    # Unattached -> Prospective
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, None, ReplicaKey(3)))
    effects = ctx.expire_election_timer()
    assert ctx.state() is RaftState.PROSPECTIVE
    assert effects.persist is None
    assert ctx.core.election_state == ElectionState(2, None, ReplicaKey(3))
    # Follower -> Prospective
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, 3, None))
    effects = ctx.advance(ctx.config.fetch_timeout_ms)
    assert ctx.state() is RaftState.PROSPECTIVE
    assert effects.persist is None
    assert ctx.core.election_state == ElectionState(2, 3, None)
    # Candidate -> Prospective
    ctx = make_ctx(1, [1, 2, 3], election_state=ElectionState(2, None, ReplicaKey(1)))
    effects = ctx.expire_election_timer()
    assert ctx.state() is RaftState.PROSPECTIVE
    assert effects.persist is None
    assert ctx.core.election_state == ElectionState(2, None, ReplicaKey(1))
    # Leader -> Resigned (check-quorum and begin_shutdown())
    for how in ("check-quorum", "shutdown"):
        ctx = make_ctx(1, [1, 2, 3])
        ctx.become_leader()
        if how == "check-quorum":
            effects = ctx.advance(ctx.config.check_quorum_timeout_ms)
        else:
            ctx.core.begin_shutdown(ctx.now_ms)
            effects = ctx.collect()
        assert ctx.state() is RaftState.RESIGNED, how
        assert effects.persist is None, how
        assert ctx.core.election_state == ElectionState(1, 1, ReplicaKey(1)), how
