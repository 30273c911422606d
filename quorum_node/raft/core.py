"""The Raft core: KIP-595 elections and pull replication, KIP-996 pre-vote and check-quorum.

A pure, deterministic state machine. The driver hands in the time (``now_ms``), a seeded
``random.Random``, the log, inbound requests and responses; the core answers with ``Effects``:
the election state to persist, messages to send and whether the log must be flushed. There is no
clock, socket, file or global randomness in here, so the same code runs in the node and in the
simulator.

The driver's contract (``take_effects`` after every call):
1. persist ``Effects.persist`` durably before sending any message of the same batch (a vote is
   only granted, and an epoch only announced, once it survives a crash);
2. apply the log mutations the core made through the ``RaftLog`` it was given (they are already
   applied: the log is in-memory or page-cache state) and, when ``Effects.flush`` is set, flush the
   log and report the flushed end offset with ``handle_flushed``. Only flushed data counts as the
   leader's own progress and only flushed data is acknowledged by a follower's next Fetch;
3. hand ``Effects.voter_changes`` and ``Effects.reads`` to whoever waits for them: every voter
   change ticket and read barrier the core handed out is settled by exactly one of them;
4. tell ``Effects.role_changes`` (once ``persist`` is durable) to whoever tells or counts them.

Each replica state lives with its role, as Kafka's ``EpochState`` classes do: ``leader.py``
(``LeaderState``: replica progress, high watermark, check-quorum, observers, read barriers),
``follower.py`` (``FollowerState``: the fetch timer, snapshot downloads, the checks of a leader's
answers), ``candidate.py`` (Unattached, Prospective, Candidate, Resigned; whom each votes for).
``quorum_state.py`` (``QuorumState``, as Kafka's) holds the current one, the election state it
persists, and every transition, each reported as a ``RoleChanged`` with its cause.

Each part of the protocol has a room of its own, given its collaborators explicitly:
``quorum_rpcs.py`` (Vote, BeginQuorumEpoch, EndQuorumEpoch, and the epoch and leader every
response carries), ``replication.py`` (the leader serving Fetch, parked fetches, the high
watermark), ``follower_fetch.py`` (the follower's fetch and what it does with the answer),
``snapshot_transfer.py`` (KIP-630, both ends), ``reads.py`` (linearizable reads),
``voter_change.py`` (KIP-853/856 voter changes) and ``voter_history.py`` (the voter set the log
defines). They share the log, ``watermarks.py`` (flushed offset, high watermark) and the
``Outbox`` (``outbox.py``) their effects go into. This module is the dispatcher (``match`` over
every request, response and state), the timers and the public API, and wires the rooms.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Iterable, Sequence
from typing import assert_never

from quorum_node.raft.candidate import (
    CandidateState,
    ProspectiveState,
    ResignedState,
    UnattachedState,
)
from quorum_node.raft.config import QuorumConfig
from quorum_node.raft.follower import FollowerState
from quorum_node.raft.follower_fetch import FollowerFetcher
from quorum_node.raft.leader import (
    LeaderState,
    QuorumDescription,
    ReadAbandoned,
    ReadBarrier,
    ReadConfirmed,
    ReadOutcome,
    ReadTimedOut,
    ReplicaDescription,
    VoterChangeDone,
    record_size,
)
from quorum_node.raft.log import LogFullError, RaftLog
from quorum_node.raft.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    LeaderChangeMessage,
    RaftRequest,
    RaftResponse,
    ReplicaInfo,
    VoteRequest,
    VoteResponse,
)
from quorum_node.raft.outbox import (
    Effects,
    OutboundRequest,
    OutboundResponse,
    Outbox,
    WarningLimiter,
    answer,
)
from quorum_node.raft.quorum_rpcs import QuorumRpcs
from quorum_node.raft.quorum_state import QuorumState, ReplicaState, TransitionCause
from quorum_node.raft.reads import LinearizableReads
from quorum_node.raft.records import Record, control_record
from quorum_node.raft.replication import LeaderReplication
from quorum_node.raft.requests import RequestFailure, RequestManager
from quorum_node.raft.snapshot_transfer import SnapshotTransfer
from quorum_node.raft.snapshots import SnapshotRecordsCheck, SnapshotStore
from quorum_node.raft.state import ElectionState, RaftState
from quorum_node.raft.status import NodeStatus
from quorum_node.raft.types import (
    NEVER,
    ControlRecordType,
    Errors,
    LeaderNotReadyError,
    NotLeaderError,
    ReplicaKey,
    VoterChangeError,
    VoterChangeKind,
)
from quorum_node.raft.voter_change import VoterChangeHandler
from quorum_node.raft.voter_history import VoterHistory
from quorum_node.raft.voters import VoterSet, voters_record
from quorum_node.raft.watermarks import Watermarks

logger = logging.getLogger(__name__)

# What the runtime, the simulator and the tests take from here (some defined in the role modules).
__all__ = [
    "Effects",
    "OutboundRequest",
    "OutboundResponse",
    "QuorumDescription",
    "RaftCore",
    "ReadAbandoned",
    "ReadBarrier",
    "ReadConfirmed",
    "ReadOutcome",
    "ReadTimedOut",
    "ReplicaDescription",
    "VoterChangeDone",
]


class RaftCore:
    """One replica's protocol engine. See the module docstring for the driver's contract."""

    def __init__(
        self,
        *,
        node_id: int,
        directory_id: uuid.UUID | None,
        cluster_id: str,
        voters: Iterable[ReplicaKey],
        log: RaftLog,
        election_state: ElectionState | None,
        config: QuorumConfig,
        random: random.Random,
        now_ms: int,
        snapshots: SnapshotStore,
        observer_ids: Iterable[int] = (),
        check_snapshot_records: SnapshotRecordsCheck | None = None,
    ) -> None:
        """``voters`` are the statically configured voters (``controller.quorum.voters``, known
        by id): in force until the first leader writes them, with their directory ids, as a
        VotersRecord; from then on the voter set is the one the log (or snapshot) defines.

        Only replicas with a configured voter id may fetch (in this product observers are the
        replacement directories of configured ids, KIP-856), plus ``observer_ids``: replicas
        that replicate the log but never vote (Kafka's brokers; the node has none).

        ``check_snapshot_records``: the state machine's check of a snapshot's records, run with
        the core's own checks on every snapshot downloaded from a leader before it is kept (by
        default any records pass: the core alone cannot tell what its state machine loads)."""
        self.node_id = node_id
        self.local_key = ReplicaKey(node_id, directory_id)
        # Without a directory id the quorum is static (Kafka's kraft.version 0): no VotersRecord
        # can name this replica, so the configured voters stay the voters.
        self._reconfigurable = directory_id is not None
        self.cluster_id = cluster_id
        self.log = log
        self.snapshots = snapshots
        self._voters = VoterHistory(local_key=self.local_key, static_voters=voters, log=log,
                                    snapshots=snapshots)
        self._static_ids = self._voters.static_ids
        self._fetcher_ids = self._static_ids | frozenset(observer_ids)
        self._warnings = WarningLimiter()
        self._voter_changes = VoterChangeHandler(local_key=self.local_key,
                                                 static_ids=self._static_ids,
                                                 fetch_timeout_ms=config.fetch_timeout_ms)
        self.config = config
        self._random = random
        self._requests = RequestManager(config.request_timeout_ms, config.retry_backoff_ms)
        self._heartbeat_ms = config.begin_quorum_interval_ms
        self._outbox = Outbox(node_id=node_id, requests=self._requests, warnings=self._warnings)
        self._watermarks = Watermarks(node_id=node_id, flushed_offset=log.end_offset)
        self._shutting_down = False
        self._now_ms = now_ms

        self._quorum = QuorumState(
            local_key=self.local_key, config=config, random=random,
            voters=lambda: self._voters.voters,
            on_leave=self._leave_state,
            stored=election_state if election_state is not None else ElectionState.initial(),
            log_epoch=log.last_fetched_epoch(), log_end_offset=log.end_offset, now_ms=now_ms)
        self._replication = LeaderReplication(
            local_key=self.local_key, cluster_id=cluster_id, config=config, log=log,
            snapshots=snapshots, quorum=self._quorum, voters=self._voters,
            voter_changes=self._voter_changes, fetcher_ids=self._fetcher_ids,
            watermarks=self._watermarks, outbox=self._outbox, warnings=self._warnings,
            voters_changed=self._voters_changed)
        self._reads = LinearizableReads(local_key=self.local_key,
                                        replication=self._replication, outbox=self._outbox)
        self._transfer = SnapshotTransfer(
            local_key=self.local_key, config=config, log=log, snapshots=snapshots,
            quorum=self._quorum, voters=self._voters, replication=self._replication,
            watermarks=self._watermarks, requests=self._requests, outbox=self._outbox,
            warnings=self._warnings, check_snapshot_records=check_snapshot_records,
            voters_changed=self._voters_changed)
        self._follower = FollowerFetcher(
            local_key=self.local_key, cluster_id=cluster_id, config=config, log=log,
            snapshots=snapshots, quorum=self._quorum, voters=self._voters,
            transfer=self._transfer, watermarks=self._watermarks, requests=self._requests,
            outbox=self._outbox, voters_changed=self._voters_changed)
        self._rpcs = QuorumRpcs(local_key=self.local_key, cluster_id=cluster_id, config=config,
                                log=log, quorum=self._quorum, voters=self._voters,
                                requests=self._requests, outbox=self._outbox,
                                warnings=self._warnings)
        self._drive(now_ms)

    # --- inspection --------------------------------------------------------------------------

    @property
    def state(self) -> RaftState:
        return self._quorum.name

    @property
    def _state(self) -> ReplicaState:
        """The current state object (``QuorumState`` owns it and every transition)."""
        return self._quorum.state

    @property
    def epoch(self) -> int:
        return self._quorum.epoch

    @property
    def leader_id(self) -> int | None:
        return self._quorum.leader_id

    @property
    def high_watermark(self) -> int | None:
        """The local high watermark: every offset below it is committed. Never decreases."""
        return self._watermarks.high_watermark

    @property
    def refused_snapshots(self) -> int:
        """Snapshots downloaded from a leader and refused (not kept, the log kept) since start."""
        return self._transfer.refused_snapshots

    @property
    def election_state(self) -> ElectionState:
        return self._quorum.election_state

    @property
    def is_voter(self) -> bool:
        return self._voters.is_voter

    @property
    def voters(self) -> VoterSet:
        """The voter set in force (the log's latest VotersRecord, else the configured voters)."""
        return self._voters.voters

    @property
    def flushed_offset(self) -> int:
        return self._watermarks.flushed_offset

    @property
    def bootstrapped(self) -> bool:
        """Whether the voter set comes from the log (or a snapshot) rather than the static
        configuration: the first leader has written it, with every voter's directory id."""
        return self._voters.bootstrapped

    @property
    def accepts_writes(self) -> bool:
        """A leader accepts client records once the bootstrap VotersRecord is in its log: that
        record goes first, in its own batch (KIP-856)."""
        return (isinstance(self._state, LeaderState) and not self._shutting_down
                and (self.bootstrapped or not self._reconfigurable))

    @property
    def voters_unheard(self) -> tuple[int, ...]:
        """On a leader that takes no client records yet: the configured voters whose directory
        ids it has still to learn from their fetches before it writes the voter set (KIP-856
        bootstrapping). Empty once it takes writes, and on any other replica."""
        if self._voters.bootstrapped or not self._reconfigurable:
            return ()
        state = self._state
        if not isinstance(state, LeaderState):
            return ()
        return tuple(key.id for key, directory_id in self._bootstrap_voters(state)
                     if directory_id is None)

    def voter_set_at(self, offset: int) -> VoterSet:
        """The voter set in force at ``offset`` (what a snapshot ending after it carries)."""
        return self._voters.at(offset)

    @property
    def pending_voter_change(self) -> tuple[VoterChangeKind, ReplicaKey] | None:
        change = self._voter_changes.pending
        return None if change is None else (change.kind, change.key)

    def status(self, now_ms: int) -> NodeStatus:
        """This replica's state now, in one frozen shape (``quorum_node.raft.status``); on the
        leader with its record of every replica, as ``describe_quorum`` gives it."""
        state, log = self._state, self.log
        return NodeStatus(
            as_of_ms=now_ms, node_id=self.node_id, directory_id=self.local_key.directory_id,
            cluster_id=self.cluster_id, state=self.state, epoch=state.epoch,
            leader_id=self.leader_id, voted_for=self._quorum.election_state.voted_key,
            is_voter=self._voters.is_voter,
            high_watermark=self._watermarks.high_watermark,
            leader_has_committed=self.leader_has_committed, voters_unheard=self.voters_unheard,
            log_start_offset=log.start_offset, log_end_offset=log.end_offset,
            log_end_epoch=log.last_fetched_epoch(), flushed_offset=self._watermarks.flushed_offset,
            voters=self._voters.voters, pending_voter_change=self.pending_voter_change,
            snapshot_id=self.snapshots.latest(), refused_snapshots=self._transfer.refused_snapshots,
            quorum=state.describe(now_ms, self.local_key, log.end_offset)
            if isinstance(state, LeaderState) else None)

    @property
    def epoch_start_offset(self) -> int | None:
        return self._state.epoch_start_offset if isinstance(self._state, LeaderState) else None

    @property
    def leader_has_committed(self) -> bool:
        """A leader whose LeaderChange is committed: its high watermark covers every write
        acknowledged in earlier epochs, so it can serve reads and writes."""
        return isinstance(self._state, LeaderState) and self._state.high_watermark is not None

    def take_effects(self) -> Effects:
        effects = self._outbox.take()
        if effects.flush:
            self._watermarks.flush_asked_to = self.log.end_offset
        effects.persist, effects.role_changes = self._quorum.take_outputs()
        return effects

    def next_deadline_ms(self) -> int:
        state = self._state
        times = [self._requests.next_deadline_ms(self._now_ms) or NEVER]
        if isinstance(state, UnattachedState) and state.next_discovery_ms > self._now_ms:
            times.append(state.next_discovery_ms)
        if isinstance(state, ResignedState) and self._shutting_down:
            pass  # a stopping resigned leader stays resigned: its timer means nothing
        elif isinstance(state, UnattachedState) and not self.is_voter:
            pass  # an observer never campaigns: its election timer means nothing
        elif isinstance(state, UnattachedState | ProspectiveState | CandidateState | ResignedState):
            times.append(state.election_deadline_ms)
            if isinstance(state, ProspectiveState):
                times.append(state.ask_again_ms)
        elif isinstance(state, FollowerState):
            times.append(state.deadline_ms)
        else:
            if self._voters.remote_voters:  # a lone voter has no quorum to check
                times.append(state.check_quorum_deadline_ms)
            times.append(state.accumulator.deadline_ms)
            times.append(state.deferred_flush.due_ms(self.config.leader_flush_delay_ms))
            times.extend(p.deadline_ms for p in state.parked)
            times.extend(read.deadline_ms for read in state.reads)
            if self._voter_changes.pending is not None:
                times.append(self._voter_changes.pending.deadline_ms)
            times.extend(
                max(state.voters[key].begin_quorum_due_ms(self._heartbeat_ms),
                    self._requests.ready_at_ms(key.id))
                for key in self._voters.peer_voters
                if not self._requests.has_in_flight(key.id)
            )
        return max(min(times), self._now_ms)

    # --- inputs ------------------------------------------------------------------------------

    def poll(self, now_ms: int) -> None:
        self._drive(now_ms)

    def handle_request(
        self, now_ms: int, source: int, correlation_id: int, request: RaftRequest
    ) -> None:
        self._now_ms = max(self._now_ms, now_ms)
        respond = self._outbox.respond
        match request:
            case FetchRequest():
                fetched = self._replication.handle_fetch(now_ms, source, correlation_id, request)
                if fetched is not None:  # else parked: answered when data arrives
                    respond(source, correlation_id, fetched)
            case VoteRequest():
                error, granted = self._rpcs.handle_vote(now_ms, request)
                respond(source, correlation_id, answer(
                    self._quorum, VoteResponse, error, vote_granted=granted,
                    voter_directory_id=self.local_key.directory_id))
            case BeginQuorumEpochRequest():
                error = self._rpcs.handle_begin_quorum_epoch(now_ms, request)
                respond(source, correlation_id,
                        answer(self._quorum, BeginQuorumEpochResponse, error))
            case EndQuorumEpochRequest():
                error = self._rpcs.handle_end_quorum_epoch(now_ms, request)
                respond(source, correlation_id, answer(self._quorum, EndQuorumEpochResponse, error))
            case FetchSnapshotRequest():
                chunk = self._transfer.handle_fetch_snapshot(now_ms, request)
                respond(source, correlation_id, chunk)
            case _:  # a new message type must get its handler: mypy checks this, so does this
                assert_never(request)
        self._drive(now_ms)

    def handle_response(
        self, now_ms: int, source: int, correlation_id: int, response: RaftResponse
    ) -> None:
        self._now_ms = max(self._now_ms, now_ms)
        ok = response.error_code == Errors.NONE
        if not self._requests.on_response(source, correlation_id, now_ms, ok):
            return  # not the request in flight in this state: stale or duplicated
        match response:
            case FetchResponse():
                if not self._rpcs.handle_common_response(now_ms, source, response):
                    self._follower.handle_fetch_response(now_ms, source, response)
            case VoteResponse():
                self._rpcs.handle_vote_response(now_ms, source, response)
            case BeginQuorumEpochResponse():
                self._rpcs.handle_begin_quorum_epoch_response(now_ms, source, response)
            case EndQuorumEpochResponse():
                self._rpcs.handle_end_quorum_epoch_response(now_ms, source, response)
            case FetchSnapshotResponse():
                if not self._rpcs.handle_common_response(now_ms, source, response):
                    self._transfer.handle_fetch_snapshot_response(now_ms, source, response)
            case _:
                assert_never(response)
        self._drive(now_ms)

    def handle_request_failure(self, now_ms: int, destination: int, correlation_id: int,
                               failure: RequestFailure = RequestFailure.UNANSWERED) -> None:
        """The request got no answer (``failure`` says why): back off, or retry at once after a
        closed connection. A closed connection or a refusal may tell that the leader is gone
        (``follower.py``)."""
        self._now_ms = max(self._now_ms, now_ms)
        if self._requests.on_failure(destination, correlation_id, now_ms, failure):
            if failure is RequestFailure.REFUSED:
                self._quorum.peer_refused(now_ms, destination)
            elif failure is RequestFailure.CLOSED:
                self._quorum.peer_closed(destination)
        self._drive(now_ms)

    def handle_flushed(self, now_ms: int, flushed_offset: int) -> None:
        """The log is durable up to ``flushed_offset`` (the end offset the flush covered)."""
        self._now_ms = max(self._now_ms, now_ms)
        marks = self._watermarks
        marks.flushed_offset = max(marks.flushed_offset, min(flushed_offset, self.log.end_offset))
        if isinstance(self._state, LeaderState):
            self._replication.advance_high_watermark(now_ms)
        self._drive(now_ms)

    def propose(self, now_ms: int, records: Sequence[Record]) -> tuple[int, int]:
        """Accept records for appending (after the linger); return their (first, last) offsets.

        The offsets are committed once the high watermark passes them in this epoch."""
        self._now_ms = max(self._now_ms, now_ms)
        offsets = self._accept(now_ms, records)
        self._drive(now_ms)
        return offsets

    def propose_each(self, now_ms: int, proposals: Sequence[Sequence[Record]]
                     ) -> list[tuple[int, int] | Exception]:
        """``propose`` for several callers' records in one step, in order: each gets its
        (first, last) offsets, or the refusal ``propose`` would raise to it (NotLeaderError,
        ValueError, LogFullError) while the others go on. Many clients' writes arriving together
        cost the leader one step, not one each."""
        self._now_ms = max(self._now_ms, now_ms)
        outcomes: list[tuple[int, int] | Exception] = []
        for records in proposals:
            try:
                outcomes.append(self._accept(now_ms, records))
            except (NotLeaderError, ValueError, LogFullError) as refusal:
                outcomes.append(refusal)
        self._drive(now_ms)
        return outcomes

    def _accept(self, now_ms: int, records: Sequence[Record]) -> tuple[int, int]:
        """Hold records in the accumulator (``propose`` without the step that follows)."""
        state = self._state
        if not isinstance(state, LeaderState) or self._shutting_down:
            raise NotLeaderError(self.leader_id, self.epoch)
        if self._reconfigurable and not self.bootstrapped:
            raise LeaderNotReadyError(self.leader_id, self.epoch)
        if not records:
            raise ValueError("nothing to append")
        size = sum(record_size(r) for r in records)
        if size > self.config.max_batch_bytes:
            raise ValueError(f"{size} bytes of records exceed one batch "
                             f"({self.config.max_batch_bytes} bytes)")
        accumulator = state.accumulator
        if accumulator.overflows(size, self.config.max_batch_bytes) \
                and not self._replication.append_pending(now_ms, state):
            raise LogFullError("the log is full: records already wait for space")
        base = self.log.end_offset + len(accumulator.records)
        accumulator.add(records, size, now_ms, self.config.append_linger_ms)
        return base, base + len(records) - 1

    def begin_shutdown(self, now_ms: int) -> None:
        """Graceful shutdown: a leader resigns at once and asks the voters to elect a successor."""
        self._now_ms = max(self._now_ms, now_ms)
        self._shutting_down = True
        if isinstance(self._state, LeaderState):
            self._quorum.to_resigned(now_ms, TransitionCause.SHUTDOWN)
        self._drive(now_ms)

    def begin_read(self, now_ms: int, timeout_ms: int) -> ReadBarrier | None:
        """Start a linearizable read on the leader: a ``ReadOutcome`` effect for the barrier's id
        settles it (confirmed, abandoned with the leadership, or timed out after
        ``timeout_ms``). None while the leader has no high watermark yet (its LeaderChange is
        not committed): retry shortly. Raises NotLeaderError elsewhere."""
        self._now_ms = max(self._now_ms, now_ms)
        state = self._state
        if not isinstance(state, LeaderState) or self._shutting_down:
            raise NotLeaderError(self.leader_id, self.epoch)
        barrier = self._reads.begin(now_ms, state, timeout_ms)
        if barrier is None:
            return None
        self._drive(now_ms)  # a lone voter confirms it at once
        return barrier

    def describe_quorum(self, now_ms: int) -> QuorumDescription:
        """DescribeQuorum: the leader's record of every replica. Raises NotLeaderError elsewhere."""
        state = self._state
        if not isinstance(state, LeaderState):
            raise NotLeaderError(self.leader_id, self.epoch)
        return state.describe(now_ms, self.local_key, self.log.end_offset)

    def add_voter(self, now_ms: int, key: ReplicaKey, timeout_ms: int) -> int:
        """KIP-856 AddVoter: make the observer ``key`` a voter. Returns a ticket, which a
        ``VoterChangeDone`` effect settles; raises NotLeaderError on a non-leader and
        VoterChangeError for a request refused at once. The change is appended once the
        observer has caught up, no other voter change is uncommitted and this leader's
        LeaderChange is committed; it succeeds once committed by a majority of the new voter
        set."""
        state = self._voter_changing_leader(now_ms)
        ticket = self._voter_changes.add(now_ms, state, self._voters.voters, key, timeout_ms)
        self._drive(now_ms)
        return ticket

    def remove_voter(self, now_ms: int, key: ReplicaKey, timeout_ms: int, *,
                     decommission: bool = False) -> int:
        """KIP-856 RemoveVoter: drop the voter ``key``. Same contract as ``add_voter``. A leader
        that removes itself leads on (not counting itself) until the change commits, then
        resigns.

        KIP-856 only removes a replaced directory: removing a node id's last directory is
        refused, so a slip in a disk replacement (removing the old directory before adding the
        new one) cannot shrink the quorum. ``decommission`` is the explicit opt-in to remove the
        id itself (scaling down), as KIP-853's RemoveRaftVoter allows; the last voter stays."""
        self._voter_changing_leader(now_ms)
        ticket = self._voter_changes.remove(now_ms, self._voters.voters, key, timeout_ms,
                                            decommission=decommission)
        self._drive(now_ms)
        return ticket

    def _voter_changing_leader(self, now_ms: int) -> LeaderState:
        """The leader's state, to change the voters in; refused elsewhere, or in a static
        quorum."""
        self._now_ms = max(self._now_ms, now_ms)
        state = self._state
        if not isinstance(state, LeaderState) or self._shutting_down:
            raise NotLeaderError(self.leader_id, self.epoch)
        if not self._reconfigurable:
            raise VoterChangeError(Errors.UNSUPPORTED_VERSION,
                                   "this quorum is static: its replicas have no directory ids")
        return state

    def _advance_voter_change(self, now_ms: int, state: LeaderState) -> None:
        """Carry out the handler's step for the change in progress."""
        step = self._voter_changes.advance(now_ms, state, self._voters.voters,
                                           bootstrapped=self.bootstrapped,
                                           latest_voters_offset=self._voters.latest_offset())
        if step.done is not None:
            self._outbox.effects.voter_changes.append(step.done)
        if step.resign:
            logger.info("node %d: removed from the voters; resigning", self.node_id)
            self._quorum.to_resigned(now_ms, TransitionCause.REMOVED)
        elif step.append is not None:
            self._voter_changes.appended(
                self._replication.append_control(now_ms, state, [voters_record(step.append)]))

    # --- the state machine's clock -----------------------------------------------------------

    def _drive(self, now_ms: int) -> None:
        """Run timers and send what the current state wants to send. Loops while the state
        changes, so that a lone voter goes Unattached -> Prospective -> Candidate -> Leader in one
        call."""
        self._now_ms = max(self._now_ms, now_ms)
        now_ms = self._now_ms
        self._requests.expire(now_ms)
        for _ in range(8):
            before = self._state
            state = self._state
            match state:
                case LeaderState():
                    self._poll_leader(now_ms, state)
                case CandidateState():
                    self._poll_candidate(now_ms, state)
                case ProspectiveState():
                    self._poll_prospective(now_ms, state)
                case FollowerState():
                    self._poll_follower(now_ms, state)
                case ResignedState():
                    self._poll_resigned(now_ms, state)
                case UnattachedState():
                    self._poll_unattached(now_ms, state)
                case _:  # a new state must get its poll: mypy checks this
                    assert_never(state)
            if self._state is before:
                return

    def _poll_leader(self, now_ms: int, state: LeaderState) -> None:
        if self._shutting_down:
            # Elected while shutting down (a nominee keeps campaigning): hand over at once.
            self._quorum.to_resigned(now_ms, TransitionCause.SHUTDOWN)
            return
        remote_voters = self._voters.remote_voters
        if remote_voters and now_ms >= state.check_quorum_deadline_ms:
            logger.warning(
                "node %d: no fetch from a majority of voters in %d ms; resigning epoch %d",
                self.node_id, self.config.check_quorum_timeout_ms, state.epoch,
            )
            self._quorum.to_resigned(now_ms, TransitionCause.CHECK_QUORUM)
            return
        self._replication.flush_deferred(now_ms, state)
        # Group commit: records wait while an fsync runs, and go out together after it.
        marks = self._watermarks
        disk_idle = not self._outbox.effects.flush \
            and marks.flushed_offset >= min(marks.flush_asked_to, self.log.end_offset)
        if state.accumulator.is_due(now_ms, self.config.max_batch_bytes, disk_idle=disk_idle):
            self._replication.append_pending(now_ms, state)
        if self._reconfigurable and not self.bootstrapped:
            self._maybe_write_bootstrap_voters(now_ms, state)
        if self._voter_changes.pending is not None:
            self._advance_voter_change(now_ms, state)
            if self._state is not state:
                return  # it removed this leader, which resigned
        self._replication.expire_parked_fetches(now_ms, state)
        self._reads.settle(now_ms, state)
        # Re-read: the steps above may change the voters.
        self._rpcs.send_begin_quorum_epochs(now_ms, state, self._voters.peer_voters)

    def _maybe_write_bootstrap_voters(self, now_ms: int, state: LeaderState) -> None:
        """KIP-856 bootstrapping: once the leader knows every configured voter's directory id
        (from their fetches), it writes them, in one batch of their own, before any client
        record. From then on the log defines the voter set."""
        keys = []
        for key, directory_id in self._bootstrap_voters(state):
            if directory_id is None:
                return
            keys.append(ReplicaKey(key.id, directory_id))
        self._replication.append_control(now_ms, state, [voters_record(keys)])

    def _bootstrap_voters(self, state: LeaderState) -> list[tuple[ReplicaKey, uuid.UUID | None]]:
        """Each configured voter and its directory id as this leader knows it (its own, or what
        the voter reported in its fetches); None while it has not fetched."""
        return [(key, key.directory_id or (
                    self.local_key.directory_id if key.matches(self.local_key)
                    else progress.directory_id))
                for key, progress in state.voters.items()]

    def _poll_candidate(self, now_ms: int, state: CandidateState) -> None:
        if state.election.is_granted:
            self._become_leader(now_ms)
        elif now_ms >= state.election_deadline_ms:
            # KAFKA-18345: a candidate that did not win waits out its randomized timer, then
            # starts over with a pre-vote instead of bumping the epoch again.
            self._quorum.to_prospective(now_ms, TransitionCause.ELECTION_TIMEOUT)
        else:
            self._rpcs.request_votes(now_ms, state.election, state.epoch, pre_vote=False)

    def _poll_prospective(self, now_ms: int, state: ProspectiveState) -> None:
        if state.election.is_granted and not state.yielded \
                and not self._rpcs.epoch_exhausted(now_ms, state.epoch):
            self._quorum.to_candidate(now_ms, TransitionCause.PRE_VOTE_GRANTED)
        elif state.election.is_rejected or now_ms >= state.election_deadline_ms:
            self._lose_pre_vote(now_ms, state)
        else:
            state.ask_again_if_due(now_ms, self.config.election_timeout_ms // 4)
            self._rpcs.request_votes(now_ms, state.election, state.epoch, pre_vote=True)

    def _lose_pre_vote(self, now_ms: int, state: ProspectiveState) -> None:
        if state.leader_id is not None and state.leader_id != self.node_id:
            self._quorum.to_follower(now_ms, state.epoch, state.leader_id,
                                     TransitionCause.PRE_VOTE_LOST)
        else:
            self._quorum.to_unattached_in_epoch(self._quorum.election_deadline(now_ms),
                                                TransitionCause.PRE_VOTE_LOST)

    def _poll_follower(self, now_ms: int, state: FollowerState) -> None:
        if now_ms >= state.deadline_ms or self._voters.is_only_voter:
            cause = (TransitionCause.LONE_VOTER if self._voters.is_only_voter
                     else TransitionCause.LEADER_RESIGNED if state.leader_resigned
                     else TransitionCause.LEADER_GONE if state.leader_gone
                     else TransitionCause.FETCH_TIMEOUT)
            if self.is_voter:
                self._quorum.to_prospective(now_ms, cause)
                return
            # An observer cannot campaign: it looks for the leader through the other voters.
            self._quorum.to_unattached_in_epoch(NEVER, cause)
            return
        self._follower.maybe_send_fetch(now_ms, state.leader_id)

    def _poll_unattached(self, now_ms: int, state: UnattachedState) -> None:
        lone = self._voters.is_only_voter
        if self.is_voter and (now_ms >= state.election_deadline_ms or lone):
            self._quorum.to_prospective(now_ms, TransitionCause.LONE_VOTER if lone
                                        else TransitionCause.ELECTION_TIMEOUT)
            return
        # KAFKA-17030: while waiting, fetch from a voter now and then to discover the leader.
        # By id, not key: a replica whose disk was replaced shares its id with a voter.
        others = [key.id for key in self._voters.voters if key.id != self.node_id]
        if others and now_ms >= state.next_discovery_ms and not self._requests.any_in_flight():
            target = others[self._random.randrange(len(others))]
            if self._follower.maybe_send_fetch(now_ms, target):
                state.next_discovery_ms = now_ms + self.config.fetch_max_wait_ms

    def _poll_resigned(self, now_ms: int, state: ResignedState) -> None:
        expired = now_ms >= state.election_deadline_ms or self._voters.is_only_voter
        if expired and not self._shutting_down and self._rpcs.epoch_exhausted(now_ms, state.epoch):
            state.election_deadline_ms = self._quorum.election_deadline(now_ms)
        elif expired and not self._shutting_down:
            # Leave the epoch we led for good: the next one can be led by anyone, us included.
            self._quorum.to_unattached(now_ms, state.epoch + 1,
                                       TransitionCause.LONE_VOTER if self._voters.is_only_voter
                                       else TransitionCause.ELECTION_TIMEOUT)
            return
        self._rpcs.send_end_quorum_epochs(now_ms, state)

    # --- transitions -------------------------------------------------------------------------

    def _voters_changed(self) -> None:
        """A room appended, truncated or loaded another voter set (``VoterHistory`` adopted it)."""
        self._quorum.voters_changed(self._now_ms)

    def _leave_state(self, old: ReplicaState) -> None:
        """What leaving ``old`` involves beyond the state (``QuorumState`` calls it once the new
        state is in)."""
        if isinstance(old, LeaderState):
            self._leave_leadership(old)
        elif isinstance(old, FollowerState):
            old.abort_download()
        # Responses are matched to the state that sent the request (KRaft resets connections).
        self._requests.reset()

    def _become_leader(self, now_ms: int) -> None:
        candidate = self._state
        assert isinstance(candidate, CandidateState)
        leader = self._quorum.to_leader(now_ms, self.log.end_offset)
        logger.info("node %d: elected leader of epoch %d", self.node_id, leader.epoch)
        change = LeaderChangeMessage(
            leader_id=self.node_id,
            voters=tuple(ReplicaInfo.of(k) for k in self._voters.voters),
            granting_voters=tuple(ReplicaInfo.of(k) for k in candidate.election.granting()),
        )
        payload = change.model_dump_json(by_alias=True).encode()
        try:
            self.log.append_as_leader(
                [control_record(ControlRecordType.LEADER_CHANGE, payload)], leader.epoch,
                now_ms, is_control=True,
            )
        except LogFullError as error:
            # A leader that cannot write its epoch's first record could commit nothing: it
            # hands the epoch on at once (EndQuorumEpoch) rather than stop the node.
            logger.warning("node %d: resigning the leadership of epoch %d at once: %s",
                           self.node_id, leader.epoch, error)
            self._quorum.to_resigned(now_ms, TransitionCause.LOG_FULL)
            return
        self._outbox.effects.flush = True

    def _leave_leadership(self, leader: LeaderState) -> None:
        abandoned = self._voter_changes.abandon(leader.epoch)
        if abandoned is not None:
            self._outbox.effects.voter_changes.append(abandoned)
        leader.accumulator.records.clear()
        self._reads.abandon(leader, self.leader_id, self.epoch)
        self._replication.release_parked(leader)
        if self._watermarks.flushed_offset < self.log.end_offset:
            # Appends left unflushed while followers committed them: a follower fetches from
            # the end of a durable log.
            self._outbox.effects.flush = True
