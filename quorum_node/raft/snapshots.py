"""Snapshots as the Raft core sees them (KIP-630), and an in-memory store.

A snapshot holds the state of the replicated state machine as of a committed offset, so that the
log below it can be deleted and a replica far behind can catch up by copying it. Its id is
(end offset, epoch): it covers every offset below ``end_offset``, and ``epoch`` is the epoch of the
record at ``end_offset - 1``.

The core sees snapshots through a ``SnapshotStore`` handed in like the log: it reads byte ranges of
the latest snapshot to answer FetchSnapshot, writes the byte ranges it downloads into a
``PartialSnapshot``, and asks a snapshot for the voter set it carries. The contents are framed and
checked by ``quorum_node.raft.snapshot_format``; the store does not interpret them beyond that.
Creating a snapshot is the state machine's business (the node's key-value store), not the core's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from quorum_node.raft.types import ReplicaKey


@dataclass(frozen=True, slots=True, order=True)
class SnapshotId:
    end_offset: int
    epoch: int

    def __str__(self) -> str:
        return f"{self.end_offset}-{self.epoch}"


class CorruptSnapshotError(ValueError):
    """Snapshot bytes that fail their framing or checksums."""


class PartialSnapshot(Protocol):
    """A snapshot being downloaded; invisible to ``latest()`` until ``freeze``."""

    @property
    def snapshot_id(self) -> SnapshotId: ...

    @property
    def written(self) -> int:
        """Bytes appended so far: the position of the next FetchSnapshot."""
        ...

    def append(self, data: bytes) -> None: ...

    def freeze(self) -> None:
        """Check the whole snapshot (raises ``CorruptSnapshotError``, and discards it), make it
        durable and make it the latest snapshot."""
        ...

    def abort(self) -> None:
        """Throw the partial download away."""
        ...


class SnapshotStore(Protocol):
    def latest(self) -> SnapshotId | None:
        """The newest complete snapshot, if any."""
        ...

    def size(self, snapshot_id: SnapshotId) -> int | None:
        """Size in bytes of a complete snapshot; None if the store does not hold it."""
        ...

    def read(self, snapshot_id: SnapshotId, position: int, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` bytes from ``position`` (0 <= position < size)."""
        ...

    def voters(self, snapshot_id: SnapshotId) -> tuple[ReplicaKey, ...] | None:
        """The voter set the snapshot carries (as of its end offset), None if it carries none."""
        ...

    def begin_download(self, snapshot_id: SnapshotId) -> PartialSnapshot: ...

    def save(self, snapshot_id: SnapshotId, contents: bytes) -> None:
        """Store a complete, framed snapshot made locally by the state machine (durably)."""
        ...

    def delete_before(self, snapshot_id: SnapshotId) -> None:
        """Remove every snapshot older than ``snapshot_id``."""
        ...


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
        from quorum_node.raft.snapshot_format import read_snapshot_header  # noqa: PLC0415

        return read_snapshot_header(self._snapshots[snapshot_id]).voters

    def begin_download(self, snapshot_id: SnapshotId) -> PartialSnapshot:
        return _MemoryPartial(self, snapshot_id)

    def save(self, snapshot_id: SnapshotId, contents: bytes) -> None:
        from quorum_node.raft.snapshot_format import read_snapshot  # noqa: PLC0415

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

    def freeze(self) -> None:
        self._check_alive()
        data, self._data = bytes(self._data), bytearray()
        self._store.save(self._id, data)  # a corrupt download is dropped all the same

    def abort(self) -> None:
        self._data.clear()

    def _check_alive(self) -> None:
        if self._generation != self._store._generation:
            raise ValueError(f"the download of snapshot {self._id} was lost in a crash")
