"""The replicated state machine a simulated node runs over its committed log, and its snapshots.

What it holds is small but exact: a chained digest of every committed data record's value, in
order, their count, and a table of the latest value per slot (so that snapshots have some bulk
and are fetched in several chunks). The invariant checker chains the same digest over the
committed prefix it knows, so a snapshot, or a state machine, that lost, added or reordered a
committed record cannot go unnoticed.

When it snapshots is the node's policy (``quorum_node.raft.snapshot_policy``), with an interval
in records small enough for the simulated workload to reach it many times a run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

from quorum_node.raft.log import MemoryLog
from quorum_node.raft.records import Record
from quorum_node.raft.snapshot_format import encode_snapshot, read_snapshot
from quorum_node.raft.snapshot_policy import SnapshotPolicy
from quorum_node.raft.snapshots import CorruptSnapshotError, SnapshotId, SnapshotStore
from quorum_node.raft.voters import VoterSet

INITIAL_DIGEST = bytes(16)
SLOTS = 32
_DIGEST = b"digest"
_COUNT = b"count"
# The simulated snapshot.interval.records: a workload proposes tens of records a second.
SNAPSHOT_INTERVAL_RECORDS = 16


def chain(digest: bytes, value: bytes) -> bytes:
    """The digest after applying one more data record."""
    return hashlib.blake2b(digest + value, digest_size=16).digest()


def read_snapshot_bytes(store: SnapshotStore, snapshot_id: SnapshotId) -> bytes:
    size = store.size(snapshot_id)
    assert size is not None, f"no snapshot {snapshot_id}"
    return store.read(snapshot_id, 0, size)


def check_snapshot_records(records: Iterator[Record]) -> None:
    """What ``StateMachine.load`` needs of a snapshot (the core runs it on every download
    before keeping it): a digest, a count and slots, each once, and nothing else."""
    seen: set[bytes] = set()
    for index, record in enumerate(records):
        key = record.key
        if key is None or key in seen:
            raise CorruptSnapshotError(f"data record {index}: no key, or one seen before")
        seen.add(key)
        if key == _DIGEST:
            valid = len(record.value) == len(INITIAL_DIGEST)
        elif key == _COUNT:
            valid = record.value.isdigit()
        else:
            slot = key.removeprefix(b"slot-")
            valid = slot != key and slot.isdigit() and int(slot) < SLOTS
        if not valid:
            raise CorruptSnapshotError(f"data record {index} ({key!r}) is not the state machine's")
    if not {_DIGEST, _COUNT} <= seen:
        raise CorruptSnapshotError("the snapshot holds no digest or no count")


def snapshot_digest(data: bytes) -> tuple[bytes, int]:
    """(digest, record count) a snapshot's state machine contents carry."""
    fields = {record.key: record.value for record in read_snapshot(data).records}
    return fields[_DIGEST], int(fields[_COUNT])


class StateMachine:
    def __init__(self) -> None:
        self.applied = 0  # the next offset to apply
        self.digest = INITIAL_DIGEST
        self.count = 0
        self._slots: dict[int, bytes] = {}
        self.policy = SnapshotPolicy(SNAPSHOT_INTERVAL_RECORDS)

    @property
    def snapshot_due(self) -> bool:
        """Whether the node's policy calls for a snapshot of what is applied now."""
        return self.policy.due(self.applied, len(self._slots))

    def restore(self, store: SnapshotStore) -> None:
        """A process starting: begin from the latest snapshot, or from nothing."""
        self.policy = SnapshotPolicy(SNAPSHOT_INTERVAL_RECORDS)
        latest = store.latest()
        if latest is not None:
            self.load(store, latest)
        else:
            self.applied, self.digest, self.count, self._slots = 0, INITIAL_DIGEST, 0, {}

    def load(self, store: SnapshotStore, snapshot_id: SnapshotId) -> None:
        records = read_snapshot(read_snapshot_bytes(store, snapshot_id)).records
        fields = {record.key: record.value for record in records}
        self.applied = snapshot_id.end_offset
        self.digest = fields.pop(_DIGEST)
        self.count = int(fields.pop(_COUNT))
        self._slots = {int(key.removeprefix(b"slot-")): value for key, value in fields.items()
                       if key is not None}
        self.policy.loaded(snapshot_id.end_offset)

    def apply(self, log: MemoryLog, high_watermark: int) -> None:
        """Apply what the log holds below the high watermark (a gap stops it: reporting one is
        the invariant checker's business)."""
        while self.applied < high_watermark:
            batch = log.batch_containing(self.applied)
            if batch is None:
                return
            end = min(batch.next_offset, high_watermark)
            if not batch.is_control:
                first = self.applied - batch.base_offset
                for record in batch.records[first : end - batch.base_offset]:
                    self.digest = chain(self.digest, record.value)
                    self._slots[self.count % SLOTS] = record.value
                    self.count += 1
            self.applied = end

    def snapshot(self, voters: VoterSet | None, timestamp_ms: int) -> bytes:
        """The state machine's snapshot as of what it applied (the policy counts from there)."""
        self.policy.written(self.applied)
        records = [Record(key=_DIGEST, value=self.digest),
                   Record(key=_COUNT, value=b"%d" % self.count)]
        records += [Record(key=b"slot-%d" % slot, value=value)
                    for slot, value in sorted(self._slots.items())]
        return encode_snapshot(voters, timestamp_ms, records)
