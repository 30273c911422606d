"""The key-value store's snapshot records: format 1 (a header naming the format, then chunks of
length-prefixed entries), read back as the store was, every defect refused naming its record;
and format 0 (one JSON put a key), written by earlier releases, still read."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import pytest

from quorum_node.kv.machine import check_snapshot_records
from quorum_node.kv.ops import (
    KV_RECORD_KEY,
    MAX_KEY_BYTES,
    Compare,
    Delete,
    KvOp,
    KvOpError,
    Put,
    Txn,
    encode_op,
)
from quorum_node.kv.snapshot_data import (
    SNAPSHOT_CHUNK_CHARS,
    SNAPSHOT_CHUNK_ENTRIES,
    SNAPSHOT_ENTRIES_KEY,
    SNAPSHOT_HEADER_KEY,
    SnapshotEntries,
    encode_snapshot_chunk,
    snapshot_data,
    snapshot_records,
)
from quorum_node.kv.store import KvStore
from quorum_node.raft.records import Record, RecordBatch
from quorum_node.raft.snapshot_format import encode_snapshot, iter_snapshot_records
from quorum_node.raft.snapshots import CorruptSnapshotError

# A chunk's entry as written: key, value, modification offset, version.
SnapshotEntry = tuple[str, str, int, int]

# Written by the release before format 1 (its snapshot_records and encode_snapshot, two records
# a batch): the store after FORMAT0_OPS, as of offset 8.
FORMAT0_SNAPSHOT = Path(__file__).parent / "data" / "format0-snapshot-8-1.checkpoint.b64"
FORMAT0_OPS: list[KvOp] = [
    Put("alpha", "1"), Put("beta", "two"), Put("alpha", "3"), Put("gone", "x"), Delete("gone"),
    Put("clé", "valeur ✓"),
    Txn((Compare("beta", "version", "=", 1),), (Put("gamma", "\u03b3"), Put("beta", "2")), ()),
    Put("alpha", "4")]


def applied(operations: list[KvOp]) -> KvStore:
    store = KvStore()
    store.apply_batch(RecordBatch(base_offset=0, epoch=1,
                                  records=tuple(encode_op(op) for op in operations)))
    return store


def reloaded(store: KvStore) -> KvStore:
    """A store loaded from a snapshot of ``store``, through the snapshot's bytes."""
    data = encode_snapshot(None, 0, snapshot_records(store.snapshot_entries()))
    loaded = KvStore()
    loaded.load_snapshot(iter_snapshot_records(data), store.next_offset)
    return loaded


def state(store: KvStore) -> tuple[object, ...]:
    items = store.items()
    return items, [store.meta(key) for key, _ in items], store.versions_from


def test_a_snapshot_reads_back_every_key_value_version_and_offset() -> None:
    operations: list[KvOp] = [Put(f"k{i:05}", f"v{i}") for i in range(2 * SNAPSHOT_CHUNK_ENTRIES)]
    operations += [Put("k00007", "again"), Delete("k00009"), Put("ключ", "значение ✓"),
                   Put("é", ""), Put("big", "x" * 300_000), Put("b" * MAX_KEY_BYTES, "𝄞" * 5),
                   Txn((), (Put("k00001", "in a txn"),), ())]
    store = applied(operations)
    records = list(snapshot_records(store.snapshot_entries()))
    assert records[0].key == SNAPSHOT_HEADER_KEY
    assert json.loads(records[0].value) == {"format": 1, "versions_from": len(operations) - 1}
    assert {record.key for record in records[1:]} == {SNAPSHOT_ENTRIES_KEY}
    assert len(records) > 3  # the entries cap and the big value's characters end chunks
    assert state(reloaded(store)) == state(store)


def test_chunks_end_at_their_character_or_entry_bound() -> None:
    """A chunk ends at the first entry that brings its keys and values to SNAPSHOT_CHUNK_CHARS
    characters, or at SNAPSHOT_CHUNK_ENTRIES entries, whichever comes first; the entries in key
    order, whatever order the store took them in."""
    sizes = [5, 40_000, 1, 70_000, 3, 200_000, 100_000, 7] * 3 + [2] * (SNAPSHOT_CHUNK_ENTRIES + 5)
    values = {f"k{index:06}": "v" * size for index, size in enumerate(sizes)}
    store = applied([Put(key, value) for key, value in
                     sorted(values.items(), key=lambda item: hash(item[0]))])
    chunks = list(snapshot_data(snapshot_records(store.snapshot_entries()),
                                store.next_offset).chunks)
    assert [key for chunk in chunks for key in chunk.keys] == sorted(values)
    for chunk in chunks:
        chars = [len(key) + len(value) for key, value in zip(chunk.keys, chunk.values,
                                                                strict=True)]
        assert len(chars) <= SNAPSHOT_CHUNK_ENTRIES
        assert sum(chars[:-1]) < SNAPSHOT_CHUNK_CHARS  # the last entry brought it to the bound
        if chunk is not chunks[-1] and len(chars) < SNAPSHOT_CHUNK_ENTRIES:
            assert sum(chars) >= SNAPSHOT_CHUNK_CHARS
        assert list(chunk.values) == [values[key] for key in chunk.keys]
        assert list(zip(chunk.mod_offsets, chunk.versions, strict=True)) == [
            store.meta(key) for key in chunk.keys]
    counts = [len(chunk.keys) for chunk in chunks]
    assert SNAPSHOT_CHUNK_ENTRIES in counts  # both bounds were reached
    assert min(counts[:-1]) < SNAPSHOT_CHUNK_ENTRIES


def test_a_key_list_that_disagrees_with_the_map_writes_no_snapshot() -> None:
    entries = {"a": ("1", 0, 1), "b": ("2", 1, 1)}
    with pytest.raises(ValueError, match="key list holds 1 keys and its map 2"):
        list(snapshot_records(SnapshotEntries(["a"], entries, None)))


def test_an_empty_store_and_one_without_versions_read_back_alike() -> None:
    for store in (KvStore(), applied([Put("a", "1")]), applied([Put("a", "1"), Delete("a")])):
        assert state(reloaded(store)) == state(store)
    assert reloaded(applied([Put("a", "1"), Txn((), (Delete("a"),), ())])).versions_from == 1


def test_a_snapshot_written_in_format_0_still_loads_and_is_checked() -> None:
    data = base64.decodebytes(FORMAT0_SNAPSHOT.read_bytes())
    check_snapshot_records(iter_snapshot_records(data))
    loaded = KvStore()
    loaded.load_snapshot(iter_snapshot_records(data), next_offset=8)
    assert state(loaded) == state(applied(FORMAT0_OPS))
    assert loaded.meta("alpha") == (7, 2)
    # Rewritten in format 1, it reads back the same.
    assert state(reloaded(loaded)) == state(loaded)


def raw_chunk(entries: list[SnapshotEntry], *, count: int | None = None,
              key_sizes: list[int] | None = None) -> bytes:
    """A chunk packed as-is, without the writer's checks."""
    keys = [key.encode("utf-8", "surrogatepass") for key, _, _, _ in entries]
    values = [value.encode() for _, value, _, _ in entries]
    n = len(entries)
    return struct.pack(f"<I{n}I{n}I{n}q{n}q", n if count is None else count,
                       *(key_sizes or [len(k) for k in keys]), *map(len, values),
                       *(e[2] for e in entries), *(e[3] for e in entries)) \
        + b"".join(keys) + b"".join(values)


HEADER = Record(value=b'{"format":1,"versions_from":null}', key=SNAPSHOT_HEADER_KEY)
GOOD = [("a", "1", 3, 1), ("b", "2", 4, 2)]


def chunk(payload: bytes) -> Record:
    return Record(value=payload, key=SNAPSHOT_ENTRIES_KEY)


DEFECTS: dict[str, tuple[list[Record], str]] = {
    "a count beyond the bytes": ([HEADER, chunk(raw_chunk(GOOD, count=1000))],
                                 "data record 1: a chunk of 56 bytes cannot hold the 1000"),
    "no entries": ([HEADER, chunk(b"\0\0\0\0")], "cannot hold the 0 entries"),
    "a byte too many": ([HEADER, chunk(raw_chunk(GOOD) + b"x")], "do not add up"),
    "an empty key": ([HEADER, chunk(raw_chunk([("", "1", 3, 1)]))], "a key of 0 bytes (1 to 1024)"),
    "a key too long": ([HEADER, chunk(raw_chunk([("k" * (MAX_KEY_BYTES + 1), "1", 3, 1)]))],
                       "a key of 1025 bytes"),
    "a key not UTF-8": ([HEADER, chunk(raw_chunk([("\ud800", "1", 3, 1)]))],
                        "a key that is not UTF-8"),
    "a key cut inside a character": ([HEADER, chunk(raw_chunk([("é", "1", 3, 1), ("z", "", 3, 1)],
                                                              key_sizes=[1, 2]))],
                                     "a key that is not UTF-8"),
    "version 0": ([HEADER, chunk(raw_chunk([("a", "1", 3, 0)]))], "a version of 0"),
    "a negative offset": ([HEADER, chunk(raw_chunk([("a", "1", -1, 1)]))], "mod_offset of -1"),
    "keys out of order": ([HEADER, chunk(raw_chunk(GOOD[::-1]))], "out of order or repeated"),
    "a key repeated in the next chunk": ([HEADER, chunk(raw_chunk(GOOD)),
                                          chunk(raw_chunk(GOOD[1:]))],
                                         "data record 2: keys out of order or repeated"),
    "another record after the header": ([HEADER, encode_op(Put("a", "1"))],
                                        "data record 1 is not a chunk of entries"),
    "a format to come": ([Record(value=b'{"format":2}', key=SNAPSHOT_HEADER_KEY)],
                         "a snapshot of format 2, which this release does not read"),
    "a header that is not JSON": ([Record(value=b"[" * 100_000, key=SNAPSHOT_HEADER_KEY)],
                                  "header is not JSON"),
    "a bad versions_from": ([Record(value=b'{"format":1,"versions_from":-1}',
                                    key=SNAPSHOT_HEADER_KEY)], "bad versions_from -1"),
    "chunks without a header": ([chunk(raw_chunk(GOOD))],
                                "data record 0 is not a key-value operation"),
}


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_a_defect_is_refused_naming_its_record_and_loads_nothing(defect: str) -> None:
    records, message = DEFECTS[defect]
    with pytest.raises(CorruptSnapshotError, match=None) as refused:
        check_snapshot_records(iter(records))
    assert message in str(refused.value)
    store = applied([Put("kept", "1")])
    before = state(store)
    with pytest.raises(KvOpError, match=None):
        store.load_snapshot(records, next_offset=10)
    assert state(store) == before


def test_a_modification_offset_at_or_past_the_snapshots_end_is_refused_when_loaded() -> None:
    records = [HEADER, chunk(raw_chunk(GOOD))]
    check_snapshot_records(iter(records))  # the end is known when it is loaded
    with pytest.raises(KvOpError, match="mod_offset of 4 \\(0 to 3\\)"):
        KvStore().load_snapshot(records, next_offset=4)
    KvStore().load_snapshot(records, next_offset=5)


@pytest.mark.parametrize(("entry", "message"), [
    (("k" * (MAX_KEY_BYTES + 1), "v", 0, 1), "key of 1025 bytes exceeds"),
    (("", "v", 0, 1), "a key must not be empty"),
    (("\ud800", "v", 0, 1), "the key is not valid Unicode text"),
    (("k", "\udfff", 0, 1), "the value is not valid Unicode text"),
])
def test_the_writer_refuses_what_the_store_could_not_hold(
        entry: SnapshotEntry, message: str) -> None:
    with pytest.raises(KvOpError, match=message):
        list(snapshot_records(SnapshotEntries.of({"a": ("1", 0, 1), entry[0]: entry[1:]}, None)))


def test_chunks_are_denser_than_json_puts() -> None:
    entries = [(f"k{i}", "v" * 100, i, 1) for i in range(1000)]
    puts = sum(len(json.dumps({"op": "put", "key": k, "value": v, "mod_offset": m,
                               "version": n}, separators=(",", ":"))) + len(KV_RECORD_KEY)
               for k, v, m, n in entries)
    assert len(encode_snapshot_chunk(*zip(*entries, strict=True))) < 0.8 * puts

