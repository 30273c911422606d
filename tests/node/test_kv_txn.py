"""Multi-key transactions (etcd's Txn) in the key-value state machine: compares of a value, a
version and a modification offset, the branch they choose, gets answered at the txn's point, and
every replica applying the same record alike."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorum_node.kv.machine import check_snapshot_records
from quorum_node.kv.ops import (
    KV_RECORD_KEY,
    MAX_KEY_BYTES,
    MAX_TXN_BYTES,
    MAX_TXN_OPS,
    MAX_VALUE_BYTES,
    Compare,
    Delete,
    Get,
    KvOp,
    KvOpError,
    Put,
    Txn,
    TxnOp,
    TxnOutcome,
    TxnResponse,
    _branch_bytes,
    _branch_bytes_each,
    decode_op,
    encode_op,
    txn_from_document,
)
from quorum_node.kv.snapshot_data import snapshot_records
from quorum_node.kv.store import KvEvent, KvStore
from quorum_node.raft.records import Record, RecordBatch
from quorum_node.raft.snapshots import CorruptSnapshotError


def ops(base: int, *operations: KvOp) -> RecordBatch:
    return RecordBatch(base_offset=base, epoch=1,
                       records=tuple(encode_op(op) for op in operations))


def seeded() -> KvStore:
    """After the quorum's first txn (at offset 0, where versions start), a=1 written at offsets
    1 and 3 (version 2, mod 3), b=x at offset 2 (version 1)."""
    store = KvStore()
    store.apply_batch(ops(0, Txn((), (), ()), Put("a", "0"), Put("b", "x"), Put("a", "1")))
    return store


def run(store: KvStore, txn: Txn) -> TxnOutcome:
    offset = store.next_offset
    store.apply_batch(ops(offset, txn))
    outcome = store.pop_outcome(offset)
    assert isinstance(outcome, TxnOutcome)
    return outcome


def test_versions_and_modification_offsets_follow_the_writes() -> None:
    store = seeded()
    assert store.meta("a") == (3, 2)
    assert store.meta("b") == (2, 1)
    assert store.meta("absent") == (-1, 0)
    store.apply_batch(ops(4, Delete("a"), Put("a", "again")))
    assert store.meta("a") == (5, 1)  # a delete ends the key's life: versions start again


@pytest.mark.parametrize(
    ("compare", "holds"),
    [
        (Compare("a", "value", "=", "1"), True),
        (Compare("a", "value", "!=", "1"), False),
        (Compare("a", "value", "<", "2"), True),
        (Compare("a", "value", ">", "1"), False),
        (Compare("a", "version", "=", 2), True),
        (Compare("a", "version", "!=", 2), False),
        (Compare("a", "version", "<", 3), True),
        (Compare("a", "version", ">", 2), False),
        (Compare("a", "mod_offset", "=", 3), True),
        (Compare("a", "mod_offset", "!=", 2), True),
        (Compare("a", "mod_offset", "<", 3), False),
        (Compare("a", "mod_offset", ">", 2), True),
        (Compare("b", "mod_offset", "=", 2), True),
        # An absent key: version 0, modification offset -1, and no value to compare.
        (Compare("none", "version", "=", 0), True),
        (Compare("none", "mod_offset", "<", 0), True),
        (Compare("none", "value", "=", ""), False),
        (Compare("none", "value", "!=", "x"), False),
        (Compare("none", "value", "<", "x"), False),
    ],
)
def test_each_compare(compare: Compare, holds: bool) -> None:
    store = seeded()
    outcome = run(store, Txn((compare,), (Put("then", "1"),), (Put("else", "1"),)))
    assert outcome.succeeded is holds
    assert store.get("then" if holds else "else") == "1"
    assert store.get("else" if holds else "then") is None


def test_every_compare_must_hold_and_an_empty_compare_list_holds() -> None:
    store = seeded()
    both = (Compare("a", "value", "=", "1"), Compare("b", "value", "=", "y"))
    assert not run(store, Txn(both, (Put("c", "1"),), ())).succeeded
    assert store.get("c") is None
    assert run(store, Txn((), (Put("c", "1"),), ())).succeeded
    assert store.get("c") == "1"


def test_a_branch_applies_at_one_offset_and_gets_see_its_writes_in_order() -> None:
    store = seeded()
    txn = Txn((Compare("a", "version", "=", 2),),
              (Get("a"), Put("a", "2"), Get("a"), Delete("b"), Get("b"), Put("new", "n"),
               Delete("never")),
              (Put("failed", "1"),))
    outcome = run(store, txn)
    assert outcome == TxnOutcome(True, (
        TxnResponse("get", "a", True, "1", 2, 3),
        TxnResponse("put", "a", True),
        TxnResponse("get", "a", True, "2", 3, 4),
        TxnResponse("delete", "b", True),
        TxnResponse("get", "b", False, None, 0, -1),
        TxnResponse("put", "new", False),
        TxnResponse("delete", "never", False),
    ))
    assert store.items() == [("a", "2"), ("new", "n")]
    assert store.meta("a") == (4, 3) and store.meta("new") == (4, 1)
    # One change per key written, all at the txn's offset (the absent key's delete is none).
    events: list[KvEvent] = []
    store.changes(4, "", False, into=events, size=0, max_events=100, max_bytes=1 << 20,
                  max_scanned=100)
    assert events == [KvEvent(4, "a", "2"), KvEvent(4, "b", None), KvEvent(4, "new", "n")]


def test_the_failure_branch_runs_when_a_compare_fails() -> None:
    store = seeded()
    outcome = run(store, Txn((Compare("a", "mod_offset", ">", 3),), (Put("a", "no"),),
                             (Get("a"), Delete("a"))))
    assert outcome == TxnOutcome(False, (TxnResponse("get", "a", True, "1", 2, 3),
                                         TxnResponse("delete", "a", True)))
    assert store.get("a") is None


def test_a_watch_answer_never_splits_a_txns_changes() -> None:
    store = KvStore()
    store.apply_batch(ops(0, Txn((), tuple(Put(f"k{i}", "v") for i in range(5)), ()),
                          Put("k9", "later")))
    events: list[KvEvent] = []
    _, next_offset, done = store.changes(0, "k", False, into=events, size=0, max_events=2,
                                         max_bytes=1 << 20, max_scanned=100)
    assert [e.key for e in events] == ["k0", "k1", "k2", "k3", "k4"]
    assert (next_offset, done) == (1, True)


def test_replicas_applying_the_same_records_agree() -> None:
    """Two stores (replicas) apply the same encoded records, one of them after restarting from
    a snapshot midway: same map, same versions and offsets, same outcomes."""
    records: list[KvOp] = [
        Put("a", "1"), Put("b", "2"),
        Txn((Compare("a", "value", "=", "1"), Compare("b", "version", "=", 1)),
            (Put("a", "2"), Delete("b"), Get("a")), (Put("x", "x"),)),
        Put("b", "3"),
        Txn((Compare("a", "mod_offset", "=", 2),), (Put("b", "4"), Get("b")),
            (Put("y", "y"),)),
        Txn((Compare("b", "version", ">", 1),), (Put("c", "c"),), (Get("c"),))]
    first, second = KvStore(), KvStore()
    first.apply_batch(ops(0, *records))
    second.apply_batch(ops(0, *records[:3]))
    restarted = KvStore()
    restarted.load_snapshot(list(snapshot_records(second.snapshot_entries())), next_offset=3)
    restarted.apply_batch(ops(3, *records[3:]))
    for store in (first, restarted):
        assert store.items() == [("a", "2"), ("b", "4"), ("c", "c")]
        assert [store.meta(key) for key in "abc"] == [(2, 2), (4, 2), (5, 1)]
    assert [first.outcome(offset) for offset in (4, 5)] == \
        [restarted.outcome(offset) for offset in (4, 5)]


def test_an_old_snapshot_without_versions_loads_alike_on_every_replica() -> None:
    old = Record(value=b'{"op":"put","key":"k","value":"v"}', key=KV_RECORD_KEY)
    store = KvStore()
    store.load_snapshot([old], next_offset=10)
    assert store.meta("k") == (9, 1)


def test_replicas_that_came_by_different_roads_decide_a_txn_alike() -> None:
    # One log: "k" written three times, then a txn comparing its version and mod offset. One
    # replica replays it all; one loaded a snapshot written before versions were kept (at 2);
    # one a snapshot of its own at another offset. Each must decide the txn as the others do.
    history = [Put("k", "1"), Put("k", "2"), Put("other", "x"), Put("k", "3")]
    txn = Txn((Compare("k", "version", "=", 1), Compare("k", "mod_offset", "=", 3)),
              (Put("decided", "yes"),), (Put("decided", "no"),))
    replayed = KvStore()
    replayed.apply_batch(ops(0, *history, txn))
    legacy = KvStore()
    legacy.load_snapshot([Record(value=b'{"op":"put","key":"k","value":"2"}',
                                 key=KV_RECORD_KEY)], next_offset=2)
    legacy.apply_batch(ops(2, *history[2:], txn))
    partial = KvStore()
    partial.apply_batch(ops(0, *history[:3]))
    own = KvStore()
    own.load_snapshot(list(snapshot_records(partial.snapshot_entries())),
                      next_offset=3)
    own.apply_batch(ops(3, *history[3:], txn))
    for store in (replayed, legacy, own):
        assert store.versions_from == 4
        assert [store.meta(key) for key in ("k", "other", "decided")] == \
            [(3, 1), (3, 1), (4, 1)]
        assert store.outcome(4) == replayed.outcome(4)
    # After the first txn, a snapshot carries where versions are counted from, even of an
    # empty map, so that a replica loading it does not start counting again at the next txn.
    emptied = KvStore()
    emptied.apply_batch(ops(0, Put("k", "1"), Txn((), (Delete("k"),), ())))
    records = list(snapshot_records(emptied.snapshot_entries()))
    check_snapshot_records(iter(records))
    reloaded = KvStore()
    reloaded.load_snapshot(records, next_offset=2)
    later: list[KvOp] = [Put("k", "a"), Put("k", "b"),
                         Txn((Compare("k", "version", "=", 2),), (Put("decided", "yes"),), ())]
    for store in (emptied, reloaded):
        store.apply_batch(ops(2, *later))
        assert store.versions_from == 1 and store.get("decided") == "yes"


def test_a_txn_round_trips_through_its_record() -> None:
    txn = Txn((Compare("a", "value", "!=", "é"), Compare("b", "mod_offset", "<", 7)),
              (Put("a", "1"), Delete("b"), Get("c")), (Get("a"),))
    record = encode_op(txn)
    assert decode_op(record) == txn
    assert json.loads(record.value)["op"] == "txn"


def _document(**branches: object) -> dict[str, object]:
    return {"compare": [], "success": [], "failure": [], **branches}


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([], "a txn is a JSON object"),
        ({"compare": [], "then": []}, "unknown txn field 'then'"),
        (_document(success={}), "'success' must be a list"),
        (_document(compare=[{"key": "a", "target": "lease", "result": "=", "lease": 1}]),
         "compare[0]: 'target' must be one of"),
        (_document(compare=[{"key": "a", "target": "value", "result": "~", "value": "1"}]),
         "compare[0]: unknown result '~'"),
        (_document(compare=[{"key": "a", "target": "version", "result": "=", "version": "1"}]),
         "compare[0]: a version compare needs a 64-bit integer"),
        (_document(compare=[{"key": "a", "target": "version", "result": "=", "version": True}]),
         "compare[0]: a version compare needs a 64-bit integer"),
        (_document(compare=[{"key": "a", "target": "value", "result": "="}]),
         "compare[0]: missing 'value'"),
        (_document(compare=[{"key": "", "target": "value", "result": "=", "value": "1"}]),
         "compare[0]: a key must not be empty"),
        (_document(success=[{"op": "cas", "key": "a"}]), "success[0]: expected"),
        (_document(failure=[{"op": "put", "key": "a"}]), "failure[0]: a put has the fields"),
        (_document(success=[{"op": "put", "key": "a", "value": "1"},
                            {"op": "delete", "key": "a"}]),
         "success[1]: key 'a' is put or deleted more than once in 'success'"),
        (_document(success=[{"op": "put", "key": "a", "value": 1}]),
         "success[0]: 'value' must be a string"),
    ],
)
def test_a_malformed_txn_is_refused_with_a_clear_reason(document: object, message: str) -> None:
    with pytest.raises(KvOpError, match=None) as refused:
        txn_from_document(document)
    assert message in str(refused.value)
    assert not refused.value.too_large


def test_the_bounds_are_refused_as_too_large() -> None:
    many = [{"op": "put", "key": f"k{i}", "value": "v"} for i in range(MAX_TXN_OPS + 1)]
    with pytest.raises(KvOpError, match="129 operations in 'success' exceed the limit of 128") \
            as refused:
        txn_from_document(_document(success=many))
    assert refused.value.too_large
    txn_from_document(_document(success=many[:MAX_TXN_OPS]))  # at the bound: fine
    big = "v" * MAX_VALUE_BYTES
    heavy = [{"op": "put", "key": f"k{i}", "value": big}
             for i in range(MAX_TXN_BYTES // MAX_VALUE_BYTES + 1)]
    with pytest.raises(KvOpError, match="exceed the limit of 2097152 bytes per txn") as refused:
        txn_from_document(_document(success=heavy))
    assert refused.value.too_large
    # Text that JSON escapes six-fold: within the bytes bound, over the record's.
    escaped = "\x01" * (MAX_VALUE_BYTES - 10)
    with pytest.raises(KvOpError, match="JSON escapes included") as refused:
        encode_op(Txn((), (Put("a", escaped),), (Put("b", escaped),)))
    assert refused.value.too_large


def test_a_bad_txn_record_from_a_foreign_writer_changes_nothing() -> None:
    store = seeded()
    before = store.items()
    foreign = Record(value=json.dumps({"op": "txn", "compare": [], "success": [
        {"op": "put", "key": "a", "value": "x"}, {"op": "put", "key": "a", "value": "y"}],
        "failure": []}).encode(), key=KV_RECORD_KEY)
    assert store.apply_batch(RecordBatch(base_offset=4, epoch=1, records=(foreign,))) == 0
    assert store.items() == before and store.next_offset == 5
    assert store.outcome(4) is None


def test_a_snapshots_versions_are_checked_before_it_is_kept_or_restored() -> None:
    store = seeded()
    records = list(snapshot_records(store.snapshot_entries()))
    check_snapshot_records(iter(records))  # what a follower and quorum-node restore run
    assert json.loads(records[0].value) == {"format": 1, "versions_from": 0}
    reloaded = KvStore()
    reloaded.load_snapshot(records, next_offset=4)
    assert reloaded.versions_from == 0 and reloaded.meta("a") == (3, 2)
    # Format 0 (one JSON put a key): the versions record is its first record, or nothing the
    # store loads.
    legacy = [Record(value=b'{"op":"versions","from":0}', key=KV_RECORD_KEY),
              Record(value=b'{"op":"put","key":"a","value":"1","mod_offset":3,"version":2}',
                     key=KV_RECORD_KEY)]
    check_snapshot_records(iter(legacy))
    with pytest.raises(CorruptSnapshotError, match="data record 1"):
        check_snapshot_records(iter([legacy[1], legacy[0]]))
    bad = Record(value=b'{"op":"put","key":"k","value":"v","mod_offset":3,"version":0}',
                 key=KV_RECORD_KEY)
    with pytest.raises(CorruptSnapshotError, match=r"data record 0: .*version 0"):
        check_snapshot_records(iter([bad]))
    beyond = Record(value=b'{"op":"put","key":"k","value":"v","mod_offset":30,"version":1}',
                    key=KV_RECORD_KEY)
    with pytest.raises(KvOpError, match="mod_offset 30"):
        KvStore().load_snapshot([beyond], next_offset=10)


# Keys and values that are ASCII or not, empty or over their bounds, repeated or not: what the
# bound on a branch's bytes judges a list at a time, or op by op for what it cannot.
branch_text = st.sampled_from(["", "k", "k", "q", "\u00e9", "\ud800", "x" * (MAX_KEY_BYTES + 1)])
branch_op = st.one_of(st.builds(Put, branch_text, branch_text | st.just("v" * MAX_VALUE_BYTES)),
                      st.builds(Delete, branch_text), st.builds(Get, branch_text))


@given(st.lists(branch_op, max_size=6))
def test_a_branch_is_judged_alike_a_list_at_a_time_and_op_by_op(branch: list[TxnOp]) -> None:
    def judged(check: Callable[[str, tuple[TxnOp, ...]], int]) -> int | str:
        try:
            return check("success", tuple(branch))
        except KvOpError as error:
            return str(error)

    assert judged(_branch_bytes) == judged(_branch_bytes_each)
