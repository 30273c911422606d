"""The snapshot byte format: round trips, Kafka's layout, and every defect refused as one error."""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorum_node.raft.records import (
    Record,
    control_record,
    control_record_type,
    decode_batches,
    encode_batch,
)
from quorum_node.raft.snapshot_format import (
    SnapshotContents,
    check_snapshot,
    encode_snapshot,
    iter_snapshot_records,
    read_snapshot,
    read_snapshot_header,
)
from quorum_node.raft.snapshots import CorruptSnapshotError
from quorum_node.raft.types import ControlRecordType, ReplicaKey
from quorum_node.raft.voters import voters_record

VOTERS = (ReplicaKey(1, uuid.UUID(int=11)), ReplicaKey(2, uuid.UUID(int=22)),
          ReplicaKey(3, uuid.UUID(int=33)))
RECORDS = [Record(value=b"v%d" % n * (n % 7), key=None if n % 3 else b"k%d" % n)
           for n in range(25)]


def _sample() -> bytes:
    return encode_snapshot(VOTERS, 1234, RECORDS, records_per_batch=4)


def _header(timestamp: int) -> Record:
    payload = json.dumps({"Version": 0, "LastContainedLogTimestamp": timestamp}).encode()
    return control_record(ControlRecordType.SNAPSHOT_HEADER, payload)


FOOTER = control_record(ControlRecordType.SNAPSHOT_FOOTER, b'{"Version":0}')


def test_round_trip_with_voters() -> None:
    contents = read_snapshot(_sample())
    assert contents.last_contained_timestamp_ms == 1234
    assert contents.voters == VOTERS
    assert contents.records == RECORDS
    assert list(iter_snapshot_records(_sample())) == RECORDS
    assert check_snapshot(memoryview(_sample())).voters == VOTERS


def test_round_trip_empty_without_voters() -> None:
    contents = read_snapshot(encode_snapshot(None, 0, []))
    assert contents == SnapshotContents(0, None, [])


@settings(max_examples=40, deadline=None)
@given(
    records=st.lists(st.builds(Record, st.binary(max_size=40), st.none() | st.binary(max_size=8)),
                     max_size=30),
    per_batch=st.integers(1, 7),
    timestamp=st.integers(0, 2**62),
)
def test_round_trip_any_records(records: list[Record], per_batch: int, timestamp: int) -> None:
    contents = read_snapshot(encode_snapshot(VOTERS[:1], timestamp, records, per_batch))
    assert (contents.records, contents.last_contained_timestamp_ms) == (records, timestamp)


def test_layout_is_kafkas() -> None:
    batches = decode_batches(_sample())
    first, *data, last = batches
    assert first.is_control and last.is_control
    assert [control_record_type(r) for r in first.records] == [
        ControlRecordType.SNAPSHOT_HEADER, ControlRecordType.KRAFT_VOTERS]
    assert json.loads(first.records[0].value) == {"Version": 0, "LastContainedLogTimestamp": 1234}
    assert first.records[1] == voters_record(VOTERS)
    assert [control_record_type(r) for r in last.records] == [ControlRecordType.SNAPSHOT_FOOTER]
    assert json.loads(last.records[0].value) == {"Version": 0}
    assert [len(batch.records) for batch in data] == [4, 4, 4, 4, 4, 4, 1]
    assert not any(batch.is_control for batch in data)
    # Offsets count from 0 and run on without a gap; epochs are 0.
    assert [batch.base_offset for batch in batches] == [0, 2, 6, 10, 14, 18, 22, 26, 27]
    assert {batch.epoch for batch in batches} == {0}


def test_big_records_are_split_into_batches_the_decoder_accepts() -> None:
    records = [Record(value=bytes(3 * 1024 * 1024)) for _ in range(3)]
    data = encode_snapshot(None, 0, records)
    assert len(decode_batches(data)) == 4  # header, two data batches, footer
    assert read_snapshot(data).records == records


def test_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="records_per_batch"):
        encode_snapshot(None, 0, [], records_per_batch=0)
    with pytest.raises(ValueError, match="does not fit"):
        encode_snapshot(None, 0, [Record(value=bytes(9 * 1024 * 1024))])
    with pytest.raises(ValueError, match="directory id"):
        encode_snapshot([ReplicaKey(1)], 0, [])


def test_header_alone_gives_the_voters() -> None:
    data = _sample()
    header = read_snapshot_header(data)
    assert (header.voters, header.last_contained_timestamp_ms) == (VOTERS, 1234)
    # Only the first batch is needed: the rest may be missing or garbage.
    assert read_snapshot_header(data[: header.size]).voters == VOTERS
    assert read_snapshot_header(data[: header.size] + b"junk").voters == VOTERS


# -- corruption: always CorruptSnapshotError --------------------------------------------------


def _refused(data: bytes, match: str | None = None) -> None:
    for check in (read_snapshot, check_snapshot, lambda d: list(iter_snapshot_records(d))):
        with pytest.raises(CorruptSnapshotError, match=match):
            check(data)


def test_truncated_at_every_byte_is_refused() -> None:
    data = _sample()
    for size in range(len(data)):
        _refused(data[:size])


def test_every_single_bit_flip_is_refused() -> None:
    data = encode_snapshot(VOTERS, 99, RECORDS[:6], records_per_batch=3)
    for position in range(len(data)):
        for bit in range(8):
            damaged = bytearray(data)
            damaged[position] ^= 1 << bit
            _refused(bytes(damaged))


def test_missing_footer_is_refused() -> None:
    data = _sample()
    footer_size = len(decode_batches(data)[-1].encode())
    _refused(data[:-footer_size], "without a footer")


def test_trailing_bytes_are_refused() -> None:
    data = _sample()
    _refused(data + b"\x00", "follow the snapshot footer")
    _refused(data + b"garbage" * 10, "follow the snapshot footer")
    # Even a well-formed batch after the footer.
    _refused(data + encode_batch(28, 0, [Record(b"x")], 0), "follow the snapshot footer")


@pytest.mark.parametrize("garbage", [b"", b"\x00", b"\x00" * 100, b"\xff" * 100,
                                     bytes(range(256)) * 4, b"not a snapshot at all"])
def test_garbage_is_refused(garbage: bytes) -> None:
    _refused(garbage)


def _framed(*batches: bytes) -> bytes:
    return b"".join(batches)


def test_structural_defects_are_refused() -> None:
    header = encode_batch(0, 0, [_header(5)], 0, is_control=True)
    data = encode_batch(1, 0, [Record(b"a"), Record(b"b")], 0)
    footer = encode_batch(3, 0, [FOOTER], 0, is_control=True)
    assert read_snapshot(_framed(header, data, footer)).records == [Record(b"a"), Record(b"b")]
    cases = {
        "first batch is not a control batch":
            _framed(encode_batch(0, 0, [_header(5)], 0), data, footer),
        "first record is not a snapshot header":
            _framed(encode_batch(0, 0, [FOOTER], 0, is_control=True), data, footer),
        "starts at offset 5, expected 0": _framed(encode_batch(5, 0, [_header(5)], 0, True)),
        "starts at offset 2, expected 1": _framed(header, encode_batch(2, 0, [Record(b"a")], 0)),
        "starts at offset 4, expected 3":
            _framed(header, data, encode_batch(4, 0, [FOOTER], 0, is_control=True)),
        "not a lone snapshot footer": _framed(
            header, encode_batch(1, 0, [_header(1)], 0, is_control=True), data, footer),
        "without a timestamp": _framed(
            encode_batch(0, 0, [control_record(ControlRecordType.SNAPSHOT_HEADER,
                                               b'{"Version":0}')], 0, is_control=True), footer),
        "unknown snapshot header": _framed(
            encode_batch(0, 0, [control_record(ControlRecordType.SNAPSHOT_HEADER,
                                               b'{"Version":1,"LastContainedLogTimestamp":0}')],
                         0, is_control=True)),
        "snapshot header is not JSON": _framed(
            encode_batch(0, 0, [control_record(ControlRecordType.SNAPSHOT_HEADER, b"\xff{")], 0,
                         is_control=True)),
        "unknown snapshot footer": _framed(header, encode_batch(
            1, 0, [control_record(ControlRecordType.SNAPSHOT_FOOTER, b'{"Version":true}')], 0,
            is_control=True)),
        "has epoch 3, not 0": _framed(header, encode_batch(1, 3, [Record(b"a")], 0), footer),
        "two voter sets": _framed(encode_batch(
            0, 0, [_header(0), voters_record(VOTERS), voters_record(VOTERS)], 0, True)),
        "snapshot voter set": _framed(encode_batch(
            0, 0, [_header(0), control_record(ControlRecordType.KRAFT_VOTERS, b"{}")], 0, True)),
        "SNAPSHOT_FOOTER in the header batch":
            _framed(encode_batch(0, 0, [_header(0), FOOTER], 0, is_control=True)),
    }
    for reason, snapshot in cases.items():
        _refused(snapshot, reason)


def test_unknown_control_records_in_the_header_batch_are_skipped() -> None:
    kraft_version = control_record(ControlRecordType.KRAFT_VERSION, b'{"Version":0}')
    header = encode_batch(0, 0, [_header(7), kraft_version, voters_record(VOTERS)], 0, True)
    footer = encode_batch(3, 0, [FOOTER], 0, is_control=True)
    assert read_snapshot(header + footer).voters == VOTERS


def test_streaming_yields_before_reaching_a_late_defect() -> None:
    data = _sample()
    stream = iter_snapshot_records(data[:-1])
    assert next(stream) == RECORDS[0]  # records come before the defect is reached
    with pytest.raises(CorruptSnapshotError):
        list(stream)
