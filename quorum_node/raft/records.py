"""Record batches: the unit that is appended, replicated, fsynced and checksummed.

One byte format serves the segment files, the wire (Fetch responses carry batches as bytes) and the
audit pipeline. All integers are big-endian::

    base_offset        int64
    batch_length       int32   bytes after this field
    epoch              int32   leader epoch that appended the batch
    magic              int8    format version, 2
    crc                uint32  CRC32C of every byte after this field
    attributes         int16   bit 5: control batch
    last_offset_delta  int32   record_count - 1
    timestamp_ms       int64   append time on the leader
    record_count       int32
    records            record_count x (key_len int32, key, value_len int32, value); len -1 = null

A control batch holds control records only; a control record's key is its type (int16) and its value
a JSON document (the LeaderChange message and, later, the voter records).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import crc32c

from quorum_node.raft.types import ControlRecordType

MAGIC = 2
CONTROL_FLAG = 0x20

_PREFIX = struct.Struct(">qi")  # base_offset, batch_length
_HEADER = struct.Struct(">qiibIhiqi")  # whole fixed header
HEADER_SIZE = _HEADER.size
# Bytes of the header that the batch_length field counts (everything after base_offset+length).
_COUNTED_HEADER = HEADER_SIZE - _PREFIX.size
# Offset of the first byte covered by the CRC (attributes), from the start of the batch.
_CRC_START = _PREFIX.size + 4 + 1 + 4
_RECORD_LEN = struct.Struct(">i")
_CONTROL_KEY = struct.Struct(">h")

# A batch larger than this is refused by the decoder as corrupt rather than allocated (8 MiB of
# records is Kafka's limit for a KRaft batch; the header adds a little).
MAX_BATCH_SIZE = 8 * 1024 * 1024 + HEADER_SIZE


class CorruptRecordError(ValueError):
    """The bytes do not hold a valid batch: bad length, bad CRC or inconsistent header."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(f"{message} at byte {position}")
        self.position = position


class TruncatedBatchError(CorruptRecordError):
    """The bytes end inside a batch (a torn write at the tail of a file)."""


@dataclass(frozen=True, slots=True)
class Record:
    value: bytes
    key: bytes | None = None


@dataclass(frozen=True, slots=True)
class RecordBatch:
    base_offset: int
    epoch: int
    records: tuple[Record, ...]
    timestamp_ms: int = 0
    is_control: bool = False
    crc: int = field(default=0, compare=False)
    # The batch's bytes, where it was decoded from or encoded to: appending it again (a
    # follower's append, a snapshot's copy) need not encode it again.
    encoded: bytes | None = field(default=None, compare=False, repr=False)

    @property
    def last_offset(self) -> int:
        return self.base_offset + len(self.records) - 1

    @property
    def next_offset(self) -> int:
        return self.base_offset + len(self.records)

    def encode(self) -> bytes:
        if self.encoded is not None:
            return self.encoded
        return encode_batch(
            self.base_offset, self.epoch, self.records, self.timestamp_ms, self.is_control
        )

    def control_records(self) -> Iterator[tuple[ControlRecordType, bytes]]:
        """(type, JSON payload) of each control record; unknown types are skipped."""
        if not self.is_control:
            return
        for record in self.records:
            record_type = control_record_type(record)
            if record_type is not None:
                yield record_type, record.value


def control_record(record_type: ControlRecordType, payload: bytes) -> Record:
    return Record(key=_CONTROL_KEY.pack(record_type), value=payload)


def control_record_type(record: Record) -> ControlRecordType | None:
    """The type of a record of a control batch; None for a key that names no known type."""
    if record.key is None or len(record.key) != _CONTROL_KEY.size:
        return None
    (type_code,) = _CONTROL_KEY.unpack(record.key)
    try:
        return ControlRecordType(type_code)
    except ValueError:
        return None


def encode_batch(
    base_offset: int,
    epoch: int,
    records: Sequence[Record],
    timestamp_ms: int,
    is_control: bool = False,
) -> bytes:
    if not records:
        raise ValueError("a batch holds at least one record")
    body = bytearray()
    for record in records:
        if record.key is None:
            body += _RECORD_LEN.pack(-1)
        else:
            body += _RECORD_LEN.pack(len(record.key))
            body += record.key
        body += _RECORD_LEN.pack(len(record.value))
        body += record.value
    attributes = CONTROL_FLAG if is_control else 0
    tail = struct.pack(">hiqi", attributes, len(records) - 1, timestamp_ms, len(records)) + body
    crc = crc32c.crc32c(tail)
    batch_length = 4 + 1 + 4 + len(tail)
    return struct.pack(">qiibI", base_offset, batch_length, epoch, MAGIC, crc) + tail


def batch_size_at(buffer: bytes | memoryview, position: int) -> int | None:
    """Total size of the batch starting at ``position``, or None if its prefix is incomplete."""
    if len(buffer) - position < _PREFIX.size:
        return None
    _, batch_length = _PREFIX.unpack_from(buffer, position)
    return int(_PREFIX.size + batch_length)


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    epoch: int
    record_count: int
    timestamp_ms: int
    is_control: bool
    crc: int
    position: int  # where the batch starts in the buffer
    end: int  # where the next batch starts

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count


def read_batch_header(
    buffer: bytes | memoryview, position: int = 0, *, verify_crc: bool = True
) -> BatchHeader:
    """Check the header of the batch at ``position`` and, with ``verify_crc``, its CRC32C, without
    parsing its records (the cheap check recovery runs over whole segments).

    Raises TruncatedBatchError when the buffer ends inside the batch and CorruptRecordError when the
    batch is complete but invalid.
    """
    available = len(buffer) - position
    if available < HEADER_SIZE:
        raise TruncatedBatchError("incomplete batch header", position)
    (base_offset, batch_length, epoch, magic, crc, attributes, last_delta, timestamp, count) = (
        _HEADER.unpack_from(buffer, position)
    )
    if batch_length < _COUNTED_HEADER or _PREFIX.size + batch_length > MAX_BATCH_SIZE:
        raise CorruptRecordError(f"invalid batch length {batch_length}", position)
    end = position + _PREFIX.size + batch_length
    if end > len(buffer):
        raise TruncatedBatchError("batch extends past the end of the data", position)
    if magic != MAGIC:
        raise CorruptRecordError(f"unknown batch magic {magic}", position)
    if verify_crc:
        actual_crc = crc32c.crc32c(buffer[position + _CRC_START : end])
        if actual_crc != crc:
            raise CorruptRecordError(
                f"CRC32C mismatch (stored {crc:#010x}, computed {actual_crc:#010x})", position
            )
    if count < 1 or last_delta != count - 1 or base_offset < 0 or epoch < 0:
        raise CorruptRecordError("inconsistent batch header", position)
    return BatchHeader(
        base_offset=base_offset,
        epoch=epoch,
        record_count=count,
        timestamp_ms=timestamp,
        is_control=bool(attributes & CONTROL_FLAG),
        crc=crc,
        position=position,
        end=end,
    )


def decode_batch(buffer: bytes | memoryview, position: int = 0) -> tuple[RecordBatch, int]:
    """Decode and verify one batch at ``position``; return it and the position after it.

    Raises TruncatedBatchError when the buffer ends inside the batch and CorruptRecordError when the
    batch is complete but invalid.
    """
    header = read_batch_header(buffer, position)
    end = header.end
    data = bytes(buffer[position:end])  # one copy; the records are slices of it
    records: list[Record] = []
    cursor = HEADER_SIZE
    size = len(data)
    unpack_length = _RECORD_LEN.unpack_from  # the hot loop of every fetch and read
    for _ in range(header.record_count):
        if cursor + 4 > size:
            raise CorruptRecordError("record length past the end of its batch", position + cursor)
        (length,) = unpack_length(data, cursor)
        cursor += 4
        key: bytes | None = None
        if length != -1:
            if length < 0 or cursor + length > size:
                raise CorruptRecordError(f"invalid record length {length}", position + cursor)
            key = data[cursor : cursor + length]
            cursor += length
        if cursor + 4 > size:
            raise CorruptRecordError("record length past the end of its batch", position + cursor)
        (length,) = unpack_length(data, cursor)
        cursor += 4
        if length < 0 or cursor + length > size:
            raise CorruptRecordError(f"invalid record length {length}", position + cursor)
        records.append(Record(data[cursor : cursor + length], key))
        cursor += length
    if cursor != size:
        raise CorruptRecordError("batch length does not match its records", position)
    batch = RecordBatch(
        base_offset=header.base_offset,
        epoch=header.epoch,
        records=tuple(records),
        timestamp_ms=header.timestamp_ms,
        is_control=header.is_control,
        crc=header.crc,
        encoded=data,
    )
    return batch, end


def decode_batches(buffer: bytes | memoryview) -> list[RecordBatch]:
    """Decode a concatenation of batches (a Fetch response's records); any defect raises."""
    batches: list[RecordBatch] = []
    position = 0
    while position < len(buffer):
        batch, position = decode_batch(buffer, position)
        batches.append(batch)
    return batches
