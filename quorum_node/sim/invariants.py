"""Safety invariants, checked after every event (Kafka's RaftEventSimulationTest, plus the
committed-data checks it runs at the end, done here continuously, plus KIP-856's voter changes):

* SingleLeader: at most one leader per epoch over the whole run (quorum-state files, and the
  replicas that reported becoming leader).
* MonotonicEpoch: a disk's persisted epoch never falls, and its core runs in that epoch.
* DurableElectionState: what the core believes is persisted is what the disk holds.
* MonotonicHighWatermark: a process's high watermark never falls, nor does the one of the leader
  of the highest epoch (once it has committed in its epoch).
* MajorityReachedHighWatermark: a leader's high watermark is on the disk of a majority of its
  voters (the set it had before this event or has now: an event may append a voter change; a
  lost disk counts with what it held when lost, which its replica may have acknowledged).
* ConsistentCommittedData: every node holds, below its high watermark, the committed data, in its
  log or its snapshot; snapshots (same id, same bytes) and state machines match the committed data:
  a replica's key-value store, whatever offset it has applied up to, and the store a snapshot
  holds, are the store the committed prefix up to there gives, applied to a fresh ``KvStore``.
* NoCommittedLoss: the leader of the highest epoch holds all committed data, and no replica
  lacking the newest committed offset could be elected: too few voters of its own voter set are
  no more up to date than it (wiped disks, snapshots and voter changes included).
* OneVoterChangeAtATime: a leader appends a VotersRecord only once the previous one is committed,
  consecutive voter sets differ by at most one voter, and the first (bootstrap) set names each
  configured voter once.
* VoterChangeCommittedByMajorities: a committed VotersRecord is held (or was acknowledged) by a
  majority of the new set, and no majority of the old set can be formed without it.

The checker keeps the globally committed prefix of the log: offset -> (epoch, base offset, CRC)
of the batch holding it, learned from any node's high watermark, with the digest of the key-value
store (``quorum_node.kv.machine.state_digest``) and the voter set it amounts to. Only nodes an
event touched are checked, and every offset once per node per process lifetime: a log below its
high watermark only grows, so a verified prefix stays verified unless the batch that ended it
disappears (then it is checked again).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from quorum_node.kv.machine import KvMachine, loaded_entries, state_digest
from quorum_node.kv.store import KvStore
from quorum_node.raft.log import MemoryLog
from quorum_node.raft.records import RecordBatch, control_record_type
from quorum_node.raft.snapshots import SnapshotId
from quorum_node.raft.state import ElectionState, RaftState
from quorum_node.raft.types import ControlRecordType
from quorum_node.raft.voters import (
    VoterSet,
    differ_by_at_most_one,
    parse_voters_record,
    voter_sets_in,
)
from quorum_node.sim.cluster import Cluster
from quorum_node.sim.durability import (
    Durability,
    Entry,
    describe,
    entry_of,
    majority,
    voters_on_disk,
)
from quorum_node.sim.node import SimNode, read_snapshot_bytes

SINGLE_LEADER = "SingleLeader"
MONOTONIC_EPOCH = "MonotonicEpoch"
DURABLE_ELECTION_STATE = "DurableElectionState"
MONOTONIC_HIGH_WATERMARK = "MonotonicHighWatermark"
MAJORITY_REACHED_HIGH_WATERMARK = "MajorityReachedHighWatermark"
CONSISTENT_COMMITTED_DATA = "ConsistentCommittedData"
NO_COMMITTED_LOSS = "NoCommittedLoss"
ONE_VOTER_CHANGE_AT_A_TIME = "OneVoterChangeAtATime"
VOTER_CHANGE_MAJORITIES = "VoterChangeCommittedByMajorities"

INVARIANTS = (
    SINGLE_LEADER,
    MONOTONIC_EPOCH,
    DURABLE_ELECTION_STATE,
    MONOTONIC_HIGH_WATERMARK,
    MAJORITY_REACHED_HIGH_WATERMARK,
    CONSISTENT_COMMITTED_DATA,
    NO_COMMITTED_LOSS,
    ONE_VOTER_CHANGE_AT_A_TIME,
    VOTER_CHANGE_MAJORITIES,
)

_INITIAL = ElectionState.initial()


class _Violated(Exception):
    """Unwinds the check at the first violation (the run stops there)."""


def _base_offset(batch: RecordBatch) -> int:
    return batch.base_offset


@dataclass(slots=True)
class _Verified:
    """How far one log was checked against the committed prefix, and the batch that ended it
    (still there, the same object, means the prefix is unchanged)."""

    end: int = 0
    last_batch: RecordBatch | None = None

    def resume(self, log: MemoryLog) -> int:
        """Where checking goes on: from the start again if the log changed below ``end``."""
        if self.end and log.batch_containing(self.end - 1) is not self.last_batch:
            self.end, self.last_batch = 0, None
        return self.end

    def advance(self, log: MemoryLog, end: int) -> None:
        if end > self.end:
            self.end = end
            self.last_batch = log.batch_containing(end - 1)


@dataclass(slots=True)
class _Process:
    """What is tracked per process lifetime of a node."""

    incarnation: int
    high_watermark: int | None = None
    verified: _Verified = field(default_factory=_Verified)
    voters: VoterSet | None = None  # the core's voter set at the previous check
    applied: int = 0  # the state machine's next offset, as last checked


@dataclass(slots=True)
class _Disk:
    """What is tracked per disk (a wipe starts a new one)."""

    directory_id: object
    max_persisted_epoch: int = 0
    seen_persisted: ElectionState | None = None
    durable_end: int = 0
    snapshot: SnapshotId | None = None  # the latest one checked


@dataclass(slots=True)
class _LeaderTerm:
    """A leader's own appends, scanned for voter changes."""

    identity: tuple[int, int, int]  # (node, incarnation, epoch)
    scanned: int  # offsets below this were looked at
    voters_offset: int | None  # the latest VotersRecord in its log (None: the static set)
    voters: VoterSet | None


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
        # The store that committed[:n] gives (the model), and its digest for every n.
        self._model = KvStore()
        self._digests = [state_digest(self._model.snapshot_entries())]
        self.committed_voters: list[tuple[int, VoterSet]] = []  # committed VotersRecords
        self.durability = Durability(cluster, self.committed)
        # The latest proposal time among committed client records (-1: none yet).
        self.newest_committed_proposal_ms = -1
        self._leaders: dict[int, int] = {}  # epoch -> leader id, across all time
        self._disks: dict[int, _Disk] = {}
        self._processes: dict[int, _Process] = {}
        self._leader_terms: dict[int, _LeaderTerm] = {}
        self._snapshot_data: dict[SnapshotId, bytes] = {}  # the first seen at each id
        self._top_epoch = -1
        self._top_high_watermark: int | None = None
        self._top_leader: tuple[int, int, int] | None = None  # (node, incarnation, epoch)
        self._top_verified = _Verified()
        # Who could be elected without the newest committed offset changes only when more is
        # committed, a durable log end falls (a flushed truncation, a wiped disk), a node starts
        # or stops, or a voter set changes.
        self._quorum_views: dict[int, tuple[object, ...]] = {}
        self._durability_checked_end = 0
        self._durability_stale = False

    @property
    def committed_end(self) -> int:
        return len(self.committed)

    def committed_voter_set(self, below: int | None = None) -> VoterSet:
        """The voter set the committed log puts in force below ``below`` (default: its end)."""
        index = len(self.committed_voters) if below is None else bisect.bisect_left(
            self.committed_voters, below, key=lambda found: found[0])
        return self.committed_voters[index - 1][1] if index else self._cluster.static_voters

    def check(self) -> None:
        try:
            touched: list[SimNode] = []
            for node in self._cluster.nodes.values():
                # A node no event touched is as it was at the last check.
                if node.touched:
                    node.touched = False
                    touched.append(node)
                    self._check_node(node)
            self._note_quorum_views(touched)
            if self._durability_stale or self._durability_checked_end != self.committed_end:
                self._check_committed_durable()
            leader = self._cluster.leader()
            if leader is not None:
                self._check_top_leader(leader, leader in touched)
        except _Violated:
            pass

    def _fail(self, invariant: str, message: str) -> None:
        if self._report(invariant, message):
            raise _Violated

    # -- per node -----------------------------------------------------------------------------
    def _disk(self, node: SimNode) -> _Disk:
        disk = self._disks.get(node.node_id)
        if disk is None or disk.directory_id != node.directory_id:
            disk = self._disks[node.node_id] = _Disk(node.directory_id)
            self._durability_stale = True
        return disk

    def _check_node(self, node: SimNode) -> None:
        disk = self._disk(node)
        durable_end = node.log.durable_end_offset
        if durable_end < disk.durable_end:
            self._durability_stale = True
        disk.durable_end = durable_end
        persisted = node.persisted or _INITIAL
        if persisted is not disk.seen_persisted:  # a quorum-state write
            disk.seen_persisted = persisted
            if persisted.epoch < disk.max_persisted_epoch:
                self._fail(
                    MONOTONIC_EPOCH,
                    f"node {node.node_id}'s persisted epoch went from {disk.max_persisted_epoch} "
                    f"to {persisted.epoch}",
                )
            disk.max_persisted_epoch = max(disk.max_persisted_epoch, persisted.epoch)
            if persisted.leader_id is not None:
                self._record_leader(persisted.epoch, persisted.leader_id, node, "its quorum-state")
        changes, node.role_changes = node.role_changes, []
        for change in changes:
            if change.after is RaftState.LEADER:
                self._record_leader(change.epoch, node.node_id, node, "a role change")
        self._check_snapshot(node, disk)
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

        process = self._processes.get(node.node_id)
        if process is None or process.incarnation != node.incarnation:
            process = self._processes[node.node_id] = _Process(node.incarnation)
        high_watermark = core.high_watermark
        if high_watermark is not None:
            if process.high_watermark is not None and high_watermark < process.high_watermark:
                self._fail(
                    MONOTONIC_HIGH_WATERMARK,
                    f"node {node.node_id}'s high watermark went from {process.high_watermark} "
                    f"to {high_watermark}",
                )
            self._check_committed_prefix(node, process.verified, high_watermark)
            if high_watermark != process.high_watermark and core.state is RaftState.LEADER:
                self._check_majority_reached(node, process, high_watermark)
            process.high_watermark = high_watermark
        self._check_state_machine(node, process)
        if core.state is RaftState.LEADER:
            self._check_voter_appends(node)
        process.voters = core.voters

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
        data committed there, or in its snapshot; offsets first seen committed extend the global
        prefix."""
        log = node.log
        offset = verified.resume(log)
        if offset < log.start_offset:
            latest = node.snapshots.latest()
            if latest is None or latest.end_offset < log.start_offset:
                self._fail(
                    CONSISTENT_COMMITTED_DATA,
                    f"node {node.node_id}'s log starts at {log.start_offset} but no snapshot "
                    f"covers the offsets below (latest snapshot: {latest})",
                )
            if log.start_offset > len(self.committed) and end > len(self.committed):
                self._fail(
                    CONSISTENT_COMMITTED_DATA,
                    f"node {node.node_id} has high watermark {end} over offsets from "
                    f"{len(self.committed)} that no replica showed committed and that its log, "
                    f"starting at {log.start_offset}, no longer holds",
                )
                return
            offset = log.start_offset
        while offset < end:
            batch = log.batch_containing(offset)
            if batch is None:
                self._fail(
                    CONSISTENT_COMMITTED_DATA,
                    f"node {node.node_id}'s high watermark is {end} but its log has no offset "
                    f"{offset} (log {log.start_offset}..{log.end_offset})",
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
        record = batch.records[offset - batch.base_offset]
        digest = self._digests[-1]
        if batch.is_control:
            self._model.skip_batch(batch.base_offset, batch.next_offset, offset + 1)
        else:
            # Record by record, not through KvMachine.apply: the replicas' apply is under test.
            if self._model.apply_batch(batch, offset + 1):
                digest = state_digest(self._model.snapshot_entries())
            proposed = self._proposed_at.get(record.value)
            if proposed is not None and proposed > self.newest_committed_proposal_ms:
                self.newest_committed_proposal_ms = proposed
        self._digests.append(digest)
        if batch.is_control and control_record_type(record) is ControlRecordType.KRAFT_VOTERS:
            self._check_voters_committed(offset, parse_voters_record(record.value))

    def _check_snapshot(self, node: SimNode, disk: _Disk) -> None:
        """A snapshot new on this disk (taken or downloaded) is the committed prefix: its epoch,
        its state machine digest, its voter set; and every snapshot of an id has the same bytes."""
        store = node.snapshots
        latest = store.latest()
        if latest is None or latest == disk.snapshot:
            return
        disk.snapshot = latest
        data = read_snapshot_bytes(store, latest)
        where = f"node {node.node_id}'s snapshot {latest}"
        if self._snapshot_data.setdefault(latest, data) != data:
            self._fail(CONSISTENT_COMMITTED_DATA, f"{where} differs from another one of that id")
        end = latest.end_offset
        if end > len(self.committed):
            self._fail(
                CONSISTENT_COMMITTED_DATA,
                f"{where} goes past the committed offsets ({len(self.committed)})",
            )
            return
        epoch = self.committed[end - 1][0]
        try:
            loaded = KvMachine.build_snapshot(latest, data)
        except ValueError as error:  # CorruptSnapshotError, KvOpError
            self._fail(CONSISTENT_COMMITTED_DATA, f"{where} cannot be loaded: {error}")
            return
        carried = store.voters(latest)
        committed_voters = self.committed_voter_set(end)
        if any(key.directory_id is None for key in committed_voters):
            committed_voters = ()
        if epoch != latest.epoch:
            self._fail(
                CONSISTENT_COMMITTED_DATA,
                f"{where}: offset {end - 1} was committed in epoch {epoch}",
            )
        if state_digest(loaded_entries(loaded)) != self._digests[end]:
            self._fail(
                CONSISTENT_COMMITTED_DATA,
                f"{where} holds a store ({len(loaded.entries)} keys) that is not the committed "
                "data's",
            )
        if sorted(carried or ()) != sorted(committed_voters):
            self._fail(
                CONSISTENT_COMMITTED_DATA,
                f"{where} carries voters {describe(carried or ())}, the committed log "
                f"{describe(committed_voters)}",
            )

    def _check_state_machine(self, node: SimNode, process: _Process) -> None:
        # The store changes only as its next offset grows (an apply, a snapshot loaded).
        store = node.state_machine.store
        applied = store.next_offset
        if applied == process.applied:
            return
        process.applied = applied
        if applied > len(self.committed) or state_digest(
            store.snapshot_entries()
        ) != self._digests[applied]:
            self._fail(
                CONSISTENT_COMMITTED_DATA,
                f"node {node.node_id}'s store ({len(store)} keys) applied up to offset "
                f"{applied} is not the one the committed records give",
            )

    def _check_majority_reached(
        self, node: SimNode, process: _Process, high_watermark: int
    ) -> None:
        """Kafka's MajorityReachedHighWatermark for a leader: a majority of its voters holds its
        high watermark on disk."""
        assert node.core is not None
        candidates = [node.core.voters]
        if process.voters is not None and process.voters != node.core.voters:
            candidates.append(process.voters)
        offset = high_watermark - 1
        if any(self.durability.majority_acknowledged(voters, offset) for voters in candidates):
            return
        holders, _, _ = self.durability.tally(node.core.voters, offset, acknowledged=True)
        self._fail(
            MAJORITY_REACHED_HIGH_WATERMARK,
            f"leader {node.node_id} (epoch {node.core.epoch}) has high watermark "
            f"{high_watermark} but only voters {holders} of {describe(node.core.voters)} have "
            "durably reached it",
        )

    # -- voter changes ------------------------------------------------------------------------
    def _check_voter_appends(self, node: SimNode) -> None:
        """Each VotersRecord a leader appends waits for the previous one to commit and changes
        one voter (the bootstrap record: names the configured voters)."""
        core = node.core
        assert core is not None and core.epoch_start_offset is not None
        identity = (node.node_id, node.incarnation, core.epoch)
        term = self._leader_terms.get(node.node_id)
        if term is None or term.identity != identity:
            start = core.epoch_start_offset
            offset, voters = voters_on_disk(node, self._cluster.static_voters, start)
            term = self._leader_terms[node.node_id] = _LeaderTerm(
                identity, start, offset, voters if offset is not None else None)
        if node.log.end_offset <= term.scanned:
            return
        batches = node.log.batches
        first = bisect.bisect_left(batches, term.scanned, key=_base_offset)
        for index in range(first, len(batches)):
            if batches[index].is_control:
                for offset, voters in voter_sets_in(batches[index]):
                    self._check_voter_append(node, term, offset, voters)
        term.scanned = node.log.end_offset

    def _check_voter_append(
        self, node: SimNode, term: _LeaderTerm, offset: int, voters: VoterSet
    ) -> None:
        assert node.core is not None
        high_watermark = node.core.high_watermark
        previous = term.voters_offset
        if previous is not None and (high_watermark is None or high_watermark <= previous):
            self._fail(
                ONE_VOTER_CHANGE_AT_A_TIME,
                f"leader {node.node_id} (epoch {node.core.epoch}) appended voters "
                f"{describe(voters)} at {offset} while the change at {previous} was uncommitted "
                f"(high watermark {high_watermark})",
            )
        self._check_one_change(term.voters, voters, f"leader {node.node_id} at offset {offset}")
        term.voters_offset, term.voters = offset, voters

    def _check_one_change(self, old: VoterSet | None, new: VoterSet, where: str) -> None:
        """``old`` None: ``new`` bootstraps the configured voters."""
        if old is None:
            configured = sorted(key.id for key in self._cluster.static_voters)
            if sorted(key.id for key in new) != configured:
                self._fail(
                    ONE_VOTER_CHANGE_AT_A_TIME,
                    f"{where}: bootstrap voters {describe(new)} are not the configured ones "
                    f"{configured}",
                )
        elif not differ_by_at_most_one(old, new):
            self._fail(
                ONE_VOTER_CHANGE_AT_A_TIME,
                f"{where}: voters went from {describe(old)} to {describe(new)} in one step",
            )

    def _check_voters_committed(self, offset: int, voters: VoterSet) -> None:
        old = self.committed_voter_set()
        self.committed_voters.append((offset, voters))
        bootstrap = len(self.committed_voters) == 1
        self._check_one_change(None if bootstrap else old, voters, f"committed offset {offset}")
        holders, _, lost = self.durability.tally(voters, offset, acknowledged=True)
        if len(holders) < majority(voters):
            self._fail(
                VOTER_CHANGE_MAJORITIES,
                f"voters {describe(voters)} committed at {offset} but held only by {holders} "
                f"(lost: {lost}): no majority of the new set",
            )
        if not self.durability.every_quorum_holds(old, offset):
            holders, lacking, lost = self.durability.tally(old, offset)
            self._fail(
                VOTER_CHANGE_MAJORITIES,
                f"voters {describe(voters)} committed at {offset} but {lacking} of the old set "
                f"{describe(old)} lack it (holders {holders}, lost {lost}): a majority of the "
                "old set could elect a leader without it",
            )

    # -- durability of the committed prefix ---------------------------------------------------
    def _note_quorum_views(self, touched: list[SimNode]) -> None:
        for node in touched:
            core = node.core
            voters = core.voters if core is not None else None
            known = self._quorum_views.get(node.node_id)
            if known is None or known[0] != node.incarnation \
                    or known[1] is not node.directory_id or known[2] is not voters:
                self._quorum_views[node.node_id] = (node.incarnation, node.directory_id, voters)
                self._durability_stale = True

    def _check_committed_durable(self) -> None:
        self._durability_stale = False
        self._durability_checked_end = self.committed_end
        if not self.committed:
            return
        top = self.committed_end - 1
        electable = self.durability.electable_without(self.durability.candidates(top))
        if electable is not None:
            candidate, granting = electable
            self._fail(
                NO_COMMITTED_LOSS,
                f"committed offset {top} could be lost: node {candidate.key.id} lacks it (log "
                f"epoch, end {candidate.position}) yet voters {granting} of its voter set "
                f"{describe(candidate.voters)} could elect it",
            )

    def can_lose_disk(self, node_id: int) -> bool:
        """Whether losing ``node_id``'s disk now leaves no replica that could be elected without
        the committed data, and a majority of every voter set in use able to vote: what an
        operator must know before replacing a disk."""
        if not self.committed:
            return False
        candidates = self.durability.candidates(self.committed_end - 1, wiped=node_id)
        return (self.durability.electable_without(candidates) is None
                and self.durability.voters_without_quorum(candidates) is None)

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
        if batch is not None:
            return batch.epoch == leader.core.epoch
        latest = leader.snapshots.latest()  # the log may start right at the high watermark
        return latest is not None and latest == SnapshotId(high_watermark, leader.core.epoch)

    def _check_has_committed(self, leader: SimNode, verified: _Verified) -> None:
        """Leader completeness: the leader's log (or snapshot, below its log start) holds every
        committed offset, unchanged."""
        log = leader.log
        offset = verified.resume(log)
        if offset < log.start_offset:
            latest = leader.snapshots.latest()
            if latest is None or latest.end_offset < min(log.start_offset, len(self.committed)):
                self._fail(
                    NO_COMMITTED_LOSS,
                    f"leader {leader.node_id} of epoch {self._top_epoch}: its log starts at "
                    f"{log.start_offset} and its snapshot {latest} does not reach there",
                )
            offset = log.start_offset
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

