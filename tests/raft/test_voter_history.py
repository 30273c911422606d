"""The voter set the log defines (``VoterHistory``) on its own: read back at start, adopted as
soon as a VotersRecord is appended, reverted by a truncation, replaced by a loaded snapshot (its
behaviour through the core is in test_raft_membership.py and test_raft_reconfig.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from quorum_node.raft.memory_snapshots import MemorySnapshotStore
from quorum_node.raft.records import Record, RecordBatch
from quorum_node.raft.snapshot_format import encode_snapshot
from quorum_node.raft.snapshots import SnapshotId
from quorum_node.raft.types import RaftInvariantError, ReplicaKey
from quorum_node.raft.voter_history import VoterHistory
from quorum_node.raft.voters import voters_record


def _append_voters(rooms: Any, *voters: ReplicaKey) -> RecordBatch:
    batch: RecordBatch = rooms.log.append_as_leader([voters_record(voters)], 1, 0,
                                                    is_control=True)
    return batch


def test_a_voters_record_is_in_force_once_appended_and_a_truncation_reverts_it(
    make_rooms: Callable[..., Any],
) -> None:
    rooms = make_rooms(log_epochs=[(1, 2)])
    history: VoterHistory = rooms.voters
    static = history.voters
    assert not history.bootstrapped and history.latest_offset() is None
    local, second, _ = static
    assert not history.appended([rooms.log.append_as_leader([Record(b"x")], 1, 0)])
    batch = _append_voters(rooms, local, second)
    assert history.appended([batch])
    assert history.voters == (local, second) and history.bootstrapped
    assert history.latest_offset() == 3 and history.at(2) == static
    assert history.remote_voters == (second,) and history.voter_ids == {1, 2}
    assert history.is_voter and not history.is_only_voter

    rooms.log.truncate_to(3)
    assert history.truncated()
    assert history.voters == static and not history.bootstrapped
    assert not history.truncated()  # nothing more to revert


def test_the_log_s_voter_set_is_read_back_at_start(make_rooms: Callable[..., Any]) -> None:
    rooms = make_rooms(log_epochs=[(1, 3)])
    local = rooms.voters.voters[0]
    _append_voters(rooms, local)
    rooms.log.append_as_leader([Record(b"x")], 1, 0)  # passed over by its header
    restarted = VoterHistory(local_key=local, static_voters=rooms.voters.voters,
                             log=rooms.log, snapshots=rooms.snapshots)
    assert restarted.voters == (local,) and restarted.latest_offset() == 3
    assert restarted.is_only_voter


def test_a_loaded_snapshot_s_voter_set_is_in_force(make_rooms: Callable[..., Any]) -> None:
    rooms = make_rooms()
    local, second, _ = rooms.voters.voters
    snapshots: MemorySnapshotStore = rooms.snapshots
    snapshots.save(SnapshotId(10, 2), encode_snapshot([local, second], 0, []))
    assert rooms.voters.snapshot_loaded(SnapshotId(10, 2))
    assert rooms.voters.voters == (local, second) and rooms.voters.latest_offset() == 9


def test_a_voter_id_outside_the_configuration_stops_the_replica(
    make_rooms: Callable[..., Any],
) -> None:
    rooms = make_rooms()
    local = rooms.voters.voters[0]
    batch = _append_voters(rooms, local, ReplicaKey(7, local.directory_id))
    with pytest.raises(RaftInvariantError, match=r"voter ids \[7\]"):
        rooms.voters.appended([batch])
