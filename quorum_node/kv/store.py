"""The key-value state machine's store: a map of UTF-8 strings applied from committed records,
each an operation of ``quorum_node.kv.ops`` (what its snapshots hold, and loading one, is
``quorum_node.kv.snapshot_data``'s).

Beside each key's value the store keeps its version (writes since it was created: 1 after the
first, gone with the key, as etcd's) and its modification offset (the offset of the last
operation that wrote it, etcd's mod_revision), which a txn compares and a snapshot carries.
They are counted from the quorum's first txn on (``versions_from``): a key last written before
it counts as written once, just before it. Replicas came to their state by different roads (a
replay from the log's start, a snapshot of their own at another offset, a snapshot written
before versions were kept, which carries none), and only that one offset of the log is the
same for all of them, so every replica starts counting there alike. Only a txn reads them.

Every other record, and every control batch, is skipped, so the record log can carry
application records and KV operations side by side. The store is pure and synchronous: the
same committed records in the same order give the same map on every replica. It lives in memory
and is rebuilt from the log at start-up.

Each applied operation leaves an ``Outcome`` (a txn a ``TxnOutcome``) under its offset, so that
the API that wrote it can tell its caller whether a cas applied. Outcomes are kept for the most
recent ``outcome_limit`` operations only (writers collect theirs as soon as their offset is
applied).

Each change of the map is also kept, in its change history, which a watch reads from an offset
on: the most recent ``event_limit`` changes, and no more than ``event_bytes_limit`` bytes of them
(``change_bytes``: a change of one large value counts as what it holds, so the history never
holds more than the bound however the writes are shaped, during a start-up's replay as after);
``events_start`` is the first offset whose changes are all still known (the snapshot's end after
loading one, later the first change dropped plus one). Watches that wait for a change register in
the store's ``WatchIndex``, by key and by prefix, and each change is handed to the ones it
concerns only: an applied operation costs a dict lookup or two, however many watches wait.

The keys are kept in order beside the map (a ``SortedList``, a pointer a key), so that a page of
a listing is a bisection and the page's entries, not a sort of every key.
"""

from __future__ import annotations

import bisect
import logging
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from operator import itemgetter
from typing import Protocol

from sortedcontainers import SortedList

from quorum_node.kv.ops import (
    ABSENT_MOD_OFFSET,
    ABSENT_VERSION,
    KV_RECORD_KEY,
    Cas,
    Delete,
    Get,
    KvOpError,
    Outcome,
    Put,
    Txn,
    TxnOutcome,
    TxnResponse,
    compare_holds,
    decode_op,
    text_bytes,
)
from quorum_node.kv.snapshot_data import Entry, LoadedSnapshot, SnapshotEntries
from quorum_node.raft.records import Record, RecordBatch, decode_batch, read_batch_header

logger = logging.getLogger(__name__)

DEFAULT_OUTCOME_LIMIT = 100_000
DEFAULT_EVENT_LIMIT = 100_000
DEFAULT_EVENT_BYTES_LIMIT = 64 * 1024 * 1024
# What keeping a change costs besides its key's and value's bytes (its tuple, its offset): a
# history of many tiny changes is bounded by its bytes too.
CHANGE_OVERHEAD_BYTES = 64
# Outcomes are immutable and only four: shared, not made for each of the millions of operations
# a start-up replays.
_OUTCOMES = {(applied, existed): Outcome(applied, existed)
             for applied in (False, True) for existed in (False, True)}


def change_bytes(key: str, value: str | None) -> int:
    """What a change (or an entry of a listing) counts for against the history's bound and an
    answer's: its key's and value's UTF-8 bytes, plus CHANGE_OVERHEAD_BYTES."""
    return text_bytes(key) + (0 if value is None else text_bytes(value)) + CHANGE_OVERHEAD_BYTES


@dataclass(frozen=True, slots=True)
class KvEvent:
    """A change of the map: the operation at ``offset`` set ``key`` to ``value`` (None: deleted
    it). Operations that changed nothing (a cas that did not apply, a delete of an absent key)
    leave no event."""

    offset: int
    key: str
    value: str | None


class ChangeWatcher(Protocol):
    """A watch waiting for changes (``quorum_node.node.kv_service``'s): of the key ``watched``
    if ``exact``, else of the keys starting with it."""

    @property
    def watched(self) -> str: ...

    @property
    def exact(self) -> bool: ...

    def take(self, offset: int, key: str, value: str | None, size: int) -> bool:
        """A change it watches was applied; False once it wants no more (its answer is full:
        the index forgets it)."""

    def end(self, *, lost: bool) -> None:
        """No more changes will come: the store stopped following the log, or (``lost``) the
        changes it waits on were replaced by a snapshot's map. The index forgets it."""


# The changes dropped from the head of the history are replaced by this (their values freed at
# once); the list is compacted once they are half of it.
_DROPPED = (-1, "", None, 0)
_COMPACT_AT = 1024
_change_offset = itemgetter(0)
_change_size = itemgetter(3)
# A txn's response made from its whole tuple, in C: NamedTuple's own constructor is a Python
# function (for its defaults), and a replay makes one for every put of every txn.
_response: Callable[[tuple[str, str, bool, None, int, int]], TxnResponse] = partial(
    tuple.__new__, TxnResponse)


class WatchIndex:
    """The watches waiting for a change, by key (exact) and by prefix. A change is handed to the
    watches of its key, and to those of each registered prefix length that its key is long
    enough for (one dict lookup each): what an applied change costs does not grow with the
    number of watches that it does not concern."""

    def __init__(self) -> None:
        self._by_key: dict[str, set[ChangeWatcher]] = {}
        self._by_prefix: dict[str, set[ChangeWatcher]] = {}
        self._prefix_lengths: Counter[int] = Counter()  # registered prefixes of each length
        self._lengths: list[int] = []  # the lengths registered, ascending

    def __len__(self) -> int:
        return (sum(len(w) for w in self._by_key.values())
                + sum(len(w) for w in self._by_prefix.values()))

    def __bool__(self) -> bool:
        return bool(self._by_key or self._by_prefix)

    def add(self, watcher: ChangeWatcher) -> None:
        if watcher.exact:
            self._by_key.setdefault(watcher.watched, set()).add(watcher)
            return
        watchers = self._by_prefix.setdefault(watcher.watched, set())
        if not watchers:
            length = len(watcher.watched)
            self._prefix_lengths[length] += 1
            if self._prefix_lengths[length] == 1:
                bisect.insort(self._lengths, length)
        watchers.add(watcher)

    def discard(self, watcher: ChangeWatcher) -> None:
        index = self._by_key if watcher.exact else self._by_prefix
        watchers = index.get(watcher.watched)
        if watchers is None or watcher not in watchers:
            return
        watchers.discard(watcher)
        if watchers:
            return
        del index[watcher.watched]
        if not watcher.exact:
            length = len(watcher.watched)
            self._prefix_lengths[length] -= 1
            if not self._prefix_lengths[length]:
                del self._prefix_lengths[length]
                self._lengths.remove(length)

    def deliver(self, offset: int, key: str, value: str | None, size: int) -> None:
        """Hand the change at ``offset`` to the watches it concerns."""
        watchers = self._by_key.get(key)
        if watchers:
            self._hand(watchers, offset, key, value, size)
        for length in self._lengths:
            if length > len(key):
                break
            watchers = self._by_prefix.get(key[:length])
            if watchers:
                self._hand(watchers, offset, key, value, size)

    def _hand(self, watchers: set[ChangeWatcher], offset: int, key: str, value: str | None,
              size: int) -> None:
        for watcher in list(watchers):
            if not watcher.take(offset, key, value, size):
                self.discard(watcher)

    def end_all(self, *, lost: bool) -> None:
        """End every watch (``ChangeWatcher.end``) and forget them all."""
        everyone = [w for index in (self._by_key, self._by_prefix) for ws in index.values()
                    for w in ws]
        self._by_key.clear()
        self._by_prefix.clear()
        self._prefix_lengths.clear()
        self._lengths.clear()
        for watcher in everyone:
            watcher.end(lost=lost)


class KvStore:
    """The map, its keys in order, the offset it has applied up to, the outcomes of recent
    operations and the history of recent changes, and the watches waiting for the next."""

    def __init__(self, outcome_limit: int = DEFAULT_OUTCOME_LIMIT,
                 event_limit: int = DEFAULT_EVENT_LIMIT,
                 event_bytes_limit: int = DEFAULT_EVENT_BYTES_LIMIT) -> None:
        if outcome_limit < 1 or event_limit < 1 or event_bytes_limit < 1:
            raise ValueError("outcome_limit, event_limit and event_bytes_limit must be at "
                             "least 1")
        # Each key's value, modification offset and version, in one tuple: one dict entry a
        # key, which is what building the map from a snapshot of a million keys costs most.
        self._entries: dict[str, Entry] = {}
        self._keys: SortedList[str] = SortedList()
        self._outcomes: OrderedDict[int, Outcome | TxnOutcome] = OrderedDict()
        self._outcome_limit = outcome_limit
        # (offset, key, value, size) of each change from _events_head on, in offset order: a
        # KvEvent is made for a watch that reads one, not for each of the millions of
        # operations a start-up replays. A list with a moving head rather than a deque, so
        # that a watch finds its offset by bisection.
        self._events: list[tuple[int, str, str | None, int]] = []
        self._events_head = 0
        self._event_limit = event_limit
        self._event_bytes_limit = event_bytes_limit
        self.events_bytes = 0  # change_bytes of the changes kept
        self.events_start = 0  # every change at or after this offset is kept
        self.next_offset = 0  # every offset below it is applied
        # The operations of txns beyond one each, applied since the store started or loaded a
        # snapshot: a txn record costs a replay what its operations do, which the snapshot
        # policy counts (``quorum_node.kv.machine``).
        self.txn_extra_ops = 0
        # The offset of the quorum's first txn, from which versions and modification offsets
        # are counted alike on every replica; None before it.
        self.versions_from: int | None = None
        self.watchers = WatchIndex()

    @property
    def applied_offset(self) -> int:
        """The last offset applied; -1 before any."""
        return self.next_offset - 1

    @property
    def events_kept(self) -> int:
        return len(self._events) - self._events_head

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> str | None:
        entry = self._entries.get(key)
        return None if entry is None else entry[0]

    def meta(self, key: str) -> tuple[int, int]:
        """``key``'s modification offset and version (ABSENT_MOD_OFFSET and ABSENT_VERSION if
        it is absent)."""
        entry = self._entries.get(key)
        return (ABSENT_MOD_OFFSET, ABSENT_VERSION) if entry is None else (entry[1], entry[2])

    def items(self) -> list[tuple[str, str]]:
        entries = self._entries
        return [(key, entries[key][0]) for key in self._keys]

    def scan(self, prefix: str, start_after: str | None, limit: int,
             max_bytes: int) -> tuple[list[tuple[str, str]], bool]:
        """Up to ``limit`` entries whose key starts with ``prefix`` and sorts after
        ``start_after``, in key order, no more than ``max_bytes`` of them (``change_bytes``)
        unless the first alone is larger; and whether more keys follow."""
        keys, stored = self._keys, self._entries
        if start_after is not None and start_after >= prefix:
            first = keys.bisect_right(start_after)
        else:
            first = keys.bisect_left(prefix)
        entries: list[tuple[str, str]] = []
        size = 0
        for key in keys.islice(first, None):
            if not key.startswith(prefix):
                return entries, False
            value = stored[key][0]
            entry_size = change_bytes(key, value)
            if len(entries) == limit or (entries and size + entry_size > max_bytes):
                return entries, True
            entries.append((key, value))
            size += entry_size
        return entries, False

    def changes(self, offset: int, watched: str, exact: bool, *, into: list[KvEvent],
                size: int, max_events: int, max_bytes: int,
                max_scanned: int) -> tuple[int, int, bool]:
        """Add to ``into`` the changes at or after ``offset`` of the key ``watched``
        (``exact``) or of the keys starting with it, in offset order: up to ``max_events`` in
        ``into``, no more than ``max_bytes`` of them (``size`` so far) unless the first alone
        is larger (more, rather than split the changes of one offset, a txn's, between two
        answers), looking at no more than ``max_scanned`` changes (a bound on the time one
        call takes). Returns the new size, the offset the next look continues from, and
        whether the answer is done (full, or every change kept was looked at). The caller
        checks ``offset >= events_start``."""
        events = self._events
        position = bisect.bisect_left(events, offset, lo=self._events_head, key=_change_offset)
        end = min(len(events), position + max_scanned)
        while position < end:
            event_offset, key, value, change_size = events[position]
            position += 1
            if not (key == watched if exact else key.startswith(watched)):
                continue
            # The changes of one offset (a txn's) are never split between answers: the next
            # answer starts at an offset.
            same_offset = bool(into) and into[-1].offset == event_offset
            if not same_offset and len(into) >= max_events:
                return size, event_offset, True
            if into and not same_offset and size + change_size > max_bytes:
                return size, event_offset, True
            into.append(KvEvent(event_offset, key, value))
            size += change_size
            if len(into) >= max_events and (position == len(events)
                                            or events[position][0] != event_offset):
                return size, event_offset + 1, True
        if position < len(events):
            return size, events[position][0], False
        return size, max(offset, self.next_offset), True

    def snapshot_entries(self) -> SnapshotEntries:
        """The map as it is now (its keys in order; each one's value, modification offset and
        version), and where versions are counted from, for a snapshot written in the
        background: a copy of the key list and of the map alone (the entries, immutable, are
        shared), quick enough for the event loop, where laying out and encoding a large map's
        entries is not (``snapshot_records`` does that, in a thread)."""
        return SnapshotEntries(list(self._keys), self._entries.copy(), self.versions_from)

    def load_snapshot(self, records: Iterable[Record], next_offset: int) -> None:
        """Replace the map by a snapshot's data records (``snapshot_data``), as of
        ``next_offset`` (its end offset). Raises KvOpError, leaving the store as it was, for a
        snapshot it cannot load."""
        self.install_snapshot(LoadedSnapshot.build(records, next_offset))

    def install_snapshot(self, loaded: LoadedSnapshot) -> None:
        """Replace the map by a snapshot built (``LoadedSnapshot.build``) beside the store: a
        swap, whatever the snapshot's size."""
        next_offset = loaded.next_offset
        self._entries = loaded.entries
        self.versions_from = loaded.versions_from
        self._keys = loaded.keys
        self._outcomes.clear()
        self._events.clear()
        self._events_head = 0
        self.events_bytes = 0
        self.events_start = next_offset  # what changed before is folded into the snapshot
        self.next_offset = next_offset
        self.txn_extra_ops = 0
        # The changes a waiting watch has not been given are part of the snapshot now.
        self.watchers.end_all(lost=True)

    def apply_batch(self, batch: RecordBatch, limit: int | None = None) -> int:
        """Apply the records of a committed batch that are not applied yet, in offset order,
        stopping before offset ``limit`` (the high watermark: nothing above it is committed).
        Returns how many KV operations were applied.

        Raises ValueError if the batch starts after ``next_offset``: a gap would mean a record
        was skipped, and replicas would diverge."""
        if batch.base_offset > self.next_offset:
            raise ValueError(
                f"batch at offset {batch.base_offset} leaves a gap after {self.applied_offset}")
        end = batch.next_offset if limit is None else min(batch.next_offset, limit)
        if end <= self.next_offset:
            return 0
        applied = 0
        if not batch.is_control:
            for offset in range(self.next_offset, end):
                if self._apply_record(offset, batch.records[offset - batch.base_offset]):
                    applied += 1
        self.next_offset = end
        return applied

    def apply_encoded(self, data: bytes, limit: int) -> None:
        """Apply encoded batches (as read from the log, starting with the batch holding
        ``next_offset``) up to offset ``limit`` (the high watermark).

        Most batches hold application records only: those are recognized from their bytes,
        which cannot hold a KV operation without holding KV_RECORD_KEY, and skipped undecoded
        (decoding every record on every replica would cost as much as the whole write path)."""
        position = 0
        while position < len(data):
            # The log checked every CRC when it wrote or recovered the batch.
            header = read_batch_header(data, position, verify_crc=False)
            if header.base_offset >= limit:
                return
            if header.is_control or data.find(KV_RECORD_KEY, position, header.end) < 0:
                self.skip_batch(header.base_offset, header.next_offset, limit)
            else:
                batch, _ = decode_batch(data, position)
                self.apply_batch(batch, limit)
            position = header.end

    def skip_batch(self, base_offset: int, next_offset: int, limit: int | None = None) -> None:
        """Move past a committed batch known to hold no KV operation (a control batch, or one
        whose bytes do not contain KV_RECORD_KEY), without decoding it. Same offset rules as
        ``apply_batch``."""
        if base_offset > self.next_offset:
            raise ValueError(
                f"batch at offset {base_offset} leaves a gap after {self.applied_offset}")
        end = next_offset if limit is None else min(next_offset, limit)
        self.next_offset = max(self.next_offset, end)

    def _apply_record(self, offset: int, record: Record) -> bool:
        try:
            op = decode_op(record)
        except KvOpError as error:
            # Only a foreign writer could produce this (the API checks every op it appends);
            # skipping it is deterministic, so every replica skips it alike.
            logger.warning("skipping malformed KV operation at offset %d: %s", offset, error)
            return False
        if op is None:
            return False
        if isinstance(op, Txn):
            done = self.apply_txn(op, offset)
            self._record(offset, done)
            self.txn_extra_ops += max(0, len(op.compares) + len(done.responses) - 1)
            return True
        outcome = self.apply(op, offset)
        self._record(offset, outcome)
        if outcome.applied:
            # What the key holds now: a put's or an applied cas's value, None after a delete.
            self._record_event(offset, op.key, None if isinstance(op, Delete) else op.value)
        return True

    def _record_event(self, offset: int, key: str, value: str | None) -> None:
        """``_record_events`` of the one change most operations make."""
        size = change_bytes(key, value)
        self._events.append((offset, key, value, size))
        self.events_bytes += size
        if self.watchers:
            self.watchers.deliver(offset, key, value, size)
        self._bound_events()

    def _record_events(self, offset: int, changes: Iterable[tuple[str, str | None]]) -> None:
        """Keep the changes the operation at ``offset`` made (in its order), hand them to the
        watches they concern, then drop the oldest beyond the history's bounds."""
        events = self._events
        deliver = self.watchers.deliver if self.watchers else None
        added = 0
        for key, value in changes:
            size = change_bytes(key, value)
            events.append((offset, key, value, size))
            added += size
            if deliver is not None:
                deliver(offset, key, value, size)
        self.events_bytes += added
        self._bound_events()

    def _bound_events(self) -> None:
        """Drop the oldest changes beyond the history's count and bytes."""
        events = self._events
        head = self._events_head
        excess = len(events) - head - self._event_limit
        if excess > 1:  # many beyond the count (a txn's): dropped at once, not one by one
            dropped = events[head:head + excess]
            events[head:head + excess] = [_DROPPED] * excess
            head += excess
            self.events_bytes -= sum(map(_change_size, dropped))
            self.events_start = dropped[-1][0] + 1
            excess = 0
        # One beyond the count (each change once the history is full), or beyond the bytes.
        while excess > 0 or self.events_bytes > self._event_bytes_limit:
            dropped_offset, _, _, dropped_size = events[head]
            events[head] = _DROPPED
            head += 1
            excess -= 1
            self.events_bytes -= dropped_size
            self.events_start = dropped_offset + 1
        if head >= _COMPACT_AT and head * 2 >= len(events):
            del events[:head]
            head = 0
        self._events_head = head

    def apply(self, op: Put | Delete | Cas, offset: int) -> Outcome:
        """Apply one operation, the one at ``offset``, to the map (without moving
        ``next_offset``)."""
        entry = self._entries.get(op.key)
        existed = entry is not None
        if isinstance(op, Put):
            self._set(op.key, op.value, entry, offset)
            return _OUTCOMES[True, existed]
        if isinstance(op, Delete):
            if existed:
                self._remove(op.key)
            return _OUTCOMES[existed, existed]
        if (None if entry is None else entry[0]) != op.expected:
            return _OUTCOMES[False, existed]
        if op.value is not None:
            self._set(op.key, op.value, entry, offset)
        elif existed:
            self._remove(op.key)
        return _OUTCOMES[True, existed]

    def apply_txn(self, txn: Txn, offset: int) -> TxnOutcome:
        """Apply the txn at ``offset``: its compares against the map as it is, then the branch
        they choose, in order (a get sees the branch's writes before it), each write at
        ``offset``. Depends on the map and the txn alone: every replica does the same.

        One loop with nothing called a put but the map's and the key order's own methods: a
        replay applies every put of every txn since the snapshot."""
        if self.versions_from is None:
            self._start_versions(offset)
        entries = self._entries
        succeeded = all(compare_holds(c, self.get(c.key), *self._version_and_mod(c.key))
                        for c in txn.compares)
        responses: list[TxnResponse] = []
        changes: list[tuple[str, str | None]] = []
        respond, change, add_key = responses.append, changes.append, self._keys.add
        for op in txn.success if succeeded else txn.failure:
            key = op.key
            entry = entries.get(key)
            if type(op) is Put:
                value = op.value
                if entry is None:
                    add_key(key)
                    entries[key] = (value, offset, 1)
                    respond(_response(("put", key, False, None, ABSENT_VERSION,
                                       ABSENT_MOD_OFFSET)))
                else:
                    entries[key] = (value, offset, entry[2] + 1)
                    respond(_response(("put", key, True, None, ABSENT_VERSION,
                                       ABSENT_MOD_OFFSET)))
                change((key, value))
            elif type(op) is Get:
                if entry is None:
                    respond(TxnResponse("get", key, False))
                else:
                    value, mod_offset, version = entry
                    respond(TxnResponse("get", key, True, value, version, mod_offset))
            else:
                if entry is not None:
                    self._remove(key)
                    change((key, None))
                respond(TxnResponse("delete", key, entry is not None))
        if changes:
            self._record_events(offset, changes)
        return TxnOutcome(succeeded, tuple(responses))

    def _start_versions(self, offset: int) -> None:
        """Count versions from the quorum's first txn, at ``offset``: every key counts as
        written once, just before it (see the module's docstring)."""
        before = max(offset - 1, 0)
        self._entries = {key: (entry[0], before, 1) for key, entry in self._entries.items()}
        self.versions_from = offset

    def _version_and_mod(self, key: str) -> tuple[int, int]:
        mod_offset, version = self.meta(key)
        return version, mod_offset

    def _set(self, key: str, value: str, previous: Entry | None, offset: int) -> None:
        """Write ``key`` at ``offset``; ``previous`` is its entry before (None: absent)."""
        if previous is None:
            self._keys.add(key)
            self._entries[key] = (value, offset, 1)
        else:
            self._entries[key] = (value, offset, previous[2] + 1)

    def _remove(self, key: str) -> None:
        del self._entries[key]
        self._keys.remove(key)

    def _record(self, offset: int, outcome: Outcome | TxnOutcome) -> None:
        self._outcomes[offset] = outcome
        while len(self._outcomes) > self._outcome_limit:
            self._outcomes.popitem(last=False)

    def outcome(self, offset: int) -> Outcome | TxnOutcome | None:
        """The outcome of the operation at ``offset``; None if there is none (not applied yet,
        not a KV operation, or too old to be remembered)."""
        return self._outcomes.get(offset)

    def pop_outcome(self, offset: int) -> Outcome | TxnOutcome | None:
        """Like ``outcome``, and forget it (a writer collects its outcome once)."""
        return self._outcomes.pop(offset, None)
