"""Linearizable reads (``LinearizableReads``) and the ``Outbox`` on their own (reads through the
core are in test_raft_reads.py)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from quorum_node.raft.leader import ParkedFetch, ReadAbandoned, ReadConfirmed, ReadTimedOut
from quorum_node.raft.messages import BeginQuorumEpochResponse, FetchRequest
from quorum_node.raft.outbox import WARNING_INTERVAL_MS, OutboundRequest, WarningLimiter
from quorum_node.raft.types import Errors, ReplicaKey


def fetch_request() -> FetchRequest:
    return FetchRequest(cluster_id=None, replica_id=2, max_wait_ms=500, current_leader_epoch=1,
                        fetch_offset=0, last_fetch_epoch=0, high_watermark=None, max_bytes=1)


def test_a_read_waits_for_the_high_watermark_and_settles_on_a_majority(
    make_rooms: Callable[..., Any],
) -> None:
    rooms = make_rooms()
    leader = rooms.lead()
    assert rooms.reads.begin(0, leader, 100) is None  # the LeaderChange is not committed yet
    leader.high_watermark = 4
    second = next(key for key in leader.voters if key.id == 2)
    leader.parked.append(ParkedFetch(2, 9, fetch_request(), 500, leader.voters[second]))
    first = rooms.reads.begin(0, leader, 100)
    # The parked fetch is answered at once: the follower's next fetch confirms the read.
    assert leader.parked == [] and [m.correlation_id for m in rooms.outbox.take().messages] == [9]
    assert leader.voters[second].read_barrier_released == first.id
    late = rooms.reads.begin(0, leader, 50)
    assert (first.id, first.read_index, late.id) == (1, 4, 2)
    rooms.reads.settle(60, leader)
    assert rooms.outbox.take().reads == [ReadTimedOut(2)]
    leader.voters[second].read_barrier_echoed = first.id  # a fetch sent after the first answer
    rooms.reads.settle(70, leader)
    assert rooms.outbox.take().reads == [ReadConfirmed(1, 4)]
    third = rooms.reads.begin(80, leader, 100)
    rooms.reads.abandon(leader, 2, 9)
    assert rooms.outbox.take().reads == [ReadAbandoned(third.id, 2, 9)]


def test_a_begin_quorum_epoch_answer_credits_only_the_voter_it_was_asked_as(
    make_rooms: Callable[..., Any],
) -> None:
    """While a replaced disk's replica is added, two voters share node 3's id, and only one of
    them can answer at node 3's address. An answer to a BeginQuorumEpoch names no directory: it
    is credited to the voter the request was addressed to, never to both."""
    local, second, old = (ReplicaKey(n, uuid.UUID(int=n)) for n in (1, 2, 3))
    replaced = ReplicaKey(3, uuid.UUID(int=33))
    rooms = make_rooms(static_voters=(local, second, old, replaced))
    leader = rooms.lead()
    leader.high_watermark = 0
    barrier = rooms.reads.begin(0, leader, 100)
    for asked, answer in ((replaced, Errors.INVALID_VOTER_KEY), (old, Errors.NONE)):
        rooms.rpcs.send_begin_quorum_epochs(0, leader, [asked])
        (request,) = rooms.outbox.take().messages
        assert rooms.requests.on_response(3, request.correlation_id, 0, True)
        rooms.rpcs.handle_begin_quorum_epoch_response(0, 3, BeginQuorumEpochResponse(
            error_code=answer, leader_id=1, leader_epoch=leader.epoch))
    assert leader.voters[old].read_barrier_echoed == barrier.id
    assert leader.voters[replaced].read_barrier_echoed == 0  # it refused
    assert not leader.voters[replaced].acknowledged


def test_the_outbox_numbers_requests_and_backs_off_from_a_dropped_response(
    make_rooms: Callable[..., Any],
) -> None:
    rooms = make_rooms()
    request = fetch_request()
    rooms.outbox.send(0, 2, request)
    rooms.outbox.send(0, 3, request)
    assert [(m.destination, m.correlation_id) for m in rooms.outbox.effects.messages] == [
        (2, 1), (3, 2)]
    assert all(isinstance(m, OutboundRequest) for m in rooms.outbox.take().messages)
    assert rooms.outbox.effects.messages == [] and rooms.requests.has_in_flight(2)
    assert rooms.requests.on_response(2, 1, 5, True)
    assert rooms.requests.is_ready(2, 5)
    rooms.outbox.drop_response(5, 2, "broken")
    assert not rooms.requests.is_ready(2, 5)


def test_a_kind_of_warning_is_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    warnings = WarningLimiter()
    with caplog.at_level(logging.WARNING):
        for now_ms in (0, 1, WARNING_INTERVAL_MS - 1):
            warnings.warn(now_ms, "a", "a at %d", now_ms)
        warnings.warn(1, "b", "b")
        warnings.warn(WARNING_INTERVAL_MS, "a", "a again")
    assert [r.getMessage() for r in caplog.records] == ["a at 0", "b", "a again"]
