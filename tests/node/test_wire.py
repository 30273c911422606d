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
