"""The key-value state machine: a map of UTF-8 strings applied from committed records.

A KV operation is a record whose key is ``KV_RECORD_KEY`` and whose value is one JSON object::

    {"op": "put", "key": K, "value": V}
    {"op": "delete", "key": K}
    {"op": "cas", "key": K, "expected": E or null, "value": V or null}

A cas applies only when the key's current value equals ``expected`` (null: the key must be
absent); it then sets ``value`` (null: deletes the key). Every other record, and every control
batch, is skipped, so the record log can carry application records and KV operations side by
side. The store is pure and synchronous: the same committed records in the same order give the
same map on every replica. It lives in memory and is rebuilt from the log at start-up.

Each applied operation leaves an ``Outcome`` under its offset, so that the API that wrote it can
tell its caller whether a cas applied. Outcomes are kept for the most recent ``outcome_limit``
operations only (writers collect theirs as soon as their offset is applied).

Each change of the map is also kept as a ``KvEvent`` (the most recent ``event_limit``), which a
watch reads from an offset on; ``events_start`` is the first offset whose changes are all still
known (the snapshot's end after loading one, later the first event dropped plus one).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from quorum_node.raft.records import Record, RecordBatch, decode_batch, read_batch_header

logger = logging.getLogger(__name__)

# The NUL byte keeps it apart from any printable key an application might use.
KV_RECORD_KEY = b"\x00kv"
MAX_KEY_BYTES = 1024  # UTF-8 bytes of a key
MAX_VALUE_BYTES = 1024 * 1024  # UTF-8 bytes of a value
DEFAULT_OUTCOME_LIMIT = 100_000
DEFAULT_EVENT_LIMIT = 100_000
# Bounds on a KV record's JSON before it is parsed. An operation is one flat object, so any
# nesting is foreign; without the depth bound a deeply nested document exhausts the parser's
# recursion on every replica (and again at every replay). The size bound is what the largest
# valid cas can take: a key and two values, each character escaped at worst as \uXXXX.
MAX_OP_DEPTH = 32
MAX_OP_BYTES = 6 * (MAX_KEY_BYTES + 2 * MAX_VALUE_BYTES) + 256


class KvOpError(ValueError):
    """An operation is malformed or exceeds a limit; ``too_large`` tells a limit from a typo."""

    def __init__(self, message: str, *, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: str


@dataclass(frozen=True, slots=True)
class Delete:
    key: str


@dataclass(frozen=True, slots=True)
class Cas:
    key: str
    expected: str | None  # None: the key must be absent
    value: str | None  # None: delete the key


KvOp = Put | Delete | Cas


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an applied operation did. ``applied`` is False only for a cas whose expectation did
    not hold (the map is then unchanged); ``existed`` is whether the key was present before."""

    applied: bool
    existed: bool


# Outcomes are immutable and only four: shared, not made for each of the millions of operations
# a start-up replays.
_OUTCOMES = {(applied, existed): Outcome(applied, existed)
             for applied in (False, True) for existed in (False, True)}


def check_key(key: str) -> None:
    if not key:
        raise KvOpError("a key must not be empty")
    size = _utf8_size(key, "key")
    if size > MAX_KEY_BYTES:
        raise KvOpError(f"key of {size} bytes exceeds the limit of {MAX_KEY_BYTES} bytes",
                        too_large=True)


def check_value(value: str) -> None:
    size = _utf8_size(value, "value")
    if size > MAX_VALUE_BYTES:
        raise KvOpError(f"value of {size} bytes exceeds the limit of {MAX_VALUE_BYTES} bytes",
                        too_large=True)


def _utf8_size(text: str, what: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:  # lone surrogates, e.g. from a JSON "\ud800" escape
        raise KvOpError(f"the {what} is not valid Unicode text") from None


def check_op(op: KvOp) -> None:
    """Raise KvOpError if ``op`` breaks a limit (what the API refuses before appending)."""
    check_key(op.key)
    if isinstance(op, Put):
        check_value(op.value)
    elif isinstance(op, Cas):
        for text in (op.expected, op.value):
            if text is not None:
                check_value(text)


def encode_op(op: KvOp) -> Record:
    """The record that carries ``op``; it is checked first, so the log only gets valid ops."""
    check_op(op)
    document: dict[str, Any]
    if isinstance(op, Put):
        document = {"op": "put", "key": op.key, "value": op.value}
    elif isinstance(op, Delete):
        document = {"op": "delete", "key": op.key}
    else:
        document = {"op": "cas", "key": op.key, "expected": op.expected, "value": op.value}
    payload = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
    return Record(value=payload.encode("utf-8"), key=KV_RECORD_KEY)


def decode_op(record: Record) -> KvOp | None:
    """The KV operation a record carries; None for a record that is not a KV operation.
    Raises KvOpError for a KV record whose payload is not a valid operation."""
    if record.key != KV_RECORD_KEY:
        return None
    if len(record.value) > MAX_OP_BYTES:
        raise KvOpError(f"an operation of {len(record.value)} bytes exceeds {MAX_OP_BYTES} bytes")
    if _nesting_exceeds(record.value, MAX_OP_DEPTH):
        raise KvOpError(f"JSON nested deeper than {MAX_OP_DEPTH} levels")
    try:
        document = json.loads(record.value.decode("utf-8"))
    except (ValueError, RecursionError) as error:  # bad UTF-8 or JSON, an over-long integer
        raise KvOpError(f"not a JSON document: {error}") from None
    if not isinstance(document, dict):
        raise KvOpError("not a JSON object")
    kind = document.get("op")
    key = document.get("key")
    if not isinstance(key, str):
        raise KvOpError("'key' must be a string")
    op: KvOp
    if kind == "put":
        op = Put(key, _string(document, "value"))
    elif kind == "delete":
        op = Delete(key)
    elif kind == "cas":
        op = Cas(key, _optional_string(document, "expected"),
                 _optional_string(document, "value"))
    else:
        raise KvOpError(f"unknown op {kind!r}")
    check_op(op)
    return op


def _nesting_exceeds(payload: bytes, limit: int) -> bool:
    """Whether the JSON text nests arrays and objects deeper than ``limit`` (brackets inside
    strings do not count). Linear, and free for a payload with few brackets at all."""
    if payload.count(b"[") + payload.count(b"{") <= limit:
        return False
    depth = 0
    in_string = escaped = False
    for byte in payload:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return False


def _string(document: dict[str, Any], name: str) -> str:
    value = _optional_string(document, name)
    if value is None:
        raise KvOpError(f"{name!r} must be a string")
    return value


def _optional_string(document: dict[str, Any], name: str) -> str | None:
    if name not in document:
        raise KvOpError(f"{name!r} is missing")
    value = document[name]
    if value is None or isinstance(value, str):
        return value
    raise KvOpError(f"{name!r} must be a string or null")


@dataclass(frozen=True, slots=True)
class KvEvent:
    """A change of the map: the operation at ``offset`` set ``key`` to ``value`` (None: deleted
    it). Operations that changed nothing (a cas that did not apply, a delete of an absent key)
    leave no event."""

    offset: int
    key: str
    value: str | None


class KvStore:
    """The map, the offset it has applied up to, and the outcomes and changes of recent
    operations."""

    def __init__(self, outcome_limit: int = DEFAULT_OUTCOME_LIMIT,
                 event_limit: int = DEFAULT_EVENT_LIMIT) -> None:
        if outcome_limit < 1 or event_limit < 1:
            raise ValueError("outcome_limit and event_limit must be at least 1")
        self._data: dict[str, str] = {}
        self._outcomes: OrderedDict[int, Outcome] = OrderedDict()
        self._outcome_limit = outcome_limit
        # (offset, key, value) of each change: a KvEvent is made for a watch that reads one,
        # not for each of the millions of operations a start-up replays.
        self._events: deque[tuple[int, str, str | None]] = deque()
        self._event_limit = event_limit
        self.events_start = 0  # every change at or after this offset is in _events
        self.next_offset = 0  # every offset below it is applied

    @property
    def applied_offset(self) -> int:
        """The last offset applied; -1 before any."""
        return self.next_offset - 1

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: str) -> str | None:
        return self._data.get(key)

    def items(self) -> list[tuple[str, str]]:
        return sorted(self._data.items())

    def scan(self, prefix: str, start_after: str | None, limit: int) -> list[tuple[str, str]]:
        """Up to ``limit`` entries whose key starts with ``prefix`` and sorts after
        ``start_after``, in key order. (A pass over every key: the store holds metadata, and a
        sorted index would cost every write.)"""
        keys = sorted(key for key in self._data
                      if key.startswith(prefix) and (start_after is None or key > start_after))
        return [(key, self._data[key]) for key in keys[:limit]]

    def events(self, offset: int, prefix: str, exact: bool, limit: int) -> list[KvEvent]:
        """Up to ``limit`` changes at or after ``offset`` of the key ``prefix`` (``exact``) or of
        the keys starting with it. The caller checks ``offset >= events_start``."""
        found: list[KvEvent] = []
        # Newest first: a watch is near the end.
        for event_offset, key, value in reversed(self._events):
            if event_offset < offset:
                break
            if key == prefix if exact else key.startswith(prefix):
                found.append(KvEvent(event_offset, key, value))
        found.reverse()
        return found[:limit]

    def snapshot_entries(self) -> list[tuple[str, str]]:
        """The map's entries as they are now, for a snapshot written in the background: a
        shallow copy (the strings are shared), quick enough for the event loop, where sorting
        and encoding a large map is not (``snapshot_records`` does that, in a thread)."""
        return list(self._data.items())

    def load_snapshot(self, records: Sequence[Record], next_offset: int) -> None:
        """Replace the map by a snapshot's records, as of ``next_offset`` (its end offset)."""
        data: dict[str, str] = {}
        for record in records:
            op = decode_op(record)
            if not isinstance(op, Put):
                raise ValueError(f"a snapshot holds puts only, not {op!r}")
            data[op.key] = op.value
        self._data = data
        self._outcomes.clear()
        self._events.clear()
        self.events_start = next_offset  # what changed before is folded into the snapshot
        self.next_offset = next_offset

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
        outcome = self.apply(op)
        self._record(offset, outcome)
        if outcome.applied:
            # What the key holds now: a put's or an applied cas's value, None after a delete.
            self._record_event(offset, op.key, None if isinstance(op, Delete) else op.value)
        return True

    def _record_event(self, offset: int, key: str, value: str | None) -> None:
        self._events.append((offset, key, value))
        if len(self._events) > self._event_limit:
            self.events_start = self._events.popleft()[0] + 1

    def apply(self, op: KvOp) -> Outcome:
        """Apply one operation to the map (without moving ``next_offset``)."""
        current = self._data.get(op.key)
        existed = current is not None
        if isinstance(op, Put):
            self._data[op.key] = op.value
            return _OUTCOMES[True, existed]
        if isinstance(op, Delete):
            self._data.pop(op.key, None)
            return _OUTCOMES[existed, existed]
        if current != op.expected:
            return _OUTCOMES[False, existed]
        if op.value is None:
            self._data.pop(op.key, None)
        else:
            self._data[op.key] = op.value
        return _OUTCOMES[True, existed]

    def _record(self, offset: int, outcome: Outcome) -> None:
        self._outcomes[offset] = outcome
        while len(self._outcomes) > self._outcome_limit:
            self._outcomes.popitem(last=False)

    def outcome(self, offset: int) -> Outcome | None:
        """The outcome of the operation at ``offset``; None if there is none (not applied yet,
        not a KV operation, or too old to be remembered)."""
        return self._outcomes.get(offset)

    def pop_outcome(self, offset: int) -> Outcome | None:
        """Like ``outcome``, and forget it (a writer collects its outcome once)."""
        return self._outcomes.pop(offset, None)


def snapshot_records(entries: list[tuple[str, str]]) -> Iterator[Record]:
    """A snapshot's data: one put per key, in key order (sorts ``entries`` in place, when the
    first record is asked for). Records are made one at a time as the snapshot is framed,
    never a list of them all."""
    entries.sort()
    for key, value in entries:
        yield encode_op(Put(key, value))
