"""The decoder alone (no Spark): rows of intact files, and damage turned into flagged rows."""

from __future__ import annotations

from typing import cast

import crc32c
import pyarrow as pa
import pytest

from quorum_audit.decode import (
    DAMAGE_CRC,
    DAMAGE_SNAPSHOT,
    DAMAGE_TORN_TAIL,
    DAMAGE_UNPARSEABLE,
    SCHEMA,
    SOURCE_SNAPSHOT,
    FileIdentity,
    decode_batches,
    decode_file,
)
from quorum_node.kv.ops import Put, encode_op
from quorum_node.kv.snapshot_data import snapshot_records
from quorum_node.kv.store import KvStore
from quorum_node.raft.records import (
    HEADER_SIZE,
    Record,
    RecordBatch,
    control_record,
    encode_batch,
    read_batch_header,
)
from quorum_node.raft.snapshot_format import encode_snapshot
from quorum_node.raft.types import ControlRecordType, ReplicaKey

IDENTITY = FileIdentity("cluster", 1, "dir", "00000000000000000100.log")


def rows(data: bytes, first_offset: int = 100, identity: FileIdentity = IDENTITY,
         schema: pa.Schema = SCHEMA) -> list[dict[str, object]]:
    return [row for batch in decode_file(data, identity, first_offset, schema)
            for row in batch.to_pylist()]


def record_bytes(record: Record) -> bytes:
    key = b"\xff\xff\xff\xff" if record.key is None else \
        len(record.key).to_bytes(4, "big") + record.key
    return key + len(record.value).to_bytes(4, "big") + record.value


def log(batches: int = 3, per_batch: int = 40) -> tuple[bytes, list[Record]]:
    """A LeaderChange-like control batch, then data batches of varied records (null and
    non-null keys, empty and long values)."""
    records = [Record(b"v" * (i % 17) + b"-%d" % i, None if i % 3 else b"k%d" % i)
               for i in range(batches * per_batch)]
    data = encode_batch(100, 4, [control_record(ControlRecordType.LEADER_CHANGE, b"{}")], 7,
                        is_control=True)
    for b in range(batches):
        data += encode_batch(101 + b * per_batch, 4, records[b * per_batch:(b + 1) * per_batch],
                             1000 + b)
    return data, records


def test_intact_rows_hold_each_record_as_the_node_wrote_it() -> None:
    data, records = log()
    decoded = rows(data)
    assert [r["offset"] for r in decoded] == list(range(100, 101 + len(records)))
    control, *rest = decoded
    assert control["is_control"] and control["control_type"] == ControlRecordType.LEADER_CHANGE
    assert control["control_value"] == "{}" and control["epoch"] == 4
    for row, record in zip(rest, records, strict=True):
        assert row["key"] == record.key and row["value_size"] == len(record.value)
        assert row["checksum"] == crc32c.crc32c(record_bytes(record))
        assert row["checksum_ok"] and row["damage"] is None and row["control_type"] is None
    assert {r["batch_base_offset"] for r in rest[:40]} == {101}
    assert rest[40]["timestamp_ms"] == 1001 and cast(int, rest[40]["position"]) > HEADER_SIZE


def test_long_batches_are_walked_as_well_as_many_short_ones() -> None:
    # One batch of 5000 records beside many of one record: both walking strategies run.
    big = [Record(b"x" * (i % 50)) for i in range(5000)]
    data = encode_batch(0, 1, big, 1)
    for i in range(200):
        data += encode_batch(5000 + i, 1, [Record(b"s%d" % i)], 2)
    decoded = rows(data, 0)
    assert len(decoded) == 5200 and all(r["checksum_ok"] for r in decoded)
    assert [r["value_size"] for r in decoded[:5000]] == [len(r.value) for r in big]


def test_a_crc_mismatch_flags_the_batch_and_keeps_its_records_checksums() -> None:
    data, records = log()
    second = bytearray(data)
    position = len(encode_batch(100, 4, [control_record(ControlRecordType.LEADER_CHANGE, b"{}")],
                                7, is_control=True))
    position += len(encode_batch(101, 4, records[:40], 1000))  # the second data batch
    second[position + HEADER_SIZE + 10] ^= 1  # inside its first record
    decoded = rows(bytes(second))
    damaged = [r for r in decoded if r["damage"] is not None]
    assert [r["offset"] for r in damaged] == list(range(141, 181))
    assert all(r["damage"] == DAMAGE_CRC and not r["checksum_ok"] for r in damaged)
    assert "CRC32C mismatch" in str(damaged[0]["error"])
    # Only the record actually hit has another checksum.
    changed = [r["offset"] for r, record in zip(damaged, records[40:80], strict=True)
               if r["checksum"] != crc32c.crc32c(record_bytes(record))]
    assert changed == [141]
    assert all(r["checksum_ok"] for r in decoded if cast(int, r["offset"]) >= 181)


def test_an_unparseable_header_costs_exactly_its_offsets() -> None:
    data, _ = log()
    broken = bytearray(data)
    control_size = len(encode_batch(100, 4, [control_record(ControlRecordType.LEADER_CHANGE,
                                                            b"{}")], 7, is_control=True))
    broken[control_size + 8:control_size + 12] = b"\x7f\xff\xff\xff"  # the batch length
    decoded = rows(bytes(broken))
    lost = [r for r in decoded if r["damage"] == DAMAGE_UNPARSEABLE]
    assert [r["offset"] for r in lost] == list(range(101, 141))
    assert all(r["epoch"] is None and r["checksum"] is None for r in lost)
    assert [r["offset"] for r in decoded if r["checksum_ok"]] == [100, *range(141, 221)]


def test_a_torn_tail_is_one_flagged_row_at_the_next_offset() -> None:
    data, _ = log()
    decoded = rows(data[:-5])
    assert decoded[-1]["damage"] == DAMAGE_TORN_TAIL and decoded[-1]["offset"] == 181
    assert len(decoded) == 82


def test_a_snapshot_is_read_with_its_header_voters_and_footer() -> None:
    voters = (ReplicaKey(1, None), ReplicaKey(2, None))
    with pytest.raises(ValueError, match="directory id"):
        encode_snapshot(voters, 5, [])
    snapshot = encode_snapshot(None, 5, [Record(b"a", b"k"), Record(b"b")], records_per_batch=1)
    identity = FileIdentity("c", 1, "d", "x.checkpoint", source=SOURCE_SNAPSHOT,
                            snapshot_end_offset=50, snapshot_epoch=3)
    decoded = rows(snapshot, 0, identity)
    assert [r["control_type"] for r in decoded] == [
        ControlRecordType.SNAPSHOT_HEADER, None, None, ControlRecordType.SNAPSHOT_FOOTER]
    assert all(r["snapshot_end_offset"] == 50 and r["source"] == "snapshot" for r in decoded)
    truncated = rows(snapshot[:-30], 0, identity)
    assert truncated[-1]["damage"] in (DAMAGE_SNAPSHOT, DAMAGE_TORN_TAIL)



def test_a_key_value_stores_snapshot_is_read_a_chunk_of_entries_a_row() -> None:
    store = KvStore()
    store.apply_batch(RecordBatch(0, 1, tuple(encode_op(Put(f"k{i}", "v" * 100))
                                              for i in range(20_000))))
    records = list(snapshot_records(store.snapshot_entries()))
    identity = FileIdentity("c", 1, "d", "x.checkpoint", source=SOURCE_SNAPSHOT,
                            snapshot_end_offset=20_000, snapshot_epoch=1)
    decoded = rows(encode_snapshot(None, 5, records), 0, identity)
    data = [r for r in decoded if not r["is_control"]]
    assert len(records) > 2 and len(data) == len(records)
    for row, record in zip(data, records, strict=True):
        assert row["key"] == record.key and row["value_size"] == len(record.value)
        assert row["checksum"] == crc32c.crc32c(record_bytes(record)) and row["checksum_ok"]

def test_only_the_columns_asked_for_are_built() -> None:
    data, records = log()
    schema = pa.schema([SCHEMA.field("offset"), SCHEMA.field("checksum")])
    decoded = rows(data, schema=schema)
    assert set(decoded[0]) == {"offset", "checksum"} and len(decoded) == len(records) + 1


def test_batch_rows_check_every_crc_without_parsing_records() -> None:
    data, records = log()
    damaged = bytearray(data)
    damaged[-3] ^= 1  # inside the last batch's last record
    table = pa.Table.from_batches(list(decode_batches(bytes(damaged), IDENTITY, 100)))
    rows_ = table.to_pylist()
    assert [(r["base_offset"], r["last_offset"], r["record_count"]) for r in rows_] == [
        (100, 100, 1), (101, 140, 40), (141, 180, 40), (181, 220, 40)]
    assert [r["checksum_ok"] for r in rows_] == [True, True, True, False]
    assert rows_[-1]["damage"] == DAMAGE_CRC and rows_[0]["is_control"]
    # The stored CRC is kept: equal across replicas as long as only the records were damaged.
    assert rows_[-1]["batch_crc"] == read_batch_header(data, rows_[-1]["position"]).crc
    assert sum(r["size"] for r in rows_) == len(data) and len(records) == 120
