"""The key-value store's operations, as records of the log: their shapes, bounds and encoding.

A KV operation is a record whose key is ``KV_RECORD_KEY`` and whose value is one JSON object::

    {"op": "put", "key": K, "value": V}
    {"op": "delete", "key": K}
    {"op": "cas", "key": K, "expected": E or null, "value": V or null}
    {"op": "txn", "compare": [...], "success": [...], "failure": [...]}

A cas applies only when the key's current value equals ``expected`` (null: the key must be
absent); it then sets ``value`` (null: deletes the key). A txn (etcd's Txn) runs its
``success`` operations if every compare holds, else its ``failure`` ones, all at its one offset
(see ``Txn`` for its shape and bounds).

Every other record, and every control batch, is not a KV operation (``decode_op`` gives None),
so the record log can carry application records and KV operations side by side.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple

from quorum_node.raft.records import Record

# The NUL byte keeps it apart from any printable key an application might use.
KV_RECORD_KEY = b"\x00kv"
MAX_KEY_BYTES = 1024  # UTF-8 bytes of a key
MAX_VALUE_BYTES = 1024 * 1024  # UTF-8 bytes of a value
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


# The operations are made by the million (a replay decodes every operation of every txn), so
# they are plain slotted classes: a frozen dataclass's __init__ sets each field through
# object.__setattr__, several times the cost. Nothing changes one once made.


@dataclass(slots=True)
class Put:
    key: str
    value: str


@dataclass(slots=True)
class Delete:
    key: str


@dataclass(slots=True)
class Cas:
    key: str
    expected: str | None  # None: the key must be absent
    value: str | None  # None: delete the key


@dataclass(slots=True)
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


class TxnResponse(NamedTuple):
    """What one operation of a txn's branch did: for a get, the key's value (None: absent),
    version and modification offset; for a delete, ``found`` is whether the key existed; for a
    put, whether it existed before. A tuple: every put of every txn a replay applies makes one."""

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
    if text.isascii():  # nothing to encode (and no lone surrogate)
        return len(text)
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


# One encoder for every record: json.dumps with options other than its defaults makes a new
# encoder at each call, a large share of encoding a small op.
_RECORD_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


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
    payload = _RECORD_JSON.encode(document).encode("utf-8")
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
        document = _parse_json(record.value.decode("utf-8"))
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


_RECORD_JSON_DECODER = json.JSONDecoder()


def _parse_json(text: str) -> Any:
    """``json.loads(text)``, with less around the parser's own call for a document that fills
    ``text`` (as every record written by ``encode_op`` does): every replica decodes every op."""
    try:
        document, end = _RECORD_JSON_DECODER.raw_decode(text)
    except ValueError:
        return json.loads(text)  # leading whitespace, or not JSON: loads says which
    if end != len(text):
        return json.loads(text)  # trailing whitespace, or more than one document
    return document


# What the nesting bound looks at: brackets, and the quotes that tell which are in strings.
_NOT_STRUCTURE = bytes(byte for byte in range(256) if byte not in b'[]{}"')


def _nesting_exceeds(payload: bytes, limit: int) -> bool:
    """Whether the JSON text nests arrays and objects deeper than ``limit`` (brackets inside
    strings do not count). Linear, in a few passes of C over the payload: a replay judges every
    txn, and a txn of many operations has many brackets.

    Escapes go first (an escaped backslash, then an escaped quote), so that every quote left
    delimits a string; then only quotes and brackets are kept. Two quotes side by side are a
    string without brackets, or the gap between two strings: dropping them leaves what is
    outside strings as it was, and usually every quote. Each pass then drops the innermost
    pairs (those side by side before it), one level of nesting a pass; brackets left that never
    close are walked one by one. Exact for any JSON text: a payload that is not JSON may be
    judged either way, and is refused all the same when it is parsed."""
    if payload.count(b"[") + payload.count(b"{") <= limit:
        return False  # brackets in strings only add to the count: an op is usually done here
    if b"\\" in payload:
        payload = payload.replace(b"\\\\", b"").replace(b'\\"', b"")
    structure = payload.translate(None, _NOT_STRUCTURE)
    if structure.count(b"[") + structure.count(b"{") <= limit:
        return False
    structure = structure.replace(b'""', b"")
    if b'"' in structure:
        structure = b"".join(structure.split(b'"')[::2])
    passes = 0
    while structure:
        if passes == limit:
            return True
        # The placeholder keeps a pass from joining a pair it made: [{}] loses one level.
        inner = structure.replace(b"{}", b"\x00").replace(b"[]", b"\x00").replace(b"\x00", b"")
        if len(inner) == len(structure):  # no pair left: brackets never closed, not JSON
            return _opens_exceed(inner, limit - passes)
        structure = inner
        passes += 1
    return False


def _opens_exceed(brackets: bytes, limit: int) -> bool:
    """Whether brackets alone, walked one by one, open more than ``limit`` at once."""
    depth = 0
    for byte in brackets:
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
_PUT_FIELDS = _TXN_OP_FIELDS["put"]
_KEY_FIELDS = _TXN_OP_FIELDS["delete"]


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
        size += _branch_bytes(name, branch)
    if size > MAX_TXN_BYTES:
        raise KvOpError(f"{size} bytes of keys and values exceed the limit of {MAX_TXN_BYTES} "
                        f"bytes per txn", too_large=True)


def _branch_bytes(name: str, branch: tuple[TxnOp, ...]) -> int:
    """The UTF-8 bytes of a branch's keys and values, checked (see ``Txn``). A branch of ASCII
    keys and values within their bounds, no key written twice, is checked a list at a time: a
    replay checks every txn again. Any other goes op by op, which names what is wrong."""
    keys = [op.key for op in branch]
    values = [op.value for op in branch if type(op) is Put]
    written = [op.key for op in branch if type(op) is not Get]
    all_keys, all_values = "".join(keys), "".join(values)
    if (all_keys.isascii() and all_values.isascii()
            and (not keys or (min(map(len, keys)) > 0 and max(map(len, keys)) <= MAX_KEY_BYTES))
            and (not values or max(map(len, values)) <= MAX_VALUE_BYTES)
            and len(set(written)) == len(written)):
        return len(all_keys) + len(all_values)
    return _branch_bytes_each(name, branch)


def _branch_bytes_each(name: str, branch: tuple[TxnOp, ...]) -> int:
    """``_branch_bytes`` op by op: the first op out of bounds is named."""
    size = 0
    written: set[str] = set()
    for index, op in enumerate(branch):
        where, key = f"{name}[{index}]", op.key
        size += _checked_size(where, check_key, key)
        if isinstance(op, Put):
            size += _checked_size(where, check_value, op.value)
        if not isinstance(op, Get):
            if key in written:
                raise KvOpError(f"{where}: key {key!r} is put or deleted more than once in "
                                f"'{name}'")
            written.add(key)
    return size


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
              _txn_ops("success", lists["success"]), _txn_ops("failure", lists["failure"]))
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


def _txn_ops(branch: str, items: list[Any]) -> tuple[TxnOp, ...]:
    """A branch's operations, each of the shape ``txn_document`` gives. One loop, no call an
    operation: a replay decodes every operation of every txn."""
    ops: list[TxnOp] = []
    append = ops.append
    for item in items:
        if isinstance(item, dict):
            kind = item.get("op")
            if kind == "put" and item.keys() == _PUT_FIELDS:
                key, value = item["key"], item["value"]
                if isinstance(key, str) and isinstance(value, str):
                    append(Put(key, value))
                    continue
            # A tuple, not a set: a foreign record's "op" may be a list, which is unhashable.
            elif kind in ("delete", "get") and item.keys() == _KEY_FIELDS:
                key = item["key"]
                if isinstance(key, str):
                    append(Delete(key) if kind == "delete" else Get(key))
                    continue
        raise _txn_op_error(branch, len(ops), item)
    return tuple(ops)


def _txn_op_error(branch: str, index: int, item: Any) -> KvOpError:
    """What is wrong with the operation ``branch[index]``, spelt out once one is wrong."""
    where = f"{branch}[{index}]"
    kind = item.get("op") if isinstance(item, dict) else None
    fields = _TXN_OP_FIELDS.get(kind) if isinstance(kind, str) else None
    if fields is None:
        return KvOpError(f'{where}: expected {{"op": "put" | "delete" | "get", "key": ...}}')
    if item.keys() != fields:
        return KvOpError(f"{where}: a {kind} has the fields {', '.join(sorted(fields))}")
    if not isinstance(item["key"], str):
        return KvOpError(f"{where}: 'key' must be a string")
    return KvOpError(f"{where}: 'value' must be a string")


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
