"""The binary client protocol's codec (quorum_node.wire): every op's request and response round
trip, and whatever is not a whole frame is refused with WireError, never read as something else."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorum_node import wire
from quorum_node.wire import Op

u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
text = st.text(max_size=20)
blob = st.binary(max_size=40)


def strategy(kind: Any) -> st.SearchStrategy[Any]:
    if isinstance(kind, tuple):
        item = kind[1]
        items = fields(item) if isinstance(item, tuple) else strategy(item)
        return st.lists(items, max_size=4)
    if kind.startswith("opt_"):
        return st.none() | strategy(kind[4:])
    return {"str": text, "bytes": blob, "u32": u32, "u64": u64, "i64": i64,
            "bool": st.booleans()}[kind]


def fields(schema: tuple[Any, ...]) -> st.SearchStrategy[tuple[Any, ...]]:
    return st.tuples(*(strategy(kind) for kind in schema))


def request_cases() -> st.SearchStrategy[tuple[Op, tuple[Any, ...]]]:
    return st.sampled_from(list(Op)).flatmap(
        lambda op: st.tuples(st.just(op), fields(wire.REQUEST_FIELDS[op])))


def response_cases() -> st.SearchStrategy[tuple[Op, tuple[Any, ...]]]:
    return st.sampled_from(list(Op)).flatmap(
        lambda op: st.tuples(st.just(op), fields(wire.RESPONSE_FIELDS[op])))


@settings(max_examples=200, deadline=None)
@given(request_cases(), u32, u32)
def test_requests_round_trip(case: tuple[Op, tuple[Any, ...]], correlation: int,
                             timeout_ms: int) -> None:
    op, values = case
    data = wire.encode_request(correlation, op, timeout_ms, values)
    assert wire.decode_request_head(data) == (correlation, op, timeout_ms)
    assert wire.decode_request_fields(op, data) == values


@settings(max_examples=200, deadline=None)
@given(response_cases(), u32)
def test_responses_round_trip(case: tuple[Op, tuple[Any, ...]], correlation: int) -> None:
    op, values = case
    data = wire.encode_response(correlation, op, values)
    assert wire.decode_response_head(data) == (correlation, wire.STATUS_OK)
    assert wire.decode_response_fields(op, data) == values


@settings(max_examples=100, deadline=None)
@given(text, text, st.none() | st.tuples(st.none() | i64, st.none() | text))
def test_errors_round_trip_as_the_http_error_body(
        code: str, message: str, leader: tuple[int | None, str | None] | None) -> None:
    sent = wire.ErrorAnswer(code, message, leader=leader)
    data = wire.encode_error(7, sent)
    assert wire.decode_response_head(data) == (7, wire.STATUS_ERROR)
    received = wire.decode_error(data)
    assert received.body() == sent.body()
    if leader is not None:
        assert received.body()["leader"] == {"id": leader[0], "url": leader[1]}
    else:
        assert set(received.body()) == {"code", "message"}


@settings(max_examples=200, deadline=None)
@given(request_cases(), st.data())
def test_a_cut_or_extended_request_is_refused(case: tuple[Op, tuple[Any, ...]],
                                              data: st.DataObject) -> None:
    op, values = case
    whole = wire.encode_request(1, op, 0, values)
    cut = data.draw(st.integers(wire.REQUEST_HEAD.size, len(whole) - 1)) \
        if len(whole) > wire.REQUEST_HEAD.size else None
    if cut is not None:
        with pytest.raises(wire.WireError):
            wire.decode_request_fields(op, whole[:cut])
    with pytest.raises(wire.WireError):
        wire.decode_request_fields(op, whole + data.draw(st.binary(min_size=1, max_size=4)))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(list(Op)), st.binary(max_size=64))
def test_any_bytes_decode_or_raise_wire_error(op: Op, tail: bytes) -> None:
    data = wire.REQUEST_HEAD.pack(1, op, 0) + tail
    with contextlib.suppress(wire.WireError):
        wire.decode_request_fields(op, data)
    response = wire.RESPONSE_HEAD.pack(1, wire.STATUS_OK) + tail
    for decode in (lambda: wire.decode_response_fields(op, response),
                   lambda: wire.decode_error(response)):
        with contextlib.suppress(wire.WireError):
            decode()


def test_a_list_count_beyond_the_message_is_refused_before_allocating() -> None:
    data = wire.REQUEST_HEAD.pack(1, Op.APPEND, 0) + (2**32 - 1).to_bytes(4, "big")
    with pytest.raises(wire.WireError, match="a list of 4294967295 items"):
        wire.decode_request_fields(Op.APPEND, data)


def test_flags_and_text_are_strict() -> None:
    bad_flag = wire.REQUEST_HEAD.pack(1, Op.GET, 0) + b"\x00\x00\x00\x01k" + b"\x02"
    with pytest.raises(wire.WireError, match="must be 0 or 1"):
        wire.decode_request_fields(Op.GET, bad_flag)
    bad_text = wire.REQUEST_HEAD.pack(1, Op.DELETE, 0) + b"\x00\x00\x00\x01\xff"
    with pytest.raises(wire.WireError, match="not UTF-8"):
        wire.decode_request_fields(Op.DELETE, bad_text)
    with pytest.raises(wire.WireError, match="shorter than its"):
        wire.decode_request_head(b"\x00\x00\x00")
    with pytest.raises(wire.WireError, match="unknown response status"):
        wire.decode_response_head(wire.RESPONSE_HEAD.pack(1, 9))


def test_a_put_is_its_key_and_value_and_a_few_bytes() -> None:
    data = wire.encode_request(1, Op.PUT, 1000, ("key", "v" * 100))
    assert len(data) == wire.REQUEST_HEAD.size + 4 + 3 + 4 + 100


# --- the compiled codecs against the schema read field by field -------------------------------
#
# The reference: each field read and written through the schema, as plainly as it can be said.
# The codecs compiled from the schemas must write the same bytes and read any bytes alike: the
# same values, or a WireError with the same message.

def reference_encode(kind: Any, value: Any, out: list[bytes]) -> None:
    if isinstance(kind, tuple):
        out.append(len(value).to_bytes(4, "big"))
        for entry in value:
            if isinstance(kind[1], tuple):
                for item_kind, item in zip(kind[1], entry, strict=True):
                    reference_encode(item_kind, item, out)
            else:
                reference_encode(kind[1], entry, out)
    elif kind.startswith("opt_"):
        out.append(b"\x00" if value is None else b"\x01")
        if value is not None:
            reference_encode(kind[4:], value, out)
    elif kind in ("str", "bytes"):
        data = value.encode("utf-8") if kind == "str" else value
        out += [len(data).to_bytes(4, "big"), data]
    elif kind == "bool":
        out.append(b"\x01" if value else b"\x00")
    else:
        out.append(value.to_bytes(8 if kind != "u32" else 4, "big", signed=kind == "i64"))


class ReferenceReader:
    def __init__(self, data: bytes, position: int) -> None:
        self.data, self.position = data, position

    def take(self, size: int, what: str) -> bytes:
        start = self.position
        if start + size > len(self.data):
            raise wire.WireError(f"truncated {what} at byte {start}")
        self.position += size
        return self.data[start:start + size]

    def flag(self, what: str) -> bool:
        value = self.take(1, what)[0]
        if value > 1:
            raise wire.WireError(f"{what}: a flag byte must be 0 or 1, got {value}")
        return value == 1

    def read(self, kind: Any) -> Any:
        if isinstance(kind, tuple):
            count = int.from_bytes(self.take(4, "list count"), "big")
            if count > len(self.data) - self.position:
                raise wire.WireError(f"a list of {count} items in "
                                     f"{len(self.data) - self.position} bytes")
            if isinstance(kind[1], tuple):
                return [tuple(self.read(item) for item in kind[1]) for _ in range(count)]
            return [self.read(kind[1]) for _ in range(count)]
        if kind.startswith("opt_"):
            return self.read(kind[4:]) if self.flag("presence") else None
        if kind in ("str", "bytes"):
            what = "string" if kind == "str" else "bytes"
            size = int.from_bytes(self.take(4, f"{what} length"), "big")
            start = self.position
            if start + size > len(self.data):
                raise wire.WireError(f"truncated {what}: {size} bytes needed at byte {start}, "
                                     f"{len(self.data) - start} left")
            data = self.take(size, what)
            try:
                return data.decode("utf-8") if kind == "str" else data
            except UnicodeDecodeError as error:
                raise wire.WireError(f"a string is not UTF-8: {error}") from None
        if kind == "bool":
            return self.flag("bool")
        size = 4 if kind == "u32" else 8
        return int.from_bytes(self.take(size, kind), "big", signed=kind == "i64")


def reference_decode(schema: tuple[Any, ...], data: bytes, position: int) -> tuple[Any, ...]:
    reader = ReferenceReader(data, position)
    values = tuple(reader.read(kind) for kind in schema)
    if reader.position != len(data):
        raise wire.WireError(f"{len(data) - reader.position} bytes after the last field")
    return values


def outcome(decode: Any) -> Any:
    try:
        return decode()
    except wire.WireError as error:
        return f"WireError: {error}"


SCHEMAS = [*(("request", op, schema) for op, schema in wire.REQUEST_FIELDS.items()),
           *(("response", op, schema) for op, schema in wire.RESPONSE_FIELDS.items())]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SCHEMAS).flatmap(
    lambda case: st.tuples(st.just(case), fields(case[2]))), st.data())
def test_the_compiled_codecs_write_and_read_as_the_schema_says(
        case: tuple[tuple[str, Op, tuple[Any, ...]], tuple[Any, ...]],
        data: st.DataObject) -> None:
    (direction, op, schema), values = case
    if direction == "request":
        head = wire.REQUEST_HEAD.pack(1, op, 0)
        encoded = wire.encode_request(1, op, 0, values)
        decode = wire.decode_request_fields
    else:
        head = wire.RESPONSE_HEAD.pack(1, wire.STATUS_OK)
        encoded = wire.encode_response(1, op, values)
        decode = wire.decode_response_fields
    out: list[bytes] = []
    for kind, value in zip(schema, values, strict=True):
        reference_encode(kind, value, out)
    assert encoded == head + b"".join(out)
    # The same bytes, cut, grown, or with a byte changed, are read alike.
    damaged = bytearray(encoded)
    if len(damaged) > len(head):
        at = data.draw(st.integers(len(head), len(damaged) - 1))
        damaged[at] = data.draw(st.sampled_from([0, 1, 2, 0x7F, 0xFF]))
    cut = data.draw(st.integers(len(head), len(encoded)))
    for message in (encoded, bytes(damaged), encoded[:cut],
                    encoded + data.draw(st.binary(min_size=1, max_size=3))):
        assert outcome(lambda m=message: decode(op, m)) == outcome(
            lambda m=message: reference_decode(schema, m, len(head)))
