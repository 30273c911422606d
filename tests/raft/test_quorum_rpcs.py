"""The election RPCs (``QuorumRpcs``) on their own: what a Vote is answered and what it moves, the
back-off a resigned leader's successors wait, and the epoch and leader every response carries
(their behaviour through the core is in test_raft_election.py and test_raft_validation.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from quorum_node.raft.messages import FetchResponse, VoteRequest
from quorum_node.raft.state import RaftState
from quorum_node.raft.types import Errors, ReplicaKey


def vote(rooms: Any, candidate: ReplicaKey, epoch: int, *, last_epoch: int = 0,
         last_offset: int = 0, pre_vote: bool = False) -> VoteRequest:
    local = rooms.voters.voters[0]
    return VoteRequest(cluster_id="rooms-cluster", voter_id=local.id,
                       voter_directory_id=local.directory_id, replica_epoch=epoch,
                       replica_id=candidate.id, replica_directory_id=candidate.directory_id,
                       last_offset_epoch=last_epoch, last_offset=last_offset, pre_vote=pre_vote)


def test_a_vote_is_granted_once_per_epoch_and_moves_the_epoch(
    make_rooms: Callable[..., Any],
) -> None:
    rooms = make_rooms()
    _, second, third = rooms.voters.voters
    assert rooms.rpcs.handle_vote(0, vote(rooms, second, 3)) == (Errors.NONE, True)
    assert rooms.quorum.epoch == 3 and rooms.quorum.election_state.voted_key == second
    assert rooms.rpcs.handle_vote(0, vote(rooms, third, 3)) == (Errors.NONE, False)
    assert rooms.rpcs.handle_vote(0, vote(rooms, third, 2)) == (
        Errors.FENCED_LEADER_EPOCH, False)


def test_a_stranger_s_vote_moves_nothing(make_rooms: Callable[..., Any]) -> None:
    rooms = make_rooms(log_epochs=[(1, 2)])
    stranger = ReplicaKey(2, uuid.UUID(int=99))  # a configured id, another directory
    assert rooms.quorum.epoch == 1  # the log's last epoch
    assert rooms.rpcs.handle_vote(0, vote(rooms, stranger, 5, last_epoch=1, last_offset=2)) == (
        Errors.INCONSISTENT_VOTER_SET, False)
    assert rooms.quorum.epoch == 1
    # A log strictly newer than ours may hold a voter set we lack: that candidate is heard.
    newer = vote(rooms, stranger, 5, last_epoch=1, last_offset=3)
    assert rooms.rpcs.handle_vote(0, newer) == (Errors.NONE, True)


def test_successors_wait_by_their_place_in_the_list(make_rooms: Callable[..., Any]) -> None:
    rooms = make_rooms()
    local, second, third = rooms.voters.voters
    backoff = rooms.rpcs._end_epoch_backoff_ms
    limit = rooms.config.election_backoff_max_ms
    assert backoff([local, second, third]) == 0
    assert backoff([second, local, third]) == limit >> 2
    assert backoff([second, third, local]) == limit >> 1
    assert backoff([second, third]) == limit


def test_a_response_s_newer_epoch_and_leader_are_followed(make_rooms: Callable[..., Any]) -> None:
    rooms = make_rooms()

    def fetched(epoch: int, leader_id: int | None,
                error: Errors = Errors.NONE) -> FetchResponse:
        return FetchResponse(error_code=error, leader_id=leader_id, leader_epoch=epoch,
                             log_start_offset=0)

    assert rooms.rpcs.handle_common_response(0, 2, fetched(4, 3))
    assert (rooms.quorum.name, rooms.quorum.epoch, rooms.quorum.leader_id) == (
        RaftState.FOLLOWER, 4, 3)
    assert rooms.rpcs.handle_common_response(0, 2, fetched(3, 2))  # stale: dropped
    assert not rooms.rpcs.handle_common_response(0, 3, fetched(4, 3))  # for the room to handle
    assert rooms.quorum.leader_id == 3
    assert rooms.rpcs.handle_common_response(0, 3, fetched(4, 3, Errors.INVALID_REQUEST))
    assert not rooms.requests.is_ready(3, 0)  # backed off from
