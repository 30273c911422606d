"""Fuzzing the binary client protocol (GET /v1/stream) on a 3-node quorum: hypothesis sends valid
requests of every op with arbitrary fields, requests of a known op with damaged fields, and
arbitrary bytes. Each message is answered (a result, or an error with the error contract's code
and message) or the stream is closed with a protocol error and its reason; a refused request
changes nothing, no node crashes, and afterwards every replica holds the same log and store.

Budget: FUZZ_EXAMPLES examples per property (default 25; FUZZ_EXAMPLES=2000 for a long run).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from fuzz_support import FUZZ_EXAMPLES, TALLY, assert_replicas_consistent, report
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from secured_cluster import InProcessCluster, plain_configs
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Subprotocol

from quorum_node import wire
from quorum_node.node.kv_service import MAX_WAIT_MS
from quorum_node.wire import Op

FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
# Answers every request may get: the error contract's codes for refused or retried calls.
EXPECTED_CODES = {"BAD_REQUEST", "TOO_LARGE", "NOT_LEADER", "NO_LEADER", "TIMEOUT",
                  "OUTCOME_UNKNOWN", "APPEND_LOST", "OFFSET_OUT_OF_RANGE", "COMPACTED",
                  "TOO_MANY_LONG_POLLS"}
# Short waits and timeouts: a fuzzed 30 s long poll only slows the fuzz down.
MAX_FUZZ_WAIT_MS = 50


@pytest.fixture(scope="module")
def quorum(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessCluster]:
    cluster = InProcessCluster(plain_configs(tmp_path_factory.mktemp("stream-fuzz"), 3,
                                             http_max_long_polls=4))
    try:
        yield cluster
    finally:
        cluster.stop()


def _leader_address(quorum: InProcessCluster) -> str:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        leader = quorum.leader()
        if leader is not None and leader.core.accepts_writes:
            return leader.config.client_listeners[0].address
        time.sleep(0.05)
    raise AssertionError("no leader")


def _open(quorum: InProcessCluster) -> ClientConnection:
    return connect(f"ws://{_leader_address(quorum)}{wire.PATH}", compression=None, proxy=None,
                   subprotocols=[Subprotocol(wire.SUBPROTOCOL)], ping_interval=None,
                   max_size=wire.MAX_RESPONSE_BYTES, open_timeout=5)


def _value(kind: Any) -> st.SearchStrategy[Any]:
    if isinstance(kind, tuple):
        item = kind[1]
        items = st.tuples(*(_value(k) for k in item)) if isinstance(item, tuple) \
            else _value(item)
        return st.lists(items, max_size=3)
    if kind.startswith("opt_"):
        return st.none() | _value(kind[4:])
    return {"str": st.text(max_size=12) | st.just("") | st.text(min_size=1100, max_size=1100),
            "bytes": st.binary(max_size=16),
            "u32": st.integers(0, MAX_FUZZ_WAIT_MS) | st.integers(0, 2**32 - 1),
            "u64": st.integers(0, 50) | st.integers(0, 2**64 - 1),
            "i64": st.integers(-(2**63), 2**63 - 1),
            "bool": st.booleans()}[kind]


def _requests() -> st.SearchStrategy[tuple[Op, tuple[Any, ...]]]:
    return st.sampled_from(list(Op)).flatmap(lambda op: st.tuples(
        st.just(op), st.tuples(*(_value(kind) for kind in wire.REQUEST_FIELDS[op]))))


def _check_answer(data: bytes, op: Op | None) -> str | None:
    """The answer's error code; None for a result."""
    correlation, status = wire.decode_response_head(data)
    assert correlation == 1
    if status == wire.STATUS_ERROR:
        error = wire.decode_error(data)
        assert error.code in EXPECTED_CODES, error
        assert error.message
        TALLY[f"answers: {error.code}"] += 1
        return error.code
    assert op is not None
    wire.decode_response_fields(op, data)
    TALLY["answers: ok"] += 1
    return None


def _send(quorum: InProcessCluster, message: bytes, op: Op | None) -> None:
    """Send one message on a new stream: answered, or closed with a protocol error; a refused
    request leaves the log as it was."""
    TALLY["messages"] += 1
    leader = quorum.leader()
    end = leader.log_dir.log.end_offset if leader is not None else None
    code: str | None  # "closed", an error code, or None for a result
    with _open(quorum) as stream:
        stream.send(message)
        try:
            # A long poll may wait its whole wait_ms (any u32 up to MAX_WAIT_MS) before its answer.
            data = stream.recv(timeout=10 + MAX_WAIT_MS / 1000, decode=False)
        except ConnectionClosed as closed:
            assert closed.rcvd is not None and closed.rcvd.code == 1002, closed
            assert closed.rcvd.reason.startswith("malformed"), closed.rcvd.reason
            TALLY["closed: malformed"] += 1
            code = "closed"
        else:
            code = _check_answer(data, op)
    if leader is not None:
        assert leader.failure is None
        if code in ("closed", "BAD_REQUEST", "TOO_LARGE"):
            assert leader.log_dir.log.end_offset == end, f"refused ({code}) but the log grew"


@FUZZ
@given(request=_requests(), timeout_ms=st.integers(0, 200))
def test_requests_with_arbitrary_fields(quorum: InProcessCluster,
                                        request: tuple[Op, tuple[Any, ...]],
                                        timeout_ms: int) -> None:
    op, fields = request
    _send(quorum, wire.encode_request(1, op, timeout_ms, fields), op)


@FUZZ
@given(request=_requests(), where=st.data())
def test_damaged_requests(quorum: InProcessCluster, request: tuple[Op, tuple[Any, ...]],
                          where: st.DataObject) -> None:
    op, fields = request
    whole = wire.encode_request(1, op, 100, fields)
    damaged = bytearray(whole)
    position = where.draw(st.integers(wire.REQUEST_HEAD.size, len(whole)), label="position")
    damaged[position:position] = where.draw(st.binary(min_size=1, max_size=8), label="insert")
    _send(quorum, bytes(damaged), op)
    TALLY["damaged"] += 1


@FUZZ
@given(message=st.binary(max_size=64))
def test_arbitrary_bytes(quorum: InProcessCluster, message: bytes) -> None:
    op = wire.decode_request_head(message)[1] if len(message) >= wire.REQUEST_HEAD.size \
        else None
    known = op if op in {o.value for o in Op} else None
    if len(message) >= wire.REQUEST_HEAD.size and message[:4] != b"\x00\x00\x00\x01":
        message = b"\x00\x00\x00\x01" + message[4:]  # the answer's correlation is checked
    _send(quorum, message, Op(known) if known is not None else None)


def test_replicas_agree_after_the_fuzz(quorum: InProcessCluster) -> None:
    nodes = list(quorum.nodes.values())
    stores = [node.state_machine.store for node in nodes]
    TALLY["high watermark"] = assert_replicas_consistent(nodes, stores)
    report("stream fuzz")
