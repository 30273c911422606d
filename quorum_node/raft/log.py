"""The replicated log as the Raft core sees it, and an in-memory implementation.

The core is handed a ``RaftLog``. Its mutations (append, truncate) only change the log's contents;
they never wait for the disk. Durability is a separate step the driver performs when the core asks
for it (``Effects.flush``): it calls ``flush()`` and reports the flushed offset back to the core,
which counts only flushed data as acknowledged. That keeps fsync (and its group commit) outside the
core and lets a simulated disk lose exactly the un-flushed suffix on a crash.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Protocol

from quorum_node.raft.records import Record, RecordBatch, decode_batches, encode_batch
from quorum_node.raft.types import OffsetAndEpoch


class RaftLog(Protocol):
    @property
    def start_offset(self) -> int:
        """First offset held by the log (0 until snapshots let it move)."""
        ...

    @property
    def end_offset(self) -> int:
        """Log end offset (LEO): the offset the next appended record gets, flushed or not."""
        ...

    def last_fetched_epoch(self) -> int:
        """Epoch of the last batch in the log; 0 when it is empty."""
        ...

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        """The largest epoch held that is <= ``epoch`` and the offset where it ends (exclusive).

        When no held epoch qualifies, answers (start_offset, 0)."""
        ...

    def read(self, offset: int, max_bytes: int) -> bytes:
        """Encoded batches from the batch holding ``offset``, up to about ``max_bytes`` (always
        at least one whole batch when the log holds ``offset``; empty past the log end)."""
        ...

    def append_as_leader(
        self, records: Sequence[Record], epoch: int, timestamp_ms: int, is_control: bool = False
    ) -> RecordBatch:
        """Append one batch at the log end, stamped with ``epoch``."""
        ...

    def append_as_follower(self, batches: Sequence[RecordBatch]) -> None:
        """Append batches replicated from the leader; the first must start at the log end."""
        ...

    def truncate_to(self, offset: int) -> None:
        """Remove every batch holding an offset >= ``offset``; afterwards end_offset <= offset."""
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
    ``crash`` throws away whatever was not flushed, as a power loss would."""

    def __init__(self) -> None:
        self._batches: list[RecordBatch] = []
        self._encoded: list[bytes] = []
        self._bases: list[int] = []
        self._epochs: list[tuple[int, int]] = []  # (epoch, start offset), increasing
        self._durable: list[tuple[RecordBatch, bytes]] = []
        self._stable_prefix = 0  # batches[:n] equal durable[:n]

    # -- RaftLog ---------------------------------------------------------------------------
    @property
    def start_offset(self) -> int:
        return 0

    @property
    def end_offset(self) -> int:
        return self._batches[-1].next_offset if self._batches else 0

    def last_fetched_epoch(self) -> int:
        return self._batches[-1].epoch if self._batches else 0

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        return epoch_end_offset(self._epochs, epoch, self.start_offset, self.end_offset)

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
        end = self.end_offset
        while self._epochs and self._epochs[-1][1] >= end:
            self._epochs.pop()
        self._stable_prefix = min(self._stable_prefix, keep)

    # -- durability --------------------------------------------------------------------------
    def flush(self) -> int:
        del self._durable[self._stable_prefix :]
        fresh = slice(self._stable_prefix, None)
        self._durable.extend(zip(self._batches[fresh], self._encoded[fresh], strict=True))
        self._stable_prefix = len(self._batches)
        return self.end_offset

    def crash(self) -> None:
        """Lose everything appended (or truncated) since the last flush."""
        self._batches, self._encoded, self._bases, self._epochs = [], [], [], []
        self._stable_prefix = 0
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
        return self._durable[-1][0].next_offset if self._durable else 0

    def batch_containing(self, offset: int) -> RecordBatch | None:
        index = bisect.bisect_right(self._bases, offset) - 1
        if index < 0:
            return None
        batch = self._batches[index]
        return batch if batch.last_offset >= offset else None

    def _push(self, batch: RecordBatch, encoded: bytes) -> None:
        if not self._epochs or batch.epoch > self._epochs[-1][0]:
            self._epochs.append((batch.epoch, batch.base_offset))
        self._batches.append(batch)
        self._encoded.append(encoded)
        self._bases.append(batch.base_offset)
