"""``SegmentLog``: the replicated log kept in segment files, with crash recovery at open.

Layout: ``<base offset, 20 digits>.log`` files in one directory, each holding encoded batches back
to back; the last one is active and the next roll starts a new one. The batch index and the epoch
cache live in memory only and are rebuilt at open by scanning the batch headers.

Durability and recovery rest on one invariant: **only the last segment can hold unflushed data**.
Appends go to the OS without fsync; ``flush`` fsyncs. A roll fsyncs the outgoing segment before the
new one gets its first byte. So after a crash only the tail of the last segment may be torn, and
recovery cuts exactly that: a defect anywhere else, or one followed by valid data, is corruption of
data that may have been acknowledged, and opening refuses without touching a byte.

Snapshots (KIP-630) move the start: ``delete_before`` deletes whole segments below a snapshot,
oldest first, so a crash leaves a suffix of the log; ``truncate_to_snapshot`` deletes every segment
and starts an empty one named after the snapshot's end offset, as Kafka does. A replica only loads
a snapshot that lies past its log end, so whatever part of that reaches the disk before a crash,
``open`` (given the latest snapshot) finds a log ending before the snapshot and finishes the job.

Threading: one thread appends, truncates and reads; ``flush`` may run concurrently in another
thread (group commit runs it via ``asyncio.to_thread``).
"""

from __future__ import annotations

import bisect
import errno
import logging
import mmap
import os
import re
import struct
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from quorum_node.raft.log import (
    EpochCache,
    LogFullError,
    check_follower_append,
    check_leader_append,
)
from quorum_node.raft.records import (
    HEADER_SIZE,
    MAGIC,
    MAX_BATCH_SIZE,
    CorruptRecordError,
    Record,
    RecordBatch,
    decode_batch,
    encode_batch,
    read_batch_header,
)
from quorum_node.raft.snapshots import SnapshotId
from quorum_node.raft.types import OffsetAndEpoch
from quorum_node.storage.errors import CorruptLogError, StorageError
from quorum_node.storage.fsutil import (
    ensure_directory,
    fsync_directory,
    open_private,
    write_all,
)

logger = logging.getLogger(__name__)

DEFAULT_SEGMENT_BYTES = 1 << 30  # Kafka's metadata.log.segment.bytes
SEGMENT_SUFFIX = ".log"
_SEGMENT_NAME = re.compile(r"([0-9]{20})\.log")

# Where the magic byte sits in a batch (after base_offset, batch_length and epoch), to resynchronise
# on it when looking for valid data past a defect.
_MAGIC_POSITION = 16
_MAGIC_BYTE = bytes([MAGIC])
_MIN_RECORD_SIZE = 8  # a record holds at least its key length and value length
_REWRITE_CHUNK = 1 << 20  # what open rewrites of the last segment at a time
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})  # a full disk, or the user's quota used up


@dataclass(eq=False)
class _Segment:
    base_offset: int
    path: Path
    fd: int
    size: int = 0
    next_offset: int = 0  # offset after the last batch; base_offset while empty
    bases: list[int] = field(default_factory=list)  # base offset of each batch
    positions: list[int] = field(default_factory=list)  # its byte position in the file
    dirty: bool = False  # written or truncated since its last fsync

    def batch_end(self, index: int) -> int:
        return self.positions[index + 1] if index + 1 < len(self.positions) else self.size


@dataclass
class _FlushTicket:
    """The end offset an in-progress flush will report; a concurrent truncation lowers it."""

    end_offset: int


@dataclass(frozen=True)
class _Defect:
    position: int
    reason: str
    undecodable: bool  # False: the batch is intact but out of sequence (never a torn write)


@dataclass(frozen=True)
class DroppedBytes:
    """The part of one segment file a repair drops, from ``position`` to its end."""

    path: Path
    position: int
    size: int  # bytes
    deleted: bool  # the whole file goes (else it is truncated at position)
    batches: int  # batches still recognisable in them (valid header and CRC32C)
    first_offset: int | None  # the first offset of the first of those, if any
    end_offset: int | None  # the offset after the last of those, if any


@dataclass(frozen=True)
class LogDamage:
    """The first defect of a log, and what cutting the log back to its last valid batch drops."""

    path: Path  # the segment holding it
    position: int  # the byte where the valid data of that segment ends
    reason: str
    torn_tail: bool  # the undecodable end of the last segment: opening the log cuts it
    valid_end_offset: int  # the end offset of the log once cut
    dropped: tuple[DroppedBytes, ...]  # the damaged segment's part first, then later segments

    @property
    def dropped_bytes(self) -> int:
        return sum(part.size for part in self.dropped)

    @property
    def dropped_batches(self) -> int:
        return sum(part.batches for part in self.dropped)

    @property
    def dropped_end_offset(self) -> int | None:
        """The offset after the last recognisable batch dropped, if any."""
        ends = [part.end_offset for part in self.dropped if part.end_offset is not None]
        return max(ends) if ends else None


@dataclass(frozen=True)
class _Damage:
    """The first defect of the log: its valid prefix ends at ``position`` of ``segment``."""

    segment: _Segment
    position: int
    reason: str
    torn_tail: bool  # what open cuts by itself: the undecodable end of the last segment


class SegmentLog:
    """A ``DurableLog`` in segment files."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        snapshot_id: SnapshotId | None = None,
    ) -> None:
        """Open (creating if needed) the log in ``directory``, cutting a torn or corrupt tail off
        the last segment (logged as a warning).

        Every batch of every segment has its header and CRC32C checked (records are not parsed,
        which keeps this at disk speed). Raises ``CorruptLogError`` and modifies nothing when the
        damage is not confined to the tail of the last segment. What it finds is fsynced, so
        ``end_offset`` after opening is durable.

        ``snapshot_id`` is the latest snapshot, if any. One ending past the log end (a crash
        between freezing a downloaded snapshot and truncating the log to it) has the log
        truncated to it; one ending at the log start gives the log its base epoch. A log that
        starts past it (or past 0 without one) is refused: the offsets between are in neither.
        """
        self._init_state(directory, segment_bytes)
        try:
            self._recover()
            self._meet_snapshot(snapshot_id)
        except BaseException:
            self.close()
            raise

    def _init_state(self, directory: str | os.PathLike[str], segment_bytes: int) -> None:
        if segment_bytes <= 0:
            raise ValueError(f"segment_bytes must be positive, not {segment_bytes}")
        self.directory = Path(directory)
        self._segment_bytes = segment_bytes
        self._segments: list[_Segment] = []
        self._segment_bases: list[int] = []
        self._epochs = EpochCache()
        self._lock = threading.Lock()
        self._tickets: list[_FlushTicket] = []
        self._dir_dirty = False
        self._closed = False
        self._failure: BaseException | None = None
        self.fsync_count = 0
        # The last append found the disk full (and was refused); an append that fits clears it.
        self.full = False
        self.refused_for_space = 0  # appends refused so

    @classmethod
    def find_damage(cls, directory: str | os.PathLike[str]) -> LogDamage | None:
        """What keeps the log in ``directory`` from opening, or would be cut when it opens (a
        torn tail), and what ``repair`` would drop; None when nothing is wrong. Changes nothing.
        The caller holds the directory's lock (``dir_lock``)."""
        with cls._unrecovered(directory) as log:
            found = log._find_damage()
            return None if found is None else log._describe_damage(found)

    @classmethod
    def repair(cls, directory: str | os.PathLike[str]) -> LogDamage | None:
        """Cut the log in ``directory`` back to its last valid batch, the way recovery cuts a torn
        tail but wherever the first defect is: the damaged segment is truncated there (deleted,
        when that leaves nothing of a segment after the first), every later segment is deleted,
        and it is all fsynced. Returns what was dropped, or None when nothing was wrong. Never
        run by the node itself: this drops records that may have been acknowledged (see
        ``quorum-node repair-log``). The caller holds the directory's lock."""
        with cls._unrecovered(directory) as log:
            found = log._find_damage()
            if found is None:
                return None
            damage = log._describe_damage(found)
            if damage.torn_tail:
                return damage  # recovery cuts it when the log opens; nothing to repair
            index = log._segments.index(found.segment)
            # Newest first, like truncate_to: a crash part-way leaves a prefix of the log that
            # still holds the damage, and running the repair again finishes it.
            while len(log._segments) > index + 1:
                log._delete_segment(log._segments[-1])
            if found.position == 0 and index > 0:
                log._delete_segment(found.segment)  # an empty segment may only be the last
            else:
                os.ftruncate(found.segment.fd, found.position)
                os.fsync(found.segment.fd)
            fsync_directory(log.directory)
            return damage

    @classmethod
    def _unrecovered(cls, directory: str | os.PathLike[str]) -> SegmentLog:
        """The segments of an existing log opened and not yet checked, for inspection."""
        log = cls.__new__(cls)
        log._init_state(directory, DEFAULT_SEGMENT_BYTES)
        try:
            if log.directory.is_dir():
                log._open_segments()
        except BaseException:
            log.close()
            raise
        return log

    # -- RaftLog -----------------------------------------------------------------------------
    @property
    def start_offset(self) -> int:
        return self._segments[0].base_offset

    @property
    def end_offset(self) -> int:
        return self._segments[-1].next_offset

    def last_fetched_epoch(self) -> int:
        # Epochs never decrease, so the newest cache entry is the epoch of the last batch.
        return self._epochs.last_epoch()

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        return self._epochs.end_offset_for(epoch, self.start_offset, self.end_offset)

    def read(self, offset: int, max_bytes: int) -> bytes:
        self._check_usable()
        found = self._locate(offset)
        if found is None:
            return b""
        ranges: list[tuple[_Segment, int, int]] = []
        total = 0
        for segment, start, end in self._batches_from(*found):
            if ranges and total + end - start > max_bytes:
                break
            total += end - start
            if ranges and ranges[-1][0] is segment:
                ranges[-1] = (segment, ranges[-1][1], end)  # adjacent batches: one pread
            else:
                ranges.append((segment, start, end))
        return b"".join(_pread(segment, start, end) for segment, start, end in ranges)

    def append_as_leader(
        self, records: Sequence[Record], epoch: int, timestamp_ms: int, is_control: bool = False
    ) -> RecordBatch:
        check_leader_append(self, epoch)
        encoded = encode_batch(self.end_offset, epoch, records, timestamp_ms, is_control)
        # Refuses what recovery could not read back (size, header); the CRC was computed just
        # now, so it is not computed again.
        header = read_batch_header(encoded, verify_crc=False)
        batch = RecordBatch(base_offset=header.base_offset, epoch=epoch, records=tuple(records),
                            timestamp_ms=timestamp_ms, is_control=is_control, crc=header.crc,
                            encoded=encoded)
        self._append(batch, encoded)
        return batch

    def append_as_follower(self, batches: Sequence[RecordBatch]) -> None:
        for batch in batches:
            check_follower_append(self, batch)
            encoded = batch.encode()
            if len(encoded) > MAX_BATCH_SIZE:
                # Recovery would take such a batch for corruption; refuse it up front.
                raise ValueError(f"batch of {len(encoded)} bytes exceeds {MAX_BATCH_SIZE}")
            self._append(batch, encoded)

    def truncate_to(self, offset: int) -> None:
        with self._lock:
            self._check_usable()
            if offset >= self.end_offset:
                return
            # Contiguous offsets: the batch holding `offset` goes (whole), with all after it.
            index = max(bisect.bisect_right(self._segment_bases, offset) - 1, 0)
            segment = self._segments[index]
            batch = max(bisect.bisect_right(segment.bases, offset) - 1, 0)
            cut = segment.positions[batch] if segment.positions else 0
            new_end = segment.bases[batch] if segment.bases else segment.base_offset
            try:
                # Newest first, so that if only some of these steps reach the disk before a
                # crash, what is left is still a prefix of the log.
                while len(self._segments) > index + 1:
                    self._delete_segment(self._segments[-1])
                os.ftruncate(segment.fd, cut)
            except OSError as exc:
                raise self._fail("truncation failed", exc) from exc
            segment.size = cut
            segment.next_offset = new_end
            segment.dirty = True
            del segment.bases[batch:]
            del segment.positions[batch:]
            self._epochs.truncate(new_end)
            self._lower_tickets(new_end)

    def truncate_to_snapshot(self, snapshot_id: SnapshotId) -> None:
        with self._lock:
            self._check_usable()
            try:
                # Newest first, like truncate_to: a crash leaves a prefix of the log, which ends
                # before the snapshot, so the next open truncates again (see the module notes).
                while self._segments:
                    self._delete_segment(self._segments[-1])
                self._sync_found(self._new_segment(snapshot_id.end_offset))
            except OSError as exc:
                raise self._fail("truncation to a snapshot failed", exc) from exc
            self._dir_dirty = False  # just fsynced
            self._epochs.reset(snapshot_id)
            self._lower_tickets(snapshot_id.end_offset)

    def delete_before(self, offset: int) -> None:
        with self._lock:
            self._check_usable()
            if offset <= self.start_offset:
                return
            try:
                # Oldest first, so that a crash leaves a suffix of the log; never the active one.
                while len(self._segments) > 1 and self._segments[0].next_offset <= offset:
                    self._delete_segment(self._segments[0])
                if self._dir_dirty:
                    fsync_directory(self.directory)
                    self.fsync_count += 1
            except OSError as exc:
                raise self._fail("deleting old segments failed", exc) from exc
            self._epochs.delete_before(self.start_offset, min(offset, self.end_offset))

    # -- DurableLog --------------------------------------------------------------------------
    def flush(self) -> int:
        """fsync what was written since the last flush; return the end offset now durable.

        Safe to call from another thread while this one keeps appending: the answer covers what
        was appended before the call, and never an offset a concurrent truncation took away."""
        with self._lock:
            self._check_usable()
            # Duplicates keep the files open even if a truncation closes them meanwhile.
            fds: list[int] = []
            try:
                for segment in self._segments:
                    if segment.dirty:
                        fds.append(os.dup(segment.fd))
            except OSError:
                _close_all(fds)
                raise
            for segment in self._segments:
                segment.dirty = False
            sync_directory, self._dir_dirty = self._dir_dirty, False
            ticket = _FlushTicket(self.end_offset)
            self._tickets.append(ticket)
        try:
            for fd in fds:
                os.fsync(fd)
            if sync_directory:
                fsync_directory(self.directory)
        except OSError as exc:
            # After a failed fsync the kernel may have dropped the dirty pages, and a retry can
            # report success without them: the log cannot be trusted any more.
            raise self._fail("fsync failed", exc) from exc
        finally:
            _close_all(fds)
            with self._lock:
                self._tickets.remove(ticket)
        with self._lock:
            self.fsync_count += len(fds) + sync_directory
        return ticket.end_offset

    # -- lifecycle and inspection ---------------------------------------------------------------
    def close(self) -> None:
        """Close the files without flushing (un-flushed data stays with the OS)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for segment in self._segments:
                os.close(segment.fd)

    def __enter__(self) -> SegmentLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def segment_paths(self) -> list[Path]:
        return [segment.path for segment in self._segments]

    # -- internals -----------------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self._closed:
            raise StorageError(f"{self.directory}: the log is closed")
        if self._failure is not None:
            raise StorageError(
                f"{self.directory}: an earlier I/O error ({self._failure}) left the log in an "
                "unknown state; restart to recover it from disk"
            )

    def _delete_segment(self, segment: _Segment) -> None:
        """Close, forget and unlink ``segment``."""
        index = self._segments.index(segment)
        os.close(segment.fd)
        del self._segments[index]
        del self._segment_bases[index]
        os.unlink(segment.path)
        self._dir_dirty = True

    def _lower_tickets(self, end_offset: int) -> None:
        """A flush in progress must not report more than the log now holds."""
        for ticket in self._tickets:
            ticket.end_offset = min(ticket.end_offset, end_offset)

    def _refuse_for_space(self, exc: OSError) -> LogFullError:
        """An append the disk had no room for: what part of it was written (a short write) is
        cut off again, so that the log is as before and no partial batch is ever read or
        flushed as one; the log stays usable and takes appends once there is room."""
        active = self._segments[-1]
        try:
            os.ftruncate(active.fd, active.size)
        except OSError as cut:
            raise self._fail("cutting an append the disk had no room for failed", cut) from exc
        self.full = True
        self.refused_for_space += 1
        return LogFullError(f"{self.directory}: no space left for an append ({exc.strerror})")

    def _fail(self, what: str, exc: OSError) -> StorageError:
        self._failure = exc
        return StorageError(f"{self.directory}: {what}: {exc}")

    def _locate(self, offset: int) -> tuple[int, int] | None:
        """(segment index, batch index) of the batch holding ``offset``."""
        index = bisect.bisect_right(self._segment_bases, offset) - 1
        if index < 0 or offset >= self.end_offset:
            return None
        bases = self._segments[index].bases
        batch = bisect.bisect_right(bases, offset) - 1
        if batch < 0:
            return None
        return index, batch

    def _batches_from(self, index: int, batch: int) -> Iterator[tuple[_Segment, int, int]]:
        for segment in self._segments[index:]:
            for position in range(batch, len(segment.positions)):
                yield segment, segment.positions[position], segment.batch_end(position)
            batch = 0

    def _append(self, batch: RecordBatch, encoded: bytes) -> None:
        with self._lock:
            self._check_usable()
            active = self._segments[-1]
            try:
                if active.size > 0 and active.size + len(encoded) > self._segment_bytes:
                    active = self._roll(batch.base_offset)
                write_all(active.fd, encoded, active.size)
            except OSError as exc:
                if exc.errno not in _NO_SPACE:
                    raise self._fail("append failed", exc) from exc
                raise self._refuse_for_space(exc) from exc
            self.full = False
            active.bases.append(batch.base_offset)
            active.positions.append(active.size)
            active.size += len(encoded)
            active.next_offset = batch.next_offset
            active.dirty = True
            self._epochs.append(batch.epoch, batch.base_offset)

    def _roll(self, base_offset: int) -> _Segment:
        outgoing = self._segments[-1]
        if outgoing.dirty:
            # Keeps the invariant that only the last segment may hold unflushed data.
            os.fsync(outgoing.fd)
            self.fsync_count += 1
            outgoing.dirty = False
        segment = self._new_segment(base_offset)
        self._dir_dirty = True
        return segment

    def _new_segment(self, base_offset: int) -> _Segment:
        path = self.directory / f"{base_offset:020d}{SEGMENT_SUFFIX}"
        fd = open_private(path, os.O_RDWR | os.O_EXCL)
        segment = _Segment(base_offset=base_offset, path=path, fd=fd, next_offset=base_offset)
        self._segments.append(segment)
        self._segment_bases.append(base_offset)
        return segment

    # -- recovery ------------------------------------------------------------------------------
    def _recover(self) -> None:
        ensure_directory(self.directory)
        if not self._open_segments():
            self._sync_found(self._new_segment(0))
            return
        # Everything is checked before the only modification recovery makes (the tail cut).
        damage = self._find_damage()
        last = self._segments[-1]
        if damage is not None:
            if not damage.torn_tail:
                raise CorruptLogError(damage.segment.path, damage.position, damage.reason)
            self._cut_tail(last, damage.position, damage.reason)
        self._sync_found(last)

    def _describe_damage(self, found: _Damage) -> LogDamage:
        """``found`` as the report of what a repair drops: the damaged segment from the defect on,
        then every later segment, each with the batches still recognisable in it."""
        index = self._segments.index(found.segment)
        starts_empty = found.position == 0 and index > 0
        valid_end = (self._segments[index - 1] if starts_empty else found.segment).next_offset
        dropped = tuple(
            self._recognisable_batches(segment, found.position, starts_empty, valid_end)
            if segment is found.segment
            else self._recognisable_batches(segment, 0, True, valid_end)
            for segment in self._segments[index:]
        )
        return LogDamage(found.segment.path, found.position, found.reason, found.torn_tail,
                         valid_end, dropped)

    def _recognisable_batches(
        self, segment: _Segment, position: int, deleted: bool, min_offset: int
    ) -> DroppedBytes:
        """The batches with a valid header and CRC32C from ``position`` on (resynchronising on
        the magic byte past anything else) that hold offsets from ``min_offset`` on."""
        size = os.fstat(segment.fd).st_size
        batches, first, end = 0, None, None
        if size > position:
            with (
                mmap.mmap(segment.fd, size, access=mmap.ACCESS_READ) as mapped,
                memoryview(mapped) as data,
            ):
                candidate = position
                while candidate + HEADER_SIZE <= size:
                    try:
                        header = read_batch_header(data, candidate)
                    except CorruptRecordError:
                        pass
                    else:
                        if header.base_offset >= min_offset:
                            batches += 1
                            first = header.base_offset if first is None else first
                            end = max(header.next_offset, end or 0)
                            candidate = header.end
                            continue
                    hit = mapped.find(_MAGIC_BYTE, candidate + 1 + _MAGIC_POSITION)
                    if hit < 0:
                        break
                    candidate = hit - _MAGIC_POSITION
        return DroppedBytes(segment.path, position, max(size - position, 0), deleted, batches,
                            first, end)

    def _open_segments(self) -> bool:
        """Open every segment file, oldest first; False when there is none."""
        names = sorted(
            (int(match.group(1)), entry.name)
            for entry in os.scandir(self.directory)
            if (match := _SEGMENT_NAME.fullmatch(entry.name)) and entry.is_file()
        )
        for base_offset, name in names:
            path = self.directory / name
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            segment = _Segment(base_offset=base_offset, path=path, fd=fd, next_offset=base_offset)
            self._segments.append(segment)
            self._segment_bases.append(base_offset)
        return bool(names)

    def _find_damage(self) -> _Damage | None:
        """Index every segment up to the first defect, which is returned; changes nothing. Only
        an undecodable tail of the last segment, with no valid batch after it, is a torn tail."""
        if not self._segments:
            return None
        *older, last = self._segments
        for segment in older:
            if (damage := self._check_starts_after_previous(segment)) is not None:
                return damage
            defect = self._scan(segment)
            if defect is not None:
                return _Damage(segment, defect.position, defect.reason, torn_tail=False)
            if not segment.bases:
                return _Damage(segment, 0, "empty segment before the last one", torn_tail=False)
        if (damage := self._check_starts_after_previous(last)) is not None:
            return damage
        defect = self._scan(last)
        if defect is None:
            return None
        if not defect.undecodable:
            return _Damage(last, defect.position, defect.reason, torn_tail=False)
        follower = self._find_valid_batch_after(last, defect.position)
        if follower is not None:
            reason = f"{defect.reason}, followed by a valid batch at byte {follower}"
            return _Damage(last, defect.position, reason, torn_tail=False)
        return _Damage(last, defect.position, defect.reason, torn_tail=True)

    def _meet_snapshot(self, snapshot_id: SnapshotId | None) -> None:
        """Reconcile the recovered log with the latest snapshot (see ``open``)."""
        snapshot_end = snapshot_id.end_offset if snapshot_id is not None else 0
        if self.start_offset > snapshot_end:
            covered = "there is no snapshot" if snapshot_id is None \
                else f"the latest snapshot ({snapshot_id}) ends at {snapshot_end}"
            raise StorageError(
                f"{self.directory}: the log starts at offset {self.start_offset} but {covered}: "
                "the offsets before the log start are lost; refusing to open the log"
            )
        if snapshot_id is None:
            return
        if snapshot_end > self.end_offset:
            logger.warning(
                "%s: the log ends at %d, before the latest snapshot %s: truncating the log to the "
                "snapshot (a crash after loading it)", self.directory, self.end_offset, snapshot_id
            )
            self.truncate_to_snapshot(snapshot_id)
        elif snapshot_end == self.start_offset:
            try:
                self._epochs.set_base(snapshot_id)
            except ValueError as exc:
                raise StorageError(
                    f"{self.directory}: the log does not continue snapshot {snapshot_id}: {exc}"
                ) from None

    def _sync_found(self, last: _Segment) -> None:
        """Make what open found durable. After a process crash (the OS kept running) the page
        cache still holds writes that were never fsynced; the caller may count everything found
        at open as flushed, so it must be.

        An fsync is not enough after one that failed: Linux marks the pages it could not write
        clean, so they show in the page cache yet a new fsync writes nothing. The last segment,
        the only one that can hold unflushed data, is written over with what it holds, which
        makes every page dirty again (at most one segment, which the scan just read whole)."""
        try:
            size = os.fstat(last.fd).st_size
            for position in range(0, size, _REWRITE_CHUNK):
                write_all(last.fd, _pread(last, position, min(size, position + _REWRITE_CHUNK)),
                          position)
            os.fsync(last.fd)
            fsync_directory(self.directory)
        except OSError as exc:
            raise StorageError(f"{self.directory}: making the log found at open durable failed "
                               f"(fsync failed): {exc}") from exc
        self.fsync_count += 2

    def _check_starts_after_previous(self, segment: _Segment) -> _Damage | None:
        index = self._segments.index(segment)
        if index > 0 and segment.base_offset != self._segments[index - 1].next_offset:
            reason = (f"segment starts at offset {segment.base_offset} but the log before it "
                      f"ends at {self._segments[index - 1].next_offset}")
            return _Damage(segment, 0, reason, torn_tail=False)
        return None

    def _cut_tail(self, segment: _Segment, position: int, reason: str) -> None:
        file_size = os.fstat(segment.fd).st_size
        logger.warning(
            "%s: cutting %d bytes at byte %d off the end of the log: %s (a torn or corrupt tail)",
            segment.path,
            file_size - position,
            position,
            reason,
        )
        os.ftruncate(segment.fd, position)

    def _scan(self, segment: _Segment) -> _Defect | None:
        """Index the segment's batches up to the first defect, which is returned."""
        size = os.fstat(segment.fd).st_size
        if size == 0:
            return None
        with (
            mmap.mmap(segment.fd, size, access=mmap.ACCESS_READ) as mapped,
            memoryview(mapped) as data,
        ):
            position = 0
            while position < size:
                try:
                    header = read_batch_header(data, position)
                    base, epoch, next_offset, end = (
                        header.base_offset, header.epoch, header.next_offset, header.end
                    )
                except CorruptRecordError as exc:
                    return _Defect(position, _describe(exc, position), undecodable=True)
                if base != segment.next_offset:
                    reason = f"batch holds offset {base}, expected {segment.next_offset}"
                    return _Defect(position, reason, undecodable=False)
                if epoch < self.last_fetched_epoch():
                    reason = f"batch epoch {epoch} is older than {self.last_fetched_epoch()}"
                    return _Defect(position, reason, undecodable=False)
                segment.bases.append(base)
                segment.positions.append(position)
                segment.next_offset = next_offset
                segment.size = position = end
                self._epochs.append(epoch, base)
        return None

    def _find_valid_batch_after(self, segment: _Segment, defect: int) -> int | None:
        """Position of a valid batch that could follow the undecodable one at ``defect``.

        Finding one means the defect is in the middle of the data, not a torn tail. Its length
        field may be what is damaged, so candidates are found by resynchronising on the magic byte;
        a candidate must decode with a good CRC and continue the log plausibly (offset and epoch),
        so stale or random bytes in a torn tail do not count.
        """
        size = os.fstat(segment.fd).st_size
        first_offset = segment.next_offset
        with (
            mmap.mmap(segment.fd, size, access=mmap.ACCESS_READ) as mapped,
            memoryview(mapped) as data,
        ):
            candidate = defect + 1
            while candidate + HEADER_SIZE <= size:
                hit = mapped.find(_MAGIC_BYTE, candidate + _MAGIC_POSITION)
                if hit < 0:
                    return None
                candidate = hit - _MAGIC_POSITION
                base, _, epoch = struct.unpack_from(">qii", data, candidate)
                # Each offset skipped since the defect needs at least one record's bytes.
                max_base = first_offset + (candidate - defect) // _MIN_RECORD_SIZE
                if first_offset <= base <= max_base and epoch >= self.last_fetched_epoch():
                    try:
                        decode_batch(data, candidate)
                    except CorruptRecordError:
                        pass
                    else:
                        return candidate
                candidate += 1
        return None


def _describe(exc: CorruptRecordError, position: int) -> str:
    """The decoder's reason, without its position when that is the batch's own."""
    return str(exc).removesuffix(f" at byte {position}")


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _pread(segment: _Segment, start: int, end: int) -> bytes:
    data = os.pread(segment.fd, end - start, start)
    if len(data) != end - start:
        raise StorageError(
            f"{segment.path}: short read at byte {start} ({len(data)} of {end - start} bytes): "
            "the file changed underneath the log"
        )
    return data
