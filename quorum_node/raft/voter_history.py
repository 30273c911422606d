"""The voter set in force, as the log defines it (KIP-853/856).

``VoterHistory`` reads every VotersRecord of the log (and the voter set of the latest snapshot)
into a ``VoterSetHistory``, follows the log as it is appended to, truncated or replaced by a
snapshot, and keeps the voter set in force with the facts the hot paths read (the voter ids, the
remote voters, whether this replica votes). Until the first leader writes a VotersRecord the
statically configured voters are in force.

It only reads the log it is given; each method that may change the voter set says whether it
did, and ``RaftCore`` tells its ``QuorumState`` (the leader regroups its replicas, a replica
removed from the voters stops campaigning).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from quorum_node.raft.log import RaftLog
from quorum_node.raft.records import RecordBatch, decode_batch, read_batch_header
from quorum_node.raft.snapshots import SnapshotId, SnapshotStore
from quorum_node.raft.types import RaftInvariantError, ReplicaKey
from quorum_node.raft.voters import VoterSet, VoterSetHistory, voter_sets_in

logger = logging.getLogger(__name__)


class VoterHistory:
    """The voter set in force on the replica ``local_key``, and its history in the log."""

    def __init__(self, *, local_key: ReplicaKey, static_voters: Iterable[ReplicaKey],
                 log: RaftLog, snapshots: SnapshotStore) -> None:
        self._local_key = local_key
        self._log = log
        self._snapshots = snapshots
        self._history = VoterSetHistory(tuple(static_voters))
        self.static_ids = frozenset(key.id for key in self._history.static_voters)
        self._load()
        self._set_voters(self._history.latest())

    # --- the voter set in force, and what the hot paths read of it ---------------------------

    def _set_voters(self, voters: VoterSet) -> None:
        """Adopt a voter set and the facts derived from it, which the hot paths read."""
        if not voters:
            raise ValueError("the voter set is empty")
        unknown = sorted(key.id for key in voters if key.id not in self.static_ids)
        if unknown:
            # KIP-856: voter ids come from the configuration; a log naming others belongs to a
            # differently configured quorum.
            raise RaftInvariantError(
                f"node {self._local_key.id}: the log names voter ids {unknown} that are not in "
                f"controller.quorum.voters {sorted(self.static_ids)}"
            )
        self.voters = voters
        self.voter_ids = frozenset(key.id for key in voters)
        self.remote_voters = tuple(k for k in voters if not k.matches(self._local_key))
        # The voters messages go to. A voter under another directory of this node's own id is
        # this node's lost disk (KIP-856, before RemoveVoter): it counts in majorities, but
        # nothing can reach it, and a request "to" it would come back to this very node.
        self.peer_voters = tuple(k for k in self.remote_voters if k.id != self._local_key.id)
        self.is_voter = len(self.remote_voters) < len(voters)
        self.is_only_voter = self.is_voter and len(voters) == 1

    @property
    def bootstrapped(self) -> bool:
        """Whether the voter set comes from the log (or a snapshot) rather than the static
        configuration: the first leader has written it, with every voter's directory id."""
        return self._history.latest_offset() is not None

    def latest_offset(self) -> int | None:
        """The offset of the VotersRecord in force, None while the static voters are."""
        return self._history.latest_offset()

    def at(self, offset: int) -> VoterSet:
        """The voter set in force at ``offset`` (what a snapshot ending after it carries)."""
        return self._history.at(offset)

    # --- following the log -------------------------------------------------------------------

    def _load(self) -> None:
        """Start-up: the set in the latest snapshot, then every VotersRecord of the log."""
        latest = self._snapshots.latest()
        if latest is not None:
            self._history.reset(latest.end_offset - 1, self._snapshots.voters(latest))
        start = max(self._log.start_offset, latest.end_offset if latest is not None else 0)
        offset = start
        while offset < self._log.end_offset:
            data = self._log.read(offset, 1 << 20)
            if not data:
                break
            position = 0
            while position < len(data):
                # Only a control batch can hold a VotersRecord, so the others (nearly all) are
                # passed over by their headers, undecoded; the log checked every CRC when it
                # wrote or recovered them.
                header = read_batch_header(data, position, verify_crc=False)
                if header.is_control:
                    self._read_voter_records([decode_batch(data, position)[0]], start)
                position, offset = header.end, header.next_offset

    def _read_voter_records(self, batches: Sequence[RecordBatch], from_offset: int = 0) -> None:
        for batch in batches:
            for offset, voters in voter_sets_in(batch):
                if offset >= from_offset:
                    self._history.add(offset, voters)

    def appended(self, batches: Sequence[RecordBatch]) -> bool:
        """Adopt a voter set as soon as its record is in the log, committed or not (KIP-856).
        Whether the voter set changed."""
        if any(batch.is_control for batch in batches):
            self._read_voter_records(batches)
            return self._adopt_latest()
        return False

    def truncated(self) -> bool:
        """A truncated VotersRecord is reverted: the previous set is in force again. Whether the
        voter set changed."""
        self._history.truncate_new(self._log.end_offset)
        return self._adopt_latest()

    def snapshot_loaded(self, snapshot_id: SnapshotId) -> bool:
        """The log was replaced by ``snapshot_id``: its voter set is in force. Whether the voter
        set changed."""
        self._history.reset(snapshot_id.end_offset - 1, self._snapshots.voters(snapshot_id))
        return self._adopt_latest()

    def _adopt_latest(self) -> bool:
        latest = self._history.latest()
        if latest == self.voters:
            return False
        logger.info("node %d: voters now %s", self._local_key.id, ", ".join(map(str, latest)))
        self._set_voters(latest)
        return True
