"""The leader's side of replication (``LeaderReplication``) on its own: who it serves, where a
follower's log diverges, parked fetches and the high watermark (its behaviour through the core is
in test_raft_replication.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quorum_node.raft.leader import LeaderState
from quorum_node.raft.messages import EpochEndOffset, FetchRequest, FetchResponse
from quorum_node.raft.outbox import OutboundResponse
from quorum_node.raft.records import Record
from quorum_node.raft.snapshot_format import encode_snapshot
from quorum_node.raft.snapshots import SnapshotId
from quorum_node.raft.types import Errors
from quorum_node.raft.voters import voters_record


def fetch(rooms: Any, replica: int, offset: int, last_epoch: int, *, epoch: int | None = None,
          cluster_id: str = "rooms-cluster", max_wait_ms: int = 500) -> FetchRequest:
    return FetchRequest(
        cluster_id=cluster_id, replica_id=replica,
        replica_directory_id=rooms.voters.voters[replica - 1].directory_id,
        max_wait_ms=max_wait_ms,
        current_leader_epoch=rooms.quorum.epoch if epoch is None else epoch,
        fetch_offset=offset, last_fetch_epoch=last_epoch, high_watermark=None, max_bytes=1 << 20)


def test_only_a_leader_serves_and_only_the_configured_ids(make_rooms: Callable[..., Any]) -> None:
    rooms = make_rooms()
    serving = rooms.replication.serving
    assert serving(0, fetch(rooms, 2, 0, 0), malformed=False) is Errors.NOT_LEADER_OR_FOLLOWER
    leader = rooms.lead()
    assert serving(0, fetch(rooms, 2, 0, 0), malformed=False) is leader
    assert serving(0, fetch(rooms, 2, 0, 0), malformed=True) is Errors.INVALID_REQUEST
    assert serving(0, fetch(rooms, 2, 0, 0, cluster_id="other"),
                   malformed=False) is Errors.INCONSISTENT_CLUSTER_ID
    assert serving(0, fetch(rooms, 2, 0, 0, epoch=leader.epoch - 1),
                   malformed=False) is Errors.FENCED_LEADER_EPOCH
    stranger = fetch(rooms, 2, 0, 0).model_copy(update={"replica_id": 9})
    assert serving(0, stranger, malformed=False) is Errors.INCONSISTENT_VOTER_SET


def test_a_fetch_position_off_the_leader_s_log_is_told_where_it_diverges(
    make_rooms: Callable[..., Any],
) -> None:
    rooms = make_rooms(log_epochs=[(1, 3), (2, 2)])  # offsets 0-2 in epoch 1, 3-4 in epoch 2
    check = rooms.replication.validate_fetch_position
    assert check(0, 0) is None
    assert check(3, 1) is None and check(5, 2) is None
    assert check(4, 1) == EpochEndOffset(epoch=1, end_offset=3)
    assert check(6, 2) == EpochEndOffset(epoch=2, end_offset=5)
    assert check(2, 3) == EpochEndOffset(epoch=2, end_offset=5)
    assert rooms.replication.snapshot_needed(0, 0) is None  # the whole log is still here


def test_a_fetch_below_the_log_start_is_sent_the_snapshot(make_rooms: Callable[..., Any]) -> None:
    rooms = make_rooms(log_epochs=[(1, 4)])
    rooms.snapshots.save(SnapshotId(3, 1), encode_snapshot(rooms.voters.voters, 0, []))
    rooms.log.truncate_to_snapshot(SnapshotId(3, 1))
    assert rooms.replication.snapshot_needed(1, 1) == SnapshotId(3, 1)
    assert rooms.replication.snapshot_needed(3, 1) is None


def test_a_caught_up_fetch_is_parked_until_records_come_and_moves_the_high_watermark(
    make_rooms: Callable[..., Any],
) -> None:
    rooms = make_rooms()
    leader: LeaderState = rooms.lead()
    replication = rooms.replication
    assert replication.handle_fetch(10, 2, 77, fetch(rooms, 2, 0, 0)) is None
    assert [parked.correlation_id for parked in leader.parked] == [77]

    leader.accumulator.add([Record(b"a"), Record(b"b")], 2, 10, 0)
    assert replication.append_pending(10, leader)
    assert leader.parked == [] and rooms.outbox.effects.flush
    (answer,) = rooms.outbox.take().messages
    assert isinstance(answer, OutboundResponse) and answer.correlation_id == 77
    assert isinstance(answer.message, FetchResponse) and answer.message.records

    # Committed once a majority (this leader and node 2) holds it durably.
    assert not replication.advance_high_watermark(20)
    rooms.watermarks.flushed_offset = rooms.log.end_offset
    response = replication.handle_fetch(20, 2, 78, fetch(rooms, 2, 2, leader.epoch,
                                                         max_wait_ms=0))
    assert leader.high_watermark == 2 and rooms.watermarks.high_watermark == 2
    assert isinstance(response, FetchResponse) and response.high_watermark == 2


def test_a_leader_stepping_down_answers_its_parked_fetches(make_rooms: Callable[..., Any]) -> None:
    rooms = make_rooms()
    leader = rooms.lead()
    rooms.replication.handle_fetch(10, 3, 5, fetch(rooms, 3, 0, 0))
    rooms.replication.release_parked(leader)
    (answer,) = rooms.outbox.take().messages
    assert answer.message.error_code == Errors.NOT_LEADER_OR_FOLLOWER and not leader.parked


def test_a_control_batch_follows_the_pending_records_and_its_voter_set_is_in_force(
    make_rooms: Callable[..., Any],
) -> None:
    rooms = make_rooms()
    leader = rooms.lead()
    local, second, _ = rooms.voters.voters
    leader.accumulator.add([Record(b"a")], 1, 0, 0)
    assert rooms.replication.append_control(0, leader, [voters_record([local, second])]) == 1
    assert rooms.log.end_offset == 2 and not leader.accumulator.records
    assert rooms.voters.voters == (local, second) and rooms.voters_changed == 1
