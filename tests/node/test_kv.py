"""The key-value state machine: pure, applied from committed batches in offset order."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorum_node.kv.ops import (
    KV_RECORD_KEY,
    MAX_KEY_BYTES,
    MAX_OP_BYTES,
    MAX_VALUE_BYTES,
    Cas,
    Delete,
    KvOp,
    KvOpError,
    Outcome,
    Put,
    _parse_json,
    decode_op,
    encode_op,
)
from quorum_node.kv.store import KvEvent, KvStore
from quorum_node.raft.records import Record, RecordBatch, control_record
from quorum_node.raft.types import ControlRecordType


def batch(base: int, *records: Record, control: bool = False) -> RecordBatch:
    return RecordBatch(base_offset=base, epoch=1, records=records, is_control=control)


def ops(base: int, *operations: KvOp) -> RecordBatch:
    return batch(base, *(encode_op(op) for op in operations))


def raw_kv(document: object) -> Record:
    return Record(value=json.dumps(document).encode(), key=KV_RECORD_KEY)


def test_put_get_delete_in_offset_order() -> None:
    store = KvStore()
    assert store.applied_offset == -1
    assert store.apply_batch(ops(0, Put("a", "1"), Put("b", "2"), Put("a", "3"))) == 3
    assert store.apply_batch(ops(3, Delete("b"))) == 1
    assert store.get("a") == "3"
    assert store.get("b") is None
    assert store.items() == [("a", "3")]
    assert len(store) == 1
    assert store.applied_offset == 3
    assert store.next_offset == 4


def test_outcomes_report_what_each_operation_did() -> None:
    store = KvStore()
    store.apply_batch(ops(0, Put("k", "v"), Put("k", "w"), Delete("k"), Delete("k")))
    assert store.outcome(0) == Outcome(applied=True, existed=False)
    assert store.outcome(1) == Outcome(applied=True, existed=True)
    assert store.outcome(2) == Outcome(applied=True, existed=True)
    assert store.outcome(3) == Outcome(applied=False, existed=False)  # nothing to delete
    assert store.outcome(4) is None  # not applied yet
    assert store.pop_outcome(1) == Outcome(applied=True, existed=True)
    assert store.pop_outcome(1) is None  # collected once


@pytest.mark.parametrize(
    ("initial", "op", "applied", "after"),
    [
        (None, Cas("k", None, "new"), True, "new"),  # expected absent, is absent
        ("old", Cas("k", None, "new"), False, "old"),  # expected absent, is present
        ("old", Cas("k", "old", "new"), True, "new"),
        ("old", Cas("k", "other", "new"), False, "old"),
        (None, Cas("k", "old", "new"), False, None),  # expected a value, key absent
        ("old", Cas("k", "old", None), True, None),  # value null deletes
        (None, Cas("k", None, None), True, None),  # absent stays absent
        ("", Cas("k", "", "x"), True, "x"),  # the empty string is a value, not absence
        ("", Cas("k", None, "x"), False, ""),
    ],
)
def test_cas(initial: str | None, op: Cas, applied: bool, after: str | None) -> None:
    store = KvStore()
    if initial is not None:
        store.apply_batch(ops(0, Put("k", initial)))
    store.apply_batch(ops(store.next_offset, op))
    assert store.outcome(store.applied_offset) == Outcome(applied, initial is not None)
    assert store.get("k") == after


def test_foreign_and_control_records_are_skipped_but_counted() -> None:
    store = KvStore()
    leader_change = control_record(ControlRecordType.LEADER_CHANGE, b'{"leaderId": 1}')
    assert store.apply_batch(batch(0, leader_change, control=True)) == 0
    # A control batch whose record happens to look like a KV op is still skipped.
    assert store.apply_batch(batch(1, encode_op(Put("x", "1")), control=True)) == 0
    foreign = [Record(b"plain"), Record(b'{"op":"put","key":"y","value":"1"}', key=b"kv"),
               Record(b'{"op":"put","key":"z","value":"1"}')]
    assert store.apply_batch(batch(2, *foreign)) == 0
    assert store.apply_batch(ops(5, Put("a", "1"))) == 1
    assert store.items() == [("a", "1")]
    assert store.next_offset == 6
    assert [store.outcome(offset) for offset in range(5)] == [None] * 5


@pytest.mark.parametrize(
    "document",
    [
        {"op": "put", "key": "k"},  # no value
        {"op": "put", "key": "k", "value": None},
        {"op": "put", "key": 1, "value": "v"},
        {"op": "cas", "key": "k", "value": "v"},  # no expected
        {"op": "cas", "key": "k", "expected": 3, "value": "v"},
        {"op": "rename", "key": "k"},
        {"op": "put", "key": "", "value": "v"},
        {"op": "put", "key": "k" * (MAX_KEY_BYTES + 1), "value": "v"},
        ["put", "k", "v"],
    ],
)
def test_malformed_kv_records_are_skipped_deterministically(document: object) -> None:
    with pytest.raises(KvOpError):
        decode_op(raw_kv(document))
    store = KvStore()
    assert store.apply_batch(batch(0, raw_kv(document), encode_op(Put("after", "1")))) == 1
    assert store.items() == [("after", "1")]
    assert store.outcome(0) is None
    assert store.next_offset == 2


@given(document=st.recursive(
           st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
           lambda inner: st.lists(inner, max_size=3)
           | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8),
       before=st.sampled_from(["", " ", "\n\t", "\ufeff"]),
       after=st.sampled_from(["", " ", "\r\n", " x", "{}", "]", "\u00e9"]))
def test_a_kv_record_parses_as_json_loads_parses_it(document: object, before: str,
                                                   after: str) -> None:
    """The records' parser takes the JSON text json.loads takes, whitespace around it too, and
    refuses what it refuses (a byte-order mark, more after the document)."""
    text = before + json.dumps(document, ensure_ascii=False) + after
    try:
        expected = json.loads(text)
    except ValueError:
        with pytest.raises(ValueError):
            _parse_json(text)
        return
    assert _parse_json(text) == expected


def test_non_json_kv_record_is_skipped() -> None:
    store = KvStore()
    store.apply_batch(batch(0, Record(b"\xff not json", key=KV_RECORD_KEY)))
    assert store.next_offset == 1
    assert len(store) == 0


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b'{"op":"put","key":"k","value":' + b"[" * 50_000 + b"]" * 50_000 + b"}",
         "nested deeper"),
        (b"[" * 50_000, "nested deeper"),  # never closed
        (b'{"op":"put","key":"k","value":"' + b"[" * 50_000 + b'"}', None),  # in a string
        (b'{"op":"put","key":"k","value":' + b"9" * 5000 + b"}", "not a JSON document"),
        (b'{"op":"put","key":"k","value":"' + b"v" * (MAX_OP_BYTES + 1) + b'"}', "exceeds"),
    ],
)
def test_hostile_kv_records_are_refused_before_parsing(payload: bytes,
                                                       reason: str | None) -> None:
    """A record no API writes (nested 50,000 deep, an integer of 5,000 digits, over the size
    bound) is skipped, the next one applied: the applier goes on, identically everywhere. A
    bracket inside a string is no nesting."""
    record = Record(value=payload, key=KV_RECORD_KEY)
    store = KvStore()
    store.apply_batch(batch(0, record, encode_op(Put("after", "1"))))
    assert store.next_offset == 2
    if reason is None:
        assert store.get("k") == "[" * 50_000
    else:
        with pytest.raises(KvOpError, match=reason):
            decode_op(record)
        assert store.items() == [("after", "1")]


def test_already_applied_records_are_not_applied_twice() -> None:
    store = KvStore()
    store.apply_batch(ops(0, Put("n", "1"), Put("n", "2")))
    store.apply_batch(ops(2, Cas("n", "2", "3")))
    # The same batches again (a re-read from an earlier offset) change nothing.
    store.apply_batch(ops(0, Put("n", "1"), Put("n", "2")))
    store.apply_batch(ops(2, Cas("n", "2", "3")))
    assert store.get("n") == "3"
    assert store.next_offset == 3


def test_a_batch_straddling_next_offset_applies_only_its_new_records() -> None:
    store = KvStore()
    store.apply_batch(ops(0, Put("a", "1"), Put("b", "1"), Put("c", "1")), limit=2)
    assert store.items() == [("a", "1"), ("b", "1")]
    assert store.next_offset == 2
    store.apply_batch(ops(0, Put("a", "1"), Put("b", "1"), Put("c", "1")))
    assert store.items() == [("a", "1"), ("b", "1"), ("c", "1")]


def test_limit_stops_at_the_high_watermark() -> None:
    store = KvStore()
    assert store.apply_batch(ops(0, Put("a", "1"), Put("b", "2")), limit=1) == 1
    assert store.get("b") is None
    assert store.next_offset == 1
    assert store.apply_batch(ops(0, Put("a", "1")), limit=0) == 0


def test_a_gap_is_refused() -> None:
    store = KvStore()
    store.apply_batch(ops(0, Put("a", "1")))
    with pytest.raises(ValueError, match="gap"):
        store.apply_batch(ops(2, Put("b", "1")))
    assert store.next_offset == 1


def test_outcomes_are_bounded() -> None:
    store = KvStore(outcome_limit=3)
    store.apply_batch(ops(0, *(Put(f"k{i}", "v") for i in range(5))))
    assert [store.outcome(i) is not None for i in range(5)] == [False, False, True, True, True]
    with pytest.raises(ValueError):
        KvStore(outcome_limit=0)


def test_limits() -> None:
    encode_op(Put("k" * MAX_KEY_BYTES, "v" * MAX_VALUE_BYTES))  # at the limits: fine
    with pytest.raises(KvOpError, match="key of 1025 bytes") as key_error:
        encode_op(Put("k" * (MAX_KEY_BYTES + 1), "v"))
    assert key_error.value.too_large
    # Limits count UTF-8 bytes, not characters.
    with pytest.raises(KvOpError) as value_error:
        encode_op(Put("k", "é" * (MAX_VALUE_BYTES // 2 + 1)))
    assert value_error.value.too_large
    with pytest.raises(KvOpError) as cas_error:
        encode_op(Cas("k", "v" * (MAX_VALUE_BYTES + 1), None))
    assert cas_error.value.too_large
    with pytest.raises(KvOpError, match="empty") as empty:
        encode_op(Delete(""))
    assert not empty.value.too_large
    with pytest.raises(KvOpError, match="not valid Unicode"):
        encode_op(Put("k", "\ud800"))


text = st.text(max_size=8)
operation = st.one_of(
    st.builds(Put, st.sampled_from("abc"), text),
    st.builds(Delete, st.sampled_from("abc")),
    st.builds(Cas, st.sampled_from("abc"), st.none() | text, st.none() | text),
)


@given(st.lists(operation, max_size=30), st.integers(min_value=1, max_value=5))
def test_matches_a_model_and_is_independent_of_batching(
        operations: list[Put | Delete | Cas], chunk: int) -> None:
    model: dict[str, str] = {}
    expected_outcomes = []
    for op in operations:
        before = model.get(op.key)
        if isinstance(op, Put):
            model[op.key] = op.value
            expected_outcomes.append(Outcome(True, before is not None))
        elif isinstance(op, Delete):
            model.pop(op.key, None)
            expected_outcomes.append(Outcome(before is not None, before is not None))
        elif before == op.expected:
            if op.value is None:
                model.pop(op.key, None)
            else:
                model[op.key] = op.value
            expected_outcomes.append(Outcome(True, before is not None))
        else:
            expected_outcomes.append(Outcome(False, before is not None))
    store = KvStore()
    for base in range(0, len(operations), chunk):
        store.apply_batch(ops(base, *operations[base:base + chunk]))
    assert dict(store.items()) == model
    assert [store.outcome(i) for i in range(len(operations))] == expected_outcomes
    # Encoding round-trips every operation exactly.
    assert [decode_op(encode_op(op)) for op in operations] == operations


def test_skip_batch_moves_past_a_batch_without_kv_operations() -> None:
    store = KvStore()
    store.apply_batch(ops(0, Put("a", "1")))
    store.skip_batch(1, 4)
    assert store.next_offset == 4
    store.skip_batch(2, 10, limit=6)  # stops at the high watermark; re-skipping is harmless
    assert store.next_offset == 6
    store.skip_batch(0, 3)  # entirely behind: nothing moves back
    assert store.next_offset == 6
    with pytest.raises(ValueError, match="gap"):
        store.skip_batch(7, 9)
    assert store.items() == [("a", "1")]


def test_apply_encoded_matches_apply_batch_and_skips_batches_without_kv_ops() -> None:
    leader_change = control_record(ControlRecordType.LEADER_CHANGE, b'{"leaderId": 1}')
    batches = [
        batch(0, leader_change, control=True),
        batch(1, Record(b"data"), Record(b"more data", key=b"k")),
        batch(3, Record(b"mixed"), encode_op(Put("a", "1")), Record(b"x")),
        ops(6, Cas("a", "1", "2"), Put("b", "1")),
        batch(8, Record(b'{"op":"put","key":"c","value":"1"}', key=b"\x00kv-not")),
        ops(9, Delete("a")),  # past the high watermark in the first pass
    ]
    data = b"".join(b.encode() for b in batches)
    encoded, decoded = KvStore(), KvStore()
    encoded.apply_encoded(data, limit=9)
    for each in batches:
        if each.base_offset < 9:
            decoded.apply_batch(each, limit=9)
    assert encoded.items() == decoded.items() == [("a", "2"), ("b", "1")]
    assert encoded.next_offset == decoded.next_offset == 9
    assert [encoded.outcome(i) for i in range(9)] == [decoded.outcome(i) for i in range(9)]
    # The next read starts with the batch holding next_offset; what was applied is not again.
    encoded.apply_encoded(data[len(b"".join(b.encode() for b in batches[:3])):], limit=10)
    assert encoded.items() == [("b", "1")]
    assert encoded.next_offset == 10


def test_scan_pages_a_prefix_in_key_order() -> None:
    store = KvStore()
    store.apply_batch(ops(0, *(Put(k, k.upper()) for k in ("b/2", "a", "b/1", "b/3", "c"))))
    assert store.scan("b/", None, 2, 1 << 20) == ([("b/1", "B/1"), ("b/2", "B/2")], True)
    assert store.scan("b/", "b/2", 2, 1 << 20) == ([("b/3", "B/3")], False)
    assert store.scan("b/", "a", 1, 1 << 20) == ([("b/1", "B/1")], True)  # before the prefix
    assert store.scan("b/", "b/3", 2, 1 << 20) == ([], False)
    assert store.scan("", None, 10, 1 << 20)[0][0] == ("a", "A")
    assert store.scan("z", None, 10, 1 << 20) == ([], False)


def events(store: KvStore, offset: int, watched: str, exact: bool, limit: int) -> list[KvEvent]:
    found: list[KvEvent] = []
    store.changes(offset, watched, exact, into=found, size=0, max_events=limit,
                  max_bytes=1 << 30, max_scanned=1 << 30)
    return found


def test_events_are_the_changes_in_offset_order() -> None:
    store = KvStore()
    store.apply_batch(ops(0, Put("k", "1"), Put("other", "x"), Cas("k", "nope", "2"),
                          Cas("k", "1", "3"), Delete("missing"), Delete("k")))
    # The cas that did not apply and the delete of an absent key changed nothing.
    assert events(store, 0, "k", True, 10) == [KvEvent(0, "k", "1"), KvEvent(3, "k", "3"),
                                               KvEvent(5, "k", None)]
    assert events(store, 4, "k", True, 10) == [KvEvent(5, "k", None)]
    assert events(store, 0, "", False, 2) == [KvEvent(0, "k", "1"), KvEvent(1, "other", "x")]
    assert events(store, 0, "o", False, 10) == [KvEvent(1, "other", "x")]


def test_events_are_bounded_and_a_snapshot_starts_them_over() -> None:
    store = KvStore(event_limit=2)
    store.apply_batch(ops(0, Put("a", "1"), Put("a", "2"), Put("a", "3")))
    assert store.events_start == 1  # the change at 0 was dropped
    assert [e.offset for e in events(store, 1, "a", True, 10)] == [1, 2]
    store.load_snapshot([encode_op(Put("a", "9"))], next_offset=40)
    assert store.events_start == 40 and events(store, 0, "", False, 10) == []


@given(st.lists(operation, max_size=30))
def test_each_event_holds_what_its_key_holds_after_the_change(
        operations: list[Put | Delete | Cas]) -> None:
    """Events are kept as what the operation left in the map (a put's or an applied cas's
    value, None after a delete or a cas to null), not read back from it."""
    store = KvStore()
    for offset, op in enumerate(operations):
        store.apply_batch(ops(offset, op))
        changed = events(store, offset, op.key, True, 10)
        if changed:
            assert changed == [KvEvent(offset, op.key, store.get(op.key))]

