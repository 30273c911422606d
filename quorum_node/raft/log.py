"""The replicated log as the Raft core sees it, and an in-memory implementation.

The core is handed a ``RaftLog``. Its mutations (append, truncate) only change the log's contents;
they never wait for the disk. Durability is a separate step the driver performs when the core asks
for it (``Effects.flush``): it calls ``flush()`` and reports the flushed offset back to the core,
which counts only flushed data as acknowledged. That keeps fsync (and its group commit) outside the
core and lets a simulated disk lose exactly the un-flushed suffix on a crash.

Snapshots (KIP-630) move the log's start. ``truncate_to_snapshot`` replaces the whole log by a
snapshot, ``delete_before`` drops what a snapshot made redundant; both are durable when they
return (no flush needed). A log that starts exactly at a snapshot's end offset keeps the
snapshot's epoch as the base of its epoch cache: the epoch of the record just before its start,
so that a follower which loaded that snapshot passes the divergence check at the log start.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Protocol

from quorum_node.raft.records import Record, RecordBatch, decode_batches, encode_batch
from quorum_node.raft.snapshots import SnapshotId
from quorum_node.raft.types import OffsetAndEpoch


class LogFullError(Exception):
    """The log's storage has no room for an append: nothing of it was written (the log is as it
    was), and a later append may succeed once space comes back. The core keeps what it could
    not append and retries; a client's new records are refused meanwhile."""


class RaftLog(Protocol):
    @property
    def start_offset(self) -> int:
        """First offset the log can hold: 0 until a snapshot lets it move (the base offset of its
        first batch, or the end offset when it is empty)."""
        ...

    @property
    def end_offset(self) -> int:
        """Log end offset (LEO): the offset the next appended record gets, flushed or not."""
        ...

    def last_fetched_epoch(self) -> int:
        """Epoch of the last batch in the log; when it is empty, its base epoch (that of the
        snapshot it starts at), or 0."""
        ...

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        """The largest epoch held that is <= ``epoch`` and the offset where it ends (exclusive).
        The base epoch counts as held, ending at the log start or where the next epoch begins.

        When no held epoch qualifies (the epoch lies wholly below the log start), answers
        (start_offset, 0): the leader then sends a snapshot."""
        ...

    def read(self, offset: int, max_bytes: int) -> bytes:
        """Encoded batches from the batch holding ``offset``, up to about ``max_bytes`` (always
        at least one whole batch when the log holds ``offset``; empty past the log end)."""
        ...

    def append_as_leader(
        self, records: Sequence[Record], epoch: int, timestamp_ms: int, is_control: bool = False
    ) -> RecordBatch:
        """Append one batch at the log end, stamped with ``epoch``. Raises ``LogFullError``
        (having appended nothing) when the storage is full."""
        ...

    def append_as_follower(self, batches: Sequence[RecordBatch]) -> None:
        """Append batches replicated from the leader; the first must start at the log end.
        Raises ``LogFullError`` when the storage is full (the batches before the one that did
        not fit stay appended)."""
        ...

    def truncate_to(self, offset: int) -> None:
        """Remove every batch holding an offset >= ``offset``; afterwards end_offset <= offset
        (but never below start_offset, and the base epoch stays)."""
        ...

    def truncate_to_snapshot(self, snapshot_id: SnapshotId) -> None:
        """Discard the whole log for a snapshot just loaded: afterwards start_offset ==
        end_offset == snapshot_id.end_offset and the base epoch is snapshot_id.epoch. Durable."""
        ...

    def delete_before(self, offset: int) -> None:
        """Delete whole batches (or files) whose records all lie below ``offset``, nothing at or
        above it. start_offset becomes the first offset kept (<= ``offset``); when that is
        ``offset`` itself, the epoch of the record before it becomes the base epoch. Durable."""
        ...


class DurableLog(RaftLog, Protocol):
    def flush(self) -> int:
        """Make everything appended so far durable; return the flushed end offset."""
        ...


def epoch_end_offset(
    epochs: Sequence[tuple[int, int]], epoch: int, start_offset: int, end_offset: int
) -> OffsetAndEpoch:
    """``end_offset_for_epoch`` over an epoch cache: (epoch, start offset) pairs, increasing."""
    index = bisect.bisect_right(epochs, (epoch, float("inf"))) - 1
    if index < 0:
        return OffsetAndEpoch(start_offset, 0)
    found_epoch, _ = epochs[index]
    if index + 1 < len(epochs):
        return OffsetAndEpoch(epochs[index + 1][1], found_epoch)
    return OffsetAndEpoch(end_offset, found_epoch)


class EpochCache:
    """The epoch cache both logs keep: (epoch, start offset) of each epoch held, increasing, over
    an optional base entry (the epoch of the snapshot the log starts at), which only the snapshot
    operations set or remove: truncation keeps it."""

    def __init__(self) -> None:
        self._entries: list[tuple[int, int]] = []
        self._has_base = False

    @property
    def base(self) -> SnapshotId | None:
        """(start offset, epoch before it) when the log has a base epoch."""
        if not self._has_base:
            return None
        epoch, offset = self._entries[0]
        return SnapshotId(offset, epoch)

    def reset(self, base: SnapshotId | None = None) -> None:
        self._entries.clear()
        self._has_base = False
        if base is not None:
            self.set_base(base)

    def set_base(self, base: SnapshotId) -> None:
        """Put the base under entries that all start at ``base.end_offset``."""
        if self._entries and self._entries[0][1] != base.end_offset:
            raise ValueError(f"base {base} is not at the start of the epochs {self._entries}")
        if self._entries and self._entries[0][0] < base.epoch:
            raise ValueError(f"base {base} is newer than the log's epoch {self._entries[0][0]}")
        if not self._entries or self._entries[0][0] > base.epoch:
            self._entries.insert(0, (base.epoch, base.end_offset))
        self._has_base = True

    def last_epoch(self) -> int:
        return self._entries[-1][0] if self._entries else 0

    def append(self, epoch: int, base_offset: int) -> None:
        """A batch of ``epoch`` was appended at ``base_offset``."""
        if not self._entries or epoch > self._entries[-1][0]:
            self._entries.append((epoch, base_offset))

    def truncate(self, end_offset: int) -> None:
        """The log now ends at ``end_offset``: forget epochs that began there or later."""
        keep = 1 if self._has_base else 0
        while len(self._entries) > keep and self._entries[-1][1] >= end_offset:
            self._entries.pop()

    def delete_before(self, start_offset: int, requested: int) -> None:
        """The log now starts at ``start_offset``, having been asked to delete below
        ``requested``: forget epochs that ended at or before the start, move the start of the
        one in force there, and make the epoch before the start the base if it is ``requested``
        (what a snapshot at ``requested`` tells after a restart)."""
        base = self.base
        if base is not None and base.end_offset == start_offset == requested:
            return  # already based there
        base_epoch = self._epoch_at(start_offset - 1) if start_offset == requested else None
        while len(self._entries) > 1 and self._entries[1][1] <= start_offset:
            del self._entries[0]
        if self._entries and self._entries[0][1] < start_offset:
            self._entries[0] = (self._entries[0][0], start_offset)
        self._has_base = False
        if base_epoch is not None:
            self.set_base(SnapshotId(start_offset, base_epoch))

    def end_offset_for(self, epoch: int, start_offset: int, end_offset: int) -> OffsetAndEpoch:
        return epoch_end_offset(self._entries, epoch, start_offset, end_offset)

    def _epoch_at(self, offset: int) -> int | None:
        """The epoch of the record at ``offset`` (None below every entry)."""
        index = bisect.bisect_right(self._entries, offset, key=lambda entry: entry[1]) - 1
        return self._entries[index][0] if index >= 0 else None


def check_leader_append(log: RaftLog, epoch: int) -> None:
    """The rule every log enforces on a leader's append: epochs never go backwards."""
    if epoch < log.last_fetched_epoch():
        raise ValueError(f"epoch {epoch} is older than the log's {log.last_fetched_epoch()}")


def check_follower_append(log: RaftLog, batch: RecordBatch) -> None:
    """The rules every log enforces on a replicated batch: it continues the log exactly and its
    epoch does not go backwards."""
    if batch.base_offset != log.end_offset:
        raise ValueError(f"batch at {batch.base_offset} does not start at log end {log.end_offset}")
    if batch.epoch < log.last_fetched_epoch():
        raise ValueError(f"batch epoch {batch.epoch} goes backwards")


class MemoryLog:
    """A log held in memory that models a disk: ``flush`` marks the current contents durable and
    ``crash`` throws away whatever was not flushed, as a power loss would.

    ``truncate_to_snapshot`` and ``delete_before`` are durable at once, as on a disk where they
    end with a directory fsync: a crash keeps the start offset and base epoch they left."""

    def __init__(self) -> None:
        self._start = 0
        self._batches: list[RecordBatch] = []
        self._encoded: list[bytes] = []
        self._bases: list[int] = []
        self._epochs = EpochCache()
        # The durable log, which starts at self._start too: what a crash leaves.
        self._durable: list[tuple[RecordBatch, bytes]] = []
        self._stable_prefix = 0  # batches[:n] equal durable[:n]

    # -- RaftLog ---------------------------------------------------------------------------
    @property
    def start_offset(self) -> int:
        return self._start

    @property
    def end_offset(self) -> int:
        return self._batches[-1].next_offset if self._batches else self._start

    def last_fetched_epoch(self) -> int:
        return self._epochs.last_epoch()

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        return self._epochs.end_offset_for(epoch, self.start_offset, self.end_offset)

    def read(self, offset: int, max_bytes: int) -> bytes:
        index = bisect.bisect_right(self._bases, offset) - 1
        if index < 0 or offset >= self.end_offset:
            return b""
        chunks = [self._encoded[index]]
        size = len(chunks[0])
        for encoded in self._encoded[index + 1 :]:
            if size + len(encoded) > max_bytes:
                break
            chunks.append(encoded)
            size += len(encoded)
        return b"".join(chunks)

    def append_as_leader(
        self, records: Sequence[Record], epoch: int, timestamp_ms: int, is_control: bool = False
    ) -> RecordBatch:
        check_leader_append(self, epoch)
        encoded = encode_batch(self.end_offset, epoch, records, timestamp_ms, is_control)
        (batch,) = decode_batches(encoded)
        self._push(batch, encoded)
        return batch

    def append_as_follower(self, batches: Sequence[RecordBatch]) -> None:
        for batch in batches:
            check_follower_append(self, batch)
            self._push(batch, batch.encode())

    def truncate_to(self, offset: int) -> None:
        # Drop every batch whose last offset is >= offset (a straddling batch goes whole).
        keep = len(self._batches)
        while keep > 0 and self._batches[keep - 1].last_offset >= offset:
            keep -= 1
        del self._batches[keep:]
        del self._encoded[keep:]
        del self._bases[keep:]
        self._epochs.truncate(self.end_offset)
        self._stable_prefix = min(self._stable_prefix, keep)

    def truncate_to_snapshot(self, snapshot_id: SnapshotId) -> None:
        self._start = snapshot_id.end_offset
        self._batches, self._encoded, self._bases = [], [], []
        self._epochs.reset(snapshot_id)
        self._durable, self._stable_prefix = [], 0

    def delete_before(self, offset: int) -> None:
        if offset <= self._start:
            return
        drop = 0
        while drop < len(self._batches) and self._batches[drop].next_offset <= offset:
            drop += 1
        if drop > self._stable_prefix:
            # Deleting is durable, so what it deletes must have been too: the durable log
            # becomes the current one up to the new start (as after a flush of that much).
            self._durable, self._stable_prefix = [], 0
        else:
            del self._durable[:drop]
            self._stable_prefix -= drop
        end = self.end_offset
        del self._batches[:drop]
        del self._encoded[:drop]
        del self._bases[:drop]
        self._start = self._batches[0].base_offset if self._batches else end
        self._epochs.delete_before(self._start, min(offset, end))

    # -- durability --------------------------------------------------------------------------
    def flush(self) -> int:
        del self._durable[self._stable_prefix :]
        fresh = slice(self._stable_prefix, None)
        self._durable.extend(zip(self._batches[fresh], self._encoded[fresh], strict=True))
        self._stable_prefix = len(self._batches)
        return self.end_offset

    def crash(self) -> None:
        """Lose everything appended (or truncated) since the last flush."""
        self._batches, self._encoded, self._bases = [], [], []
        self._epochs.reset(self._epochs.base)
        durable, self._durable = self._durable, []
        for batch, encoded in durable:
            self._push(batch, encoded)
        self._durable = durable
        self._stable_prefix = len(self._batches)

    def wipe(self) -> None:
        """Total loss of the disk."""
        self.__init__()  # type: ignore[misc]

    # -- inspection (tests and the simulator) -------------------------------------------------
    @property
    def batches(self) -> Sequence[RecordBatch]:
        return self._batches

    @property
    def durable_end_offset(self) -> int:
        return self._durable[-1][0].next_offset if self._durable else self._start

    def batch_containing(self, offset: int) -> RecordBatch | None:
        index = bisect.bisect_right(self._bases, offset) - 1
        if index < 0:
            return None
        batch = self._batches[index]
        return batch if batch.last_offset >= offset else None

    def _push(self, batch: RecordBatch, encoded: bytes) -> None:
        self._epochs.append(batch.epoch, batch.base_offset)
        self._batches.append(batch)
        self._encoded.append(encoded)
        self._bases.append(batch.base_offset)
