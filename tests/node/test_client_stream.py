"""The binary client protocol (``GET /v1/stream``, quorum_node.wire) against real in-process
nodes: answers out of order, the stream's bounds (in flight, idle, size), malformed messages
refused with a reason and never a crash, redirects and failover over the stream, streams closed
at shutdown, the client's outcome-unknown rule on a stream that hangs up, pings and fragmented
answers, and ``quorum-client load`` (pipelined puts) over both protocols."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_client_api import Cluster
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect
from websockets.sync.server import Server, ServerConnection, serve
from websockets.typing import Subprotocol

from quorum_node import wire
from quorum_node.cli.client import main as client_main
from quorum_node.client import PROTOCOLS, QuorumClient, QuorumClientError
from quorum_node.node.api.stream import MAX_IN_FLIGHT
from quorum_node.wire import Op


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("stream-single"), 1)
    try:
        cluster.leader()
        yield cluster
    finally:
        cluster.stop()


def open_stream(cluster: Cluster, *, subprotocol: bool = True) -> ClientConnection:
    address = cluster.leader().address
    return connect(f"ws://{address}{wire.PATH}", compression=None, proxy=None,
                   subprotocols=[Subprotocol(wire.SUBPROTOCOL)] if subprotocol else None,
                   max_size=wire.MAX_RESPONSE_BYTES, ping_interval=None, open_timeout=5)


def answer(stream: ClientConnection, op: Op, timeout_s: float = 10) -> tuple[int, Any]:
    """The next answer: its correlation and fields (or the ErrorAnswer)."""
    data = stream.recv(timeout=timeout_s, decode=False)
    correlation, status = wire.decode_response_head(data)
    if status == wire.STATUS_ERROR:
        return correlation, wire.decode_error(data)
    return correlation, wire.decode_response_fields(op, data)


def closed_with(stream: ClientConnection) -> tuple[int, str]:
    with pytest.raises(ConnectionClosed) as closed:
        stream.recv(timeout=5)
    frame = closed.value.rcvd
    assert frame is not None
    return frame.code, frame.reason


def test_answers_come_as_they_complete_not_in_order(single: Cluster) -> None:
    with open_stream(single) as stream:
        stream.send(wire.encode_request(1, Op.LIST, 0, ("", None, 1, True)))
        _, (_, _, applied_offset) = answer(stream, Op.LIST)
        # A watch that waits for a change, then the put that makes it: the put is answered
        # first, the watch right after, with the put's change.
        stream.send(wire.encode_request(
            7, Op.WATCH, 0, (False, "ooo/", applied_offset + 1, 5000, 10)))
        stream.send(wire.encode_request(8, Op.PUT, 5000, ("ooo/a", "one")))
        first, put = answer(stream, Op.PUT)
        assert first == 8
        offset, _, applied = put
        assert applied
        second, (events, next_offset, _) = answer(stream, Op.WATCH)
        assert second == 7
        assert events == [(offset, "ooo/a", "one")] and next_offset == offset + 1


def test_every_op_over_the_stream(single: Cluster) -> None:
    with QuorumClient(single.bootstrap, protocol="binary") as client:
        assert client.put("ops/a", "1").applied
        assert client.cas("ops/a", "1", "2").applied
        assert not client.cas("ops/a", "1", "3").applied
        assert client.get("ops/a") == "2" and client.get("ops/a", stale=True) == "2"
        assert client.last_answer["value"] == "2"
        assert client.get("ops/none") is None
        assert client.last_answer["code"] == "KEY_NOT_FOUND"
        assert client.list_keys("ops/").entries == [("ops/a", "2")]
        deleted = client.delete("ops/a")
        assert deleted.applied and not client.delete("ops/a").applied
        changes = client.watch(deleted.offset, prefix="ops/")
        assert [(e.key, e.value) for e in changes.events] == [("ops/a", None)]
        first, last = client.append([b"\x00raw", b""])
        got = client.read(first, max_records=2)
        assert [r.value for r in got.records] == [b"\x00raw", b""] and last == first + 1
        results = client.put_many([(f"many/{i}", str(i)) for i in range(100)], window=16)
        assert [r.key for r in results] == [f"many/{i}" for i in range(100)]
        assert all(r.applied for r in results)
        assert len(client.list_keys("many/", limit=1000).entries) == 100


def test_a_refused_call_carries_the_error_contract(single: Cluster) -> None:
    with QuorumClient(single.bootstrap, protocol="binary") as client:
        with pytest.raises(QuorumClientError) as refused:
            client.put("k" * 2000, "v")
        assert refused.value.code == "TOO_LARGE"
        assert refused.value.body is not None and set(refused.value.body) == {"code", "message"}
        with pytest.raises(QuorumClientError) as bad:
            client.read(0, max_records=0)
        assert bad.value.code == "BAD_REQUEST"


@pytest.mark.parametrize(("message", "code", "reason"), [
    (b"\x00\x00\x00", 1002, "malformed request: a request of 3 bytes"),
    (wire.REQUEST_HEAD.pack(1, Op.PUT, 0) + b"\x00\x00\x00\x09ab", 1002,
     "malformed PUT request: truncated string"),
    (wire.REQUEST_HEAD.pack(1, Op.GET, 0) + b"\x00\x00\x00\x01k\x01trailing", 1002,
     "malformed GET request: 8 bytes after the last field"),
    ("a text message", 1003, "binary messages only"),
])
def test_a_malformed_message_closes_the_stream_with_its_reason(
        single: Cluster, message: bytes | str, code: int, reason: str) -> None:
    with open_stream(single) as stream:
        stream.send(message)
        closed_code, closed_reason = closed_with(stream)
    assert closed_code == code
    assert closed_reason.startswith(reason)
    with QuorumClient(single.bootstrap, protocol="binary") as client:
        assert client.put("after-malformed", "still serving").applied


def test_a_message_over_the_size_bound_closes_the_stream(single: Cluster) -> None:
    with open_stream(single) as stream:
        # The node closes (1009) as soon as it reads the frame's length; the client may still
        # be sending and see only the connection reset.
        with pytest.raises(ConnectionClosed) as closed:
            stream.send(b"\x00" * (wire.MAX_REQUEST_BYTES + 1))
            stream.recv(timeout=5)
        if closed.value.rcvd is not None:
            assert closed.value.rcvd.code == 1009
    with QuorumClient(single.bootstrap, protocol="binary") as client:
        assert client.put("after-too-large", "still serving").applied


def test_an_unknown_op_is_answered_and_the_stream_goes_on(single: Cluster) -> None:
    with open_stream(single) as stream:
        stream.send(wire.REQUEST_HEAD.pack(3, 99, 0) + b"whatever")
        correlation, refusal = answer(stream, Op.GET)
        assert correlation == 3 and isinstance(refusal, wire.ErrorAnswer)
        assert refusal.code == "BAD_REQUEST" and "unknown op 99" in refusal.message
        stream.send(wire.encode_request(4, Op.GET, 0, ("absent", True)))
        assert answer(stream, Op.GET)[0] == 4


def test_a_stream_without_the_subprotocol_is_refused(single: Cluster) -> None:
    with pytest.raises(InvalidStatus) as refused:
        open_stream(single, subprotocol=False)
    assert refused.value.response.status_code == 400
    assert b"quorum-client.v1" in refused.value.response.body


def test_requests_beyond_the_in_flight_bound_wait_for_a_slot(single: Cluster) -> None:
    with open_stream(single) as stream:
        # Every slot taken by a watch that waits 1.5 s for a change that never comes. The
        # clock starts before the first is sent: on a busy machine the sends alone take a while,
        # and the first watch's wait runs meanwhile.
        started = time.monotonic()
        for correlation in range(MAX_IN_FLIGHT):
            stream.send(wire.encode_request(correlation, Op.WATCH, 0,
                                            (True, "never-written", 0, 1500, 1)))
        stream.send(wire.encode_request(MAX_IN_FLIGHT, Op.GET, 0, ("absent", True)))
        answered: dict[int, float] = {}
        while MAX_IN_FLIGHT not in answered:
            correlation, _ = wire.decode_response_head(stream.recv(timeout=10, decode=False))
            answered[correlation] = time.monotonic() - started
        # The get was read only once a watch had ended (none can before 1.5 s), not served at
        # once.
        assert answered[MAX_IN_FLIGHT] > 1.4
        assert len(answered) > 1


def test_an_idle_stream_is_closed_but_not_one_waiting_for_an_answer(tmp_path: Path) -> None:
    first = Cluster(tmp_path, 1)
    first.stop()
    configs = [config.model_copy(update={"http_read_timeout_ms": 500})
               for config in first.configs]
    cluster = Cluster(tmp_path, 1, configs)
    try:
        cluster.leader()
        with open_stream(cluster) as stream:
            # A watch waiting 1.5 s keeps the stream open past the idle timeout ...
            stream.send(wire.encode_request(1, Op.WATCH, 0, (True, "idle", 0, 1500, 1)))
            correlation, _ = answer(stream, Op.WATCH)
            assert correlation == 1
            # ... then nothing is in flight: closed after the timeout.
            started = time.monotonic()
            code, reason = closed_with(stream)
            assert code == 1001 and reason == "idle for 0.5 s"
            assert time.monotonic() - started < 2
        with QuorumClient(cluster.bootstrap, protocol="binary") as client:
            client.put("idle", "one")
            time.sleep(0.8)  # the node closes the stream; the client opens another ...
            # ... before sending: a cas, never repeated, is not left with an unknown outcome.
            assert client.cas("idle", "one", "two").applied
    finally:
        cluster.stop()


def test_redirect_to_the_leader_and_failover_over_the_stream(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, 3)
    try:
        follower = cluster.follower()
        leader = cluster.leader()
        with QuorumClient([follower.address], protocol="binary", timeout_s=10) as client:
            assert client.put("failover", "one").applied  # NOT_LEADER, then the leader
            assert client._policy.preferred == leader.url
        with QuorumClient(cluster.bootstrap, protocol="binary", timeout_s=15) as client:
            assert client.get("failover") == "one"
            cluster.shut_down(leader)
            assert client.put("failover", "two").applied  # a new leader, elected meanwhile
            assert client.get("failover") == "two"
            assert client._policy.preferred != leader.url
    finally:
        cluster.stop()


# --- a node that misbehaves -----------------------------------------------------------------

class _MisbehavingStream:
    """A "node" whose stream hangs up on every request, answers each NOT_LEADER pointing at
    itself, or answers a get in fragments."""

    def __init__(self) -> None:
        self.mode = "hang-up"
        self.requests: list[int] = []
        self.server: Server = serve(self._serve, "127.0.0.1", 0, compression=None,
                                    subprotocols=[Subprotocol(wire.SUBPROTOCOL)])
        self.port = self.server.socket.getsockname()[1]

    def _serve(self, connection: ServerConnection) -> None:
        for message in connection:
            assert isinstance(message, bytes)
            correlation, op, _ = wire.decode_request_head(message)
            self.requests.append(op)
            if self.mode == "hang-up":
                connection.close()
                return
            if self.mode == "fragments":
                # A ping, then the answer in three frames: the client answers the ping and
                # puts the answer together.
                connection.ping()
                answer = wire.encode_response(correlation, Op.GET, ("fragmented", 7))
                connection.send([answer[:3], answer[3:9], answer[9:]])
                continue
            connection.send(wire.encode_error(correlation, wire.ErrorAnswer(
                "NOT_LEADER", "not the leader",
                leader=(1, f"http://127.0.0.1:{self.port}"))))


@pytest.fixture
def misbehaving() -> Iterator[_MisbehavingStream]:
    node = _MisbehavingStream()
    thread = threading.Thread(target=node.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield node
    finally:
        node.server.shutdown()
        thread.join(5)


def test_a_cas_or_append_cut_off_on_the_stream_is_never_repeated(
        misbehaving: _MisbehavingStream) -> None:
    with QuorumClient(f"127.0.0.1:{misbehaving.port}", timeout_s=0.3,
                      protocol="binary") as client:
        for write in (lambda: client.cas("k", None, "v"), lambda: client.append([b"r"])):
            with pytest.raises(QuorumClientError) as unknown:
                write()
            assert unknown.value.code == "OUTCOME_UNKNOWN"
        assert misbehaving.requests == [Op.CAS, Op.APPEND]  # one try each
        for idempotent in (lambda: client.get("k"), lambda: client.put("k", "v"),
                           lambda: client.delete("k")):
            with pytest.raises(QuorumClientError) as gave_up:
                idempotent()
            assert gave_up.value.code == "UNAVAILABLE"
        assert len(misbehaving.requests) > 2 + 3 * 2


def test_pings_and_fragmented_answers_are_handled(misbehaving: _MisbehavingStream) -> None:
    misbehaving.mode = "fragments"
    with QuorumClient(f"127.0.0.1:{misbehaving.port}", timeout_s=2, protocol="binary") as client:
        assert client.get("k", stale=True) == "fragmented"
        assert client.get("k", stale=True) == "fragmented"  # the same stream goes on
    assert misbehaving.requests == [Op.GET, Op.GET]


def test_a_redirect_loop_over_the_stream_is_given_up(misbehaving: _MisbehavingStream) -> None:
    misbehaving.mode = "loop"
    with pytest.raises(QuorumClientError) as failed, \
            QuorumClient(f"127.0.0.1:{misbehaving.port}", timeout_s=0.3,
                         protocol="binary") as client:
        client.cas("k", None, "v")
    assert failed.value.code == "UNAVAILABLE"
    assert "redirected more than 5 times" in str(failed.value)


class _NotFound(http.server.BaseHTTPRequestHandler):
    """An HTTP server without the stream (a node of an older version)."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = b'{"code": "NOT_FOUND", "message": "no such endpoint"}'
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_node_without_the_stream_is_said_so() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        with pytest.raises(QuorumClientError) as refused, \
                QuorumClient(f"127.0.0.1:{server.server_port}", protocol="binary") as client:
            client.get("k")
        assert refused.value.code == "UNSUPPORTED_PROTOCOL"
    finally:
        server.shutdown()
        server.server_close()


def test_open_streams_are_closed_when_the_node_shuts_down(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, 1)
    try:
        cluster.leader()
        with open_stream(cluster) as idle, open_stream(cluster) as polling:
            polling.send(wire.encode_request(1, Op.WATCH, 0, (True, "shutdown", 0, 30_000, 1)))
            started = time.monotonic()
            cluster.shut_down(*cluster.members.values())
            assert time.monotonic() - started < 5  # not held by the streams
            assert closed_with(idle) == (1001, "the node is shutting down")
            # The waiting watch is answered (or cut off) by the shutdown, not after 30 s.
            with pytest.raises(ConnectionClosed):
                while True:
                    polling.recv(timeout=5)
            assert time.monotonic() - started < 5
    finally:
        cluster.stop()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cli_load_puts_what_list_prints(single: Cluster, protocol: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--bootstrap-server", single.bootstrap, "--protocol", protocol]
    values = {f"load-{protocol}/{i:03}": f"value {i}" for i in range(150)}
    values[f"load-{protocol}/odd"] = "tab\there\nnewline \\ backslash\r"
    dump = tmp_path / "dump.tsv"
    lines = [f"{key}\t{_escaped(value)}" for key, value in sorted(values.items())]
    dump.write_text("\n".join(lines) + "\n")
    assert client_main([*common, "load", str(dump), "--window", "16"]) == 0
    out, _ = capsys.readouterr()
    assert out.startswith(f"OK {len(values)} keys (offsets ")
    assert client_main([*common, "list", f"load-{protocol}/", "--all", "--limit", "40"]) == 0
    out, _ = capsys.readouterr()
    assert out.splitlines() == lines  # what list prints, load puts back
    bad = tmp_path / "bad.tsv"
    bad.write_text("no tab here\n")
    assert client_main([*common, "load", str(bad)]) == 2
    _, err = capsys.readouterr()
    assert "line 1: expected KEY<TAB>VALUE" in err


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t") \
        .replace("\r", "\\r")
