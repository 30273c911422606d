"""The snapshot transfer (KIP-630): a follower whose log the leader no longer holds fetches the
leader's latest snapshot in chunks, checks it whole, and replaces its log by it.

The leader serves FetchSnapshot (checked as a Fetch is, by ``LeaderReplication.serving``); the
follower's download lives in its ``FollowerState`` (a fetch answered with a snapshot id begins
it, ``FollowerFetcher`` asks for its next chunk). A downloaded snapshot is kept only once its
framing, its voter set (configured ids only, as a fetched VotersRecord) and the state machine's
own check of its records pass: a refused one changes nothing, and is backed off from.

``SnapshotTransfer`` is given what it reads and writes (the log and snapshots, the quorum state,
the voter history, this replica's watermarks, the outbox); ``voters_changed`` is how it tells
``RaftCore`` that a loaded snapshot brought another voter set.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from quorum_node.raft.config import QuorumConfig
from quorum_node.raft.follower import FollowerState, voter_set_problem
from quorum_node.raft.log import RaftLog
from quorum_node.raft.messages import FetchSnapshotRequest, FetchSnapshotResponse
from quorum_node.raft.outbox import Outbox, WarningLimiter, answer
from quorum_node.raft.quorum_state import QuorumState
from quorum_node.raft.replication import LeaderReplication
from quorum_node.raft.requests import RequestManager
from quorum_node.raft.snapshot_format import iter_snapshot_records, read_snapshot_header
from quorum_node.raft.snapshots import (
    Buffer,
    CorruptSnapshotError,
    SnapshotId,
    SnapshotRecordsCheck,
    SnapshotStore,
)
from quorum_node.raft.types import Errors, ReplicaKey
from quorum_node.raft.voter_history import VoterHistory
from quorum_node.raft.watermarks import Watermarks

logger = logging.getLogger(__name__)


class SnapshotTransfer:
    """Both ends of a snapshot's transfer. ``check_snapshot_records``: the state machine's check
    of a downloaded snapshot's records (None: any records pass)."""

    def __init__(self, *, local_key: ReplicaKey, config: QuorumConfig, log: RaftLog,
                 snapshots: SnapshotStore, quorum: QuorumState, voters: VoterHistory,
                 replication: LeaderReplication, watermarks: Watermarks,
                 requests: RequestManager, outbox: Outbox, warnings: WarningLimiter,
                 check_snapshot_records: SnapshotRecordsCheck | None,
                 voters_changed: Callable[[], None]) -> None:
        self._local_key = local_key
        self._config = config
        self._log = log
        self._snapshots = snapshots
        self._quorum = quorum
        self._voters = voters
        self._static_ids = voters.static_ids
        self._replication = replication
        self._watermarks = watermarks
        self._requests = requests
        self._outbox = outbox
        self._warnings = warnings
        self._check_snapshot_records = check_snapshot_records
        self._voters_changed = voters_changed
        # Snapshots downloaded from a leader and refused (not kept, the log kept) since start.
        self.refused_snapshots = 0

    def begin_download(self, state: FollowerState, snapshot_id: SnapshotId) -> None:
        if state.download is not None:
            if state.download.snapshot_id == snapshot_id:
                return
            state.abort_download()
        logger.info("node %d: the leader's log starts past ours; fetching snapshot %s",
                    self._local_key.id, snapshot_id)
        state.download = self._snapshots.begin_download(snapshot_id)

    def handle_fetch_snapshot(
        self, now_ms: int, request: FetchSnapshotRequest
    ) -> FetchSnapshotResponse:
        state = self._replication.serving(now_ms, request, malformed=request.position < 0)
        if isinstance(state, Errors):
            return answer(self._quorum, FetchSnapshotResponse, state)
        snapshot_id = SnapshotId(request.snapshot_id.end_offset, request.snapshot_id.epoch)
        size = self._snapshots.size(snapshot_id)
        if size is None:
            return answer(self._quorum, FetchSnapshotResponse, Errors.SNAPSHOT_NOT_FOUND)
        if request.position >= size:
            return answer(self._quorum, FetchSnapshotResponse, Errors.POSITION_OUT_OF_RANGE)
        self._replication.note_contact(now_ms, state, ReplicaKey(request.replica_id,
                                                                 request.replica_directory_id))
        max_bytes = min(request.max_bytes, self._config.fetch_max_bytes)
        return answer(self._quorum, FetchSnapshotResponse, Errors.NONE,
                      snapshot_id=request.snapshot_id, size=size, position=request.position,
                      records=self._snapshots.read(snapshot_id, request.position, max_bytes))

    def handle_fetch_snapshot_response(
        self, now_ms: int, source: int, response: FetchSnapshotResponse
    ) -> None:
        state = self._quorum.state
        if (not isinstance(state, FollowerState) or state.leader_id != source
                or response.leader_epoch != state.epoch or state.download is None):
            return
        download = state.download
        if response.error_code in (Errors.SNAPSHOT_NOT_FOUND, Errors.POSITION_OUT_OF_RANGE):
            # The leader moved on to a newer snapshot: fetch again, which names it.
            state.abort_download()
            return
        if response.error_code != Errors.NONE:
            return
        expected = download.snapshot_id
        if (response.snapshot_id is None
                or SnapshotId(response.snapshot_id.end_offset, response.snapshot_id.epoch)
                != expected or response.position != download.written or not response.records):
            logger.warning("node %d: unexpected chunk of snapshot %s; starting over",
                           self._local_key.id, expected)
            state.abort_download()
            return
        download.append(response.records)
        if download.written < response.size:
            state.heard_from_leader(now_ms)  # progress; the last chunk counts once checked
            return
        state.download = None
        try:
            download.freeze(self.check_snapshot)
        except CorruptSnapshotError as error:
            # Nothing changed: the log, the voters and the high watermark are as they were.
            # Backed off from, and the fetch timer not reset: a leader that only sends
            # snapshots that cannot be used is in the end replaced by an election.
            self.refused_snapshots += 1
            self._warnings.warn(now_ms, f"refused-snapshot-{source}",
                                "node %d: refused snapshot %s from leader %d, the log is kept: "
                                "%s", self._local_key.id, expected, source, error)
            self._requests.back_off(source, now_ms)
            return
        state.heard_from_leader(now_ms)
        self.load_snapshot(expected)

    def check_snapshot(self, data: Buffer) -> None:
        """What a leader's snapshot must hold, beyond its framing, to be kept: a voter set (if
        it carries one) of configured ids only, as a fetched VotersRecord must name, and
        records the state machine can load. Once kept it replaces the log, and its voter set is
        in force at once and at every start."""
        voters = read_snapshot_header(data).voters
        if voters is not None:
            problem = voter_set_problem(voters, self._static_ids)
            if problem is not None:
                raise CorruptSnapshotError(f"its voter set {problem}")
        if self._check_snapshot_records is not None:
            self._check_snapshot_records(iter_snapshot_records(data))

    def load_snapshot(self, snapshot_id: SnapshotId) -> None:
        """Replace the log by a downloaded snapshot: the log restarts at its end offset, the
        voter set is the one it carries, and everything below it is committed."""
        logger.info("node %d: loaded snapshot %s", self._local_key.id, snapshot_id)
        self._log.truncate_to_snapshot(snapshot_id)
        self._watermarks.flushed_offset = self._log.end_offset
        if self._voters.snapshot_loaded(snapshot_id):
            self._voters_changed()
        known = self._watermarks.high_watermark
        if known is None or known < snapshot_id.end_offset:
            self._watermarks.advance_high_watermark(snapshot_id.end_offset)
        self._snapshots.delete_before(snapshot_id)
        self._outbox.effects.snapshot_loaded = snapshot_id
