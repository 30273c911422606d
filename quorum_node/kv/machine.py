"""The key-value state machine's synchronous heart, the one the node and the simulator run.

``KvMachine`` applies the committed log to a ``KvStore``, decides when to snapshot it (the
policy is ``quorum_node.raft.snapshot_policy``'s: every ``snapshot.interval.records`` applied
records, and no more often than it has applied a quarter as many records as the map has keys; a
txn counts as many records as it has operations, what replaying it costs), says what a snapshot
holds and how far the log may then be compacted, and loads a snapshot. It does no I/O and reads
no clock: its host reads the log and the snapshot store, writes snapshots and deletes the log
(the node on its disk, in threads where that is slow; the simulator on its simulated disk), so
the same committed bytes give the same store on both.

``check_snapshot_records`` is what the store can load from a snapshot: the Raft core runs it on
every snapshot downloaded from a leader before keeping it, and ``quorum-node restore`` on a
backup's snapshot before restoring it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

from quorum_node.kv.ops import KvOpError
from quorum_node.kv.snapshot_data import (
    LoadedSnapshot,
    SnapshotEntries,
    snapshot_data,
    snapshot_records,
)
from quorum_node.kv.store import KvStore
from quorum_node.raft.records import BatchHeader, Record
from quorum_node.raft.snapshot_format import encode_snapshot_batches, iter_snapshot_records
from quorum_node.raft.snapshot_policy import SnapshotPolicy
from quorum_node.raft.snapshots import CorruptSnapshotError, SnapshotId
from quorum_node.raft.voters import VoterSet


def check_snapshot_records(records: Iterator[Record]) -> None:
    """Raise CorruptSnapshotError naming the first of a snapshot's data records that the store
    cannot load (``KvStore.load_snapshot`` would refuse it, and a replica that kept such a
    snapshot could neither apply its log nor start): every chunk of entries is decoded and
    checked, one at a time, as loading it would. Modification offsets are checked against the
    snapshot's end when it is loaded."""
    try:
        for _ in snapshot_data(records, 2**63).chunks:
            pass
    except KvOpError as error:
        raise CorruptSnapshotError(str(error)) from None


def state_digest(content: SnapshotEntries) -> bytes:
    """A digest of a store's state (every entry with its modification offset and version, and
    where versions are counted from): equal states, and only those, have equal digests."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(repr(content.versions_from).encode())
    # The map's own entries, sorted here: not the key list that the snapshot's writer follows.
    for key, (value, mod_offset, version) in sorted(content.entries.items()):
        for text in (key, value):
            encoded = text.encode()
            digest.update(len(encoded).to_bytes(4, "little") + encoded)
        digest.update(mod_offset.to_bytes(8, "little", signed=True)
                      + version.to_bytes(8, "little", signed=True))
    return digest.digest()


def loaded_entries(loaded: LoadedSnapshot) -> SnapshotEntries:
    """What a loaded snapshot holds, as ``KvStore.snapshot_entries`` would give it once
    installed."""
    return SnapshotEntries(list(loaded.keys), loaded.entries.copy(), loaded.versions_from)


@dataclass(frozen=True, slots=True)
class SnapshotPlan:
    """A snapshot to write: its id, the voter set it carries (None unless every voter's
    directory is known), its timestamp and the store's entries as of its end."""

    snapshot_id: SnapshotId
    voters: VoterSet | None
    timestamp_ms: int
    content: SnapshotEntries
    txn_extra_ops: int

    def batches(self) -> Iterator[bytes]:
        """The snapshot's bytes, a batch at a time, sorted and encoded as they are taken (the
        node takes them in a thread: beside the map, only the copy of its entries is held)."""
        return encode_snapshot_batches(self.voters, self.timestamp_ms,
                                       snapshot_records(self.content))


class KvMachine:
    """A store fed from the committed log, and when and how it is snapshotted."""

    def __init__(self, store: KvStore, snapshot_interval_records: int,
                 latest_snapshot_end: int = 0) -> None:
        self.store = store
        self.policy = SnapshotPolicy(snapshot_interval_records, latest_snapshot_end)

    @property
    def next_offset(self) -> int:
        """Every offset below it is applied."""
        return self.store.next_offset

    def apply(self, encoded: bytes, high_watermark: int) -> None:
        """Apply the log's encoded batches (as read from it at ``next_offset``) below the high
        watermark. Raises RuntimeError if that applied nothing, and ValueError if the batches
        leave a gap after ``next_offset``: either way the store can no longer follow the log."""
        before = self.store.next_offset
        self.store.apply_encoded(encoded, limit=high_watermark)
        if self.store.next_offset == before:
            raise RuntimeError(f"no committed batch at offset {before} below the high "
                               f"watermark {high_watermark}")

    @property
    def snapshot_due(self) -> bool:
        """Whether the policy calls for a snapshot of what is applied now."""
        store = self.store
        return self.policy.due(store.next_offset, len(store), store.txn_extra_ops)

    def plan_snapshot(self, last_batch: BatchHeader, voters: VoterSet) -> SnapshotPlan | None:
        """The snapshot of the store as it is now, given the log's batch holding the last offset
        applied and the voter set in force there; None unless that batch ends there (a snapshot
        ends at a batch boundary: try again after the next batch)."""
        end = self.store.next_offset
        if end == 0 or last_batch.next_offset != end:
            return None
        carried = voters if all(key.directory_id is not None for key in voters) else None
        return SnapshotPlan(SnapshotId(end, last_batch.epoch), carried, last_batch.timestamp_ms,
                            self.store.snapshot_entries(), self.store.txn_extra_ops)

    def snapshot_written(self, plan: SnapshotPlan, retained_log_records: int) -> int:
        """The snapshot is saved: the policy counts from its end. Returns the offset the log may
        be deleted below, keeping ``retained_log_records`` for followers a little behind."""
        end = plan.snapshot_id.end_offset
        self.policy.written(end, plan.txn_extra_ops)
        return max(0, end - retained_log_records)

    @staticmethod
    def build_snapshot(snapshot_id: SnapshotId, data: bytes) -> LoadedSnapshot:
        """Decode and check a snapshot's bytes beside the store (the node does it in a thread).
        Raises CorruptSnapshotError or KvOpError for one the store cannot load."""
        return LoadedSnapshot.build(iter_snapshot_records(data), snapshot_id.end_offset)

    def install(self, snapshot_id: SnapshotId, loaded: LoadedSnapshot) -> bool:
        """Replace the store by a built snapshot, unless it has applied up to it already. True
        if installed."""
        if loaded.next_offset <= self.store.next_offset:
            return False
        self.store.install_snapshot(loaded)
        self.policy.loaded(snapshot_id.end_offset)
        return True

    def load(self, snapshot_id: SnapshotId, data: bytes) -> bool:
        """Build and install a snapshot if it is ahead of the store. True if installed."""
        if snapshot_id.end_offset <= self.store.next_offset:
            return False
        return self.install(snapshot_id, self.build_snapshot(snapshot_id, data))
