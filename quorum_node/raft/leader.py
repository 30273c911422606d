"""The leader's own state, as Kafka's ``LeaderState`` keeps it: what each replica has fetched,
the high watermark a majority holds, check-quorum, the observers, the read barriers waiting for a
majority, the fetches parked until there is something to answer, and the proposals waiting for
the linger. ``RaftCore`` handles the RPCs and calls in here for the bookkeeping; nothing here
reads a clock or does I/O (the core hands in ``now_ms``).
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from quorum_node.raft.messages import FetchRequest
from quorum_node.raft.records import Record
from quorum_node.raft.types import NEVER, Errors, ReplicaKey
from quorum_node.raft.voters import VoterSet

# Observers that stopped fetching this long ago are forgotten (Kafka: 5 minutes).
OBSERVER_SESSION_TIMEOUT_MS = 5 * 60 * 1000
# At most this many observers are tracked. A new one beyond it evicts the one that fetched
# least recently (never the subject of a pending AddVoter): a live observer fetches every
# fetch.max.wait, so it is back in the table at its next fetch, whereas refusing newcomers
# would lock a legitimate replacement replica out for a whole session timeout after any burst
# of fetches with made-up keys. In this product observers are the replacements of lost disks
# (one or two at a time), so a few dozen is plenty.
MAX_OBSERVERS = 64
# A leader flushes its log at the latest this long after an append it left unflushed, its
# followers' commits notwithstanding.
LEADER_UNFLUSHED_MAX_MS = 1000


@dataclass(frozen=True, slots=True)
class ReplicaDescription:
    key: ReplicaKey
    log_end_offset: int | None
    last_fetch_ms: int | None
    last_caught_up_ms: int | None


@dataclass(frozen=True, slots=True)
class QuorumDescription:
    """The leader's view of the quorum (DescribeQuorum)."""

    leader_id: int
    epoch: int
    high_watermark: int | None
    voters: tuple[ReplicaDescription, ...]
    observers: tuple[ReplicaDescription, ...]


@dataclass(frozen=True, slots=True)
class ReadBarrier:
    """A linearizable read in progress (ReadIndex): once a majority of voters has fetched from
    this leader, in its epoch, after the barrier was taken, every write acknowledged before the
    read began lies below ``read_index``. The core settles it with one ``ReadOutcome`` effect.

    "After" is what the fetch proves, not when it arrives: it echoes the newest barrier id the
    leader's answers named (``FetchRequest.read_barrier``), so it was sent after an answer sent
    after the barrier was taken. A fetch that arrives after the barrier but was sent before it
    (held in the socket of a paused leader while its sender moved on to a newer epoch, whose
    leader committed meanwhile) proves nothing. Barrier ids only grow."""

    id: int
    epoch: int
    read_index: int
    deadline_ms: int


@dataclass(frozen=True, slots=True)
class ReadConfirmed:
    """A majority of voters fetched from this leader after the barrier: reading up to
    ``read_index`` is linearizable."""

    barrier_id: int
    read_index: int


@dataclass(frozen=True, slots=True)
class ReadAbandoned:
    """This replica stopped leading before the barrier was confirmed; ``leader_id`` and
    ``epoch`` are what it knows now (where the reader may go instead)."""

    barrier_id: int
    leader_id: int | None
    epoch: int


@dataclass(frozen=True, slots=True)
class ReadTimedOut:
    """No majority fetched from this leader before the barrier's deadline."""

    barrier_id: int


ReadOutcome = ReadConfirmed | ReadAbandoned | ReadTimedOut


@dataclass(frozen=True, slots=True)
class VoterChangeDone:
    """The end of the voter change ``ticket``: committed (``error`` NONE) or failed. Emitted once
    for every ticket ``add_voter``/``remove_voter`` returned, unless the process stops first."""

    ticket: int
    error: Errors
    message: str


@dataclass(slots=True)
class ReplicaProgress:
    """What the leader knows of one replica in its epoch (Kafka's ``ReplicaState``)."""

    end_offset: int | None = None  # last fetch offset: what the replica has durably
    last_fetch_ms: int | None = None
    last_caught_up_ms: int | None = None
    leader_end_at_last_fetch: int = 0
    acknowledged: bool = False  # fetched from, or answered BeginQuorumEpoch of, this leader
    next_begin_quorum_ms: int = 0
    # Read barriers (``ReadBarrier``): the newest one this voter has proved to follow this leader
    # after (a fetch echoed it, or it answered a BeginQuorumEpoch sent after it); the newest one
    # a BeginQuorumEpoch in flight to it was sent after; the newest one whose start answered its
    # parked fetch (no records to flush first: its next fetch echoes it within a round trip).
    read_barrier_echoed: int = 0
    read_barrier_asked: int = 0
    read_barrier_released: int = 0
    directory_id: uuid.UUID | None = None  # as the replica reports it in its fetches

    def begin_quorum_due_ms(self, heartbeat_ms: int) -> int:
        """BeginQuorumEpoch goes to a voter until it acknowledges the epoch, then again only
        when it has not fetched for ``heartbeat_ms`` (half the fetch timeout)."""
        due = self.next_begin_quorum_ms
        if self.acknowledged and self.last_fetch_ms is not None:
            due = max(due, self.last_fetch_ms + heartbeat_ms)
        return due


@dataclass(slots=True)
class ParkedFetch:
    """A Fetch with nothing to answer yet: answered when records or a newer high watermark
    come, or at ``deadline_ms``."""

    source: int
    correlation_id: int
    request: FetchRequest
    deadline_ms: int
    progress: ReplicaProgress  # the fetching replica's, as its fetch was recorded


def record_size(record: Record) -> int:
    """What a record counts for against the batch limit (its value and key, and their framing)."""
    return len(record.value) + (len(record.key) if record.key is not None else 0) + 8


@dataclass(slots=True)
class BatchAccumulator:
    """The client records a leader holds for the linger (Kafka's ``BatchAccumulator``): their
    offsets are given when proposed, and they go to the log together, as one batch, once the
    linger has passed, the batch is full or the disk is idle (group commit)."""

    records: list[Record] = field(default_factory=list)
    size_bytes: int = 0
    deadline_ms: int = NEVER  # the linger's end; or the retry after the log was full

    def add(self, records: Sequence[Record], size_bytes: int, now_ms: int,
            linger_ms: int) -> None:
        self.records.extend(records)
        self.size_bytes += size_bytes
        if self.deadline_ms == NEVER:
            self.deadline_ms = now_ms + linger_ms

    def overflows(self, size_bytes: int, max_bytes: int) -> bool:
        """Whether ``size_bytes`` more would take the batch past ``max_bytes``: the records
        held go first, so that a batch never outgrows the limit."""
        return bool(self.records) and self.size_bytes + size_bytes > max_bytes

    def is_due(self, now_ms: int, max_bytes: int, *, disk_idle: bool) -> bool:
        """Whether the records held go to the log now: while an fsync runs they wait (up to the
        linger, or until the batch is full); with the disk idle there is nothing to wait for."""
        return bool(self.records) and (now_ms >= self.deadline_ms
                                       or self.size_bytes >= max_bytes or disk_idle)

    def appended(self) -> None:
        """The records held are in the log (a new list: the log may keep the one it was given)."""
        self.records = []
        self.size_bytes = 0
        self.deadline_ms = NEVER


@dataclass(slots=True)
class DeferredFlush:
    """The leader's own appends left unflushed while its followers commit them
    (``QuorumConfig.leader_flush_delay_ms``): those not yet committed, oldest first, as (end
    offset, when appended); and when the oldest unflushed one was appended."""

    uncommitted: deque[tuple[int, int]] = field(default_factory=deque)
    since_ms: int = NEVER

    def note(self, end_offset: int, now_ms: int) -> None:
        self.uncommitted.append((end_offset, now_ms))
        self.since_ms = min(self.since_ms, now_ms)

    def committed(self, high_watermark: int) -> None:
        while self.uncommitted and self.uncommitted[0][0] <= high_watermark:
            self.uncommitted.popleft()

    def due_ms(self, delay_ms: int) -> int:
        """When the log must be flushed: once the oldest append still uncommitted has waited
        ``delay_ms``, and at the latest ``LEADER_UNFLUSHED_MAX_MS`` after the oldest unflushed
        one (so that a failing disk is found, and the leader's copy is durable, within that)."""
        if self.since_ms == NEVER:
            return NEVER
        due = self.since_ms + LEADER_UNFLUSHED_MAX_MS
        if self.uncommitted:
            due = min(due, self.uncommitted[0][1] + delay_ms)
        return due

    def clear(self) -> None:
        self.uncommitted.clear()
        self.since_ms = NEVER


@dataclass(slots=True)
class LeaderState:
    epoch: int
    voted_key: ReplicaKey | None
    epoch_start_offset: int
    check_quorum_deadline_ms: int
    voters: dict[ReplicaKey, ReplicaProgress]
    observers: dict[ReplicaKey, ReplicaProgress] = field(default_factory=dict)
    high_watermark: int | None = None  # unknown until this epoch's LeaderChange is committed
    fetched_voters: set[ReplicaKey] = field(default_factory=set)
    accumulator: BatchAccumulator = field(default_factory=BatchAccumulator)
    parked: list[ParkedFetch] = field(default_factory=list)
    reads: list[ReadBarrier] = field(default_factory=list)  # oldest (lowest id) first
    newest_read_barrier: int = 0  # the id of the newest barrier taken: named in every answer
    # The voter each BeginQuorumEpoch in flight was addressed to, by node id (one request in
    # flight per node): its answer names no directory, and during a voter change two voters
    # share an id, of which only the one asked may be credited.
    begin_quorum_asked: dict[int, ReplicaProgress] = field(default_factory=dict)
    deferred_flush: DeferredFlush = field(default_factory=DeferredFlush)

    @property
    def awaits_echo(self) -> int:
        """The barrier id a fetch must echo to help confirm the reads waiting, 0 if none wait."""
        return self.reads[-1].id if self.reads else 0

    def awaits_answer_from(self, progress: ReplicaProgress) -> bool:
        """Whether the reads waiting need a BeginQuorumEpoch answered by this voter: it has not
        proved the newest barrier, and no parked fetch of its was answered at its start (a
        fetch answered with records comes back only after the follower's fsync; an answer to a
        request sent after the barrier proves as much, a round trip later)."""
        awaited = self.awaits_echo
        return awaited > progress.read_barrier_echoed and awaited > progress.read_barrier_released

    def can_grant_vote(self, candidate: ReplicaKey, up_to_date: bool, pre_vote: bool) -> bool:
        return False  # a leader of this epoch votes for nobody

    # --- replicas ----------------------------------------------------------------------------

    def note_contact(self, now_ms: int, replica: ReplicaKey, *, local_key: ReplicaKey,
                     counts_itself: bool, check_quorum_timeout_ms: int,
                     protected: ReplicaKey | None) -> ReplicaProgress:
        """A Fetch or FetchSnapshot from ``replica``: it follows this leader (check-quorum).
        ``counts_itself``: the leader is a voter (not one removing itself, KIP-856);
        ``protected``: the observer a pending AddVoter waits for, never evicted."""
        voter_key = next((k for k in self.voters if k.matches(replica)), None)
        if voter_key is not None and voter_key.directory_id is None \
                and replica.directory_id is not None:
            # A voter known by id only (before the bootstrap VotersRecord names directories):
            # the directory it first fetched under in this epoch is its own. Another one under
            # its id is another replica (a replaced disk, or a forged fetch) and must not
            # become the voter's directory in the bootstrap VotersRecord.
            known = local_key.directory_id if voter_key.id == local_key.id \
                else self.voters[voter_key].directory_id
            if known is not None and known != replica.directory_id:
                voter_key = None
        if voter_key is None:
            progress = self.observers.get(replica)
            if progress is None:
                progress = self.observers[replica] = self._new_observer(now_ms, protected)
            return progress
        progress = self.voters[voter_key]
        progress.acknowledged = True
        if not voter_key.matches(local_key):
            self.fetched_voters.add(voter_key)
            needed = len(self.voters) // 2 + 1 - (1 if counts_itself else 0)
            if len(self.fetched_voters) >= needed:
                self.fetched_voters.clear()
                self.check_quorum_deadline_ms = now_ms + check_quorum_timeout_ms
        return progress

    def _new_observer(self, now_ms: int, protected: ReplicaKey | None) -> ReplicaProgress:
        """Room for one more observer: the expired go, then (at MAX_OBSERVERS) the stalest."""
        observers = self.observers
        if observers:
            for key in [k for k, p in observers.items()
                        if p.last_fetch_ms is None
                        or now_ms - p.last_fetch_ms >= OBSERVER_SESSION_TIMEOUT_MS]:
                del observers[key]
        while len(observers) >= MAX_OBSERVERS:
            stalest = min((k for k in observers if k != protected),
                          key=lambda k: observers[k].last_fetch_ms or 0)
            del observers[stalest]
        return ReplicaProgress()

    def record_fetch(self, now_ms: int, progress: ReplicaProgress, replica: ReplicaKey,
                     offset: int, leader_end: int, *, read_barrier: int = 0) -> None:
        """A valid fetch at ``offset`` (what the replica has durably) while the leader's log
        ends at ``leader_end``, echoing ``read_barrier``. Caught up (Kafka's rule): at the
        leader's end now, or at its end as of the replica's previous fetch."""
        if offset >= leader_end:
            progress.last_caught_up_ms = now_ms
        elif offset >= progress.leader_end_at_last_fetch and progress.last_fetch_ms is not None:
            progress.last_caught_up_ms = progress.last_fetch_ms
        progress.end_offset = offset
        progress.directory_id = replica.directory_id
        progress.last_fetch_ms = now_ms
        progress.leader_end_at_last_fetch = leader_end
        # No more than was named: an echo beyond it was never heard from this leader.
        progress.read_barrier_echoed = max(progress.read_barrier_echoed,
                                           min(read_barrier, self.newest_read_barrier))

    def is_caught_up(self, key: ReplicaKey, now_ms: int, within_ms: int) -> bool:
        """Whether the observer ``key`` reached the leader's log end within ``within_ms``."""
        progress = self.observers.get(key)
        return progress is not None and progress.last_caught_up_ms is not None \
            and now_ms - progress.last_caught_up_ms <= within_ms

    def regroup(self, voters: VoterSet, local_key: ReplicaKey) -> None:
        """Sort the replica progress into voters and observers after a change of the voter set,
        keeping what each has fetched; the high watermark stays (it never drops)."""
        old = [*self.voters.items(), *self.observers.items()]
        regrouped: dict[ReplicaKey, ReplicaProgress] = {}
        for key in voters:
            # Exact key first: a static voter known by id only becomes the same replica's key.
            found = next((kp for kp in old if kp[0] == key), None) or next(
                (kp for kp in old if kp[0].matches(key)), None)
            if found is not None:
                old.remove(found)
            regrouped[key] = found[1] if found is not None else ReplicaProgress()
        observers: dict[ReplicaKey, ReplicaProgress] = {}
        for key, progress in old:
            if key.matches(local_key) or progress.last_fetch_ms is None:
                continue  # the leader itself, or a voter that never fetched in this epoch
            observers[ReplicaKey(key.id, key.directory_id or progress.directory_id)] = progress
        self.voters = regrouped
        self.observers = observers
        self.fetched_voters &= set(regrouped)

    def successors(self, node_id: int) -> list[ReplicaKey]:
        """The other voters, most caught-up first: the likeliest winner campaigns first."""
        remote = [(k, p) for k, p in self.voters.items() if k.id != node_id]
        remote.sort(key=lambda kp: -(kp[1].end_offset if kp[1].end_offset is not None else -1))
        return [k for k, _ in remote]

    def describe(self, now_ms: int, local_key: ReplicaKey,
                 local_end_offset: int) -> QuorumDescription:
        def row(key: ReplicaKey, progress: ReplicaProgress) -> ReplicaDescription:
            if key.matches(local_key):
                return ReplicaDescription(local_key, local_end_offset, now_ms, now_ms)
            # A static voter's uuid is not configured; report the one its fetches carry.
            reported = ReplicaKey(key.id, key.directory_id or progress.directory_id)
            return ReplicaDescription(reported, progress.end_offset, progress.last_fetch_ms,
                                      progress.last_caught_up_ms)

        observers = tuple(
            row(key, progress) for key, progress in self.observers.items()
            if progress.last_fetch_ms is not None
            and now_ms - progress.last_fetch_ms < OBSERVER_SESSION_TIMEOUT_MS
        )
        return QuorumDescription(
            leader_id=local_key.id, epoch=self.epoch, high_watermark=self.high_watermark,
            voters=tuple(row(key, progress) for key, progress in self.voters.items()),
            observers=observers,
        )

    # --- the high watermark ------------------------------------------------------------------

    def majority_end(self, local_key: ReplicaKey, flushed_offset: int) -> int:
        """The end offset a majority of voters holds durably (the leader counts what it has
        flushed); -1 for a voter that has not fetched in this epoch."""
        ends = sorted(
            (
                flushed_offset if key.matches(local_key)
                else (p.end_offset if p.end_offset is not None else -1)
                for key, p in self.voters.items()
            ),
            reverse=True,
        )
        return ends[len(ends) // 2]

    # --- read barriers -----------------------------------------------------------------------

    def begin_read(self, barrier_id: int, read_index: int, deadline_ms: int) -> ReadBarrier:
        """A barrier confirmed by the fetches that echo it (``read_index``: the high watermark;
        ``barrier_id``: above every earlier one)."""
        barrier = ReadBarrier(barrier_id, self.epoch, read_index, deadline_ms)
        self.reads.append(barrier)
        self.newest_read_barrier = barrier_id
        return barrier

    def settle_reads(self, now_ms: int, local_key: ReplicaKey) -> list[ReadOutcome]:
        """Confirm the barriers a majority of voters (this leader included) fetched after, and
        time out the ones past their deadline."""
        if not self.reads:
            return []
        needed = len(self.voters) // 2 + 1
        echoed = sorted(
            (self.newest_read_barrier if key.matches(local_key)
             else progress.read_barrier_echoed for key, progress in self.voters.items()),
            reverse=True)
        # The newest barrier a majority has echoed: it and every earlier one are confirmed.
        confirmed_to = echoed[needed - 1]
        settled: list[ReadOutcome] = []
        keep: list[ReadBarrier] = []
        for barrier in self.reads:
            if barrier.id <= confirmed_to:
                settled.append(ReadConfirmed(barrier.id, barrier.read_index))
            elif now_ms >= barrier.deadline_ms:
                settled.append(ReadTimedOut(barrier.id))
            else:
                keep.append(barrier)
        self.reads = keep
        return settled

    def abandon_reads(self, leader_id: int | None, epoch: int) -> list[ReadOutcome]:
        """Leadership is lost: every barrier is abandoned, with where it went."""
        abandoned: list[ReadOutcome] = [ReadAbandoned(barrier.id, leader_id, epoch)
                                         for barrier in self.reads]
        self.reads = []
        return abandoned
