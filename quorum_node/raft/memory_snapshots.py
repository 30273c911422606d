"""A snapshot store in memory, for tests and the simulator (the node's is
``quorum_node.storage.snapshot_store``)."""

from __future__ import annotations

from quorum_node.raft.snapshot_format import check_snapshot, read_snapshot, read_snapshot_header
from quorum_node.raft.snapshots import PartialSnapshot, SnapshotCheck, SnapshotId
from quorum_node.raft.types import ReplicaKey


class MemorySnapshotStore:
    """A snapshot store in memory (tests and the simulator). A frozen or saved snapshot is durable:
    ``crash`` loses only downloads in progress; ``wipe`` loses everything."""

    def __init__(self) -> None:
        self._snapshots: dict[SnapshotId, bytes] = {}
        self._generation = 0  # bumped by a crash: downloads begun before it are lost

    def latest(self) -> SnapshotId | None:
        return max(self._snapshots) if self._snapshots else None

    def size(self, snapshot_id: SnapshotId) -> int | None:
        data = self._snapshots.get(snapshot_id)
        return None if data is None else len(data)

    def read(self, snapshot_id: SnapshotId, position: int, max_bytes: int) -> bytes:
        data = self._snapshots[snapshot_id]
        if not 0 <= position < len(data):
            raise ValueError(f"position {position} outside snapshot {snapshot_id}")
        return data[position : position + max_bytes]

    def voters(self, snapshot_id: SnapshotId) -> tuple[ReplicaKey, ...] | None:
        return read_snapshot_header(self._snapshots[snapshot_id]).voters

    def begin_download(self, snapshot_id: SnapshotId) -> PartialSnapshot:
        return _MemoryPartial(self, snapshot_id)

    def save(self, snapshot_id: SnapshotId, contents: bytes) -> None:
        read_snapshot(contents)  # refuse to store what could not be read back
        self._snapshots[snapshot_id] = contents

    def delete_before(self, snapshot_id: SnapshotId) -> None:
        for old in [s for s in self._snapshots if s < snapshot_id]:
            del self._snapshots[old]

    def crash(self) -> None:
        """Lose the downloads in progress; frozen and saved snapshots are durable."""
        self._generation += 1

    def wipe(self) -> None:
        self._snapshots.clear()
        self._generation += 1


class _MemoryPartial:
    def __init__(self, store: MemorySnapshotStore, snapshot_id: SnapshotId) -> None:
        self._store = store
        self._id = snapshot_id
        self._data = bytearray()
        self._generation = store._generation

    @property
    def snapshot_id(self) -> SnapshotId:
        return self._id

    @property
    def written(self) -> int:
        return len(self._data)

    def append(self, data: bytes) -> None:
        self._check_alive()
        self._data += data

    def freeze(self, check: SnapshotCheck) -> None:
        self._check_alive()
        data, self._data = bytes(self._data), bytearray()
        check_snapshot(data)  # a corrupt or refused download is dropped all the same
        check(data)
        self._store.save(self._id, data)

    def abort(self) -> None:
        self._data.clear()

    def _check_alive(self) -> None:
        if self._generation != self._store._generation:
            raise ValueError(f"the download of snapshot {self._id} was lost in a crash")
