"""The follower's side of replication (``FollowerFetcher``) and the snapshot transfer
(``SnapshotTransfer``) on their own: when a fetch goes out and what it asks for, what may be
truncated, what a downloaded snapshot must hold (their behaviour through the core is in
test_raft_replication.py and test_raft_snapshots.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from quorum_node.raft.messages import FetchRequest, FetchSnapshotRequest
from quorum_node.raft.outbox import OutboundRequest
from quorum_node.raft.quorum_state import TransitionCause
from quorum_node.raft.snapshot_format import encode_snapshot
from quorum_node.raft.snapshots import CorruptSnapshotError, SnapshotId
from quorum_node.raft.types import RaftInvariantError, ReplicaKey
from quorum_node.raft.voters import voters_record


def test_one_fetch_at_a_time_and_only_once_the_log_is_flushed(
    make_rooms: Callable[..., Any],
) -> None:
    rooms = make_rooms(log_epochs=[(1, 3)])
    rooms.watermarks.flushed_offset = 2
    assert not rooms.follower.maybe_send_fetch(0, 2)  # offset 2 is not durable yet
    rooms.watermarks.flushed_offset = 3
    assert rooms.follower.maybe_send_fetch(0, 2)
    assert not rooms.follower.maybe_send_fetch(0, 3)  # one in flight
    (sent,) = rooms.outbox.take().messages
    assert isinstance(sent, OutboundRequest) and sent.destination == 2
    assert isinstance(sent.message, FetchRequest)
    assert (sent.message.fetch_offset, sent.message.last_fetch_epoch) == (3, 1)


def test_a_download_in_progress_asks_for_its_next_chunk(make_rooms: Callable[..., Any]) -> None:
    rooms = make_rooms(log_epochs=[(1, 1)])
    rooms.quorum.to_follower(0, 2, 2, TransitionCause.LEADER_LEARNED)
    state = rooms.quorum.state
    rooms.transfer.begin_download(state, SnapshotId(40, 2))
    state.download.append(b"12345")
    assert rooms.follower.maybe_send_fetch(0, 2)
    (sent,) = rooms.outbox.take().messages
    assert isinstance(sent.message, FetchSnapshotRequest)
    assert (sent.message.snapshot_id.end_offset, sent.message.position) == (40, 5)


def test_nothing_committed_is_truncated_and_a_truncated_voter_set_is_reverted(
    make_rooms: Callable[..., Any],
) -> None:
    rooms = make_rooms(log_epochs=[(1, 3)])
    local, second, _ = rooms.voters.voters
    batch = rooms.log.append_as_leader([voters_record([local, second])], 1, 0, is_control=True)
    rooms.voters.appended([batch])
    rooms.watermarks.advance_high_watermark(2)
    assert rooms.follower.committed_end() == 2
    with pytest.raises(RaftInvariantError, match="below the high watermark 2"):
        rooms.follower.truncate_to(1)
    rooms.follower.truncate_to(3)
    assert rooms.log.end_offset == 3 and rooms.voters_changed == 1
    assert len(rooms.voters.voters) == 3
    with pytest.raises(RaftInvariantError, match="would go back from 2 to 1"):
        rooms.watermarks.advance_high_watermark(1)


def test_a_snapshot_naming_an_unconfigured_voter_is_refused(
    make_rooms: Callable[..., Any],
) -> None:
    rooms = make_rooms()
    local = rooms.voters.voters[0]
    rooms.transfer.check_snapshot(encode_snapshot(rooms.voters.voters, 0, []))
    with pytest.raises(CorruptSnapshotError, match="its voter set"):
        rooms.transfer.check_snapshot(
            encode_snapshot([local, ReplicaKey(8, local.directory_id)], 0, []))


def test_a_loaded_snapshot_replaces_the_log_and_commits_what_it_holds(
    make_rooms: Callable[..., Any],
) -> None:
    rooms = make_rooms(log_epochs=[(1, 2)])
    local, second, _ = rooms.voters.voters
    rooms.snapshots.save(SnapshotId(30, 3), encode_snapshot([local, second], 0, []))
    rooms.transfer.load_snapshot(SnapshotId(30, 3))
    assert rooms.log.start_offset == rooms.log.end_offset == rooms.watermarks.flushed_offset == 30
    assert rooms.watermarks.high_watermark == 30 and rooms.follower.committed_end() == 30
    assert rooms.voters.voters == (local, second) and rooms.voters_changed == 1
    assert rooms.outbox.effects.snapshot_loaded == SnapshotId(30, 3)
