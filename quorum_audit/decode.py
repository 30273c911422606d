"""Decode a segment or snapshot file into Arrow record batches of audit rows: one row a record
(``decode_file``), or one row a batch (``decode_batches``: headers and CRC32C only, the cheap view
the audit takes of the bulk of a log).

Pure functions over bytes (no Spark, no I/O), so that they are tested and benchmarked alone and run
unchanged inside Spark's Python workers. Batch headers are read by the node's own decoder
(``read_batch_header``, which checks the CRC32C) and control records by ``decode_batch``; only the
walk over the records' length fields is done here, with numpy across all the batches of a chunk at
once, because a per-record Python loop is what would bound the audit's throughput.

Damage never raises. A batch whose CRC32C fails still yields its records, when their lengths hold
together, with ``checksum_ok`` false (so that the records that really differ can be told apart by
comparing checksums with other replicas). Bytes that do not parse as a batch become one row per
offset they must have held (known from the next valid batch, found by resynchronising on the magic
byte as the node's recovery does) or, with nothing valid after them, one row at the offset
expected there.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import crc32c
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from quorum_node.raft.records import (
    HEADER_SIZE,
    MAGIC,
    BatchHeader,
    CorruptRecordError,
    TruncatedBatchError,
    control_record_type,
    decode_batch,
    read_batch_header,
)
from quorum_node.raft.snapshot_format import read_snapshot_header
from quorum_node.raft.snapshots import CorruptSnapshotError
from quorum_node.raft.types import ControlRecordType

SOURCE_LOG = "log"
SOURCE_SNAPSHOT = "snapshot"

# What is wrong with a row's batch (the ``damage`` column; null when nothing is).
DAMAGE_CRC = "crc"  # the CRC32C does not match: the bytes changed after they were written
DAMAGE_UNPARSEABLE = "unparseable"  # not a batch at all: a damaged header or length
DAMAGE_TORN_TAIL = "torn_tail"  # the file ends inside a batch: a write cut short (or a live copy)
DAMAGE_SEQUENCE = "sequence"  # a valid batch out of place: offset gap or overlap, epoch regression
DAMAGE_SNAPSHOT = "snapshot"  # a snapshot without its header or footer

# The rows, in Arrow terms; the Spark schema is derived from this one.
SCHEMA = pa.schema([
    ("cluster_id", pa.string()),
    ("node_id", pa.int32()),
    ("directory_id", pa.string()),
    ("source", pa.string()),  # "log" or "snapshot"
    ("file", pa.string()),
    ("file_index", pa.int32()),  # the file's place in the load's list of files (see discover)
    ("snapshot_end_offset", pa.int64()),  # snapshot rows: the snapshot's id
    ("snapshot_epoch", pa.int32()),
    ("position", pa.int64()),  # byte position of the batch in the file
    ("batch_base_offset", pa.int64()),
    ("offset", pa.int64()),  # in a snapshot, the record's offset within it
    ("epoch", pa.int32()),
    ("timestamp_ms", pa.int64()),
    ("is_control", pa.bool_()),
    ("control_type", pa.int16()),  # Kafka's control record type; null for data records
    ("key", pa.binary()),
    ("value_size", pa.int32()),
    ("checksum", pa.int64()),  # CRC32C of the record's bytes (key length, key, value length, value)
    ("checksum_ok", pa.bool_()),  # the batch's CRC32C matched and its records parsed
    ("control_value", pa.string()),  # a control record's JSON document
    ("damage", pa.string()),
    ("error", pa.string()),  # what exactly is wrong, for people
])

# A row per batch: the audit's view of the bulk of the data (see decode_batches).
BATCH_SCHEMA = pa.schema([
    *[SCHEMA.field(name) for name in ("cluster_id", "node_id", "directory_id", "source", "file",
                                      "file_index", "snapshot_end_offset", "snapshot_epoch",
                                      "position")],
    ("size", pa.int64()),  # bytes
    ("base_offset", pa.int64()),
    ("last_offset", pa.int64()),
    ("epoch", pa.int32()),
    ("timestamp_ms", pa.int64()),
    ("record_count", pa.int32()),
    ("is_control", pa.bool_()),
    ("batch_crc", pa.int64()),  # the CRC32C stored in the batch
    ("checksum_ok", pa.bool_()),
    ("damage", pa.string()),
    ("error", pa.string()),
])

ROWS_PER_ARROW_BATCH = 1 << 19
_MAGIC_POSITION = 16  # of the magic byte within a batch (after base offset, length and epoch)
_MIN_RECORD_SIZE = 8  # key length and value length
_LENGTH = struct.Struct(">i")
_NO_TIMESTAMP = np.iinfo(np.int64).min
# Below this many batches still being walked, a plain loop beats numpy's per-call overhead.
_VECTOR_MIN_BATCHES = 16

Int64s = npt.NDArray[np.int64]
Bytes = npt.NDArray[np.uint8]


@dataclass(frozen=True)
class FileIdentity:
    """Where a file comes from: the columns that every row of it repeats."""

    cluster_id: str
    node_id: int
    directory_id: str
    file: str
    file_index: int = 0
    source: str = SOURCE_LOG
    snapshot_end_offset: int | None = None
    snapshot_epoch: int | None = None


@dataclass
class _Piece:
    """Rows of consecutive records that share their damage (none, mostly). Integer columns use
    -1 for null (offsets, epochs and sizes are never negative)."""

    position: Int64s
    base: Int64s
    offset: Int64s
    epoch: Int64s
    timestamp: Int64s
    control: npt.NDArray[np.bool_]
    record_start: Int64s  # -1: the record's bytes are unknown
    record_end: Int64s
    key_size: Int64s  # -1: null key
    value_size: Int64s
    control_rows: dict[int, tuple[int | None, str]]  # row -> (control type, JSON)
    ok: bool
    damage: str | None = None
    error: str | None = None

    def __len__(self) -> int:
        return len(self.offset)


@dataclass(frozen=True)
class Scanned:
    """One batch of a file, or bytes where a batch should be: what the scan found, in order."""

    position: int
    end: int  # where the next one starts
    first_offset: int  # the offsets it holds (inferred from its neighbours when unparseable)
    end_offset: int
    header: BatchHeader | None  # None: the bytes do not parse as a batch
    damage: str | None = None
    error: str | None = None

    @property
    def checksum_ok(self) -> bool:
        # A batch out of sequence is intact (its CRC held); only its place is wrong.
        return self.header is not None and self.damage in (None, DAMAGE_SEQUENCE)


def scan(data: pa.Buffer | bytes, first_offset: int, *, snapshot: bool = False
         ) -> Iterator[Scanned]:
    """Every batch header of a file, checked (CRC32C included) by the node's own decoder, and
    every defect: at disk speed, since no record is parsed."""
    view = memoryview(data).cast("B")
    array: Bytes = np.frombuffer(view, dtype=np.uint8)
    if snapshot and (problem := _snapshot_header_problem(view)):
        yield Scanned(0, 0, first_offset, first_offset + 1, None, DAMAGE_SNAPSHOT, problem)
    position, expected, last_epoch = 0, first_offset, -1
    last: BatchHeader | None = None
    while position < len(view):
        try:
            header = read_batch_header(view, position)
        except CorruptRecordError as error:
            found = _damaged(view, array, position, expected=expected, last_epoch=last_epoch,
                             error=error)
            yield found
            position, expected = found.end, found.end_offset
            continue
        damage = reason = None
        if header.base_offset != expected:
            damage, reason = DAMAGE_SEQUENCE, \
                f"batch holds offset {header.base_offset}, expected {expected}"
        elif header.epoch < last_epoch:
            damage, reason = DAMAGE_SEQUENCE, \
                f"batch epoch {header.epoch} is older than {last_epoch}"
        yield Scanned(position, header.end, header.base_offset, header.next_offset, header,
                      damage, reason)
        position, expected, last_epoch, last = header.end, header.next_offset, header.epoch, \
            header
    if snapshot and not _is_footer(view, last):
        yield Scanned(position, position, expected, expected + 1, None, DAMAGE_SNAPSHOT,
                      f"the snapshot has no footer after byte {position} (truncated)")


def decode_file(data: pa.Buffer | bytes, identity: FileIdentity, first_offset: int,
                schema: pa.Schema = SCHEMA, only: frozenset[int] | None = None
                ) -> Iterator[pa.RecordBatch]:
    """The rows of one file, a row per record, in Arrow batches of at most about
    ``ROWS_PER_ARROW_BATCH`` rows, with the columns of ``schema`` (a subset of ``SCHEMA``).
    ``first_offset`` is where the file's name says it starts (a segment's base offset; 0 for a
    snapshot); ``only``, if given, the byte positions of the batches wanted."""
    view = memoryview(data).cast("B")
    array: Bytes = np.frombuffer(view, dtype=np.uint8)
    pieces: list[_Piece] = []
    run: list[BatchHeader] = []
    run_rows = 0
    for found in scan(data, first_offset, snapshot=identity.source == SOURCE_SNAPSHOT):
        if only is not None and found.position not in only:
            continue
        if found.header is not None and found.damage is None:
            run.append(found.header)
            run_rows += found.header.record_count
        else:
            pieces += _walk_run(view, array, run)
            run, run_rows = [], 0
            if found.header is None:
                pieces.append(_lost(found.position, found.first_offset, found.end_offset,
                                    found.damage or DAMAGE_UNPARSEABLE, found.error or ""))
            else:
                pieces += _walk_run(view, array, [found.header], found.damage, found.error,
                                    ok=found.checksum_ok)
        if run_rows >= ROWS_PER_ARROW_BATCH:
            pieces += _walk_run(view, array, run)
            run, run_rows = [], 0
            yield _to_arrow(pieces, view, array, identity, schema)
            pieces = []
    pieces += _walk_run(view, array, run)
    if pieces:
        yield _to_arrow(pieces, view, array, identity, schema)


def decode_batches(data: pa.Buffer | bytes, identity: FileIdentity, first_offset: int,
                   schema: pa.Schema = BATCH_SCHEMA) -> Iterator[pa.RecordBatch]:
    """The rows of one file, a row per batch (``BATCH_SCHEMA``): all the audit needs from the
    bulk of a log, since a batch's CRC32C covers every byte of its records."""
    found = list(scan(data, first_offset, snapshot=identity.source == SOURCE_SNAPSHOT))
    rows = len(found)

    def ints(values: Iterator[int | None], kind: pa.DataType) -> pa.Array:
        return pa.array(list(values), type=kind)

    builders: dict[str, Callable[[], pa.Array]] = {
        **_identity_columns(identity, rows),
        "position": lambda: ints((f.position for f in found), pa.int64()),
        "size": lambda: ints((f.end - f.position for f in found), pa.int64()),
        "base_offset": lambda: ints((f.first_offset for f in found), pa.int64()),
        "last_offset": lambda: ints((f.end_offset - 1 for f in found), pa.int64()),
        "epoch": lambda: ints((f.header.epoch if f.header else None for f in found), pa.int32()),
        "timestamp_ms": lambda: ints((f.header.timestamp_ms if f.header else None for f in found),
                                     pa.int64()),
        "record_count": lambda: ints((f.header.record_count if f.header else None for f in found),
                                     pa.int32()),
        "is_control": lambda: pa.array([f.header is not None and f.header.is_control
                                        for f in found]),
        "batch_crc": lambda: ints((f.header.crc if f.header else None for f in found), pa.int64()),
        "checksum_ok": lambda: pa.array([f.checksum_ok for f in found]),
        "damage": lambda: pa.array([f.damage for f in found], pa.string()),
        "error": lambda: pa.array([f.error for f in found], pa.string()),
    }
    if rows:
        yield pa.RecordBatch.from_arrays([builders[name]() for name in schema.names],
                                         schema=schema)


def _snapshot_header_problem(view: memoryview) -> str | None:
    try:
        read_snapshot_header(view)
    except CorruptSnapshotError as error:
        return str(error)
    return None


def _is_footer(view: memoryview, header: BatchHeader | None) -> bool:
    if header is None or not header.is_control:
        return False
    batch, _ = decode_batch(view, header.position)
    return [control_record_type(r) for r in batch.records] == [ControlRecordType.SNAPSHOT_FOOTER]


def _damaged(view: memoryview, array: Bytes, position: int, *, expected: int, last_epoch: int,
             error: CorruptRecordError) -> Scanned:
    """What the bytes at ``position`` are, when they do not pass as a batch."""
    reason = str(error)
    try:
        header = read_batch_header(view, position, verify_crc=False)
    except CorruptRecordError:
        header = None
    if header is not None and header.base_offset == expected:
        # Only the CRC failed: the header holds together, so the records may still be read.
        return Scanned(position, header.end, header.base_offset, header.next_offset, header,
                       DAMAGE_CRC, reason)
    following = _next_valid_batch(view, array, position, expected, last_epoch)
    if following is None:
        damage = DAMAGE_TORN_TAIL if isinstance(error, TruncatedBatchError) else \
            DAMAGE_UNPARSEABLE
        what = f"{len(view) - position} bytes from byte {position} to the end do not parse " \
               f"({reason})"
        return Scanned(position, len(view), expected, expected + 1, None, damage, what)
    what = f"bytes {position}-{following.position} do not parse ({reason})"
    return Scanned(position, following.position, expected,
                   max(following.base_offset, expected + 1), None, DAMAGE_UNPARSEABLE, what)


def _next_valid_batch(view: memoryview, array: Bytes, defect: int, expected: int,
                      last_epoch: int) -> BatchHeader | None:
    """The first intact batch after ``defect`` that could continue the file (offset and epoch
    plausible: each offset skipped needs at least one record's bytes), found by resynchronising
    on the magic byte, since the damaged length cannot be trusted."""
    candidate = defect + 1
    while candidate + HEADER_SIZE <= len(array):
        hit = _find_magic(array, candidate + _MAGIC_POSITION)
        if hit < 0:
            return None
        candidate = hit - _MAGIC_POSITION
        base, _, epoch = struct.unpack_from(">qii", view, candidate)
        if expected <= base <= expected + (candidate - defect) // _MIN_RECORD_SIZE \
                and epoch >= last_epoch:
            try:
                return read_batch_header(view, candidate)
            except CorruptRecordError:
                pass
        candidate += 1
    return None


def _find_magic(array: Bytes, start: int) -> int:
    """Index of the next magic byte at or after ``start``; -1 if none (searched a window at a
    time, so that a defect near the start of a big file does not scan all of it)."""
    window = 1 << 16
    while start < len(array):
        hits = np.flatnonzero(array[start:start + window] == MAGIC)
        if len(hits):
            return start + int(hits[0])
        start += window
    return -1


def _lost(position: int, first: int, end: int, damage: str, error: str) -> _Piece:
    """Rows for offsets whose records could not be read at all."""
    count = end - first
    unknown = np.full(count, -1, np.int64)
    return _Piece(
        position=np.full(count, position, np.int64), base=unknown, offset=np.arange(first, end),
        epoch=unknown, timestamp=np.full(count, _NO_TIMESTAMP, np.int64),
        control=np.zeros(count, np.bool_), record_start=unknown, record_end=unknown,
        key_size=unknown, value_size=unknown, control_rows={}, ok=False, damage=damage,
        error=error)


def _walk_run(view: memoryview, array: Bytes, headers: list[BatchHeader],
              damage: str | None = None, error: str | None = None, *, ok: bool = True
              ) -> list[_Piece]:
    """One piece for consecutive batches, records located by their length fields."""
    if not headers:
        return []
    counts = np.fromiter((h.record_count for h in headers), np.int64, len(headers))
    starts = np.fromiter((h.position for h in headers), np.int64, len(headers))
    ends = np.fromiter((h.end for h in headers), np.int64, len(headers))
    record_start, key_size, value_size, broken = _walk(array, starts + HEADER_SIZE, ends, counts)
    record_end = np.where(record_start >= 0, record_start + 8 + np.maximum(key_size, 0)
                          + value_size, -1)
    batch_of_row = np.repeat(np.arange(len(headers)), counts)
    bases = np.fromiter((h.base_offset for h in headers), np.int64, len(headers))
    first_row = np.cumsum(counts) - counts
    offset = bases[batch_of_row] + (np.arange(len(batch_of_row)) - first_row[batch_of_row])
    control_rows: dict[int, tuple[int | None, str]] = {}
    for index, header in enumerate(headers):
        if header.is_control and not broken[index]:
            control_rows.update(_control_rows(view, header, int(first_row[index])))
    pieces = [_Piece(
        position=starts[batch_of_row], base=bases[batch_of_row], offset=offset,
        epoch=np.fromiter((h.epoch for h in headers), np.int64, len(headers))[batch_of_row],
        timestamp=np.fromiter((h.timestamp_ms for h in headers), np.int64,
                              len(headers))[batch_of_row],
        control=np.fromiter((h.is_control for h in headers), np.bool_, len(headers))[batch_of_row],
        record_start=record_start, record_end=record_end, key_size=key_size,
        value_size=value_size, control_rows=control_rows, ok=ok, damage=damage, error=error)]
    if broken.any():
        # Rare (a writer bug, or damage the CRC missed): split the run around such batches.
        return _split_broken(pieces[0], broken[batch_of_row], damage, error)
    return pieces


def _split_broken(piece: _Piece, broken_rows: npt.NDArray[np.bool_], damage: str | None,
                  error: str | None) -> list[_Piece]:
    piece.record_start[broken_rows] = -1
    piece.record_end[broken_rows] = -1
    piece.key_size[broken_rows] = -1
    piece.value_size[broken_rows] = -1
    pieces: list[_Piece] = []
    edges = np.flatnonzero(np.diff(broken_rows.astype(np.int8))) + 1
    for lo, hi in zip([0, *edges.tolist()], [*edges.tolist(), len(piece)], strict=True):
        is_broken = bool(broken_rows[lo])
        pieces.append(_Piece(
            position=piece.position[lo:hi], base=piece.base[lo:hi], offset=piece.offset[lo:hi],
            epoch=piece.epoch[lo:hi], timestamp=piece.timestamp[lo:hi],
            control=piece.control[lo:hi], record_start=piece.record_start[lo:hi],
            record_end=piece.record_end[lo:hi], key_size=piece.key_size[lo:hi],
            value_size=piece.value_size[lo:hi],
            control_rows={row - lo: v for row, v in piece.control_rows.items() if lo <= row < hi},
            ok=piece.ok and not is_broken,
            damage=(damage or DAMAGE_UNPARSEABLE) if is_broken else damage,
            error=(error or "the batch's records do not match its length") if is_broken
            else error))
    return pieces


def _control_rows(view: memoryview, header: BatchHeader, first_row: int
                  ) -> Iterator[tuple[int, tuple[int | None, str]]]:
    try:
        batch, _ = decode_batch(view, header.position)
    except CorruptRecordError:  # a CRC-failed control batch: its JSON cannot be trusted either
        return
    for index, record in enumerate(batch.records):
        record_type = control_record_type(record)
        yield first_row + index, (None if record_type is None else int(record_type),
                                  record.value.decode("utf-8", "replace"))


def _walk(array: Bytes, cursors: Int64s, ends: Int64s, counts: Int64s
          ) -> tuple[Int64s, Int64s, Int64s, npt.NDArray[np.bool_]]:
    """Locate every record of the batches whose records start at ``cursors``: the k-th record of
    every batch is found in one vectorised step. Returns each record's start, key size (-1 null)
    and value size, in batch order, and which batches do not parse."""
    return _Walk(array, cursors, ends, counts).run()


class _Walk:
    def __init__(self, array: Bytes, cursors: Int64s, ends: Int64s, counts: Int64s) -> None:
        total = int(counts.sum())
        self.array = array
        self.cursors = cursors.copy()
        self.ends = ends
        self.counts = counts
        self.record_start = np.full(total, -1, np.int64)
        self.key_size = np.full(total, -1, np.int64)
        self.value_size = np.full(total, -1, np.int64)
        self.broken = np.zeros(len(counts), np.bool_)
        self.first_row = np.cumsum(counts) - counts

    def run(self) -> tuple[Int64s, Int64s, Int64s, npt.NDArray[np.bool_]]:
        order = np.argsort(-self.counts, kind="stable")  # batches still walking: a prefix
        sorted_counts = self.counts[order]
        step = 0
        while True:
            active = int(np.searchsorted(-sorted_counts, -step, side="left"))
            if active < _VECTOR_MIN_BATCHES:
                break
            self._step(order[:active], step)
            step += 1
        for batch in order[:active].tolist():  # the few long batches left: a plain loop
            self.broken[batch] |= self._walk_one(batch, step)
        self.broken |= self.cursors != self.ends
        return self.record_start, self.key_size, self.value_size, self.broken

    def _step(self, batches: Int64s, step: int) -> None:
        at = self.cursors[batches]
        limit = self.ends[batches]
        keys = _be32(self.array, at, limit)
        value_at = at + 4 + np.maximum(keys, 0)
        values = _be32(self.array, value_at, limit)
        end = value_at + 4 + values
        bad = (at + 4 > limit) | (keys < -1) | (value_at + 4 > limit) | (values < 0) | \
            (end > limit)
        rows = self.first_row[batches] + step
        self.record_start[rows] = at
        self.key_size[rows] = keys
        self.value_size[rows] = values
        self.broken[batches] |= bad
        self.cursors[batches] = np.where(bad, limit, end)

    def _walk_one(self, batch: int, step: int) -> bool:
        """The rest of one batch's records from record ``step``; True if they do not parse."""
        data = self.array.data
        at, limit = int(self.cursors[batch]), int(self.ends[batch])
        first = int(self.first_row[batch])
        for row in range(first + step, first + int(self.counts[batch])):
            if at + 8 > limit:
                return True
            (keys,) = _LENGTH.unpack_from(data, at)
            value_at = at + 4 + max(keys, 0)
            if keys < -1 or value_at + 4 > limit:
                return True
            (values,) = _LENGTH.unpack_from(data, value_at)
            if values < 0 or value_at + 4 + values > limit:
                return True
            self.record_start[row], self.key_size[row], self.value_size[row] = at, keys, values
            at = value_at + 4 + values
        self.cursors[batch] = at
        return False


_FOUR = np.arange(4, dtype=np.int64)
_SHIFTS = np.array([24, 16, 8, 0], dtype=np.int64)


def _be32(array: Bytes, at: Int64s, limit: Int64s) -> Int64s:
    """The big-endian int32 at each position (0 where it would not fit before ``limit``)."""
    fits = at + 4 <= limit
    safe = np.where(fits, at, 0)
    raw = (array[safe[:, None] + _FOUR].astype(np.int64) << _SHIFTS).sum(axis=1)
    signed: Int64s = np.where(raw >= 1 << 31, raw - (1 << 32), raw)
    return np.where(fits, signed, 0)


def _to_arrow(pieces: list[_Piece], view: memoryview, array: Bytes, identity: FileIdentity,
              schema: pa.Schema) -> pa.RecordBatch:
    """The rows of ``pieces`` with the columns of ``schema`` only: a column nobody reads (the
    audit reads a dozen) costs nothing to build nor to hand to Spark."""
    rows = sum(len(p) for p in pieces)

    def column(name: str) -> Int64s:
        return np.concatenate([getattr(p, name) for p in pieces])

    def checksums() -> pa.Array:
        record_start, record_end = column("record_start"), column("record_end")
        known = record_start >= 0
        values = np.full(rows, -1, np.int64)
        starts, ends = record_start[known].tolist(), record_end[known].tolist()
        values[known] = [crc32c.crc32c(view[s:e]) for s, e in zip(starts, ends, strict=True)]
        return _nullable(values, pa.int64())

    control_type = np.full(rows, -1, np.int64)
    control_value = np.full(rows, None, dtype=object)
    has_control = np.zeros(rows, np.bool_)
    damage = np.full(rows, None, dtype=object)
    error = np.full(rows, None, dtype=object)
    ok = np.ones(rows, np.bool_)
    first = 0
    for piece in pieces:
        for row, (kind, document) in piece.control_rows.items():
            control_type[first + row] = -1 if kind is None else kind
            control_value[first + row] = document
            has_control[first + row] = True
        if piece.damage is not None or not piece.ok:
            damage[first:first + len(piece)] = piece.damage
            error[first:first + len(piece)] = piece.error
            ok[first:first + len(piece)] = piece.ok and piece.damage is None
        first += len(piece)

    def strings(values: npt.NDArray[np.object_], present: bool) -> pa.Array:
        # All-null columns (the common case) without a pass over Python objects.
        return pa.array(values, pa.string()) if present else pa.nulls(rows, pa.string())

    def timestamps() -> pa.Array:
        timestamp = column("timestamp")
        return pa.array(timestamp, mask=timestamp == _NO_TIMESTAMP)

    builders: dict[str, Callable[[], pa.Array]] = {
        **_identity_columns(identity, rows),
        "position": lambda: pa.array(column("position")),
        "batch_base_offset": lambda: _nullable(column("base"), pa.int64()),
        "offset": lambda: pa.array(column("offset")),
        "epoch": lambda: _nullable(column("epoch"), pa.int32()),
        "timestamp_ms": timestamps,
        "is_control": lambda: pa.array(column("control")),
        "control_type": lambda: _nullable(control_type, pa.int16(), ~has_control),
        "key": lambda: _keys(array, column("record_start"), column("key_size")),
        "value_size": lambda: _nullable(column("value_size"), pa.int32()),
        "checksum": checksums,
        "checksum_ok": lambda: pa.array(ok),
        "control_value": lambda: strings(control_value, bool(has_control.any())),
        "damage": lambda: strings(damage, not ok.all()),
        "error": lambda: strings(error, not ok.all()),
    }
    return pa.RecordBatch.from_arrays([builders[name]() for name in schema.names],
                                      schema=schema)


def _identity_columns(identity: FileIdentity, rows: int) -> dict[str, Callable[[], pa.Array]]:
    """Builders of the columns every row of a file repeats."""
    def constant(value: object, kind: pa.DataType) -> Callable[[], pa.Array]:
        return lambda: pa.repeat(pa.scalar(value, kind), rows)

    return {
        "cluster_id": constant(identity.cluster_id, pa.string()),
        "node_id": constant(identity.node_id, pa.int32()),
        "directory_id": constant(identity.directory_id, pa.string()),
        "source": constant(identity.source, pa.string()),
        "file": constant(identity.file, pa.string()),
        "file_index": constant(identity.file_index, pa.int32()),
        "snapshot_end_offset": constant(identity.snapshot_end_offset, pa.int64()),
        "snapshot_epoch": constant(identity.snapshot_epoch, pa.int32()),
    }


def _nullable(values: Int64s, kind: pa.DataType,
              null: npt.NDArray[np.bool_] | None = None) -> pa.Array:
    mask = values < 0 if null is None else null
    return pa.array(values.astype(kind.to_pandas_dtype()), type=kind, mask=mask)


def _keys(array: Bytes, record_start: Int64s, key_size: Int64s) -> pa.Array:
    """The keys as one Arrow binary column, gathered without a Python loop."""
    present = (record_start >= 0) & (key_size >= 0)
    sizes = np.where(present, key_size, 0)
    offsets = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    total = int(offsets[-1])
    gather = np.repeat(record_start + 4 - offsets[:-1], sizes) + np.arange(total)
    data = array[gather] if total else np.zeros(0, np.uint8)
    validity = np.packbits(present, bitorder="little")
    return pa.Array.from_buffers(
        pa.binary(), len(sizes),
        [pa.py_buffer(validity), pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)],
        null_count=int(len(sizes) - present.sum()))
