"""Snapshots as the Raft core sees them (KIP-630).

A snapshot holds the state of the replicated state machine as of a committed offset, so that the
log below it can be deleted and a replica far behind can catch up by copying it. Its id is
(end offset, epoch): it covers every offset below ``end_offset``, and ``epoch`` is the epoch of the
record at ``end_offset - 1``.

The core sees snapshots through a ``SnapshotStore`` handed in like the log: it reads byte ranges of
the latest snapshot to answer FetchSnapshot, writes the byte ranges it downloads into a
``PartialSnapshot``, and asks a snapshot for the voter set it carries. The contents are framed and
checked by ``quorum_node.raft.snapshot_format``; the store does not interpret them beyond that,
except through the ``SnapshotCheck`` a download is frozen with: the core's checks of what the
snapshot says (its voter set, and, through the state machine's ``SnapshotRecordsCheck``, every
record), run over the very bytes that are then kept.
Creating a snapshot is the state machine's business (the node's key-value store), not the core's.
The stores: ``quorum_node.storage.snapshot_store`` (files) and
``quorum_node.raft.memory_snapshots`` (memory: tests and the simulator).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from quorum_node.raft.records import Record
from quorum_node.raft.types import ReplicaKey


@dataclass(frozen=True, slots=True, order=True)
class SnapshotId:
    end_offset: int
    epoch: int

    def __str__(self) -> str:
        return f"{self.end_offset}-{self.epoch}"


class CorruptSnapshotError(ValueError):
    """Snapshot bytes that fail their framing or checksums, or contents that cannot be used (a
    voter set naming ids that are not configured, records the state machine cannot load)."""


Buffer = bytes | memoryview
# Checks a whole snapshot's contents, its framing already checked; raises CorruptSnapshotError.
SnapshotCheck = Callable[[Buffer], None]
# The state machine's check of a snapshot's data records, in order: raises CorruptSnapshotError
# naming the first one it could not load.
SnapshotRecordsCheck = Callable[[Iterator[Record]], None]


class PartialSnapshot(Protocol):
    """A snapshot being downloaded; invisible to ``latest()`` until ``freeze``."""

    @property
    def snapshot_id(self) -> SnapshotId: ...

    @property
    def written(self) -> int:
        """Bytes appended so far: the position of the next FetchSnapshot."""
        ...

    def append(self, data: bytes) -> None: ...

    def freeze(self, check: SnapshotCheck) -> None:
        """Check the whole snapshot, its framing and then ``check`` over the same bytes (either
        raises ``CorruptSnapshotError``, and the download is discarded), make it durable and
        make it the latest snapshot."""
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
