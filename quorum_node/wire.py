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
from collections.abc import Callable, Sequence
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


# --- compiled codecs ---------------------------------------------------------------------------
#
# Each schema is compiled once, when first used, into an encoder and a decoder of straight-line
# Python (as namedtuple and dataclasses compile theirs). Read through the schema field by field,
# every field cost a call and a chain of comparisons, several times the framing itself: most of
# what a txn of many operations cost to send and to answer. ``codec_source`` shows what a
# schema compiles to. Decoders check every length and flag before using it, and raise WireError
# only.

# A fixed-width kind: its struct, by the name the generated code knows it by.
_FIXED_WIDTH: Final = {"u32": _U32, "u64": _U64, "i64": _I64}
_CODEC_NAMESPACE: Final = {
    "WireError": WireError,
    **{f"_unpack_{kind}": layout.unpack_from for kind, layout in _FIXED_WIDTH.items()},
    **{f"_pack_{kind}": layout.pack for kind, layout in _FIXED_WIDTH.items()},
}


class _Source:
    """Python source being generated, a line at a time, with names unique within it."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._count = 0

    def name(self, stem: str) -> str:
        self._count += 1
        return f"{stem}{self._count}"

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)


def _emit_decode(kind: Kind, target: str, src: _Source, depth: int) -> None:
    """Lines that read a ``kind`` from ``data`` at ``pos`` (``size`` is its length) into the
    variable ``target``, moving ``pos`` past it."""
    emit = src.emit
    if kind in ("str", "bytes"):
        what = "string" if kind == "str" else "bytes"
        emit(depth, "start = pos + 4")
        emit(depth, f'if start > size: raise WireError(f"truncated {what} length at byte {{pos}}")')
        emit(depth, "pos = start + _unpack_u32(data, pos)[0]")
        emit(depth, f"if pos > size: raise WireError(f\"truncated {what}: {{pos - start}} bytes "
                    f"needed at byte {{start}}, {{size - start}} left\")")
        emit(depth, f"{target} = data[start:pos]" + ('.decode("utf-8")' if kind == "str" else ""))
    elif kind in _FIXED_WIDTH:
        width = _FIXED_WIDTH[kind].size
        emit(depth, f"if pos + {width} > size: "
                    f'raise WireError(f"truncated {kind} at byte {{pos}}")')
        emit(depth, f"{target} = _unpack_{kind}(data, pos)[0]")
        emit(depth, f"pos += {width}")
    elif kind == "bool":
        _emit_flag("bool", target, src, depth)
        emit(depth, f"{target} = {target} == 1")
    elif isinstance(kind, str) and kind.startswith("opt_"):
        present = src.name("present")
        _emit_flag("presence", present, src, depth)
        emit(depth, f"if {present}:")
        _emit_decode(kind[4:], target, src, depth + 1)
        emit(depth, "else:")
        emit(depth + 1, f"{target} = None")
    elif isinstance(kind, tuple) and kind[0] == "list":
        count, item = src.name("count"), kind[1]
        emit(depth, 'if pos + 4 > size: raise WireError(f"truncated list count at byte {pos}")')
        emit(depth, f"{count} = _unpack_u32(data, pos)[0]")
        emit(depth, "pos += 4")
        # Every item takes at least one byte: a count beyond what is left is a lie, refused
        # before anything is allocated for it.
        emit(depth, f"if {count} > size - pos: "
                    f'raise WireError(f"a list of {{{count}}} items in {{size - pos}} bytes")')
        emit(depth, f"{target} = []")
        emit(depth, f"for _ in range({count}):")
        if isinstance(item, tuple):
            names = [src.name("item") for _ in item]
            for item_kind, name in zip(item, names, strict=True):
                _emit_decode(item_kind, name, src, depth + 1)
            emit(depth + 1, f"{target}.append({_tuple(names)})")
        else:
            name = src.name("item")
            _emit_decode(item, name, src, depth + 1)
            emit(depth + 1, f"{target}.append({name})")
    else:
        raise ValueError(f"unknown field kind {kind!r}")


def _emit_flag(what: str, target: str, src: _Source, depth: int) -> None:
    """Lines that read a flag byte, 0 or 1, into ``target``."""
    src.emit(depth, f'if pos >= size: raise WireError(f"truncated {what} at byte {{pos}}")')
    src.emit(depth, f"{target} = data[pos]")
    src.emit(depth, "pos += 1")
    src.emit(depth, f"if {target} > 1: "
                    f'raise WireError(f"{what}: a flag byte must be 0 or 1, got {{{target}}}")')


def _emit_encode(kind: Kind, value: str, src: _Source, depth: int) -> None:
    """Lines that append the encoding of the variable ``value``, a ``kind``, to ``out``."""
    emit = src.emit
    if kind == "str":
        encoded = src.name("encoded")
        emit(depth, f'{encoded} = {value}.encode("utf-8")')
        emit(depth, f"append(_pack_u32(len({encoded})))")
        emit(depth, f"append({encoded})")
    elif kind == "bytes":
        emit(depth, f"append(_pack_u32(len({value})))")
        emit(depth, f"append(bytes({value}))")
    elif kind in _FIXED_WIDTH:
        emit(depth, f"append(_pack_{kind}({value}))")
    elif kind == "bool":
        emit(depth, f'append(b"\\x01" if {value} else b"\\x00")')
    elif isinstance(kind, str) and kind.startswith("opt_"):
        emit(depth, f"if {value} is None:")
        emit(depth + 1, 'append(b"\\x00")')
        emit(depth, "else:")
        emit(depth + 1, 'append(b"\\x01")')
        _emit_encode(kind[4:], value, src, depth + 1)
    elif isinstance(kind, tuple) and kind[0] == "list":
        entry, item = src.name("entry"), kind[1]
        emit(depth, f"append(_pack_u32(len({value})))")
        emit(depth, f"for {entry} in {value}:")
        if isinstance(item, tuple):
            _emit_unpack(item, entry, src, depth + 1)
        else:
            _emit_encode(item, entry, src, depth + 1)
    else:
        raise ValueError(f"unknown field kind {kind!r}")


def _emit_unpack(schema: Schema, values: str, src: _Source, depth: int) -> None:
    """Lines that encode the sequence ``values``, one value a field of ``schema``."""
    names = [src.name("value") for _ in schema]
    src.emit(depth, f"if len({values}) != {len(schema)}: "
                    f'raise ValueError(f"{{len({values})}} values for {len(schema)} fields")')
    if names:
        src.emit(depth, f"{', '.join(names)}, = {values}")
    for kind, name in zip(schema, names, strict=True):
        _emit_encode(kind, name, src, depth)


def _tuple(names: Sequence[str]) -> str:
    return f"({', '.join(names)},)" if names else "()"


def codec_source(schema: Schema) -> str:
    """The Python a schema compiles to: ``encode(values, out)``, which appends the encoding of
    ``values`` (one a field) to the list ``out``, and ``decode(data, pos)``, which reads the
    fields from ``pos`` to the end of ``data``."""
    src = _Source()
    src.emit(0, "def encode(values, out):")
    src.emit(1, "append = out.append")
    _emit_unpack(schema, "values", src, 1)
    src.emit(0, "")
    src.emit(0, "def decode(data, pos):")
    src.emit(1, "size = len(data)")
    src.emit(1, "try:")
    names = [src.name("field") for _ in schema]
    for kind, name in zip(schema, names, strict=True):
        _emit_decode(kind, name, src, 2)
    src.emit(1, "except UnicodeDecodeError as error:")
    src.emit(2, 'raise WireError(f"a string is not UTF-8: {error}") from None')
    src.emit(1, 'if pos != size: raise WireError(f"{size - pos} bytes after the last field")')
    src.emit(1, f"return {_tuple(names)}")
    return "\n".join(src.lines) + "\n"


class _Codec:
    """A schema's compiled encoder and decoder (``codec_source``)."""

    __slots__ = ("decode", "encode")

    def __init__(self, schema: Schema, name: str) -> None:
        namespace: dict[str, Any] = dict(_CODEC_NAMESPACE)
        exec(compile(codec_source(schema), f"<wire codec {name}>", "exec"), namespace)
        self.encode: Callable[[Sequence[Any], list[bytes]], None] = namespace["encode"]
        self.decode: Callable[[bytes, int], tuple[Any, ...]] = namespace["decode"]


class _Codecs(dict[Op, _Codec]):
    """Each op's codec, compiled when the op is first framed: compiling every one at import
    would cost each process that imports this module several milliseconds, a client's CLI
    included. (Two threads may both compile one: either result serves.)"""

    def __init__(self, schemas: dict[Op, Schema], direction: str) -> None:
        super().__init__()
        self._schemas = schemas
        self._direction = direction

    def __missing__(self, op: Op) -> _Codec:
        codec = self[op] = _Codec(self._schemas[op], f"{op.name} {self._direction}")
        return codec


_REQUEST_CODECS: Final = _Codecs(REQUEST_FIELDS, "request")
_RESPONSE_CODECS: Final = _Codecs(RESPONSE_FIELDS, "response")
_ERROR_CODEC: Final = _Codec(ERROR_FIELDS, "error")


def encode_request(correlation: int, op: Op, timeout_ms: int, fields: Sequence[Any]) -> bytes:
    out = [REQUEST_HEAD.pack(correlation, op, timeout_ms)]
    _REQUEST_CODECS[op].encode(fields, out)
    return b"".join(out)


def encode_response(correlation: int, op: Op, fields: Sequence[Any]) -> bytes:
    out = [RESPONSE_HEAD.pack(correlation, STATUS_OK)]
    _RESPONSE_CODECS[op].encode(fields, out)
    return b"".join(out)


def encode_error(correlation: int, error: ErrorAnswer) -> bytes:
    out = [RESPONSE_HEAD.pack(correlation, STATUS_ERROR)]
    leader = error.leader
    _ERROR_CODEC.encode((
        error.code, error.message, leader is not None,
        leader[0] if leader is not None else None, leader[1] if leader is not None else None),
        out)
    return b"".join(out)


def decode_request_head(data: bytes) -> tuple[int, int, int]:
    """(correlation, op number, timeout_ms); the op may be unknown (the caller answers it)."""
    if len(data) < REQUEST_HEAD.size:
        raise WireError(f"a request of {len(data)} bytes is shorter than its "
                        f"{REQUEST_HEAD.size}-byte head")
    correlation, op, timeout_ms = REQUEST_HEAD.unpack_from(data)
    return correlation, op, timeout_ms


def decode_request_fields(op: Op, data: bytes) -> tuple[Any, ...]:
    return _REQUEST_CODECS[op].decode(data, REQUEST_HEAD.size)


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
    return _RESPONSE_CODECS[op].decode(data, RESPONSE_HEAD.size)


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
    code, message, has_leader, leader_id, leader_url = _ERROR_CODEC.decode(
        data, RESPONSE_HEAD.size)
    return ErrorAnswer(code, message, leader=(leader_id, leader_url) if has_leader else None)
