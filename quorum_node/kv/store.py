"""The key-value state machine: a map of UTF-8 strings applied from committed records.

A KV operation is a record whose key is ``KV_RECORD_KEY`` and whose value is one JSON object::

    {"op": "put", "key": K, "value": V}
    {"op": "delete", "key": K}
    {"op": "cas", "key": K, "expected": E or null, "value": V or null}
    {"op": "txn", "compare": [...], "success": [...], "failure": [...]}

A cas applies only when the key's current value equals ``expected`` (null: the key must be
absent); it then sets ``value`` (null: deletes the key). A txn (etcd's Txn) runs its
``success`` operations if every compare holds, else its ``failure`` ones, all at its one offset
(see ``Txn`` for its shape and bounds).

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
import itertools
import json
import logging
import struct
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import itemgetter, lt
from typing import Any, NamedTuple, Protocol, TypeGuard

from sortedcontainers import SortedList

from quorum_node.raft.records import Record, RecordBatch, decode_batch, read_batch_header

logger = logging.getLogger(__name__)

# The NUL byte keeps it apart from any printable key an application might use.
KV_RECORD_KEY = b"\x00kv"
MAX_KEY_BYTES = 1024  # UTF-8 bytes of a key
MAX_VALUE_BYTES = 1024 * 1024  # UTF-8 bytes of a value
DEFAULT_OUTCOME_LIMIT = 100_000
DEFAULT_EVENT_LIMIT = 100_000
DEFAULT_EVENT_BYTES_LIMIT = 64 * 1024 * 1024
# What keeping a change costs besides its key's and value's bytes (its tuple, its offset): a
# history of many tiny changes is bounded by its bytes too.
CHANGE_OVERHEAD_BYTES = 64
# Bounds on a KV record's JSON before it is parsed. An operation is one flat object, so any
# nesting is foreign; without the depth bound a deeply nested document exhausts the parser's
# recursion on every replica (and again at every replay). The size bound is what the largest
# valid cas can take: a key and two values, each character escaped at worst as \uXXXX.
MAX_OP_DEPTH = 32
MAX_OP_BYTES = 6 * (MAX_KEY_BYTES + 2 * MAX_VALUE_BYTES) + 256
# A txn's bounds: operations in its compare list and in each branch (etcd's --max-txn-ops
# default), and the UTF-8 bytes of every key and value it names, which bounds the record (the
# log's batch bound is 8 MiB) and what applying it costs every replica.
MAX_TXN_OPS = 128
MAX_TXN_BYTES = 2 * 1024 * 1024
# The record's JSON, escapes and framing included (what one append may carry): only text full
# of control characters, which JSON escapes six-fold, reaches it within MAX_TXN_BYTES.
MAX_TXN_RECORD_BYTES = 4 * 1024 * 1024
# An absent key's version and modification offset in a compare (offsets start at 0).
ABSENT_VERSION = 0
ABSENT_MOD_OFFSET = -1


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


@dataclass(frozen=True, slots=True)
class Get:
    """A txn's read of a key, answered with its value, version and modification offset as they
    are at that point of the txn (after the branch's operations before it)."""

    key: str


COMPARE_TARGETS = ("value", "version", "mod_offset")
COMPARE_RESULTS = ("=", "!=", "<", ">")


@dataclass(frozen=True, slots=True)
class Compare:
    """Whether ``key``'s ``target`` stands in ``result`` to ``operand``: a string for a value
    (compared as etcd does, by code point, which is UTF-8 byte order), an integer for a
    version or a modification offset. An absent key has version ABSENT_VERSION and
    modification offset ABSENT_MOD_OFFSET; a compare of an absent key's value never holds,
    whatever its result (etcd's rule)."""

    key: str
    target: str  # one of COMPARE_TARGETS
    result: str  # one of COMPARE_RESULTS
    operand: str | int


TxnOp = Put | Delete | Get


@dataclass(frozen=True, slots=True)
class Txn:
    """etcd's Txn: if every compare holds, the ``success`` operations apply, in order, else the
    ``failure`` ones, all at the txn's one offset (each key written gets it as its modification
    offset). Bounds (``check_txn``): at most MAX_TXN_OPS compares and as many operations in each
    branch, at most MAX_TXN_BYTES of keys and values in all, and no key put or deleted twice in
    one branch (etcd refuses those too: the outcome would depend on the order)."""

    compares: tuple[Compare, ...]
    success: tuple[TxnOp, ...]
    failure: tuple[TxnOp, ...]


KvOp = Put | Delete | Cas | Txn


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an applied operation did. ``applied`` is False only for a cas whose expectation did
    not hold (the map is then unchanged); ``existed`` is whether the key was present before."""

    applied: bool
    existed: bool


@dataclass(frozen=True, slots=True)
class TxnResponse:
    """What one operation of a txn's branch did: for a get, the key's value (None: absent),
    version and modification offset; for a delete, ``found`` is whether the key existed; for a
    put, whether it existed before."""

    op: str  # "put", "delete" or "get"
    key: str
    found: bool
    value: str | None = None
    version: int = ABSENT_VERSION
    mod_offset: int = ABSENT_MOD_OFFSET


@dataclass(frozen=True, slots=True)
class TxnOutcome:
    """What an applied txn did: whether its compares held (its success branch ran) and what each
    operation of the branch that ran answered."""

    succeeded: bool
    responses: tuple[TxnResponse, ...]


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
    if isinstance(op, Txn):
        check_txn(op)
        return
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
    elif isinstance(op, Cas):
        document = {"op": "cas", "key": op.key, "expected": op.expected, "value": op.value}
    else:
        document = {"op": "txn", **txn_document(op)}
    payload = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    if isinstance(op, Txn) and len(payload) > MAX_TXN_RECORD_BYTES:
        raise KvOpError(f"the txn's record of {len(payload)} bytes (JSON escapes included) "
                        f"exceeds the limit of {MAX_TXN_RECORD_BYTES} bytes", too_large=True)
    return Record(value=payload, key=KV_RECORD_KEY)


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
    if kind == "txn":
        if len(record.value) > MAX_TXN_RECORD_BYTES:
            raise KvOpError(f"a txn of {len(record.value)} bytes exceeds {MAX_TXN_RECORD_BYTES} "
                            f"bytes")
        return txn_from_document({name: value for name, value in document.items()
                                  if name != "op"})
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


_NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in b"[]{}")


def _nesting_exceeds(payload: bytes, limit: int) -> bool:
    """Whether the JSON text nests arrays and objects deeper than ``limit`` (brackets inside
    strings do not count). Linear, and free for a payload with few brackets at all.

    Escapes go first (an escaped backslash, then an escaped quote), so that every quote left
    delimits a string; the brackets outside strings are then walked alone, not the bytes of
    every key and value (a txn's). Exact for any JSON text: a payload that is not JSON may be
    judged either way, and is refused all the same when it is parsed."""
    if payload.count(b"[") + payload.count(b"{") <= limit:
        return False
    unescaped = payload.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(unescaped.split(b'"')[::2])
    depth = 0
    for byte in outside.translate(None, _NOT_BRACKETS):
        if byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return True
        else:  # ] }
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


# --- transactions ----------------------------------------------------------------------------

_TXN_FIELDS = frozenset({"compare", "success", "failure"})
_TXN_OP_FIELDS = {"put": {"op", "key", "value"}, "delete": {"op", "key"}, "get": {"op", "key"}}


def check_txn(txn: Txn) -> None:
    """Raise KvOpError if ``txn`` breaks a bound (see ``Txn``)."""
    for name, items in (("compare", txn.compares), ("success", txn.success),
                        ("failure", txn.failure)):
        if len(items) > MAX_TXN_OPS:
            raise KvOpError(f"{len(items)} operations in '{name}' exceed the limit of "
                            f"{MAX_TXN_OPS}", too_large=True)
    size = 0
    for index, compare in enumerate(txn.compares):
        size += _checked_compare(index, compare)
    for name, branch in (("success", txn.success), ("failure", txn.failure)):
        written: set[str] = set()
        for index, op in enumerate(branch):
            key = op.key
            # An ASCII key within its bound is its size in bytes: the usual case, checked and
            # measured without encoding it (or naming its place).
            if key.isascii() and 0 < len(key) <= MAX_KEY_BYTES:
                size += len(key)
            else:
                size += _checked_size(f"{name}[{index}]", check_key, key)
            if isinstance(op, Put):
                value = op.value
                if value.isascii() and len(value) <= MAX_VALUE_BYTES:
                    size += len(value)
                else:
                    size += _checked_size(f"{name}[{index}]", check_value, value)
            if not isinstance(op, Get):
                if key in written:
                    raise KvOpError(f"{name}[{index}]: key {key!r} is put or deleted more than "
                                    f"once in '{name}'")
                written.add(key)
    if size > MAX_TXN_BYTES:
        raise KvOpError(f"{size} bytes of keys and values exceed the limit of {MAX_TXN_BYTES} "
                        f"bytes per txn", too_large=True)


def _checked_compare(index: int, compare: Compare) -> int:
    where = f"compare[{index}]"
    size = _checked_size(where, check_key, compare.key)
    if compare.target not in COMPARE_TARGETS:
        raise KvOpError(f"{where}: unknown target {compare.target!r} (one of "
                        f"{', '.join(COMPARE_TARGETS)})")
    if compare.result not in COMPARE_RESULTS:
        raise KvOpError(f"{where}: unknown result {compare.result!r} (one of "
                        f"{' '.join(COMPARE_RESULTS)})")
    operand = compare.operand
    if compare.target == "value":
        if not isinstance(operand, str):
            raise KvOpError(f"{where}: a value compare needs a string")
        size += _checked_size(where, check_value, operand)
    elif isinstance(operand, bool) or not isinstance(operand, int) \
            or not -2**63 <= operand < 2**63:
        raise KvOpError(f"{where}: a {compare.target} compare needs a 64-bit integer")
    return size


def _checked_size(where: str, check: Any, text: str) -> int:
    try:
        check(text)
    except KvOpError as error:
        raise KvOpError(f"{where}: {error}", too_large=error.too_large) from None
    return text_bytes(text)


def txn_document(txn: Txn) -> dict[str, Any]:
    """The JSON shape of a txn (a record's, without its ``"op"``, and the API's body)."""
    return {
        "compare": [{"key": c.key, "target": c.target, "result": c.result, c.target: c.operand}
                    for c in txn.compares],
        "success": [_txn_op_document(op) for op in txn.success],
        "failure": [_txn_op_document(op) for op in txn.failure],
    }


def _txn_op_document(op: TxnOp) -> dict[str, Any]:
    if isinstance(op, Put):
        return {"op": "put", "key": op.key, "value": op.value}
    return {"op": "delete" if isinstance(op, Delete) else "get", "key": op.key}


def txn_from_document(document: Any) -> Txn:
    """The txn a JSON document describes (``txn_document``'s shape; ``success`` and
    ``failure`` may be left out), checked; raises KvOpError naming what is wrong."""
    if not isinstance(document, dict):
        raise KvOpError('a txn is a JSON object {"compare": [...], "success": [...], '
                        '"failure": [...]}')
    unknown = sorted(set(document) - _TXN_FIELDS)
    if unknown:
        raise KvOpError(f"unknown txn field {unknown[0]!r} (expected compare, success, "
                        f"failure)")
    lists = {}
    for name in _TXN_FIELDS:
        items = document.get(name, [])
        if not isinstance(items, list):
            raise KvOpError(f"{name!r} must be a list")
        if len(items) > MAX_TXN_OPS:
            raise KvOpError(f"{len(items)} operations in {name!r} exceed the limit of "
                            f"{MAX_TXN_OPS}", too_large=True)
        lists[name] = items
    txn = Txn(tuple(_compare(index, item) for index, item in enumerate(lists["compare"])),
              tuple(_txn_op("success", i, item) for i, item in enumerate(lists["success"])),
              tuple(_txn_op("failure", i, item) for i, item in enumerate(lists["failure"])))
    check_txn(txn)
    return txn


def _compare(index: int, item: Any) -> Compare:
    where = f"compare[{index}]"
    if not isinstance(item, dict):
        raise KvOpError(f"{where}: expected an object {{\"key\", \"target\", \"result\", "
                        f"<target>}}")
    target = item.get("target")
    if target not in COMPARE_TARGETS:
        raise KvOpError(f"{where}: 'target' must be one of {', '.join(COMPARE_TARGETS)}")
    expected = {"key", "target", "result", target}
    if set(item) != expected:
        extra = sorted(set(item) - expected)
        what = f"unknown field {extra[0]!r}" if extra else \
            f"missing {sorted(expected - set(item))[0]!r}"
        raise KvOpError(f"{where}: {what}")
    key, result, operand = item["key"], item["result"], item[target]
    if not isinstance(key, str):
        raise KvOpError(f"{where}: 'key' must be a string")
    if not isinstance(result, str):
        raise KvOpError(f"{where}: 'result' must be one of {' '.join(COMPARE_RESULTS)}")
    if not isinstance(operand, str | int):
        raise KvOpError(f"{where}: a {target} compare needs "
                        f"{'a string' if target == 'value' else 'a 64-bit integer'}")
    return Compare(key, target, result, operand)


def _txn_op(branch: str, index: int, item: Any) -> TxnOp:
    # The item's place (``branch[index]``) is spelt out only in an error: a replay decodes
    # every operation of every txn.
    kind = item.get("op") if isinstance(item, dict) else None
    fields = _TXN_OP_FIELDS.get(kind) if isinstance(kind, str) else None
    if fields is None:
        raise KvOpError(f'{branch}[{index}]: expected {{"op": "put" | "delete" | "get", '
                        f'"key": ...}}')
    if item.keys() != fields:
        raise KvOpError(f"{branch}[{index}]: a {kind} has the fields "
                        f"{', '.join(sorted(fields))}")
    key = item["key"]
    if not isinstance(key, str):
        raise KvOpError(f"{branch}[{index}]: 'key' must be a string")
    if kind == "put":
        if not isinstance(item["value"], str):
            raise KvOpError(f"{branch}[{index}]: 'value' must be a string")
        return Put(key, item["value"])
    return Delete(key) if kind == "delete" else Get(key)


def compare_holds(compare: Compare, value: str | None, version: int, mod_offset: int) -> bool:
    """Whether ``compare`` holds of a key whose value is ``value`` (None: absent), with this
    version and modification offset."""
    actual: str | int
    if compare.target == "value":
        if value is None:
            return False
        actual = value
    else:
        actual = version if compare.target == "version" else mod_offset
    operand = compare.operand
    if compare.result == "=":
        return actual == operand
    if compare.result == "!=":
        return actual != operand
    if compare.result == "<":
        return actual < operand  # type: ignore[operator]
    return actual > operand  # type: ignore[operator]


def text_bytes(text: str) -> int:
    """The UTF-8 size of ``text`` (counted without encoding it when it is ASCII)."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


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
        self._data: dict[str, str] = {}
        # Each key's (modification offset, version), beside the map rather than in it, so that
        # a read of a value costs what it did.
        self._meta: dict[str, tuple[int, int]] = {}
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
        return len(self._data)

    def get(self, key: str) -> str | None:
        return self._data.get(key)

    def meta(self, key: str) -> tuple[int, int]:
        """``key``'s modification offset and version (ABSENT_MOD_OFFSET and ABSENT_VERSION if
        it is absent)."""
        return self._meta.get(key, (ABSENT_MOD_OFFSET, ABSENT_VERSION))

    def items(self) -> list[tuple[str, str]]:
        data = self._data
        return [(key, data[key]) for key in self._keys]

    def scan(self, prefix: str, start_after: str | None, limit: int,
             max_bytes: int) -> tuple[list[tuple[str, str]], bool]:
        """Up to ``limit`` entries whose key starts with ``prefix`` and sorts after
        ``start_after``, in key order, no more than ``max_bytes`` of them (``change_bytes``)
        unless the first alone is larger; and whether more keys follow."""
        keys, data = self._keys, self._data
        if start_after is not None and start_after >= prefix:
            first = keys.bisect_right(start_after)
        else:
            first = keys.bisect_left(prefix)
        entries: list[tuple[str, str]] = []
        size = 0
        for key in keys.islice(first, None):
            if not key.startswith(prefix):
                return entries, False
            value = data[key]
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
        """The map's entries as they are now (value, modification offset, version), and where
        versions are counted from, for a snapshot written in the background: a shallow copy
        (the strings are shared), quick enough for the event loop, where sorting and encoding a
        large map is not (``snapshot_records`` does that, in a thread)."""
        meta = self._meta
        return SnapshotEntries([(key, value, *meta[key]) for key, value in self._data.items()],
                               self.versions_from)

    def load_snapshot(self, records: Iterable[Record], next_offset: int) -> None:
        """Replace the map by a snapshot's data records (``snapshot_data``), as of
        ``next_offset`` (its end offset). Raises KvOpError, leaving the store as it was, for a
        snapshot it cannot load."""
        self.install_snapshot(LoadedSnapshot.build(records, next_offset))

    def install_snapshot(self, loaded: LoadedSnapshot) -> None:
        """Replace the map by a snapshot built (``LoadedSnapshot.build``) beside the store: a
        swap, whatever the snapshot's size."""
        next_offset = loaded.next_offset
        self._data = loaded.data
        self._meta = loaded.meta
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
        size = change_bytes(key, value)
        events = self._events
        events.append((offset, key, value, size))
        self.events_bytes += size
        if self.watchers:
            self.watchers.deliver(offset, key, value, size)
        head = self._events_head
        while (len(events) - head > self._event_limit
               or self.events_bytes > self._event_bytes_limit):
            dropped_offset, _, _, dropped_size = events[head]
            events[head] = _DROPPED
            head += 1
            self.events_bytes -= dropped_size
            self.events_start = dropped_offset + 1
        if head >= _COMPACT_AT and head * 2 >= len(events):
            del events[:head]
            head = 0
        self._events_head = head

    def apply(self, op: Put | Delete | Cas, offset: int) -> Outcome:
        """Apply one operation, the one at ``offset``, to the map (without moving
        ``next_offset``)."""
        current = self._data.get(op.key)
        existed = current is not None
        if isinstance(op, Put):
            self._set(op.key, op.value, existed, offset)
            return _OUTCOMES[True, existed]
        if isinstance(op, Delete):
            if existed:
                self._remove(op.key)
            return _OUTCOMES[existed, existed]
        if current != op.expected:
            return _OUTCOMES[False, existed]
        if op.value is not None:
            self._set(op.key, op.value, existed, offset)
        elif existed:
            self._remove(op.key)
        return _OUTCOMES[True, existed]

    def apply_txn(self, txn: Txn, offset: int) -> TxnOutcome:
        """Apply the txn at ``offset``: its compares against the map as it is, then the branch
        they choose, in order (a get sees the branch's writes before it), each write at
        ``offset``. Depends on the map and the txn alone: every replica does the same."""
        if self.versions_from is None:
            self._start_versions(offset)
        succeeded = all(compare_holds(c, self._data.get(c.key), *self._version_and_mod(c.key))
                        for c in txn.compares)
        responses = []
        for op in txn.success if succeeded else txn.failure:
            current = self._data.get(op.key)
            existed = current is not None
            if isinstance(op, Get):
                version, mod_offset = self._version_and_mod(op.key)
                responses.append(TxnResponse("get", op.key, existed, current, version,
                                             mod_offset))
                continue
            if isinstance(op, Put):
                self._set(op.key, op.value, existed, offset)
                self._record_event(offset, op.key, op.value)
            elif existed:
                self._remove(op.key)
                self._record_event(offset, op.key, None)
            responses.append(TxnResponse("put" if isinstance(op, Put) else "delete", op.key,
                                         existed))
        return TxnOutcome(succeeded, tuple(responses))

    def _start_versions(self, offset: int) -> None:
        """Count versions from the quorum's first txn, at ``offset``: every key counts as
        written once, just before it (see the module's docstring)."""
        before = max(offset - 1, 0)
        self._meta = dict.fromkeys(self._meta, (before, 1))
        self.versions_from = offset

    def _version_and_mod(self, key: str) -> tuple[int, int]:
        mod_offset, version = self.meta(key)
        return version, mod_offset

    def _set(self, key: str, value: str, existed: bool, offset: int) -> None:
        if not existed:
            self._keys.add(key)
            self._meta[key] = (offset, 1)
        else:
            self._meta[key] = (offset, self._meta[key][1] + 1)
        self._data[key] = value

    def _remove(self, key: str) -> None:
        del self._data[key]
        del self._meta[key]
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


# A snapshot's entry: key, value, modification offset, version.
SnapshotEntry = tuple[str, str, int, int]


@dataclass(frozen=True, slots=True)
class LoadedSnapshot:
    """A snapshot's map, built from its data records and not yet installed in a store
    (``KvStore.install_snapshot``): building it touches no store, so it can be done in a thread
    while the store goes on serving."""

    data: dict[str, str]
    meta: dict[str, tuple[int, int]]
    keys: SortedList[str]
    versions_from: int | None
    next_offset: int

    @classmethod
    def build(cls, records: Iterable[Record], next_offset: int) -> LoadedSnapshot:
        """Decode and check a snapshot's data records (``snapshot_data``), as of ``next_offset``
        (its end offset). Raises KvOpError for a snapshot the store cannot load."""
        data: dict[str, str] = {}
        meta: dict[str, tuple[int, int]] = {}
        versions_from, chunks = snapshot_data(records, next_offset)
        for keys, values, mod_offsets, versions in chunks:
            data.update(zip(keys, values, strict=True))
            meta.update(zip(keys, zip(mod_offsets, versions, strict=True), strict=True))
        # The snapshot's records come in key order: sorting them again is a linear pass.
        return cls(data, meta, SortedList(data), versions_from, next_offset)


class SnapshotEntries(NamedTuple):
    """What a snapshot of the store holds: its entries, and ``KvStore.versions_from``."""

    entries: list[SnapshotEntry]
    versions_from: int | None


# --- snapshots -------------------------------------------------------------------------------
#
# A snapshot's data records (framed as KIP-630 has it: ``quorum_node.raft.snapshot_format``), in
# SNAPSHOT_FORMAT 1:
#
#   record 0   key SNAPSHOT_HEADER_KEY, value {"format": 1, "versions_from": OFFSET or null}
#   record 1.. key SNAPSHOT_ENTRIES_KEY, value a chunk of entries, every key in order (the keys
#              of a chunk follow those of the one before), each chunk little-endian:
#                count                  u32, at least 1
#                key sizes              count x u32, UTF-8 bytes
#                value sizes            count x u32, UTF-8 bytes
#                modification offsets   count x i64
#                versions               count x i64
#                keys                   their UTF-8 bytes back to back, then the values' alike
#
# A chunk is read with a few struct calls and slices of two decoded strings, not a JSON document
# a key: loading a large snapshot costs about what building its map does. Format 0, written by
# earlier releases and still read, has no header record: one JSON put a key
# ({"op": "put", "key", "value", "mod_offset", "version"}; the last two absent before versions
# were kept), after {"op": "versions", "from": OFFSET} once the quorum has had a txn. A release
# before format 1 refuses a format-1 snapshot as a whole (a leader's, or a backup's): it keeps
# its log, so every node is upgraded before a snapshot in it is sent to an older one.

SNAPSHOT_FORMAT = 1
SNAPSHOT_HEADER_KEY = b"\x00kv-snapshot"
SNAPSHOT_ENTRIES_KEY = b"\x00kv-entries"
# A chunk ends once its keys and values reach SNAPSHOT_CHUNK_CHARS characters or it holds
# SNAPSHOT_CHUNK_ENTRIES entries: at most 4 bytes a character before its last entry, which is
# within the key and value bounds, so that a chunk always fits a batch of the snapshot.
SNAPSHOT_CHUNK_CHARS = 256 * 1024
SNAPSHOT_CHUNK_ENTRIES = 8192
_CHUNK_COUNT = struct.Struct("<I")
_CHUNK_ENTRY_FIXED_BYTES = 4 + 4 + 8 + 8  # an entry's two sizes, offset and version
_LEGACY_CHUNK_RECORDS = 1024  # format 0's puts, decoded into chunks of this many


class SnapshotChunk(NamedTuple):
    """Entries of a snapshot, in key order, each checked as a put of the store is."""

    keys: list[str]
    values: list[str]
    mod_offsets: Sequence[int]
    versions: Sequence[int]


class SnapshotData(NamedTuple):
    """A snapshot's data as it is read: where versions are counted from, and its entries, each
    chunk decoded and checked as it is reached (a defect raises KvOpError then, naming the data
    record)."""

    versions_from: int | None
    chunks: Iterator[SnapshotChunk]


def snapshot_records(content: SnapshotEntries) -> Iterator[Record]:
    """A snapshot's data in SNAPSHOT_FORMAT: its header record, then the entries in key order
    (sorts ``entries`` in place, when the first chunk is asked for), a chunk at a time as the
    snapshot is framed, never a list of them all. Raises KvOpError for a key or value the store
    could not hold (the API refuses those before they are written)."""
    entries, versions_from = content
    header = json.dumps({"format": SNAPSHOT_FORMAT, "versions_from": versions_from},
                        separators=(",", ":"))
    yield Record(value=header.encode("utf-8"), key=SNAPSHOT_HEADER_KEY)
    entries.sort()
    start = 0
    while start < len(entries):
        end = _chunk_end(entries, start)
        yield Record(value=encode_snapshot_chunk(entries[start:end]), key=SNAPSHOT_ENTRIES_KEY)
        start = end


def _chunk_end(entries: list[SnapshotEntry], start: int) -> int:
    limit = min(len(entries), start + SNAPSHOT_CHUNK_ENTRIES)
    chars = 0
    end = start
    while end < limit and chars < SNAPSHOT_CHUNK_CHARS:
        key, value, _, _ = entries[end]
        chars += len(key) + len(value)
        end += 1
    return end


def encode_snapshot_chunk(entries: Sequence[SnapshotEntry]) -> bytes:
    """One chunk of a snapshot's entries (see SNAPSHOT_FORMAT), in the order given."""
    keys, values, mod_offsets, versions = zip(*entries, strict=True)
    key_bytes, key_sizes = _utf8_joined(keys, check_key)
    value_bytes, value_sizes = _utf8_joined(values, check_value)
    if min(key_sizes) < 1 or max(key_sizes) > MAX_KEY_BYTES:
        for key in keys:
            check_key(key)
    if max(value_sizes) > MAX_VALUE_BYTES:
        for value in values:
            check_value(value)
    count = len(keys)
    fixed = struct.pack(f"<I{count}I{count}I{count}q{count}q", count, *key_sizes, *value_sizes,
                        *mod_offsets, *versions)
    return b"".join((fixed, key_bytes, value_bytes))


def _utf8_joined(texts: Sequence[str], check: Callable[[str], None]) -> tuple[bytes, list[int]]:
    """The UTF-8 bytes of ``texts`` back to back, and each one's size: one encoding of them all
    when they are ASCII (a byte a character), the usual case."""
    joined = "".join(texts)
    try:
        encoded = joined.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: check names it
        for text in texts:
            check(text)
        raise
    if len(encoded) == len(joined):
        return encoded, [len(text) for text in texts]
    each = [text.encode("utf-8") for text in texts]
    return encoded, [len(item) for item in each]


def snapshot_data(records: Iterable[Record], end_offset: int) -> SnapshotData:
    """Read a snapshot's data records, of either format, as of ``end_offset`` (its end: every
    modification offset is below it). Raises KvOpError, naming the data record, for anything
    the store could not load, here for the first record and while iterating for the others."""
    remaining = iter(records)
    first = next(remaining, None)
    if first is None:
        return SnapshotData(None, iter(()))
    if first.key == SNAPSHOT_HEADER_KEY:
        return SnapshotData(_snapshot_header(first), _chunks(remaining, end_offset))
    versions_from = _legacy_versions_from(first)
    if versions_from is None:
        remaining = itertools.chain((first,), remaining)
    return SnapshotData(versions_from,
                        _legacy_chunks(remaining, end_offset, 0 if versions_from is None else 1))


def _snapshot_header(record: Record) -> int | None:
    try:
        document = json.loads(record.value)
    except (ValueError, RecursionError):  # not UTF-8 or JSON, nested too deep
        raise KvOpError("data record 0: a snapshot's header is not JSON") from None
    if not isinstance(document, dict) or document.get("format") != SNAPSHOT_FORMAT:
        found = document.get("format") if isinstance(document, dict) else document
        raise KvOpError(f"data record 0: a snapshot of format {found!r}, which this release "
                        f"does not read (it reads {SNAPSHOT_FORMAT} and 0)")
    versions_from = document.get("versions_from")
    if versions_from is not None and not _is_offset(versions_from):
        raise KvOpError(f"data record 0: a snapshot's header carries a bad versions_from "
                        f"{versions_from!r}")
    return versions_from


def _chunks(records: Iterator[Record], end_offset: int) -> Iterator[SnapshotChunk]:
    last_key = ""  # below every key: a key is never empty
    for index, record in enumerate(records, start=1):
        if record.key != SNAPSHOT_ENTRIES_KEY:
            raise KvOpError(f"data record {index} is not a chunk of entries: a snapshot of "
                            f"format {SNAPSHOT_FORMAT} holds only those after its header")
        try:
            chunk = decode_snapshot_chunk(record.value, end_offset)
        except KvOpError as error:
            raise KvOpError(f"data record {index}: {error}") from None
        keys = chunk.keys
        if not (last_key < keys[0] and all(map(lt, keys, itertools.islice(keys, 1, None)))):
            raise KvOpError(f"data record {index}: keys out of order or repeated")
        last_key = keys[-1]
        yield chunk


def decode_snapshot_chunk(payload: bytes, end_offset: int) -> SnapshotChunk:
    """A chunk's entries (see SNAPSHOT_FORMAT), checked: sizes that add up to the payload's,
    keys and values within the store's bounds and UTF-8, modification offsets below
    ``end_offset`` and versions from 1. Raises KvOpError."""
    size = len(payload)
    (count,) = _CHUNK_COUNT.unpack_from(payload) if size >= _CHUNK_COUNT.size else (0,)
    fixed = _CHUNK_COUNT.size + count * _CHUNK_ENTRY_FIXED_BYTES
    if count < 1 or fixed > size:
        raise KvOpError(f"a chunk of {size} bytes cannot hold the {count} entries it counts")
    key_sizes = struct.unpack_from(f"<{count}I", payload, 4)
    value_sizes = struct.unpack_from(f"<{count}I", payload, 4 + 4 * count)
    mod_offsets = struct.unpack_from(f"<{count}q", payload, 4 + 8 * count)
    versions = struct.unpack_from(f"<{count}q", payload, 4 + 16 * count)
    keys_end = fixed + sum(key_sizes)
    if keys_end + sum(value_sizes) != size:
        raise KvOpError(f"a chunk's entries do not add up to its {size} bytes")
    if (shortest := min(key_sizes)) < 1 or (longest := max(key_sizes)) > MAX_KEY_BYTES:
        bad = shortest if shortest < 1 else longest
        raise KvOpError(f"a chunk holds a key of {bad} bytes (1 to {MAX_KEY_BYTES})")
    if (longest := max(value_sizes)) > MAX_VALUE_BYTES:
        raise KvOpError(f"a chunk holds a value of {longest} bytes (at most {MAX_VALUE_BYTES})")
    if (lowest := min(mod_offsets)) < 0 or (highest := max(mod_offsets)) >= end_offset:
        bad = lowest if lowest < 0 else highest
        raise KvOpError(f"a chunk carries a mod_offset of {bad} (0 to {end_offset - 1})")
    if (lowest := min(versions)) < 1:
        raise KvOpError(f"a chunk carries a version of {lowest} (versions start at 1)")
    return SnapshotChunk(_utf8_split(payload, fixed, key_sizes, "key"),
                         _utf8_split(payload, keys_end, value_sizes, "value"),
                         mod_offsets, versions)


def _utf8_split(payload: bytes, start: int, sizes: Sequence[int], what: str) -> list[str]:
    """The texts of ``sizes`` UTF-8 bytes each, back to back from ``start``: sliced out of one
    decoded string when it is ASCII (a byte a character), the usual case."""
    bounds = list(itertools.accumulate(sizes, initial=0))
    end = start + bounds[-1]
    try:
        text = payload[start:end].decode("utf-8")
        if len(text) == end - start:
            return list(map(text.__getitem__, map(slice, bounds, bounds[1:])))
        view = memoryview(payload)[start:end]
        return [str(view[low:high], "utf-8") for low, high in itertools.pairwise(bounds)]
    except UnicodeDecodeError:
        raise KvOpError(f"a chunk holds a {what} that is not UTF-8 text") from None


def _legacy_chunks(records: Iterator[Record], end_offset: int,
                   first_index: int) -> Iterator[SnapshotChunk]:
    """Format 0's puts, in chunks of _LEGACY_CHUNK_RECORDS."""
    keys: list[str] = []
    values: list[str] = []
    mod_offsets: list[int] = []
    versions: list[int] = []
    for index, record in enumerate(records, start=first_index):
        try:
            op = decode_op(record)
        except KvOpError as error:
            raise KvOpError(f"data record {index} is not a valid key-value operation: "
                            f"{error}") from None
        if not isinstance(op, Put):
            what = "not a key-value operation" if op is None else f"a {type(op).__name__}"
            raise KvOpError(f"data record {index} is {what}: a snapshot of the store holds puts "
                            f"only")
        try:
            mod_offset, version = _legacy_meta(record, end_offset)
        except KvOpError as error:
            raise KvOpError(f"data record {index}: {error}") from None
        keys.append(op.key)
        values.append(op.value)
        mod_offsets.append(mod_offset)
        versions.append(version)
        if len(keys) == _LEGACY_CHUNK_RECORDS:
            yield SnapshotChunk(keys, values, mod_offsets, versions)
            keys, values, mod_offsets, versions = [], [], [], []
    if keys:
        yield SnapshotChunk(keys, values, mod_offsets, versions)


def _legacy_versions_from(record: Record) -> int | None:
    """The offset versions are counted from if ``record`` is a format-0 snapshot's first record
    saying so; None for any other record."""
    if record.key != KV_RECORD_KEY or not record.value.startswith(b'{"op":"versions"'):
        return None
    try:
        document = json.loads(record.value)
    except (ValueError, RecursionError):
        raise KvOpError("data record 0: a snapshot's versions record is not JSON") from None
    offset = document.get("from") if isinstance(document, dict) else None
    if not _is_offset(offset):
        raise KvOpError(f"data record 0: a snapshot's versions record carries a bad offset "
                        f"{offset!r}")
    return offset


def _legacy_meta(record: Record, end_offset: int) -> tuple[int, int]:
    """The modification offset and version a format-0 put carries. One written before they were
    kept carries neither: its keys count as written once, at the snapshot's last offset (what
    every replica loading that snapshot assumes alike)."""
    document = json.loads(record.value)
    mod_offset, version = document.get("mod_offset"), document.get("version")
    if mod_offset is None and version is None:
        return end_offset - 1, 1
    if (not _is_offset(mod_offset) or not _is_offset(version)
            or not mod_offset < end_offset or version < 1):
        raise KvOpError(f"a snapshot's put carries a bad mod_offset {mod_offset!r} or version "
                        f"{version!r}")
    return mod_offset, version


def _is_offset(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
