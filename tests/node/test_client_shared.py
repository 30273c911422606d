"""One QuorumClient shared by many threads, as a gRPC channel is, against real in-process nodes:
each thread gets its own answers over one stream per node (or the HTTP pool), one thread's
given-up request leaves the stream to the others, the reading passes from thread to thread, and
a stream that ends wakes every thread waiting on it. ``shared_client_workout`` is also run over
TLS (tests/security/test_security_tls_auth.py)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from test_client_api import Cluster
from websockets.http11 import Request
from websockets.server import ServerProtocol
from websockets.sync.server import Server, ServerConnection, serve
from websockets.typing import Subprotocol

from quorum_node import wire
from quorum_node.client import QuorumClient
from quorum_node.client_stream import ClientStream, StreamBroken
from quorum_node.wire import Op


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("shared-single"), 1)
    try:
        cluster.leader()
        yield cluster
    finally:
        cluster.stop()


def in_threads(count: int, work: Callable[[int], None]) -> list[BaseException]:
    """Run ``work(0)`` .. ``work(count - 1)`` at once, each in its thread; what they raised."""
    failures: list[BaseException] = []
    start = threading.Barrier(count)

    def run(index: int) -> None:
        try:
            start.wait(10)
            work(index)
        except BaseException as failure:  # reported by the test
            failures.append(failure)

    pool = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(60)
    assert not any(thread.is_alive() for thread in pool), "a thread hung"
    return failures


def shared_client_workout(client: QuorumClient, tag: str, *, threads: int = 16,
                          rounds: int = 8) -> None:
    """Every call of the key-value API from ``threads`` threads at once on ``client``: each
    thread checks that every answer is its own."""

    def work(index: int) -> None:
        own = f"{tag}/{index}"
        for n in range(rounds):
            value = f"{index}-{n}"
            assert client.put(own, value).key == own
            assert client.get(own) == value
            assert client.cas(own, value, value + "+").applied
            swapped = client.txn(compare=[{"key": own, "target": "value", "result": "=",
                                           "value": value + "+"}],
                                 success=[{"op": "get", "key": own},
                                          {"op": "put", "key": own + "/t", "value": value}])
            assert swapped.succeeded and swapped.responses[0]["value"] == value + "+"
            written = client.put_many([(f"{own}/m{i}", f"{value}.{i}") for i in range(5)])
            assert [w.key for w in written] == [f"{own}/m{i}" for i in range(5)]
            page = client.list_keys(own + "/").entries
            assert page == [(own + "/m" + str(i), f"{value}.{i}") for i in range(5)] \
                + [(own + "/t", value)]
            assert client.delete(own + "/t").applied

    failures = in_threads(threads, work)
    assert not failures, failures[:3]


def established_to(port: int) -> int:
    """The connections open to ``port`` on this machine's loopback (the nodes are in-process)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                local, state = line.split()[1], line.split()[3]
                if int(local.rsplit(":", 1)[1], 16) == port and state == "01":
                    count += 1
    return count


@pytest.mark.parametrize("protocol", ["binary", "http"])
def test_threads_sharing_a_client_get_their_own_answers(single: Cluster, protocol: str) -> None:
    address = single.leader().address
    port = int(address.rsplit(":", 1)[1])
    before = established_to(port)
    with QuorumClient(address, timeout_s=10, protocol=protocol) as client:
        shared_client_workout(client, f"shared-{protocol}")
        opened = established_to(port) - before
    if protocol == "binary":
        assert opened == 1  # one stream carried every thread's calls
    else:
        assert 1 <= opened <= 16  # one keep-alive connection per thread calling at once


def test_a_request_given_up_leaves_the_stream_to_the_others(single: Cluster) -> None:
    stream = ClientStream.open(f"http://{single.leader().address}", headers={},
                               ssl_context=None, timeout_s=5)
    try:
        watch = stream.send(Op.WATCH, 0, (True, "given-up", 1 << 40, 10_000, 10))
        with pytest.raises(StreamBroken, match="no answer in time"):
            stream.wait(watch, 0.2)
        assert not stream.ended and stream.usable
        put = stream.send(Op.PUT, 5_000, ("given-up/other", "v"))
        assert not isinstance(stream.wait(put, 5), wire.ErrorAnswer)
        assert stream.in_flight == 0
    finally:
        stream.close()


def test_the_reading_passes_to_a_thread_still_waiting(single: Cluster) -> None:
    """The thread reading for the others gets its answer first and leaves; the next one waiting
    must read on, or its answer would never be taken off the socket."""
    address = single.leader().address
    with QuorumClient(address, timeout_s=10) as writer, QuorumClient(address,
                                                                     timeout_s=10) as shared:
        offset = writer.put("handover/start", "x").offset
        answers: dict[str, float] = {}

        def watch(key: str) -> None:
            shared.watch(offset, key=key, wait_ms=8_000)
            answers[key] = time.monotonic()

        first = threading.Thread(target=watch, args=("handover/first",))
        first.start()
        time.sleep(0.3)  # the first watch waits, reading for the stream
        second = threading.Thread(target=watch, args=("handover/second",))
        second.start()
        time.sleep(0.3)
        writer.put("handover/first", "1")
        first.join(5)
        assert "handover/first" in answers
        time.sleep(0.2)
        written = time.monotonic()
        writer.put("handover/second", "2")
        second.join(5)
        assert answers["handover/second"] - written < 2.0  # not its own time out


class _SilentNode:
    """A "node" that accepts the stream, reads requests, never answers, and hangs up when told."""

    def __init__(self) -> None:
        self.received = threading.Semaphore(0)
        self.hang_up = threading.Event()
        self.server: Server = serve(self._serve, "127.0.0.1", 0, compression=None,
                                    subprotocols=[Subprotocol(wire.SUBPROTOCOL)])
        self.port = self.server.socket.getsockname()[1]

    def _serve(self, connection: ServerConnection) -> None:
        while not self.hang_up.is_set():
            try:
                connection.recv(timeout=0.05)
            except TimeoutError:
                continue
            except Exception:  # the client went away
                return
            self.received.release()
        connection.close()


@pytest.fixture
def silent() -> Iterator[_SilentNode]:
    node = _SilentNode()
    thread = threading.Thread(target=node.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield node
    finally:
        node.hang_up.set()
        node.server.shutdown()
        thread.join(5)


def test_a_stream_that_ends_wakes_every_waiting_thread(silent: _SilentNode) -> None:
    stream = ClientStream.open(f"http://127.0.0.1:{silent.port}", headers={},
                               ssl_context=None, timeout_s=5)
    ended_after: list[float] = []

    def wait_for_an_answer(index: int) -> None:
        correlation = stream.send(Op.GET, 0, (f"k{index}", True))
        with pytest.raises(StreamBroken, match="closed"):
            stream.wait(correlation, 30)
        ended_after.append(time.monotonic() - hung_up_at[0])

    hung_up_at = [float("inf")]
    failures: list[BaseException] = []
    waiting = threading.Thread(
        target=lambda: failures.extend(in_threads(8, wait_for_an_answer)), daemon=True)
    waiting.start()
    for _ in range(8):
        assert silent.received.acquire(timeout=5)
    hung_up_at[0] = time.monotonic()
    silent.hang_up.set()
    waiting.join(10)
    assert not failures, failures[:3]
    assert len(ended_after) == 8 and max(ended_after) < 2.0
    assert stream.ended and not stream.usable
    stream.close()


class _DeafNode:
    """A "node" that accepts one stream and then reads nothing more: not even a close."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        connection, _ = self.listener.accept()
        self.connections.append(connection)
        protocol = ServerProtocol(subprotocols=[Subprotocol(wire.SUBPROTOCOL)])
        while not (requests := [e for e in protocol.events_received() if isinstance(e, Request)]):
            protocol.receive_data(connection.recv(65536))
        protocol.send_response(protocol.accept(requests[0]))
        for data in protocol.data_to_send():
            connection.sendall(data)

    def close(self) -> None:
        for connection in self.connections:
            connection.close()
        self.listener.close()


def test_closing_a_stream_wakes_the_thread_reading_it() -> None:
    deaf = _DeafNode()
    stream = ClientStream.open(f"http://127.0.0.1:{deaf.port}", headers={},
                               ssl_context=None, timeout_s=5)
    woke: list[BaseException] = []

    def wait_for_an_answer() -> None:
        correlation = stream.send(Op.GET, 0, ("k", True))
        try:
            stream.wait(correlation, 30)
        except StreamBroken as broken:
            woke.append(broken)

    try:
        reader = threading.Thread(target=wait_for_an_answer, daemon=True)
        reader.start()
        time.sleep(0.3)  # the thread is reading, in a poll of the socket
        closed_at = time.monotonic()
        stream.close()  # the node never answers the close: only the client can end the poll
        reader.join(5)
        assert woke and "closed" in str(woke[0])
        assert time.monotonic() - closed_at < 2.0
    finally:
        deaf.close()
