"""The leader's side of replication (KIP-595 pull replication): serving Fetch, the high watermark.

A follower's Fetch is answered with records, with the epoch and offset its log diverges at (the
follower truncates towards it), or, when the log it needs is gone, with the snapshot to fetch
instead (KIP-630). A fetch with nothing to return is parked until records are appended, the
high watermark moves on, or its wait ends. Each fetch is the follower's acknowledgement of its
durable log: the high watermark is the offset a majority of voters holds, raised only past this
epoch's LeaderChange (Raft commits an entry of its own term).

``LeaderReplication`` is given what it reads and writes (the log, the snapshots, the quorum
state, this replica's watermarks, the outbox its answers go into); ``RaftCore`` hands it each
Fetch and calls it when the local log is flushed or the leader's pending records are due.
As in Kafka's ``LeaderState``, the per-replica bookkeeping is ``LeaderState``'s own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from quorum_node.raft.config import QuorumConfig
from quorum_node.raft.leader import LeaderState, ParkedFetch, ReplicaProgress
from quorum_node.raft.log import LogFullError, RaftLog
from quorum_node.raft.messages import (
    EpochEndOffset,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    SnapshotIdField,
)
from quorum_node.raft.outbox import Outbox, WarningLimiter, answer
from quorum_node.raft.quorum_state import QuorumState
from quorum_node.raft.records import Record
from quorum_node.raft.snapshots import SnapshotId, SnapshotStore
from quorum_node.raft.types import Errors, ReplicaKey
from quorum_node.raft.voter_change import VoterChangeHandler
from quorum_node.raft.voter_history import VoterHistory
from quorum_node.raft.watermarks import Watermarks

# How soon a leader whose log was full tries its pending records again.
FULL_LOG_RETRY_MS = 100


class LeaderReplication:
    """Serves the followers' fetches while this replica leads. ``fetcher_ids``: the replica ids
    that may fetch (the configured voter ids and the observers); ``voter_changes``: an AddVoter
    in progress protects its observer from eviction; ``voters_changed``: how it tells
    ``RaftCore`` that a VotersRecord it appended changed the voter set."""

    def __init__(self, *, local_key: ReplicaKey, cluster_id: str, config: QuorumConfig,
                 log: RaftLog, snapshots: SnapshotStore, quorum: QuorumState,
                 voters: VoterHistory, voter_changes: VoterChangeHandler,
                 fetcher_ids: frozenset[int], watermarks: Watermarks, outbox: Outbox,
                 warnings: WarningLimiter, voters_changed: Callable[[], None]) -> None:
        self._local_key = local_key
        self._cluster_id = cluster_id
        self._config = config
        self._log = log
        self._snapshots = snapshots
        self._quorum = quorum
        self._voters = voters
        self._voter_changes = voter_changes
        self._fetcher_ids = fetcher_ids
        self._watermarks = watermarks
        self._outbox = outbox
        self._warnings = warnings
        self._voters_changed = voters_changed

    def _cluster_ok(self, cluster_id: str | None) -> bool:
        return cluster_id is None or cluster_id == self._cluster_id

    def serving(
        self, now_ms: int, request: FetchRequest | FetchSnapshotRequest, *, malformed: bool
    ) -> LeaderState | Errors:
        """The leader's state, to serve a Fetch or FetchSnapshot with; or why it is refused
        (``malformed``: the request's own fields are inconsistent). Checked before the leader
        records anything of the fetcher: a refusal changes nothing, and tells any replica where
        the leader is."""
        if not self._cluster_ok(request.cluster_id):
            return Errors.INCONSISTENT_CLUSTER_ID
        if malformed or request.replica_id < 0 or request.max_bytes <= 0:
            return Errors.INVALID_REQUEST
        if request.current_leader_epoch < self._quorum.epoch:
            return Errors.FENCED_LEADER_EPOCH
        if request.current_leader_epoch > self._quorum.epoch:
            return Errors.UNKNOWN_LEADER_EPOCH
        state = self._quorum.state
        if not isinstance(state, LeaderState):
            return Errors.NOT_LEADER_OR_FOLLOWER
        if request.replica_id not in self._fetcher_ids:
            self._warnings.warn(now_ms, "unknown-fetcher",
                                "node %d: refused a fetch from replica %d: not an id of "
                                "controller.quorum.voters", self._local_key.id, request.replica_id)
            return Errors.INCONSISTENT_VOTER_SET
        return state

    def fetch_response(self, error: Errors, **fields: Any) -> FetchResponse:
        return answer(self._quorum, FetchResponse, error, log_start_offset=self._log.start_offset,
                      **fields)

    def handle_fetch(
        self, now_ms: int, source: int, correlation_id: int, request: FetchRequest
    ) -> FetchResponse | None:
        state = self.serving(now_ms, request, malformed=(
            request.max_wait_ms < 0 or request.fetch_offset < 0 or request.last_fetch_epoch < 0
            or request.last_fetch_epoch > request.current_leader_epoch))
        if isinstance(state, Errors):
            return self.fetch_response(state)

        replica = ReplicaKey(request.replica_id, request.replica_directory_id)
        snapshot = self.snapshot_needed(request.fetch_offset, request.last_fetch_epoch)
        if snapshot is not None:
            self.note_contact(now_ms, state, replica)
            return self.leader_fetch_response(
                state, snapshot_id=SnapshotIdField(end_offset=snapshot.end_offset,
                                                   epoch=snapshot.epoch))
        diverging = self.validate_fetch_position(request.fetch_offset, request.last_fetch_epoch)
        if diverging is not None:
            return self.leader_fetch_response(state, diverging_epoch=diverging)

        progress = self.record_fetch(now_ms, state, replica, request)
        self.advance_high_watermark(now_ms)
        response = self.valid_fetch_response(state, request)
        newer_hwm = state.high_watermark is not None and (
            request.high_watermark is None or state.high_watermark > request.high_watermark)
        linger = self._config.high_watermark_linger_ms
        # A read waits for an echo this fetch does not carry: the answer names the barrier, and
        # the fetch that follows it confirms the read.
        unechoed = request.read_barrier < state.awaits_echo
        if response.records or request.max_wait_ms == 0 or (newer_hwm and linger == 0) \
                or unechoed:
            return response
        wait = min(request.max_wait_ms, self._config.long_poll_ms)
        if newer_hwm:
            wait = min(wait, linger)  # the new high watermark goes out with records, or soon
        state.parked.append(ParkedFetch(source, correlation_id, request, now_ms + wait, progress))
        return None

    def snapshot_needed(self, offset: int, last_epoch: int) -> SnapshotId | None:
        """KIP-630: the snapshot to send instead of records when the log the follower needs is
        gone: its offset is below the log start, or its last epoch is older than every epoch
        the log still holds."""
        if self._log.start_offset == 0:
            return None
        latest = self._snapshots.latest()
        if latest is None:
            return None
        if offset < self._log.start_offset or self._log.end_offset_for_epoch(last_epoch).epoch == 0:
            return latest
        return None

    def validate_fetch_position(self, offset: int, last_epoch: int) -> EpochEndOffset | None:
        """None if (offset, last fetched epoch) is consistent with the leader's log; otherwise the
        epoch and end offset the follower should truncate towards."""
        if offset == 0 and self._log.start_offset == 0:
            return None
        end = self._log.end_offset_for_epoch(last_epoch)
        if end.epoch != last_epoch or end.offset < offset:
            return EpochEndOffset(epoch=end.epoch, end_offset=end.offset)
        return None

    def valid_fetch_response(self, state: LeaderState, request: FetchRequest) -> FetchResponse:
        max_bytes = min(request.max_bytes, self._config.fetch_max_bytes)
        return self.leader_fetch_response(
            state, records=self._log.read(request.fetch_offset, max_bytes))

    def leader_fetch_response(self, state: LeaderState, **fields: Any) -> FetchResponse:
        """An answer to a valid fetch: with the high watermark and the newest read barrier,
        which the follower's next fetch echoes (``LinearizableReads``)."""
        return self.fetch_response(Errors.NONE, high_watermark=state.high_watermark,
                                   read_barrier=state.newest_read_barrier, **fields)

    def note_contact(self, now_ms: int, state: LeaderState,
                     replica: ReplicaKey) -> ReplicaProgress:
        return state.note_contact(now_ms, replica, local_key=self._local_key,
                                  counts_itself=self._voters.is_voter,
                                  check_quorum_timeout_ms=self._config.check_quorum_timeout_ms,
                                  protected=self._voter_changes.adding)

    def record_fetch(self, now_ms: int, state: LeaderState, replica: ReplicaKey,
                     request: FetchRequest) -> ReplicaProgress:
        progress = self.note_contact(now_ms, state, replica)
        state.record_fetch(now_ms, progress, replica, request.fetch_offset, self._log.end_offset,
                           read_barrier=request.read_barrier)
        return progress

    def advance_high_watermark(self, now_ms: int) -> bool:
        """Raise the leader's high watermark to the offset a majority of voters holds, but only
        past this epoch's LeaderChange record (Raft: commit an entry of the current term), and
        never downwards. Returns True if it moved."""
        state = self._quorum.state
        if not isinstance(state, LeaderState):
            return False
        majority_end = state.majority_end(self._local_key, self._watermarks.flushed_offset)
        if majority_end <= state.epoch_start_offset:
            return False
        if state.high_watermark is not None and majority_end <= state.high_watermark:
            return False
        state.high_watermark = majority_end
        self._watermarks.advance_high_watermark(majority_end)
        state.deferred_flush.committed(majority_end)
        linger = self._config.high_watermark_linger_ms
        if linger == 0:
            self.complete_parked_fetches(state, lambda parked: True)
        else:
            # Parked fetches learn the new high watermark with the next records, or at the
            # latest after the linger.
            for parked in state.parked:
                parked.deadline_ms = min(parked.deadline_ms, now_ms + linger)
        return True

    def append_pending(self, now_ms: int, state: LeaderState) -> bool:
        """Append the pending records as one batch; False when the log is full, with the records
        still pending (their proposals keep their offsets) and a retry after a back-off."""
        accumulator = state.accumulator
        try:
            self._log.append_as_leader(accumulator.records, state.epoch, now_ms)
        except LogFullError as error:
            self._warnings.warn(now_ms, "log-full", "node %d: %d records wait for space: %s",
                                self._local_key.id, len(accumulator.records), error)
            accumulator.deadline_ms = now_ms + FULL_LOG_RETRY_MS
            return False
        lone = len(accumulator.records) == 1
        accumulator.appended()
        end = self._log.end_offset
        if lone and self._send_lone_write_to_fewest(now_ms, state, end):
            return True
        self._flush_or_defer(now_ms, state, lone=lone)  # before the parked fetches are answered
        self.complete_parked_fetches(state, lambda parked: parked.request.fetch_offset < end)
        return True

    def _send_lone_write_to_fewest(self, now_ms: int, state: LeaderState, end: int) -> bool:
        """Send a lone write (a batch of one record, ending at ``end``) at once to only as many
        of the voters parked here as commit it with the leader's own flush, the longest parked
        first; the other parked voters get it with the next records, or within
        ``leader_flush_delay_ms``. On a machine with few cores, every follower's work at once
        slows the one the commit waits for, and the followers take turns. False, doing
        nothing, when no more voters are parked than that, when the delay is 0 (Kafka answers
        every parked Fetch), or when the leader is no voter."""
        delay = self._config.leader_flush_delay_ms
        if not delay:
            return False
        others = {id(progress) for progress in self._other_voters(state)}
        if len(others) == len(state.voters):
            return False  # a leader removing itself: its flush counts for nothing
        needed = len(state.voters) // 2  # a majority, with the leader
        behind = [parked for parked in state.parked
                  if parked.request.fetch_offset < end and id(parked.progress) in others]
        if len(behind) <= needed:
            return False
        self._flush_leader_log(state)
        later = {id(parked) for parked in behind[needed:]}
        for parked in behind[needed:]:
            parked.deadline_ms = min(parked.deadline_ms, now_ms + delay)
        self.complete_parked_fetches(state, lambda parked: parked.request.fetch_offset < end
                                     and id(parked) not in later)
        return True

    # --- the leader's own flush --------------------------------------------------------------

    def _flush_or_defer(self, now_ms: int, state: LeaderState, *, lone: bool) -> None:
        """Flush the records just appended, or, for a ``lone`` write, leave them unflushed while
        the voters fetching from this leader are a majority without it: they commit the record,
        and the leader's fsync is off the commit's path (``QuorumConfig.leader_flush_delay_ms``).
        A batch of several records is a leader under load: its fsync runs beside the loop while
        the next batch gathers (group commit), and batches stay large."""
        if lone and self._config.leader_flush_delay_ms \
                and self._followers_commit_alone(now_ms, state):
            state.deferred_flush.note(self._log.end_offset, now_ms)
        else:
            self._flush_leader_log(state)

    def flush_deferred(self, now_ms: int, state: LeaderState) -> None:
        """Flush the deferred appends once they are due (``DeferredFlush.due_ms``)."""
        if now_ms >= state.deferred_flush.due_ms(self._config.leader_flush_delay_ms):
            self._flush_leader_log(state)

    def _flush_leader_log(self, state: LeaderState) -> None:
        self._outbox.effects.flush = True
        state.deferred_flush.clear()  # the flush covers every append made before it

    def _followers_commit_alone(self, now_ms: int, state: LeaderState) -> bool:
        """Whether the voters other than this replica that fetch from it (a fetch parked here,
        or one within the flush delay) are a majority of the voters."""
        recent = now_ms - self._config.leader_flush_delay_ms
        parked = {id(fetch.progress) for fetch in state.parked}
        fetching = sum(
            1 for progress in self._other_voters(state)
            if id(progress) in parked
            or (progress.last_fetch_ms is not None and progress.last_fetch_ms >= recent))
        return fetching > len(state.voters) // 2

    def _other_voters(self, state: LeaderState) -> list[ReplicaProgress]:
        """The progress of each voter but this replica."""
        return [progress for key, progress in state.voters.items()
                if not key.matches(self._local_key)]

    def append_control(self, now_ms: int, state: LeaderState,
                       records: Sequence[Record]) -> int | None:
        """Append a control batch after whatever client records are pending; its base offset,
        or None while the log's disk is full (nothing appended: the caller tries again at a
        later poll, as pending records are)."""
        # Proposals keep the offsets they were given: the control batch only ever follows them.
        if state.accumulator.records and not self.append_pending(now_ms, state):
            return None
        try:
            batch = self._log.append_as_leader(records, state.epoch, now_ms, is_control=True)
        except LogFullError as error:
            self._warnings.warn(now_ms, "log-full", "node %d: a control record waits for "
                                "space: %s", self._local_key.id, error)
            return None
        self._flush_leader_log(state)
        if self._voters.appended([batch]):
            self._voters_changed()
        end = self._log.end_offset
        self.complete_parked_fetches(state, lambda parked: parked.request.fetch_offset < end)
        return batch.base_offset

    def expire_parked_fetches(self, now_ms: int, state: LeaderState) -> None:
        self.complete_parked_fetches(state, lambda parked: parked.deadline_ms <= now_ms)

    def complete_parked_fetches(
        self, state: LeaderState, done: Callable[[ParkedFetch], bool]
    ) -> None:
        keep: list[ParkedFetch] = []
        for parked in state.parked:
            if done(parked):
                self._outbox.respond(parked.source, parked.correlation_id,
                                     self.valid_fetch_response(state, parked.request))
            else:
                keep.append(parked)
        state.parked = keep

    def release_parked(self, leader: LeaderState) -> None:
        """The leadership is lost: every parked fetch is answered, to look for the new leader."""
        for parked in leader.parked:
            self._outbox.respond(parked.source, parked.correlation_id,
                                 self.fetch_response(Errors.NOT_LEADER_OR_FOLLOWER))
        leader.parked.clear()
