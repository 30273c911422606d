"""KIP-856 voter changes in the core: bootstrapping the voter set into the log, AddVoter and
RemoveVoter with their preconditions and errors, a leader removing itself, and voters applied
from the log before they commit (reference catalogue items 41-45)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from quorum_node.raft.messages import (
    BeginQuorumEpochRequest,
    EndQuorumEpochRequest,
    FetchRequest,
    FetchResponse,
    VoteRequest,
    VoteResponse,
)
from quorum_node.raft.records import Record, decode_batches
from quorum_node.raft.state import RaftState
from quorum_node.raft.types import (
    Errors,
    LeaderNotReadyError,
    NotLeaderError,
    ReplicaKey,
    VoterChangeError,
)
from quorum_node.raft.voters import voter_sets_in

U = {n: uuid.UUID(int=n) for n in range(1, 10)}
REPLACED_3 = uuid.UUID(int=33)  # node 3's new directory after a disk replacement
TIMEOUT_MS = 10_000


def key(node: int, directory: uuid.UUID | None = None) -> ReplicaKey:
    return ReplicaKey(node, directory if directory is not None else U[node])


def fetch(ctx: Any, node: int, offset: int, directory: uuid.UUID | None = None) -> FetchResponse:
    """A fetch from ``node`` at ``offset`` (with the epoch the leader's log has there), answered at
    once (max_wait 0)."""
    last_epoch = ctx.log.end_offset_for_epoch(ctx.core.epoch).epoch if offset else 0
    if offset and ctx.log.batch_containing(offset - 1) is not None:
        last_epoch = ctx.log.batch_containing(offset - 1).epoch
    response = ctx.deliver_one(node, ctx.fetch_request(
        node, ctx.core.epoch, offset, last_epoch, max_wait_ms=0,
        directory_id=directory if directory is not None else U[node]))
    assert isinstance(response, FetchResponse)
    return response


def catch_up(ctx: Any, *nodes: int | tuple[int, uuid.UUID]) -> None:
    """Flush the leader and let each replica fetch to the log end (twice: the second fetch
    acknowledges what the first returned)."""
    ctx.flush()
    for _ in range(2):
        for node in nodes:
            node_id, directory = node if isinstance(node, tuple) else (node, U[node])
            fetch(ctx, node_id, ctx.log.end_offset, directory)
        ctx.flush()


def voter_records(ctx: Any) -> list[tuple[int, tuple[ReplicaKey, ...]]]:
    return [found for batch in ctx.log.batches for found in voter_sets_in(batch)]


@pytest.fixture
def leader(make_ctx: Callable[..., Any]) -> Any:
    """Node 1 leading a 3-voter quorum configured by id, with the bootstrap VotersRecord written
    and committed."""
    ctx = make_ctx(1, (1, 2, 3), local_directory_id=U[1])
    ctx.become_leader()
    catch_up(ctx, 2, 3)
    assert ctx.core.bootstrapped
    assert ctx.core.high_watermark == ctx.log.end_offset
    return ctx


def outcome(ctx: Any, ticket: int) -> tuple[Errors, str] | None:
    """How the change ``ticket`` ended (its one VoterChangeDone effect); None while it runs."""
    done = [d for effects in ctx.history for d in effects.voter_changes if d.ticket == ticket]
    assert len(done) <= 1, done
    return (done[0].error, done[0].message) if done else None


def ended(ctx: Any, ticket: int) -> tuple[Errors, str]:
    """How the change ``ticket`` ended, which it must have by now."""
    found = outcome(ctx, ticket)
    assert found is not None, f"voter change {ticket} has not ended"
    return found


# --- bootstrapping (41) ------------------------------------------------------------------------


def test_leader_writes_configured_voters_with_their_uuids_in_one_batch_before_any_write(
    make_ctx: Callable[..., Any],
) -> None:
    ctx = make_ctx(1, (1, 2, 3), local_directory_id=U[1])
    epoch = ctx.become_leader()
    with pytest.raises(LeaderNotReadyError):
        ctx.core.propose(ctx.now_ms, [Record(b"x")])
    assert ctx.core.voters_unheard == (2, 3)
    fetch(ctx, 2, 0)
    assert not ctx.core.bootstrapped  # node 3's directory id is not known yet
    assert ctx.core.voters_unheard == (3,)
    assert voter_records(ctx) == []
    fetch(ctx, 3, 0)
    assert ctx.core.bootstrapped
    assert ctx.core.voters_unheard == ()
    [(offset, voters)] = voter_records(ctx)
    assert voters == (key(1), key(2), key(3))
    batch = ctx.log.batch_containing(offset)
    assert batch.is_control and len(batch.records) == 1 and batch.epoch == epoch
    assert ctx.core.voters == (key(1), key(2), key(3))
    first, _ = ctx.core.propose(ctx.now_ms, [Record(b"x")])
    assert first > offset


def test_static_quorum_without_directory_ids_takes_writes_and_refuses_changes(
    make_ctx: Callable[..., Any],
) -> None:
    ctx = make_ctx(1, (1, 2, 3))
    ctx.become_leader()
    assert ctx.core.voters_unheard == ()  # it waits for no one's directory id
    ctx.core.propose(ctx.now_ms, [Record(b"x")])
    with pytest.raises(VoterChangeError) as refused:
        ctx.core.add_voter(ctx.now_ms, key(3, REPLACED_3), TIMEOUT_MS)
    assert refused.value.error is Errors.UNSUPPORTED_VERSION


def test_follower_applies_voters_before_commit_and_reverts_on_truncation(
    make_ctx: Callable[..., Any],
) -> None:
    ctx = make_ctx(3, (1, 2, 3), local_directory_id=U[3])
    # The leader of epoch 1 wrote its LeaderChange and a VotersRecord that names 3 by another
    # directory: 3 is not a voter while that record stands.
    from quorum_node.raft.log import MemoryLog  # noqa: PLC0415
    from quorum_node.raft.messages import LeaderChangeMessage  # noqa: PLC0415
    from quorum_node.raft.records import control_record  # noqa: PLC0415
    from quorum_node.raft.types import ControlRecordType  # noqa: PLC0415
    from quorum_node.raft.voters import voters_record  # noqa: PLC0415

    source = MemoryLog()
    change = LeaderChangeMessage(leader_id=1, voters=(), granting_voters=())
    source.append_as_leader([control_record(ControlRecordType.LEADER_CHANGE,
                                            change.model_dump_json(by_alias=True).encode())],
                            1, 0, is_control=True)
    source.append_as_leader([voters_record([key(1), key(2), key(3, REPLACED_3)])], 1, 0,
                            is_control=True)
    ctx.deliver_one(1, ctx.begin_quorum_request(1, 1))
    request = ctx.take_requests(FetchRequest, 1)[-1]
    ctx.deliver_response(request, ctx.fetch_response(1, 1, records_bytes=source.read(0, 1 << 20)))
    assert ctx.core.voters == (key(1), key(2), key(3, REPLACED_3))
    assert not ctx.core.is_voter  # uncommitted, yet in force
    ctx.flush()
    # A new leader of epoch 2 never had the VotersRecord: truncation brings the static set back.
    ctx.deliver_one(2, ctx.begin_quorum_request(2, 2))
    request = ctx.take_requests(FetchRequest, 2)[-1]
    ctx.deliver_response(request, ctx.fetch_response(2, 2, diverging=(1, 1)))
    assert ctx.log.end_offset == 1
    assert ctx.core.voters == (ReplicaKey(1), ReplicaKey(2), ReplicaKey(3))
    assert ctx.core.is_voter


# --- AddVoter (42, 43) ----------------------------------------------------------------------


def test_add_voter_waits_for_catch_up_then_commits_with_the_new_majority(leader: Any) -> None:
    ctx = leader
    # The replaced node 3 fetches from the start with its new directory id: an observer.
    fetch(ctx, 3, 0, REPLACED_3)
    assert [r.key for r in ctx.core.describe_quorum(ctx.now_ms).observers] == [key(3, REPLACED_3)]
    ctx.core.propose(ctx.now_ms, [Record(b"x")])
    ctx.flush()
    ticket = ctx.core.add_voter(ctx.now_ms, key(3, REPLACED_3), TIMEOUT_MS)
    assert ctx.core.pending_voter_change == ("add", key(3, REPLACED_3))
    ctx.poll()
    assert voter_records(ctx)[-1][1] == (key(1), key(2), key(3))  # lagging: not added yet
    assert outcome(ctx, ticket) is None
    fetch(ctx, 3, ctx.log.end_offset, REPLACED_3)  # caught up: the record goes in
    offset, voters = voter_records(ctx)[-1]
    assert voters == (key(1), key(2), key(3), key(3, REPLACED_3))
    assert ctx.core.voters == voters  # in force before it commits
    assert outcome(ctx, ticket) is None
    ctx.flush()
    # Leader and node 2 hold it: 2 of 4 is no majority of the new set.
    fetch(ctx, 2, ctx.log.end_offset)
    assert ctx.core.high_watermark <= offset
    fetch(ctx, 3, ctx.log.end_offset, REPLACED_3)
    assert ctx.core.high_watermark > offset
    assert outcome(ctx, ticket) == (Errors.NONE, f"add {key(3, REPLACED_3)}: committed")
    assert ctx.core.pending_voter_change is None


@pytest.mark.parametrize(
    ("request_key", "error"),
    [
        (key(2), Errors.DUPLICATE_VOTER),
        (key(4), Errors.INVALID_REQUEST),  # node 4 is not a configured voter
        (ReplicaKey(3), Errors.INVALID_REQUEST),  # no directory id
        (key(3, uuid.UUID(int=99)), Errors.INVALID_REQUEST),  # never fetched: not an observer
    ],
)
def test_add_voter_refusals(leader: Any, request_key: ReplicaKey, error: Errors) -> None:
    with pytest.raises(VoterChangeError) as refused:
        leader.core.add_voter(leader.now_ms, request_key, TIMEOUT_MS)
    assert refused.value.error is error
    assert leader.core.pending_voter_change is None


def test_one_voter_change_at_a_time(leader: Any) -> None:
    fetch(leader, 3, 0, REPLACED_3)
    leader.core.add_voter(leader.now_ms, key(3, REPLACED_3), TIMEOUT_MS)
    with pytest.raises(VoterChangeError) as refused:
        leader.core.remove_voter(leader.now_ms, key(3), TIMEOUT_MS)
    assert refused.value.error is Errors.REQUEST_TIMED_OUT
    assert "in progress" in refused.value.message


def test_add_voter_times_out_when_the_observer_never_catches_up(leader: Any) -> None:
    fetch(leader, 3, 0, REPLACED_3)  # far behind, and it stops fetching
    ticket = leader.core.add_voter(leader.now_ms, key(3, REPLACED_3), 1000)
    leader.advance(1001)
    error, message = ended(leader, ticket)
    assert error is Errors.REQUEST_TIMED_OUT and "catch up" in message
    assert leader.core.voters == (key(1), key(2), key(3))


def test_add_voter_waits_for_the_leader_change_of_its_epoch_to_commit(leader: Any) -> None:
    ctx = leader
    # Node 1 loses the leadership and wins it back: its new LeaderChange is not committed.
    ctx.deliver_one(2, ctx.begin_quorum_request(2, ctx.core.epoch + 1))
    ctx.become_leader()
    records_before = voter_records(ctx)
    fetch(ctx, 3, ctx.log.end_offset, REPLACED_3)  # caught up, as an observer
    ticket = ctx.core.add_voter(ctx.now_ms, key(3, REPLACED_3), 1000)
    ctx.advance(1001)
    error, message = ended(ctx, ticket)
    assert error is Errors.REQUEST_TIMED_OUT and "LeaderChange" in message
    assert voter_records(ctx) == records_before


def test_voter_change_fails_when_leadership_is_lost(leader: Any) -> None:
    fetch(leader, 3, 0, REPLACED_3)
    ticket = leader.core.add_voter(leader.now_ms, key(3, REPLACED_3), TIMEOUT_MS)
    epoch = leader.core.epoch
    leader.deliver_one(2, leader.begin_quorum_request(2, epoch + 1))
    assert ended(leader, ticket)[0] is Errors.NOT_LEADER_OR_FOLLOWER


def test_voter_changes_on_a_follower_raise_not_leader(make_ctx: Callable[..., Any]) -> None:
    ctx = make_ctx(2, (1, 2, 3), local_directory_id=U[2])
    ctx.deliver_one(1, ctx.begin_quorum_request(1, 1))
    with pytest.raises(NotLeaderError) as refused:
        ctx.core.add_voter(ctx.now_ms, key(3, REPLACED_3), TIMEOUT_MS)
    assert refused.value.leader_id == 1


# --- RemoveVoter (44, 45) -------------------------------------------------------------------


def replace_disk_of_3(ctx: Any) -> None:
    """AddVoter (3, u3') to the bootstrapped leader and commit it."""
    fetch(ctx, 3, 0, REPLACED_3)
    catch_up(ctx, 2, (3, REPLACED_3))
    ticket = ctx.core.add_voter(ctx.now_ms, key(3, REPLACED_3), TIMEOUT_MS)
    catch_up(ctx, 2, (3, REPLACED_3))
    assert ended(ctx, ticket)[0] is Errors.NONE


def test_remove_voter_completes_the_disk_replacement(leader: Any) -> None:
    replace_disk_of_3(leader)
    ticket = leader.core.remove_voter(leader.now_ms, key(3), TIMEOUT_MS)
    catch_up(leader, 2, (3, REPLACED_3))
    assert ended(leader, ticket)[0] is Errors.NONE
    assert leader.core.voters == (key(1), key(2), key(3, REPLACED_3))
    assert voter_records(leader)[-1][1] == (key(1), key(2), key(3, REPLACED_3))
    # The old directory fetching now is an observer.
    fetch(leader, 3, 0, U[3])
    observers = [r.key for r in leader.core.describe_quorum(leader.now_ms).observers]
    assert key(3) in observers


@pytest.mark.parametrize(
    ("request_key", "error"),
    [
        (key(3, REPLACED_3), Errors.VOTER_NOT_FOUND),
        (key(3), Errors.INVALID_REQUEST),  # the only directory of node 3
        (key(5), Errors.INVALID_REQUEST),  # not a configured voter id
    ],
)
def test_remove_voter_refusals(leader: Any, request_key: ReplicaKey, error: Errors) -> None:
    with pytest.raises(VoterChangeError) as refused:
        leader.core.remove_voter(leader.now_ms, request_key, TIMEOUT_MS)
    assert refused.value.error is error


def test_decommission_removes_a_node_id_down_to_one_voter(leader: Any) -> None:
    ctx = leader
    ticket = ctx.core.remove_voter(ctx.now_ms, key(3), TIMEOUT_MS, decommission=True)
    ctx.flush()
    offset, voters = voter_records(ctx)[-1]
    assert voters == (key(1), key(2))
    fetch(ctx, 3, ctx.log.end_offset)  # the removed voter's fetch no longer counts
    assert ctx.core.high_watermark <= offset
    catch_up(ctx, 2)
    assert ended(ctx, ticket)[0] is Errors.NONE
    # Node 3 is an observer again; its id is still configured, so it can be added back.
    assert key(3) in [r.key for r in ctx.core.describe_quorum(ctx.now_ms).observers]
    ticket = ctx.core.remove_voter(ctx.now_ms, key(2), TIMEOUT_MS, decommission=True)
    catch_up(ctx, 2)
    assert ended(ctx, ticket)[0] is Errors.NONE
    assert ctx.core.voters == (key(1),)
    with pytest.raises(VoterChangeError) as refused:
        ctx.core.remove_voter(ctx.now_ms, key(1), TIMEOUT_MS, decommission=True)
    assert refused.value.error is Errors.INVALID_REQUEST
    assert "only voter" in refused.value.message
    fetch(ctx, 3, 0)
    catch_up(ctx, 3)
    ticket = ctx.core.add_voter(ctx.now_ms, key(3), TIMEOUT_MS)
    catch_up(ctx, 3)
    assert ended(ctx, ticket)[0] is Errors.NONE
    assert ctx.core.voters == (key(1), key(3))


def leader_3_with_a_second_directory(make_ctx: Callable[..., Any]) -> Any:
    """Node 3 (as 3) leading {1, 2, 3} with AddVoter (3, u3') committed: voters {1, 2, 3, 3'}."""
    ctx = make_ctx(3, (1, 2, 3), local_directory_id=U[3])
    ctx.become_leader()
    catch_up(ctx, 1, 2)
    fetch(ctx, 3, 0, REPLACED_3)
    catch_up(ctx, 1, 2, (3, REPLACED_3))
    ticket = ctx.core.add_voter(ctx.now_ms, key(3, REPLACED_3), TIMEOUT_MS)
    catch_up(ctx, 1, 2, (3, REPLACED_3))
    assert ended(ctx, ticket)[0] is Errors.NONE
    return ctx


def test_leader_removing_itself_leads_until_committed_then_resigns(
    make_ctx: Callable[..., Any],
) -> None:
    # Node 3 is the leader; a second directory of node 3 cannot exist on the same node, so the
    # leader's own old key goes out after its id got another directory: add (3, u3') first.
    ctx = leader_3_with_a_second_directory(make_ctx)
    ticket = ctx.core.remove_voter(ctx.now_ms, key(3), TIMEOUT_MS)
    ctx.flush()
    record_offset = voter_records(ctx)[-1][0]
    assert not ctx.core.is_voter
    assert ctx.state() is RaftState.LEADER  # still leading, not counting itself
    fetch(ctx, 1, ctx.log.end_offset)
    assert ctx.core.high_watermark <= record_offset  # 1 of {1, 2, 3'} is no majority
    fetch(ctx, 2, ctx.log.end_offset)
    assert ctx.core.high_watermark > record_offset
    assert ended(ctx, ticket)[0] is Errors.NONE
    assert ctx.state() is RaftState.RESIGNED
    sent = {r.destination for r in ctx.take_requests(EndQuorumEpochRequest)}
    assert sent == {1, 2}  # never to its own node id: that would be itself
    # Once resigned it leaves the epoch as an observer: it never campaigns again.
    ctx.advance(ctx.config.election_timeout_ms * 3)
    assert ctx.state() is RaftState.UNATTACHED
    assert not ctx.core.is_voter
    ctx.advance(ctx.config.election_timeout_ms * 3)
    assert ctx.take_requests(VoteRequest) == []


# --- elections with two directories of one node -------------------------------------------


def test_votes_count_for_the_directory_that_cast_them(leader: Any) -> None:
    replace_disk_of_3(leader)
    voters = leader.core.voters
    assert len(voters) == 4
    from quorum_node.raft.election import EpochElection  # noqa: PLC0415

    election = EpochElection(key(1), voters)
    election.record(key(3, REPLACED_3), True)
    assert not election.is_granted  # 2 of 4
    election.record(ReplicaKey(3), True)  # cannot tell the two apart: counts for neither
    assert not election.is_granted
    election.record(key(3), True)
    assert election.is_granted


def test_a_node_that_answers_as_its_new_directory_is_asked_for_that_vote(leader: Any) -> None:
    """Between AddVoter (3, u3') and RemoveVoter (3, u3) the voters are {1, 2, 3, 3'}: an
    election needs 3 of 4 and so the vote of node 3's new directory. A node answering as
    another directory than the one asked is asked again as the one it has."""
    ctx = leader
    replace_disk_of_3(ctx)
    epoch = ctx.core.epoch
    ctx.deliver_request(2, ctx.begin_quorum_request(2, epoch + 1))  # node 2 takes over ...
    ctx.advance(ctx.config.fetch_timeout_ms)  # ... and goes silent
    assert ctx.state() is RaftState.PROSPECTIVE
    to_2 = ctx.take_request(VoteRequest, 2)
    asked = ctx.take_request(VoteRequest, 3)
    assert asked.message.voter_directory_id == U[3]  # the lost directory
    ctx.deliver_response(asked, VoteResponse(
        error_code=Errors.INVALID_VOTER_KEY, leader_id=None, leader_epoch=ctx.core.epoch,
        vote_granted=False, voter_directory_id=REPLACED_3))
    assert ctx.state() is RaftState.PROSPECTIVE  # 1, 2 and 3' can still make 3 of 4
    ctx.advance(ctx.config.retry_backoff_ms)
    again = ctx.take_request(VoteRequest, 3)
    assert again.message.voter_directory_id == REPLACED_3
    ctx.deliver_response(again, VoteResponse(
        error_code=Errors.NONE, leader_id=None, leader_epoch=ctx.core.epoch, vote_granted=True,
        voter_directory_id=REPLACED_3))
    assert ctx.state() is RaftState.PROSPECTIVE  # 2 of 4
    ctx.deliver_response(to_2, VoteResponse(
        error_code=Errors.NONE, leader_id=None, leader_epoch=ctx.core.epoch, vote_granted=True,
        voter_directory_id=U[2]))
    assert ctx.state() is RaftState.CANDIDATE


def test_no_request_goes_to_another_directory_of_the_nodes_own_id(
    make_ctx: Callable[..., Any],
) -> None:
    """Voters {1, 2, 3, 3'} on node 3 (as 3): 3' is its own id under another directory, so
    BeginQuorumEpoch and Vote go to nodes 1 and 2 only, and 3' counts as a vote lost."""
    ctx = leader_3_with_a_second_directory(make_ctx)
    assert len(ctx.core.voters) == 4
    ctx.clear_outbox()
    ctx.advance(ctx.config.fetch_timeout_ms)  # no fetches for a while: heartbeats are due
    assert {r.destination for r in ctx.take_requests(BeginQuorumEpochRequest)} == {1, 2}
    ctx.deliver_request(1, ctx.begin_quorum_request(1, ctx.core.epoch + 1))
    ctx.advance(ctx.config.fetch_timeout_ms)
    assert ctx.state() is RaftState.PROSPECTIVE
    assert {r.destination for r in ctx.take_requests(VoteRequest)} == {1, 2}


def test_vote_response_names_the_voting_directory(leader: Any) -> None:
    response = leader.deliver_one(2, leader.vote_request(2, leader.core.epoch, 0, 0, pre_vote=True))
    assert response.voter_directory_id == U[1]


def test_fetched_batches_decode(leader: Any) -> None:
    # Sanity of the fixture: the log is LeaderChange, then the bootstrap VotersRecord.
    batches = decode_batches(leader.log.read(0, 1 << 20))
    assert [b.is_control for b in batches] == [True, True]
