"""Safety invariants, checked after every event (Kafka's RaftEventSimulationTest, plus the
committed-data checks it runs at the end, done here continuously):

* SingleLeader: at most one leader per epoch over the whole run (quorum-state files and LEADERs).
* MonotonicEpoch: a node's persisted epoch never falls, and its core runs in that epoch.
* DurableElectionState: what the core believes is persisted is what the disk holds.
* MonotonicHighWatermark: a process's high watermark never falls, nor does the one of the leader
  of the highest epoch (once it has committed in its epoch).
* MajorityReachedHighWatermark: any node's high watermark is on the disk of a majority of voters.
* ConsistentCommittedData: every node holds, below its high watermark, the committed data.
* NoCommittedLoss: the leader of the highest epoch holds all committed data.

The checker keeps the globally committed prefix of the log: offset -> (epoch, base offset, CRC)
of the batch holding it, learned from any node's high watermark. Only nodes an event touched are
checked, and every offset once per node per process lifetime: a log below its high watermark only
grows, so a verified prefix stays verified unless the batch that ended it disappears (then it is
checked again).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from quorum_node.raft.log import MemoryLog
from quorum_node.raft.records import RecordBatch
from quorum_node.raft.state import ElectionState, RaftState
from quorum_node.sim.cluster import Cluster
from quorum_node.sim.node import SimNode

SINGLE_LEADER = "SingleLeader"
MONOTONIC_EPOCH = "MonotonicEpoch"
DURABLE_ELECTION_STATE = "DurableElectionState"
MONOTONIC_HIGH_WATERMARK = "MonotonicHighWatermark"
MAJORITY_REACHED_HIGH_WATERMARK = "MajorityReachedHighWatermark"
CONSISTENT_COMMITTED_DATA = "ConsistentCommittedData"
NO_COMMITTED_LOSS = "NoCommittedLoss"

INVARIANTS = (
    SINGLE_LEADER,
    MONOTONIC_EPOCH,
    DURABLE_ELECTION_STATE,
    MONOTONIC_HIGH_WATERMARK,
    MAJORITY_REACHED_HIGH_WATERMARK,
    CONSISTENT_COMMITTED_DATA,
    NO_COMMITTED_LOSS,
)

# What identifies the data at one offset: the epoch, base offset and CRC of the batch holding it.
Entry = tuple[int, int, int]


def entry_of(batch: RecordBatch) -> Entry:
    return batch.epoch, batch.base_offset, batch.crc


_INITIAL = ElectionState.initial()


class _Violated(Exception):
    """Unwinds the check at the first violation (the run stops there)."""


@dataclass(slots=True)
class _Verified:
    """How far one log was checked against the committed prefix, and the batch that ended it
    (with its index in the log, so that checking it is still there costs no search)."""

    end: int = 0
    index: int = -1
    last_batch: RecordBatch | None = None

    def still_valid(self, log: MemoryLog) -> bool:
        batches = log.batches
        return self.end == 0 or (
            self.index < len(batches) and batches[self.index] is self.last_batch
        )

    def advance(self, log: MemoryLog, end: int) -> None:
        if end > self.end:
            self.end = end
            self.index = bisect.bisect_right(log.batches, end - 1, key=_base_offset) - 1
            self.last_batch = log.batches[self.index]


def _base_offset(batch: RecordBatch) -> int:
    return batch.base_offset


@dataclass(slots=True)
class _Process:
    """What is tracked per process lifetime of a node."""

    incarnation: int
    high_watermark: int | None = None
    verified: _Verified = field(default_factory=_Verified)


class InvariantChecker:
    def __init__(
        self,
        cluster: Cluster,
        proposed_at: Mapping[bytes, int],
        report: Callable[[str, str], bool],
    ) -> None:
        self._cluster = cluster
        self._proposed_at = proposed_at
        # Records a violation; False when that invariant is switched off for this run.
        self._report = report
        self.committed: list[Entry] = []
        # The latest proposal time among committed client records (-1: none yet).
        self.newest_committed_proposal_ms = -1
        self._leaders: dict[int, int] = {}  # epoch -> leader id, across all time
        self._max_persisted_epoch: dict[int, int] = {}
        self._seen_persisted: dict[int, ElectionState] = {}
        self._durable_end: dict[int, int] = {}
        self._processes: dict[int, _Process] = {}
        self._top_epoch = -1
        self._top_high_watermark: int | None = None
        self._top_leader: tuple[int, int, int] | None = None  # (node, incarnation, epoch)
        self._top_verified = _Verified()
        # A high watermark stays durable on a majority until it rises (checked where it does) or
        # a durable log end falls (a flushed truncation, a wiped disk).
        self._durable_end_fell = False

    @property
    def committed_end(self) -> int:
        return len(self.committed)

    def check(self) -> None:
        try:
            touched: list[SimNode] = []
            for node in self._cluster.nodes.values():
                # A node no event touched is as it was at the last check.
                if node.touched:
                    node.touched = False
                    touched.append(node)
                    self._check_node(node)
            if self._durable_end_fell:
                self._durable_end_fell = False
                self._check_highest_high_watermark_durable()
            leader = self._cluster.leader()
            if leader is not None:
                self._check_top_leader(leader, leader in touched)
        except _Violated:
            pass

    def _fail(self, invariant: str, message: str) -> None:
        if self._report(invariant, message):
            raise _Violated

    # -- per node -----------------------------------------------------------------------------
    def _check_node(self, node: SimNode) -> None:
        durable_end = node.log.durable_end_offset
        if durable_end < self._durable_end.get(node.node_id, 0):
            self._durable_end_fell = True
        self._durable_end[node.node_id] = durable_end
        persisted = node.persisted or _INITIAL
        if persisted is not self._seen_persisted.get(node.node_id):  # a quorum-state write
            self._seen_persisted[node.node_id] = persisted
            previous = self._max_persisted_epoch.get(node.node_id, 0)
            if persisted.epoch < previous:
                self._fail(
                    MONOTONIC_EPOCH,
                    f"node {node.node_id}'s persisted epoch went from {previous} to "
                    f"{persisted.epoch}",
                )
            self._max_persisted_epoch[node.node_id] = max(previous, persisted.epoch)
            if persisted.leader_id is not None:
                self._record_leader(persisted.epoch, persisted.leader_id, node, "its quorum-state")
        core = node.core
        if core is None:
            return
        believed = core.election_state
        if core.epoch != persisted.epoch or believed.epoch != persisted.epoch:
            self._fail(
                MONOTONIC_EPOCH,
                f"node {node.node_id} is in epoch {core.epoch} (election state "
                f"{believed.epoch}) but persisted epoch {persisted.epoch}",
            )
        if believed != persisted:
            self._fail(
                DURABLE_ELECTION_STATE,
                f"node {node.node_id} believes {believed} is persisted, the disk holds {persisted}",
            )
        if core.state is RaftState.LEADER:
            self._record_leader(core.epoch, node.node_id, node, "its state")

        process = self._processes.get(node.node_id)
        if process is None or process.incarnation != node.incarnation:
            process = self._processes[node.node_id] = _Process(node.incarnation)
        high_watermark = core.high_watermark
        if high_watermark is None:
            return
        if process.high_watermark is not None and high_watermark < process.high_watermark:
            self._fail(
                MONOTONIC_HIGH_WATERMARK,
                f"node {node.node_id}'s high watermark went from {process.high_watermark} to "
                f"{high_watermark}",
            )
        if high_watermark != process.high_watermark:
            self._check_majority_reached(node, high_watermark)
        process.high_watermark = high_watermark
        self._check_committed_prefix(node, process.verified, high_watermark)

    def _record_leader(self, epoch: int, leader_id: int, node: SimNode, source: str) -> None:
        known = self._leaders.setdefault(epoch, leader_id)
        if known != leader_id:
            self._fail(
                SINGLE_LEADER,
                f"epoch {epoch} has two leaders, {known} and {leader_id} "
                f"(node {node.node_id} says so in {source})",
            )

    def _check_committed_prefix(self, node: SimNode, verified: _Verified, end: int) -> None:
        """Every offset below ``end`` (the node's high watermark) is in the node's log with the
        data committed there; offsets first seen committed extend the global prefix."""
        log = node.log
        if not verified.still_valid(log):
            verified.end = 0
        offset = verified.end
        while offset < end:
            batch = log.batch_containing(offset)
            if batch is None:
                self._fail(
                    CONSISTENT_COMMITTED_DATA,
                    f"node {node.node_id}'s high watermark is {end} but its log has no offset "
                    f"{offset} (log end {log.end_offset})",
                )
                return
            entry = entry_of(batch)
            for at in range(offset, min(batch.next_offset, end)):
                if at == len(self.committed):
                    self._commit(batch, at)
                elif self.committed[at] != entry:
                    self._fail(
                        CONSISTENT_COMMITTED_DATA,
                        f"node {node.node_id} holds (epoch, base, crc) {entry} at committed "
                        f"offset {at}, which was committed as {self.committed[at]}",
                    )
            offset = batch.next_offset
        verified.advance(log, end)

    def _commit(self, batch: RecordBatch, offset: int) -> None:
        self.committed.append(entry_of(batch))
        if batch.is_control:
            return
        proposed = self._proposed_at.get(batch.records[offset - batch.base_offset].value)
        if proposed is not None and proposed > self.newest_committed_proposal_ms:
            self.newest_committed_proposal_ms = proposed

    # -- the leader of the highest epoch ------------------------------------------------------
    def _check_top_leader(self, leader: SimNode, touched: bool) -> None:
        core = leader.core
        assert core is not None
        if core.epoch < self._top_epoch:
            return  # a deposed leader that has not noticed yet, its successor being down
        self._top_epoch = core.epoch
        identity = (leader.node_id, leader.incarnation, core.epoch)
        if identity != self._top_leader:
            self._top_leader = identity
            self._top_verified = _Verified()
            touched = True
        high_watermark = core.high_watermark
        if high_watermark is not None:
            top = self._top_high_watermark
            if high_watermark != top and self._covers_own_epoch(leader, high_watermark):
                if top is not None and high_watermark < top:
                    self._fail(
                        MONOTONIC_HIGH_WATERMARK,
                        f"leader {leader.node_id} (epoch {core.epoch}) has high watermark "
                        f"{high_watermark}, below {top} reached earlier",
                    )
                self._top_high_watermark = high_watermark
        if touched or self._top_verified.end < len(self.committed):
            self._check_has_committed(leader, self._top_verified)

    @staticmethod
    def _covers_own_epoch(leader: SimNode, high_watermark: int) -> bool:
        """Whether the leader's high watermark is its own: a new leader keeps the one it had as a
        follower (a valid but stale bound) until it commits an entry of its epoch (Kafka's leader
        has none until then)."""
        assert leader.core is not None
        batch = leader.log.batch_containing(high_watermark - 1)
        return batch is not None and batch.epoch == leader.core.epoch

    def _check_highest_high_watermark_durable(self) -> None:
        highest: tuple[int, SimNode] | None = None
        for node in self._cluster.alive():
            high_watermark = node.core.high_watermark if node.core is not None else None
            if high_watermark is not None and (highest is None or high_watermark > highest[0]):
                highest = (high_watermark, node)
        if highest is not None:
            self._check_majority_reached(highest[1], highest[0])

    def _check_majority_reached(self, node: SimNode, high_watermark: int) -> None:
        """Kafka's MajorityReachedHighWatermark, for every node's high watermark (a follower's
        is bounded by a leader's): a majority of voters holds it on disk."""
        voters = self._cluster.voter_ids
        durable = [
            voter
            for voter in voters
            if self._cluster.nodes[voter].log.durable_end_offset >= high_watermark
        ]
        if len(durable) <= len(voters) // 2:
            assert node.core is not None
            self._fail(
                MAJORITY_REACHED_HIGH_WATERMARK,
                f"node {node.node_id} ({node.core.state}, epoch {node.core.epoch}) has high "
                f"watermark {high_watermark} but only voters {durable} of {voters} have durably "
                "reached it",
            )

    def _check_has_committed(self, leader: SimNode, verified: _Verified) -> None:
        """Leader completeness: the leader's log holds every committed offset, unchanged."""
        log = leader.log
        if not verified.still_valid(log):
            verified.end = 0
        offset = verified.end
        end = len(self.committed)
        for at in range(offset, end):
            batch = log.batch_containing(at)
            entry = entry_of(batch) if batch is not None else None
            if entry != self.committed[at]:
                self._fail(
                    NO_COMMITTED_LOSS,
                    f"leader {leader.node_id} of epoch {self._top_epoch} holds {entry} at offset "
                    f"{at}, committed as {self.committed[at]}",
                )
                return
        verified.advance(log, end)
