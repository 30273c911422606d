"""The bytes of a snapshot (KIP-630), laid out as Kafka lays out a ``.checkpoint`` file.

A snapshot is ordinary record batches back to back, offsets counting from 0 within it::

    control batch   SnapshotHeader {"Version": 0, "LastContainedLogTimestamp": ms}
                    [KRaftVoters: the voter set as of the snapshot's end offset]
    data batches    the state machine's records, in order
    control batch   SnapshotFooter {"Version": 0}

Every batch carries its CRC32C, and the footer proves the snapshot is complete: a download cut
short or a file torn by a crash is refused as a whole rather than loaded in part. Pure functions,
no I/O; every defect in the bytes raises ``CorruptSnapshotError`` and nothing else.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeGuard

from quorum_node.raft.records import (
    HEADER_SIZE,
    MAX_BATCH_SIZE,
    CorruptRecordError,
    Record,
    RecordBatch,
    control_record,
    control_record_type,
    decode_batch,
    encode_batch,
    read_batch_header,
)
from quorum_node.raft.snapshots import Buffer, CorruptSnapshotError
from quorum_node.raft.types import ControlRecordType, ReplicaKey
from quorum_node.raft.voters import parse_voters_record, voters_record

SNAPSHOT_VERSION = 0
# Snapshot batches are not log entries, so their epoch means nothing; it is always 0 and checked,
# because the CRC does not cover it (only the attributes onwards).
_EPOCH = 0
_RECORD_OVERHEAD = 8  # key and value length fields
# Room for the records of one data batch, so that the decoder (which refuses bigger batches as
# corrupt) can read back every batch we write.
_MAX_BATCH_PAYLOAD = MAX_BATCH_SIZE - HEADER_SIZE


@dataclass(frozen=True)
class SnapshotContents:
    last_contained_timestamp_ms: int
    voters: tuple[ReplicaKey, ...] | None
    records: list[Record]  # the data records, in order


@dataclass(frozen=True)
class SnapshotHeader:
    """What the first batch says, and where the data batches start."""

    last_contained_timestamp_ms: int
    voters: tuple[ReplicaKey, ...] | None
    size: int  # bytes of the header batch
    next_offset: int  # offset of the first data record


def encode_snapshot(
    voters: Sequence[ReplicaKey] | None,
    last_contained_timestamp_ms: int,
    records: Iterable[Record],
    records_per_batch: int = 1000,
) -> bytes:
    """Frame ``records`` as a snapshot, with ``voters`` (if given) in the header batch."""
    return b"".join(encode_snapshot_batches(voters, last_contained_timestamp_ms, records,
                                            records_per_batch))


def encode_snapshot_batches(
    voters: Sequence[ReplicaKey] | None,
    last_contained_timestamp_ms: int,
    records: Iterable[Record],
    records_per_batch: int = 1000,
) -> Iterator[bytes]:
    """``encode_snapshot``, one batch at a time: a large snapshot is written as it is framed,
    never held whole in memory."""
    if records_per_batch < 1:
        raise ValueError(f"records_per_batch must be positive, not {records_per_batch}")
    timestamp = last_contained_timestamp_ms
    header = [control_record(ControlRecordType.SNAPSHOT_HEADER, _json(
        {"Version": SNAPSHOT_VERSION, "LastContainedLogTimestamp": timestamp}))]
    if voters is not None:
        header.append(voters_record(voters))
    yield encode_batch(0, _EPOCH, header, timestamp, is_control=True)
    offset = len(header)
    pending: list[Record] = []
    pending_bytes = 0
    for record in records:
        size = _RECORD_OVERHEAD + len(record.value) + len(record.key or b"")
        if size > _MAX_BATCH_PAYLOAD:
            raise ValueError(f"a record of {size} bytes does not fit in a batch")
        if pending and (pending_bytes + size > _MAX_BATCH_PAYLOAD
                        or len(pending) == records_per_batch):
            yield encode_batch(offset, _EPOCH, pending, timestamp)
            offset += len(pending)
            pending, pending_bytes = [], 0
        pending.append(record)
        pending_bytes += size
    if pending:
        yield encode_batch(offset, _EPOCH, pending, timestamp)
        offset += len(pending)
    footer = control_record(ControlRecordType.SNAPSHOT_FOOTER, _json({"Version": SNAPSHOT_VERSION}))
    yield encode_batch(offset, _EPOCH, [footer], timestamp, is_control=True)


def read_snapshot(data: Buffer) -> SnapshotContents:
    """Decode and check a whole snapshot; ``CorruptSnapshotError`` on any defect."""
    header = read_snapshot_header(data)
    records = list(iter_snapshot_records(data))
    return SnapshotContents(header.last_contained_timestamp_ms, header.voters, records)


def check_snapshot(data: Buffer) -> SnapshotHeader:
    """Check a whole snapshot (for a big one, e.g. an mmapped file) at about disk speed: the
    header and footer, every batch's framing, CRC32C, offsets and epoch. Data records are only
    parsed by ``read_snapshot`` (a batch whose CRC matches holds what its writer encoded).
    Returns the header."""
    header = read_snapshot_header(data)
    position, offset = header.size, header.next_offset
    while position < len(data):
        try:
            # Headers and CRCs only: data records are parsed when the snapshot is loaded.
            batch_header = read_batch_header(data, position)
        except CorruptRecordError as error:
            raise CorruptSnapshotError(f"corrupt snapshot batch: {error}") from None
        if batch_header.is_control:
            break  # the footer (or a defect), which the full walk below checks
        if batch_header.base_offset != offset or batch_header.epoch != _EPOCH:
            break
        position, offset = batch_header.end, batch_header.next_offset
    _check_tail(data, position, offset)
    return header


def read_snapshot_header(data: Buffer) -> SnapshotHeader:
    """Decode and check the header batch at the start of ``data``; what follows it is not looked
    at (it may be absent), so this is all reading the voters of a snapshot costs."""
    batch, end = _decode(data, 0, expected_offset=0)
    if not batch.is_control:
        raise CorruptSnapshotError("the first batch is not a control batch (no snapshot header)")
    first, *rest = batch.records
    if control_record_type(first) is not ControlRecordType.SNAPSHOT_HEADER:
        raise CorruptSnapshotError("the first record is not a snapshot header")
    fields = _parse_json(first.value, "snapshot header")
    timestamp = fields.get("LastContainedLogTimestamp")
    if not _is_int(timestamp):
        raise CorruptSnapshotError(f"snapshot header without a timestamp: {fields}")
    voters: tuple[ReplicaKey, ...] | None = None
    for record in rest:
        record_type = control_record_type(record)
        if record_type is ControlRecordType.KRAFT_VOTERS:
            if voters is not None:
                raise CorruptSnapshotError("the snapshot header batch holds two voter sets")
            try:
                voters = parse_voters_record(record.value)
            except ValueError as error:
                raise CorruptSnapshotError(f"snapshot voter set: {error}") from None
        elif record_type in (ControlRecordType.SNAPSHOT_HEADER, ControlRecordType.SNAPSHOT_FOOTER):
            raise CorruptSnapshotError(f"unexpected {record_type.name} in the header batch")
        # Other control records (Kafka's KRaftVersion, types we do not know) carry nothing we use.
    return SnapshotHeader(timestamp, voters, end, batch.next_offset)


def iter_snapshot_records(data: Buffer) -> Iterator[Record]:
    """The data records of a snapshot, checked batch by batch as they are read.

    A defect raises ``CorruptSnapshotError`` when it is reached, at the latest once the end is:
    records already yielded are trustworthy only once the iteration has run to its end."""
    header = read_snapshot_header(data)
    yield from _records_from(data, header.size, header.next_offset)


def _check_tail(data: Buffer, position: int, offset: int) -> None:
    collections.deque(_records_from(data, position, offset), maxlen=0)


def _records_from(data: Buffer, position: int, offset: int) -> Iterator[Record]:
    while True:
        if position >= len(data):
            raise CorruptSnapshotError(
                f"the snapshot ends at byte {position} without a footer (truncated)")
        batch, position = _decode(data, position, expected_offset=offset)
        offset = batch.next_offset
        if not batch.is_control:
            yield from batch.records
            continue
        if [control_record_type(r) for r in batch.records] != [ControlRecordType.SNAPSHOT_FOOTER]:
            raise CorruptSnapshotError(
                f"control batch at offset {batch.base_offset} is not a lone snapshot footer")
        _parse_json(batch.records[0].value, "snapshot footer")
        if position != len(data):
            raise CorruptSnapshotError(
                f"{len(data) - position} bytes follow the snapshot footer at byte {position}")
        return


def _decode(data: Buffer, position: int, *, expected_offset: int) -> tuple[RecordBatch, int]:
    try:
        batch, end = decode_batch(data, position)  # checks the CRC32C
    except CorruptRecordError as error:
        raise CorruptSnapshotError(f"corrupt snapshot batch: {error}") from None
    if batch.base_offset != expected_offset:
        raise CorruptSnapshotError(
            f"batch at byte {position} starts at offset {batch.base_offset}, "
            f"expected {expected_offset}")
    if batch.epoch != _EPOCH:
        raise CorruptSnapshotError(f"batch at byte {position} has epoch {batch.epoch}, not 0")
    return batch, end


def _json(document: dict[str, int]) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


def _parse_json(payload: bytes, what: str) -> dict[str, object]:
    try:
        fields = json.loads(payload)
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError
        raise CorruptSnapshotError(f"{what} is not JSON: {error}") from None
    if not isinstance(fields, dict) or not _is_int(version := fields.get("Version")) \
            or version != SNAPSHOT_VERSION:
        raise CorruptSnapshotError(f"unknown {what}: {payload!r}")
    return fields


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is not 1
