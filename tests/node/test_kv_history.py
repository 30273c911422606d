"""The key-value store's bounds against a client that reads or writes a lot: the change history
bounded in bytes (live, and when a start-up replays the log), pages and watch answers bounded in
bytes, the ordered index of keys a listing pages through, and the index that hands a change to
the waiting watches it concerns only."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from quorum_node.kv.ops import Cas, Delete, Get, KvOp, Put, Txn, encode_op
from quorum_node.kv.store import CHANGE_OVERHEAD_BYTES, KvEvent, KvStore, change_bytes
from quorum_node.raft.records import RecordBatch

MIB = 1024 * 1024


def ops(base: int, *operations: KvOp) -> RecordBatch:
    return RecordBatch(base_offset=base, epoch=1, records=tuple(encode_op(op) for op in operations))


def test_the_history_is_bounded_in_bytes_live_and_when_the_log_is_replayed() -> None:
    bound = 2 * MIB
    value = "v" * (MIB // 4)
    batches = [ops(offset, Put("hot", value + str(offset))) for offset in range(300)]
    live = KvStore(event_bytes_limit=bound)
    for each in batches:
        live.apply_batch(each)
        assert live.events_bytes <= bound
    # 300 changes of a quarter MiB: a count bound alone kept 75 MiB of them.
    assert live.events_kept == bound // change_bytes("hot", value + "299")
    assert live.events_start == 300 - live.events_kept
    # A start-up rebuilds the store from the log's bytes: the same bound, the same history.
    replayed = KvStore(event_bytes_limit=bound)
    replayed.apply_encoded(b"".join(each.encode() for each in batches), limit=300)
    assert (replayed.events_bytes, replayed.events_start) == (live.events_bytes,
                                                              live.events_start)
    found: list[KvEvent] = []
    replayed.changes(replayed.events_start, "hot", True, into=found, size=0, max_events=1000,
                     max_bytes=1 << 40, max_scanned=1 << 40)
    assert [e.offset for e in found] == list(range(live.events_start, 300))


def test_a_history_of_tiny_changes_counts_what_each_costs_beside_its_bytes() -> None:
    store = KvStore(event_bytes_limit=100 * CHANGE_OVERHEAD_BYTES)
    store.apply_batch(ops(0, *(Put(f"k{i}", "") for i in range(1000))))
    assert store.events_kept < 100 and store.events_bytes <= 100 * CHANGE_OVERHEAD_BYTES


def test_utf8_sizes_count_every_byte() -> None:
    assert change_bytes("k\u00e9", "\U0001f642") == 1 + 2 + 4 + CHANGE_OVERHEAD_BYTES
    assert change_bytes("k", None) == 1 + CHANGE_OVERHEAD_BYTES


def test_a_page_of_keys_is_bounded_in_bytes_and_says_more_follow() -> None:
    store = KvStore()
    big = "x" * 300_000
    store.apply_batch(ops(0, *(Put(f"big/{i}", big) for i in range(5)), Put("small", "s")))
    entries, more = store.scan("big/", None, 100, MIB)
    assert [key for key, _ in entries] == ["big/0", "big/1", "big/2"] and more
    entries, more = store.scan("big/", "big/2", 100, MIB)
    assert [key for key, _ in entries] == ["big/3", "big/4"] and not more
    # One entry larger than the bound still makes a page (else nothing could read it).
    entries, more = store.scan("big/", None, 100, 1000)
    assert [key for key, _ in entries] == ["big/0"] and more


def test_a_watch_answer_is_bounded_in_bytes_and_continues_where_it_stopped() -> None:
    store = KvStore()
    big = "x" * 300_000
    store.apply_batch(ops(0, *(Put("big", big + str(i)) for i in range(5))))
    found: list[KvEvent] = []
    size, next_offset, done = store.changes(0, "big", True, into=found, size=0, max_events=100,
                                            max_bytes=MIB, max_scanned=1000)
    assert [e.offset for e in found] == [0, 1, 2] and done and next_offset == 3
    assert size == 3 * change_bytes("big", big + "0")


def test_a_long_look_at_the_history_is_done_in_slices() -> None:
    store = KvStore()
    store.apply_batch(ops(0, *(Put(f"other/{i}", "v") for i in range(50)), Put("mine", "1")))
    found: list[KvEvent] = []
    _, next_offset, done = store.changes(0, "mine", True, into=found, size=0, max_events=10,
                                         max_bytes=MIB, max_scanned=20)
    assert (found, next_offset, done) == ([], 20, False)  # looked at 20, continue from there
    _, next_offset, done = store.changes(next_offset, "mine", True, into=found, size=0,
                                         max_events=10, max_bytes=MIB, max_scanned=40)
    assert (found, next_offset, done) == ([KvEvent(50, "mine", "1")], 51, True)


KEYS = ["ak", "a/k", "a/bk", "abk", "bk", "b\u00e9k", "k"]
put = st.builds(Put, st.sampled_from(["a", "a/", "a/b", "ab", "b", "b\u00e9", ""]).map(
    lambda k: k + "k"), st.text(max_size=3))
delete = st.builds(Delete, st.sampled_from(KEYS))
# A txn's branch writes each key once at most; with no compare, its success branch runs.
txn = st.lists(put | delete, max_size=4, unique_by=lambda op: op.key).map(
    lambda writes: Txn((), tuple(writes), ()))
# A snapshot's map (a dict in the list), loaded in the store's place: a leader's, say.
operation = st.one_of(
    put, delete,
    st.builds(Cas, st.sampled_from(["ak", "a/k", "bk"]), st.none() | st.text(max_size=2),
              st.none() | st.text(max_size=2)),
    txn, st.dictionaries(st.sampled_from(KEYS), st.text(max_size=2), max_size=4),
)


@given(st.lists(operation, max_size=40), st.sampled_from(["", "a", "a/", "b", "z"]),
       st.none() | st.sampled_from(["", "a", "a/k", "ak", "bk"]),
       st.integers(min_value=1, max_value=5))
def test_pages_follow_the_map_in_key_order_whatever_was_put_and_deleted(
        operations: list[KvOp | dict[str, str]], prefix: str, start_after: str | None,
        limit: int) -> None:
    """Puts, deletes, cas, txns writing several keys, and snapshots loaded in the map's place:
    the ordered index of keys a page bisects stays the map's keys."""
    store = KvStore()
    model: dict[str, str] = {}
    for offset, op in enumerate(operations):
        if isinstance(op, dict):
            model = dict(op)
            store.load_snapshot([encode_op(Put(key, value)) for key, value in
                                 sorted(model.items())], next_offset=offset + 1)
            continue
        store.apply_batch(ops(offset, op))
        for write in op.success if isinstance(op, Txn) else (op,):
            apply_to_model(model, write)
    expected = sorted((k, v) for k, v in model.items() if k.startswith(prefix)
                      and (start_after is None or k > start_after))
    assert store.items() == sorted(model.items())
    entries, more = store.scan(prefix, start_after, limit, MIB)
    assert entries == expected[:limit] and more == (len(expected) > limit)


def apply_to_model(model: dict[str, str], op: Put | Delete | Cas | Get) -> None:
    """What ``op`` writes to the model (a txn's Get writes nothing)."""
    if isinstance(op, Put):
        model[op.key] = op.value
    elif isinstance(op, Delete):
        model.pop(op.key, None)
    elif isinstance(op, Cas) and model.get(op.key) == op.expected:
        if op.value is None:
            model.pop(op.key, None)
        else:
            model[op.key] = op.value


@dataclass(eq=False)
class Watcher:
    watched: str
    exact: bool
    room: int = 1000
    taken: list[int] = field(default_factory=list)
    ended: bool | None = None  # lost, once ended

    def take(self, offset: int, key: str, value: str | None, size: int) -> bool:
        self.taken.append(offset)
        return len(self.taken) < self.room

    def end(self, *, lost: bool) -> None:
        self.ended = lost


def test_a_change_is_handed_only_to_the_watches_it_concerns() -> None:
    store = KvStore()
    idle = [Watcher(f"idle-{i}/", exact=False) for i in range(10_000)]
    idle += [Watcher(f"idle-key-{i}", exact=True) for i in range(10_000)]
    key, prefix, everything = Watcher("a/b", True), Watcher("a/", False), Watcher("", False)
    longer = Watcher("a/bc", False)  # longer than a/b: not its prefix
    for watcher in [*idle, key, prefix, everything, longer]:
        store.watchers.add(watcher)
    store.apply_batch(ops(0, Put("a/b", "1"), Put("zz", "2"), Put("a/bcd", "3"), Delete("a/b")))
    assert all(not watcher.taken for watcher in idle)
    assert key.taken == [0, 3] and prefix.taken == [0, 2, 3]
    assert everything.taken == [0, 1, 2, 3] and longer.taken == [2]
    store.apply_batch(ops(4, Put("idle-7/x", "v"), Put("idle-key-9", "v")))
    assert [w.taken for w in idle if w.taken] == [[4], [5]]
    assert len(store.watchers) == 20_004


def test_a_full_watch_is_forgotten_and_a_snapshot_ends_every_watch_as_lost() -> None:
    store = KvStore()
    full, waiting = Watcher("k", True, room=1), Watcher("k", True)
    store.watchers.add(full)
    store.watchers.add(waiting)
    store.apply_batch(ops(0, Put("k", "1"), Put("k", "2")))
    assert full.taken == [0] and waiting.taken == [0, 1] and len(store.watchers) == 1
    store.load_snapshot([encode_op(Put("k", "9"))], next_offset=10)
    assert waiting.ended is True and full.ended is None and not store.watchers
    store.watchers.add(waiting)
    store.watchers.discard(waiting)
    store.watchers.discard(waiting)  # forgetting twice is harmless
    assert not store.watchers


history_key = st.sampled_from(["a", "b", "\u00e9", "long/" + "k" * 40])
history_value = st.sampled_from(["", "1", "\u00e9\U0001f642", "v" * 200])
history_op = st.one_of(
    st.builds(Put, history_key, history_value), st.builds(Delete, history_key),
    st.builds(lambda puts, deletes: Txn((), (*puts, *deletes), ()),
              st.lists(st.builds(Put, st.sampled_from(["t1", "t2", "t\u00e9"]), history_value),
                       max_size=3, unique_by=lambda op: op.key),
              st.lists(st.builds(Delete, st.sampled_from(["a", "b"])), max_size=2,
                       unique_by=lambda op: op.key)))


@given(st.lists(history_op, max_size=25), st.integers(1, 6), st.integers(1, 6))
def test_the_history_keeps_the_newest_changes_within_both_bounds(
        operations: list[KvOp], event_limit: int, overheads: int) -> None:
    """Against a model that keeps every change and drops the oldest while either bound is
    exceeded: the same changes kept, their bytes, and where the history starts."""
    bytes_limit = overheads * CHANGE_OVERHEAD_BYTES + 300
    store = KvStore(event_limit=event_limit, event_bytes_limit=bytes_limit)
    model: list[tuple[int, str, str | None]] = []
    start = 0
    for offset, op in enumerate(operations):
        before = dict(store.items())
        store.apply_batch(ops(offset, op))
        after = dict(store.items())
        model += [(offset, key, after.get(key)) for key in _written(op)
                  if key in before or key in after]
        while len(model) > event_limit or sum(
                change_bytes(key, value) for _, key, value in model) > bytes_limit:
            start = model.pop(0)[0] + 1
    found: list[KvEvent] = []
    store.changes(0, "", False, into=found, size=0, max_events=1000, max_bytes=1 << 40,
                  max_scanned=1 << 40)
    assert [(e.offset, e.key, e.value) for e in found] == model
    assert store.events_bytes == sum(change_bytes(key, value) for _, key, value in model)
    assert store.events_start == start


def _written(op: KvOp) -> list[str]:
    return [each.key for each in op.success] if isinstance(op, Txn) else [op.key]
