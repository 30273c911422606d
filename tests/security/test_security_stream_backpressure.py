"""A client stream whose client never reads its answers, against a node process: the node stops
reading its requests once the unread answers pass http.stream.max.unsent.bytes, holds no more
than that (the process's memory stays where it was), cuts the stream after
http.stream.write.timeout.ms, and serves everyone else meanwhile. Plain, and over TLS with a
reader's token (what a read role can do)."""

from __future__ import annotations

import socket
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from proc_cluster import FAST, NodeProcess, ProcessCluster
from raw_clients import binary_frame, connect, rss_bytes, upgrade
from secured_cluster import Pki

from quorum_node import wire
from quorum_node.client import QuorumClient

VALUE = "v" * (1024 * 1024)  # the largest value a key may hold
WRITE_TIMEOUT_MS = 3000
# Requests sent at once without reading: unbounded, each held answer was a copy of VALUE.
GETS = 400


def stale_gets(count: int) -> bytes:
    """``count`` stale GETs of the big value, as binary frames: 26 bytes each."""
    return b"".join(binary_frame(wire.encode_request(i, wire.Op.GET, 0, ("big", True)))
                    for i in range(count))


def never_reading_stream(node: NodeProcess, context: ssl.SSLContext | None,
                         token: str | None) -> socket.socket:
    """A client stream with a small receive buffer, which the test never reads from."""
    connection = connect(node.port, context=context, receive_buffer=16 * 1024)
    headers = {"Sec-WebSocket-Protocol": wire.SUBPROTOCOL}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return upgrade(connection, node.port, wire.PATH, headers)


def peak_rss_while(pid: int, seconds: float) -> int:
    """The largest resident memory of ``pid`` seen over ``seconds``."""
    peak = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        peak = max(peak, rss_bytes(pid))
        time.sleep(0.05)
    return peak


def cut_after(connection: socket.socket, within_s: float) -> float | None:
    """Seconds until reading ``connection`` ends in the node's cut (after what the client's
    kernel buffered, if anything); None if it goes on for ``within_s``."""
    start = time.monotonic()
    connection.settimeout(0.2)
    while time.monotonic() - start < within_s:
        try:
            if not connection.recv(1 << 16):
                return time.monotonic() - start
        except TimeoutError:
            continue
        except (ConnectionError, ssl.SSLError, OSError):
            return time.monotonic() - start
    return None


def attack(node: NodeProcess, open_stream: Callable[[], socket.socket], *, gets: int,
           served: Callable[[], None], capsys: pytest.CaptureFixture[str], label: str) -> None:
    """Send ``gets`` stale GETs without reading; the node's memory stays flat, others are
    served meanwhile, and the stream is cut after the write timeout."""
    assert node.process is not None
    pid = node.process.pid
    before = peak_rss_while(pid, 0.5)
    stream = open_stream()
    stream.sendall(stale_gets(gets))
    during = peak_rss_while(pid, WRITE_TIMEOUT_MS / 1000 * 0.5)
    served()  # the stream's client reads nothing: everyone else is served all the same
    during = max(during, peak_rss_while(pid, WRITE_TIMEOUT_MS / 1000))
    # Past the write timeout, the client reads what its kernel buffered: then the cut.
    cut = cut_after(stream, 5)
    stream.close()
    after = peak_rss_while(pid, 0.5)
    with capsys.disabled():
        print(f"\n{label}: node RSS {before / 2**20:.0f} MiB before, {during / 2**20:.0f} MiB "
              f"at most while {gets} stale GETs of a 1 MiB value went unread, "
              f"{after / 2**20:.0f} MiB after; the stream was "
              f"{'not cut' if cut is None else 'cut past the write timeout'}")
    assert during - before < 48 * 2**20, (before, during)
    assert cut is not None, "the stream was never cut"
    assert node.process.poll() is None


@pytest.fixture
def plain(tmp_path: Path) -> Iterator[ProcessCluster]:
    cluster = ProcessCluster.create(tmp_path, 1, **FAST,
                                    http_stream_write_timeout_ms=WRITE_TIMEOUT_MS)
    cluster.start_all()
    try:
        cluster.wait_for_leader()
        yield cluster
    finally:
        cluster.stop_all()


def test_a_client_that_never_reads_holds_no_more_than_the_bound(
        plain: ProcessCluster, capsys: pytest.CaptureFixture[str]) -> None:
    node = plain.nodes[1]
    with QuorumClient(f"127.0.0.1:{node.port}", timeout_s=20) as client:
        client.put("big", VALUE)

        def served() -> None:
            assert client.get("big", stale=True) == VALUE

        attack(node, lambda: never_reading_stream(node, None, None), gets=GETS, served=served,
               capsys=capsys, label="PLAINTEXT")
        served()
    assert "closing a stream of 127.0.0.1: more than 1048576 bytes" in node.log_path.read_text()


def test_a_reader_over_tls_that_never_reads_holds_no_more_than_the_bound(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "pki").mkdir()
    pki = Pki.create(tmp_path / "pki", range(1, 2))

    cluster = ProcessCluster.create(tmp_path, 1, pki.node_settings, tls=True, **FAST,
                                    http_stream_write_timeout_ms=WRITE_TIMEOUT_MS)
    cluster.start_all()
    try:
        node = cluster.nodes[1]
        writer = QuorumClient(f"127.0.0.1:{node.port}", timeout_s=20,
                              credentials=pki.credentials(token="writer"))
        with writer:
            writer.put("big", VALUE)  # waits for the node to lead
        context = pki.credentials().ssl_context()

        def served() -> None:
            probe = urllib.request.urlopen(f"{node.url}/healthz", timeout=5, context=context)
            assert probe.status == 200

        attack(node, lambda: never_reading_stream(node, context, pki.tokens["reader"]),
               gets=GETS, served=served, capsys=capsys, label="SSL, reader token")
    finally:
        cluster.stop_all()


def test_answers_flow_again_once_the_client_reads(plain: ProcessCluster) -> None:
    """A slow client is no hostile one: one that reads late, within the write timeout, gets
    every answer, in its own time."""
    node = plain.nodes[1]
    with QuorumClient(f"127.0.0.1:{node.port}", timeout_s=20) as client:
        client.put("big", VALUE)
    stream = never_reading_stream(node, None, None)
    count = 40
    sending = threading.Thread(target=stream.sendall, args=(stale_gets(count),))
    sending.start()
    time.sleep(WRITE_TIMEOUT_MS / 1000 / 3)  # the node holds its answers back meanwhile
    answered: set[int] = set()
    buffered = b""
    stream.settimeout(10)
    while len(answered) < count:
        chunk = stream.recv(1 << 20)
        assert chunk, f"closed after {len(answered)} answers"
        buffered += chunk
        while len(buffered) >= 2:
            length = buffered[1] & 0x7F
            head = 2 + {126: 2, 127: 8}.get(length, 0)
            size = int.from_bytes(buffered[2:head], "big") if length >= 126 else length
            if len(buffered) < head or len(buffered) < head + size:
                break
            message, buffered = buffered[head:head + size], buffered[head + size:]
            correlation, status = wire.decode_response_head(message)
            assert status == wire.STATUS_OK
            value, _ = wire.decode_response_fields(wire.Op.GET, message)
            assert value == VALUE
            answered.add(correlation)
    sending.join(5)
    stream.close()
    assert answered == set(range(count))
