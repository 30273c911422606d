"""The follower's side of replication (KIP-595): fetching from the leader and taking its answer.

One fetch at a time, sent only once the log is flushed: its offset is the follower's
acknowledgement of durable data. An answer is validated whole before anything changes (records
that chain onto the log, a divergence above what is committed, a high watermark that never goes
back); then the follower appends, truncates, or begins a snapshot download
(``snapshot_transfer.py``), and learns the leader's high watermark. A response wrong in any part
is dropped and backed off from without resetting the fetch timer, so a leader that keeps
answering nonsense is in the end replaced by an election.

``FollowerFetcher`` is given what it reads and writes (the log, the quorum state, the voter
history, this replica's watermarks, the outbox); ``voters_changed`` is how it tells ``RaftCore``
that an appended or truncated VotersRecord changed the voter set.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from quorum_node.raft.config import QuorumConfig
from quorum_node.raft.follower import (
    FollowerState,
    diverging_point,
    fetch_response_problem,
    validated_batches,
)
from quorum_node.raft.log import LogFullError, RaftLog
from quorum_node.raft.messages import (
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    SnapshotIdField,
)
from quorum_node.raft.outbox import Outbox
from quorum_node.raft.quorum_state import QuorumState
from quorum_node.raft.records import RecordBatch
from quorum_node.raft.requests import RequestManager
from quorum_node.raft.snapshot_transfer import SnapshotTransfer
from quorum_node.raft.snapshots import SnapshotId, SnapshotStore
from quorum_node.raft.types import Errors, RaftInvariantError, ReplicaKey
from quorum_node.raft.voter_history import VoterHistory
from quorum_node.raft.watermarks import Watermarks


class FollowerFetcher:
    """Fetches from the leader (or, unattached, from a voter, to discover the leader) and
    applies the answer."""

    def __init__(self, *, local_key: ReplicaKey, cluster_id: str, config: QuorumConfig,
                 log: RaftLog, snapshots: SnapshotStore, quorum: QuorumState,
                 voters: VoterHistory, transfer: SnapshotTransfer, watermarks: Watermarks,
                 requests: RequestManager, outbox: Outbox,
                 voters_changed: Callable[[], None]) -> None:
        self._local_key = local_key
        self._cluster_id = cluster_id
        self._config = config
        self._log = log
        self._snapshots = snapshots
        self._quorum = quorum
        self._voters = voters
        self._static_ids = voters.static_ids
        self._transfer = transfer
        self._watermarks = watermarks
        self._requests = requests
        self._outbox = outbox
        self._voters_changed = voters_changed

    def committed_end(self) -> int | None:
        """What this replica knows is committed, the floor below which no leader's word may
        truncate its log: its high watermark, or, before it has learned one (after a restart:
        the high watermark is not persisted, as in Kafka), its latest snapshot's end, since a
        snapshot only ever holds committed records."""
        latest = self._snapshots.latest()
        if latest is None:
            return self._watermarks.high_watermark
        return max(self._watermarks.high_watermark or 0, latest.end_offset)

    def maybe_send_fetch(self, now_ms: int, target: int) -> bool:
        # One fetch at a time, and only once the log is flushed: the fetch offset is the
        # follower's acknowledgement of durable data.
        if self._requests.any_in_flight() or not self._requests.is_ready(target, now_ms):
            return False
        if self._watermarks.flushed_offset < self._log.end_offset:
            return False
        state = self._quorum.state
        if isinstance(state, FollowerState) and state.download is not None:
            download = state.download
            self._outbox.send(now_ms, target, FetchSnapshotRequest(
                cluster_id=self._cluster_id, replica_id=self._local_key.id,
                replica_directory_id=self._local_key.directory_id,
                max_bytes=self._config.fetch_max_bytes, current_leader_epoch=self._quorum.epoch,
                snapshot_id=SnapshotIdField(end_offset=download.snapshot_id.end_offset,
                                            epoch=download.snapshot_id.epoch),
                position=download.written,
            ))
            return True
        self._outbox.send(now_ms, target, FetchRequest(
            cluster_id=self._cluster_id, replica_id=self._local_key.id,
            replica_directory_id=self._local_key.directory_id,
            max_wait_ms=self._config.long_poll_ms, current_leader_epoch=self._quorum.epoch,
            fetch_offset=self._log.end_offset, last_fetch_epoch=self._log.last_fetched_epoch(),
            high_watermark=self._watermarks.high_watermark, max_bytes=self._config.fetch_max_bytes,
            read_barrier=state.read_barrier if isinstance(state, FollowerState) else 0,
        ))
        return True

    def handle_fetch_response(self, now_ms: int, source: int, response: FetchResponse) -> None:
        state = self._quorum.state
        if (response.error_code != Errors.NONE or not isinstance(state, FollowerState)
                or state.leader_id != source or response.leader_epoch != state.epoch):
            return
        # Everything is validated before anything changes: a response that is wrong in any part
        # is dropped whole, logged and backed off from. The fetch timer is not reset, so a
        # leader that keeps answering nonsense is in the end replaced by an election.
        committed = self.committed_end()
        problem = fetch_response_problem(response, committed)
        batches: list[RecordBatch] = []
        if problem is None and response.records and response.snapshot_id is None \
                and response.diverging_epoch is None:
            batches, problem = validated_batches(response, self._log, self._static_ids)
        point: int | None = None
        if problem is None and response.diverging_epoch is not None:
            point = diverging_point(self._log, response.diverging_epoch)
            if committed is not None and point < committed:
                problem = (f"it asks to truncate to {point}, below the committed offset "
                           f"{committed}: committed data would be lost")
        if problem is not None:
            self._outbox.drop_response(now_ms, source, problem)
            return
        state.read_barrier = max(state.read_barrier, response.read_barrier)
        if response.snapshot_id is not None:
            self._transfer.begin_download(state, SnapshotId(response.snapshot_id.end_offset,
                                                            response.snapshot_id.epoch))
        elif point is not None:
            self.truncate_to(point)
        elif batches:
            # A full log keeps hearing from its leader: no election while it waits for space.
            self.append_as_follower(now_ms, source, batches)
        # Not when answered with a snapshot: the local log was not validated against the
        # leader's and may hold a diverging suffix; the snapshot's load sets the watermark.
        if response.high_watermark is not None and response.snapshot_id is None:
            high_watermark = min(response.high_watermark, self._log.end_offset)
            known = self._watermarks.high_watermark
            if known is None or high_watermark >= known:
                self._watermarks.advance_high_watermark(high_watermark)
        state.heard_from_leader(now_ms)

    def append_as_follower(self, now_ms: int, source: int,
                           batches: Sequence[RecordBatch]) -> None:
        """On a full log the rest of the records are dropped (what did fit stays appended, to be
        flushed as any append) and fetched again after a back-off."""
        try:
            self._log.append_as_follower(batches)
        except LogFullError as error:
            appended = [batch for batch in batches if batch.next_offset <= self._log.end_offset]
            if appended:
                self._log_appended(appended)
                self._outbox.effects.flush = True
            self._outbox.drop_response(now_ms, source, str(error))
            return
        self._log_appended(batches)
        self._outbox.effects.flush = True

    def truncate_to(self, point: int) -> None:
        if self._watermarks.high_watermark is not None and point < self._watermarks.high_watermark:
            raise RaftInvariantError(
                f"node {self._local_key.id}: truncating to {point}, below the high watermark "
                f"{self._watermarks.high_watermark}: committed data would be lost"
            )
        self._log.truncate_to(point)
        self._watermarks.flushed_offset = min(self._watermarks.flushed_offset, self._log.end_offset)
        if self._voters.truncated():
            self._voters_changed()

    def _log_appended(self, batches: Sequence[RecordBatch]) -> None:
        if self._voters.appended(batches):
            self._voters_changed()
