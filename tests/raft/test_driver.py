"""The driver hands the core's outcomes (read barriers, voter changes, role changes) to its
host."""

from __future__ import annotations

import random

from quorum_node.raft.config import QuorumConfig
from quorum_node.raft.core import (
    OutboundRequest,
    OutboundResponse,
    RaftCore,
    ReadConfirmed,
    ReadOutcome,
    VoterChangeDone,
)
from quorum_node.raft.driver import CoreDriver
from quorum_node.raft.log import MemoryLog
from quorum_node.raft.memory_snapshots import MemorySnapshotStore
from quorum_node.raft.messages import VoteRequest
from quorum_node.raft.quorum_state import RoleChanged
from quorum_node.raft.snapshots import SnapshotId
from quorum_node.raft.state import ElectionState, RaftState
from quorum_node.raft.types import ReplicaKey


class RecordingHost:
    """A DriverHost on a fixed clock that keeps what the driver hands it."""

    def __init__(self) -> None:
        self.flush_wanted = False
        self.reads: list[ReadOutcome] = []
        self.voter_changes: list[VoterChangeDone] = []
        self.told: list[str] = []  # persists and role changes, in the order the host got them

    def now_ms(self) -> int:
        return 0

    def persist(self, state: ElectionState) -> None:
        self.told.append(f"persist epoch {state.epoch}")

    def role_changed(self, change: RoleChanged) -> None:
        self.told.append(f"{change.before} -> {change.after}")

    def send(self, request: OutboundRequest) -> None:
        raise AssertionError("a lone voter sends nothing")

    def answer(self, response: OutboundResponse) -> None:
        raise AssertionError("a lone voter answers nothing")

    def flush(self) -> None:
        self.flush_wanted = True

    def snapshot_loaded(self, snapshot_id: SnapshotId) -> None:
        raise AssertionError("no snapshot to load")

    def voter_change_done(self, done: VoterChangeDone) -> None:
        self.voter_changes.append(done)

    def read_settled(self, outcome: ReadOutcome) -> None:
        self.reads.append(outcome)

    def stepped(self) -> None:
        pass

    def set_timer(self, at_ms: int) -> None:
        pass

    def core_failed(self, error: Exception) -> None:
        raise error

    def core_spinning(self, polls: int) -> None:
        raise AssertionError(f"spinning after {polls} polls")


def test_a_read_barrier_is_settled_through_the_host() -> None:
    log = MemoryLog()
    core = RaftCore(node_id=1, directory_id=None, cluster_id="c", voters=[ReplicaKey(1)],
                    log=log, election_state=None, config=QuorumConfig(),
                    random=random.Random(0), now_ms=0, snapshots=MemorySnapshotStore())
    host = RecordingHost()
    driver = CoreDriver(core, host)
    driver.after_step()
    assert core.state is RaftState.LEADER and host.flush_wanted
    driver.handle_flushed(log.flush())  # its LeaderChange commits
    barrier = driver.request(lambda c: c.begin_read(0, 1000))
    assert barrier is not None
    assert host.reads == [ReadConfirmed(barrier.id, barrier.read_index)]
    assert host.voter_changes == []


def test_a_failed_election_state_write_stops_the_node_before_anything_leaves() -> None:
    """A vote that did not reach the disk must never be sent, nor be the core's from then on (it
    would grant the same vote again, and a power loss would take it back): the node stops."""

    class FailingDisk(RecordingHost):
        def __init__(self) -> None:
            super().__init__()
            self.failures: list[Exception] = []
            self.sent: list[OutboundRequest] = []
            self.answers: list[OutboundResponse] = []

        def persist(self, state: ElectionState) -> None:
            raise OSError(28, "No space left on device")

        def send(self, request: OutboundRequest) -> None:
            self.sent.append(request)

        def answer(self, response: OutboundResponse) -> None:
            self.answers.append(response)

        def core_failed(self, error: Exception) -> None:
            self.failures.append(error)

    core = RaftCore(node_id=1, directory_id=None, cluster_id="c",
                    voters=[ReplicaKey(1), ReplicaKey(2), ReplicaKey(3)], log=MemoryLog(),
                    election_state=None, config=QuorumConfig(), random=random.Random(0),
                    now_ms=0, snapshots=MemorySnapshotStore())
    host = FailingDisk()
    driver = CoreDriver(core, host)
    driver.after_step()
    # A candidate of epoch 1 asks for the vote: granting it means writing it first.
    driver.handle_request(2, 7, VoteRequest(
        cluster_id="c", voter_id=1, replica_epoch=1, replica_id=2, last_offset_epoch=0,
        last_offset=0))
    assert host.answers == [], "the vote left before it was on disk"
    assert [str(error) for error in host.failures] == ["[Errno 28] No space left on device"]
    assert not driver.driving
    assert host.told == [], "a role change was told that is not on disk"


def test_role_changes_are_told_once_the_election_state_is_durable() -> None:
    core = RaftCore(node_id=1, directory_id=None, cluster_id="c", voters=[ReplicaKey(1)],
                    log=MemoryLog(), election_state=None, config=QuorumConfig(),
                    random=random.Random(0), now_ms=0, snapshots=MemorySnapshotStore())
    host = RecordingHost()
    CoreDriver(core, host).after_step()
    assert host.told == ["persist epoch 1", "unattached -> prospective",
                         "prospective -> candidate", "candidate -> leader"]
