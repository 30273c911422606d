"""The binary client protocol: the client API's operations over one WebSocket.

A client opens ``GET /v1/stream`` on a node's client listener, upgraded to a WebSocket with the
subprotocol ``quorum-client.v1`` (TLS, tokens and client certificates as for HTTP: the upgrade
request carries them). Each binary WebSocket message is one request or one response::

    request   correlation uint32 | op uint8 (Op) | timeout_ms uint32 (0: default) | fields
    response  correlation uint32 | status uint8 (0: ok, 1: error) | fields

all big-endian. A request's fields, and an ok response's, are the op's (REQUEST_FIELDS and
RESPONSE_FIELDS); an error's are ERROR_FIELDS, the one error contract of the HTTP APIs: code,
message, and on NOT_LEADER or NO_LEADER the leader's id and URL. Many requests may be in flight
on one stream; each is answered when it completes, so answers come in any order and the
correlation id pairs them up.

Field kinds: ``bool`` one byte 0 or 1; ``u32``, ``u64``, ``i64`` fixed width; ``str`` a uint32
length and UTF-8; ``bytes`` a uint32 length and the bytes; ``opt_*`` a presence byte (0 or 1) and,
if 1, the value; a list a uint32 count and its items, each the item's fields in order. Nothing may
follow the last field. A message that does not decode raises WireError, never anything else.

Why not JSON: a put is a key and a value; framing them costs a struct pack, where JSON costs an
encode and a decode on both ends (and base64 for record bytes). This module imports nothing of
the node, so that the client can use it with the standard library alone.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from typing import Any, Final

# How a client may talk to the nodes: this protocol, or the HTTP API.
CLIENT_PROTOCOLS: Final = ("binary", "http")
DEFAULT_CLIENT_PROTOCOL: Final = "binary"
PATH: Final = "/v1/stream"
SUBPROTOCOL: Final = "quorum-client.v1"
# The largest request: an append of up to 4 MiB of records, each with its 4-byte length.
MAX_REQUEST_BYTES: Final = 8 * 1024 * 1024
# The largest response a client accepts (a read answers about 1 MiB of values; a page of keys
# may hold more).
MAX_RESPONSE_BYTES: Final = 64 * 1024 * 1024

STATUS_OK: Final = 0
STATUS_ERROR: Final = 1

REQUEST_HEAD: Final = struct.Struct(">IBI")
RESPONSE_HEAD: Final = struct.Struct(">IB")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_U8 = struct.Struct(">B")


class Op(enum.IntEnum):
    PUT = 1
    GET = 2
    DELETE = 3
    CAS = 4
    APPEND = 5
    READ = 6
    LIST = 7
    WATCH = 8
    TXN = 9


class WireError(ValueError):
    """A message that is not a well-formed frame of this protocol."""


# A schema: the kinds of a message's fields, in order. A kind is a name, or ("list", item) with
# ``item`` a kind (items are plain values) or a schema (items are tuples).
Kind = Any
Schema = tuple[Kind, ...]

REQUEST_FIELDS: Final[dict[Op, Schema]] = {
    Op.PUT: ("str", "str"),  # key, value
    Op.GET: ("str", "bool"),  # key, stale
    Op.DELETE: ("str",),  # key
    Op.CAS: ("str", "opt_str", "opt_str"),  # key, expected (None: absent), value (None: delete)
    Op.APPEND: (("list", "bytes"),),  # values
    Op.READ: ("u64", "u32", "u32"),  # offset, max_records, wait_ms
    Op.LIST: ("str", "opt_str", "u32", "bool"),  # prefix, start_after, limit, stale
    # exact (a key, else a prefix), key or prefix, offset, wait_ms, max_events
    Op.WATCH: ("bool", "str", "u64", "u32", "u32"),
    # compares (key, target, result, value for a value target, number for a version or
    # mod_offset one), then the success and the failure operations (op: put, delete or get,
    # key, value: a put's only)
    Op.TXN: (("list", ("str", "str", "str", "opt_str", "opt_i64")),
             ("list", ("str", "str", "opt_str")), ("list", ("str", "str", "opt_str"))),
}
_WRITE: Final[Schema] = ("u64", "u64", "bool")  # offset, epoch, applied
RESPONSE_FIELDS: Final[dict[Op, Schema]] = {
    Op.PUT: _WRITE,
    Op.GET: ("opt_str", "i64"),  # value (None: no such key), applied_offset
    Op.DELETE: _WRITE,  # applied: whether the key existed
    Op.CAS: _WRITE,  # applied: whether the expectation held
    Op.APPEND: ("u64", "u64", "u64"),  # first_offset, last_offset, epoch
    # high_watermark, next_offset, records (offset, timestamp_ms, key, value)
    Op.READ: ("opt_i64", "u64", ("list", ("u64", "i64", "opt_bytes", "bytes"))),
    # entries (key, value), next_start_after, applied_offset
    Op.LIST: (("list", ("str", "str")), "opt_str", "i64"),
    # events (offset, key, value; None: deleted), next_offset, applied_offset
    Op.WATCH: (("list", ("u64", "str", "opt_str")), "u64", "i64"),
    # offset, epoch, succeeded, responses (op, key, found: a put's key existed, a delete
    # deleted one, a get's key is present; value, version, mod_offset: a get's)
    Op.TXN: ("u64", "u64", "bool", ("list", ("str", "str", "bool", "opt_str", "i64", "i64"))),
}
# code, message, leader (present on NOT_LEADER and NO_LEADER): id, url
ERROR_FIELDS: Final[Schema] = ("str", "str", "bool", "opt_i64", "opt_str")


# --- encoding ----------------------------------------------------------------------------------

def _encode(kind: Kind, value: Any, out: list[bytes]) -> None:
    if kind == "str":
        data = value.encode("utf-8")
        out.append(_U32.pack(len(data)))
        out.append(data)
    elif kind == "bytes":
        out.append(_U32.pack(len(value)))
        out.append(bytes(value))
    elif kind == "u64":
        out.append(_U64.pack(value))
    elif kind == "i64":
        out.append(_I64.pack(value))
    elif kind == "u32":
        out.append(_U32.pack(value))
    elif kind == "bool":
        out.append(b"\x01" if value else b"\x00")
    elif isinstance(kind, str) and kind.startswith("opt_"):
        if value is None:
            out.append(b"\x00")
        else:
            out.append(b"\x01")
            _encode(kind[4:], value, out)
    elif isinstance(kind, tuple) and kind[0] == "list":
        item = kind[1]
        out.append(_U32.pack(len(value)))
        if isinstance(item, tuple):
            for entry in value:
                _encode_fields(item, entry, out)
        else:
            for entry in value:
                _encode(item, entry, out)
    else:
        raise ValueError(f"unknown field kind {kind!r}")


def _encode_fields(schema: Schema, values: Sequence[Any], out: list[bytes]) -> None:
    if len(values) != len(schema):
        raise ValueError(f"{len(values)} values for {len(schema)} fields")
    for kind, value in zip(schema, values, strict=True):
        _encode(kind, value, out)


def encode_request(correlation: int, op: Op, timeout_ms: int, fields: Sequence[Any]) -> bytes:
    out = [REQUEST_HEAD.pack(correlation, op, timeout_ms)]
    _encode_fields(REQUEST_FIELDS[op], fields, out)
    return b"".join(out)


def encode_response(correlation: int, op: Op, fields: Sequence[Any]) -> bytes:
    out = [RESPONSE_HEAD.pack(correlation, STATUS_OK)]
    _encode_fields(RESPONSE_FIELDS[op], fields, out)
    return b"".join(out)


def encode_error(correlation: int, error: ErrorAnswer) -> bytes:
    out = [RESPONSE_HEAD.pack(correlation, STATUS_ERROR)]
    leader = error.leader
    _encode_fields(ERROR_FIELDS, (
        error.code, error.message, leader is not None,
        leader[0] if leader is not None else None, leader[1] if leader is not None else None),
        out)
    return b"".join(out)


# --- decoding ----------------------------------------------------------------------------------

class _Reader:
    __slots__ = ("data", "position")

    def __init__(self, data: bytes, position: int) -> None:
        self.data = data
        self.position = position

    def sized(self, what: str) -> bytes:
        """A u32 length, then that many bytes (a string's or a bytes field's): one call, as
        a txn's keys and values are most of what a request holds."""
        data, length_at = self.data, self.position
        start = length_at + _U32.size
        if start > len(data):
            raise WireError(f"truncated {what} length at byte {length_at}")
        end = start + _U32.unpack_from(data, length_at)[0]
        if end > len(data):
            raise WireError(f"truncated {what}: {end - start} bytes needed at byte {start}, "
                            f"{len(data) - start} left")
        self.position = end
        return data[start:end]

    def fixed(self, layout: struct.Struct, what: str) -> Any:
        start = self.position
        if start + layout.size > len(self.data):
            raise WireError(f"truncated {what} at byte {start}")
        self.position = start + layout.size
        return layout.unpack_from(self.data, start)[0]

    def flag(self, what: str) -> bool:
        value = self.fixed(_U8, what)
        if value > 1:
            raise WireError(f"{what}: a flag byte must be 0 or 1, got {value}")
        return bool(value)

    def read(self, kind: Kind) -> Any:
        if kind == "str":
            try:
                return self.sized("string").decode("utf-8")
            except UnicodeDecodeError as error:
                raise WireError(f"a string is not UTF-8: {error}") from None
        if kind == "bytes":
            return self.sized("bytes")
        if kind == "u64":
            return self.fixed(_U64, "u64")
        if kind == "i64":
            return self.fixed(_I64, "i64")
        if kind == "u32":
            return self.fixed(_U32, "u32")
        if kind == "bool":
            return self.flag("bool")
        if isinstance(kind, str) and kind.startswith("opt_"):
            return self.read(kind[4:]) if self.flag("presence") else None
        if isinstance(kind, tuple) and kind[0] == "list":
            count = self.fixed(_U32, "list count")
            item = kind[1]
            # Every item takes at least one byte: a count beyond what is left is a lie, refused
            # before anything is allocated for it.
            if count > len(self.data) - self.position:
                raise WireError(f"a list of {count} items in {len(self.data) - self.position} "
                                f"bytes")
            if isinstance(item, tuple):
                return [self.fields(item) for _ in range(count)]
            return [self.read(item) for _ in range(count)]
        raise ValueError(f"unknown field kind {kind!r}")

    def fields(self, schema: Schema) -> tuple[Any, ...]:
        return tuple(self.read(kind) for kind in schema)

    def end(self) -> None:
        if self.position != len(self.data):
            raise WireError(f"{len(self.data) - self.position} bytes after the last field")


def decode_fields(schema: Schema, data: bytes, position: int) -> tuple[Any, ...]:
    reader = _Reader(data, position)
    values = reader.fields(schema)
    reader.end()
    return values


def decode_request_head(data: bytes) -> tuple[int, int, int]:
    """(correlation, op number, timeout_ms); the op may be unknown (the caller answers it)."""
    if len(data) < REQUEST_HEAD.size:
        raise WireError(f"a request of {len(data)} bytes is shorter than its "
                        f"{REQUEST_HEAD.size}-byte head")
    correlation, op, timeout_ms = REQUEST_HEAD.unpack_from(data)
    return correlation, op, timeout_ms


def decode_request_fields(op: Op, data: bytes) -> tuple[Any, ...]:
    return decode_fields(REQUEST_FIELDS[op], data, REQUEST_HEAD.size)


def decode_response_head(data: bytes) -> tuple[int, int]:
    """(correlation, status)."""
    if len(data) < RESPONSE_HEAD.size:
        raise WireError(f"a response of {len(data)} bytes is shorter than its "
                        f"{RESPONSE_HEAD.size}-byte head")
    correlation, status = RESPONSE_HEAD.unpack_from(data)
    if status not in (STATUS_OK, STATUS_ERROR):
        raise WireError(f"unknown response status {status}")
    return correlation, status


def decode_response_fields(op: Op, data: bytes) -> tuple[Any, ...]:
    return decode_fields(RESPONSE_FIELDS[op], data, RESPONSE_HEAD.size)


class ErrorAnswer:
    """An error response: the error contract's code, message and leader (id, url)."""

    __slots__ = ("code", "leader", "message")

    def __init__(self, code: str, message: str, *,
                 leader: tuple[int | None, str | None] | None = None) -> None:
        self.code = code
        self.message = message
        self.leader = leader

    def body(self) -> dict[str, Any]:
        """The error as the HTTP APIs' JSON error body says it."""
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.leader is not None:
            body["leader"] = {"id": self.leader[0], "url": self.leader[1]}
        return body

    def __repr__(self) -> str:
        return f"ErrorAnswer({self.code!r}, {self.message!r}, leader={self.leader!r})"


def decode_error(data: bytes) -> ErrorAnswer:
    code, message, has_leader, leader_id, leader_url = decode_fields(
        ERROR_FIELDS, data, RESPONSE_HEAD.size)
    return ErrorAnswer(code, message, leader=(leader_id, leader_url) if has_leader else None)
