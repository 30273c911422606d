"""Peer identity over SSL, and what a connection may hold.

A node's certificate speaks for its own node id only: a request naming another sender is refused
before the core sees it, and certificates that merely look like a node's (a name no node has,
two common names) are no peers. A reload of the TLS files closes the connections made under the
old ones. A peer stream cannot buffer more than the largest request, nor stall; a listener
holds at most max.connections connections, and a TLS handshake must end within the read
timeout. The audit log never shows a token passed in the query string.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import shutil
import socket
import ssl
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from certs import CertificateAuthority
from proc_cluster import FAST, ProcessCluster, free_port
from raw_clients import (
    binary_frame_head,
    open_raw_stream,
    rss_bytes,
    seconds_until_closed,
    send_until_refused,
)
from secured_cluster import InProcessCluster, Pki, secured_configs

from quorum_node.client import QuorumClient
from quorum_node.node.transport import (
    MAX_REQUEST_BYTES,
    REQUEST_TYPES,
    STREAM_PATH,
    PeerClient,
    PeerUnavailable,
    decode_frame,
    encode_frame,
)
from quorum_node.raft.messages import (
    BeginQuorumEpochRequest,
    RaftRequest,
    VoteRequest,
    VoteResponse,
)
from quorum_node.raft.requests import RequestFailure

_TAG = struct.Struct(">IB")
_RPC_INDEX = {cls: index for index, cls in enumerate(REQUEST_TYPES.values())}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    pki = Pki.create(directory, range(1, 4))
    # Names the old glob (quorum-node-*:peer) made peers: a name no node has, and two names in
    # one certificate (the first one counted).
    pki.certificates["quorum-node-x9"] = pki.ca.issue(directory, "quorum-node-x9")
    pki.certificates["two-peers"] = pki.ca.issue(
        directory / "two-peers", "quorum-node-2", more_common_names=("quorum-node-1",))
    pki.certificates["two-clients"] = pki.ca.issue(
        directory / "two-clients", "quorum-operator", more_common_names=("app-reader",))
    return pki


def wait_for_leader(cluster: InProcessCluster) -> None:
    deadline = time.monotonic() + 15
    while cluster.leader() is None:
        assert time.monotonic() < deadline, "no leader"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[InProcessCluster]:
    cluster = InProcessCluster(secured_configs(tmp_path_factory.mktemp("identity"), pki, 3))
    try:
        wait_for_leader(cluster)
        yield cluster
    finally:
        cluster.stop()


def context_of(pki: Pki, certificate: str) -> ssl.SSLContext:
    return pki.credentials(certificate=certificate).ssl_context()


def port_of(cluster: InProcessCluster, node_id: int) -> int:
    """The node's controller listener: where peers (and forgers) speak."""
    return cluster.nodes[node_id].config.controller_listener.port


def client_port_of(cluster: InProcessCluster, node_id: int) -> int:
    return cluster.nodes[node_id].config.client_listeners[0].port


def post(port: int, context: ssl.SSLContext, path: str, body: bytes = b"",
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    try:
        connection.request("POST", path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def state(cluster: InProcessCluster) -> dict[int, tuple[int, int | None]]:
    return {i: (node.core.epoch, node.core.leader_id) for i, node in cluster.nodes.items()}


def vote_as(cluster: InProcessCluster, replica_id: int, voter_id: int, *,
            epoch_ahead: int) -> VoteRequest:
    """A Vote from ``replica_id`` with an up-to-date log, ``epoch_ahead`` past the quorum's epoch:
    a voter would grant it and move to that epoch."""
    voter = cluster.nodes[voter_id]
    return VoteRequest(
        cluster_id=voter.config.cluster_id, voter_id=voter_id,
        voter_directory_id=voter.log_dir.meta.directory_id,
        replica_epoch=voter.core.epoch + epoch_ahead, replica_id=replica_id,
        replica_directory_id=cluster.nodes[replica_id].log_dir.meta.directory_id,
        last_offset_epoch=voter.core.epoch + epoch_ahead, last_offset=10**9)


async def stream_call(port: int, context: ssl.SSLContext, request: RaftRequest
                      ) -> tuple[int, bytes]:
    """One request over a peer stream: (status, body) of its answer (0: a frame, 1: an error)."""
    async with aiohttp.ClientSession() as session, session.ws_connect(
            f"https://127.0.0.1:{port}{STREAM_PATH}", ssl=context) as socket_:
        await socket_.send_bytes(_TAG.pack(7, _RPC_INDEX[type(request)]) + encode_frame(request))
        message = await socket_.receive(timeout=10)
        assert message.type is aiohttp.WSMsgType.BINARY, message
        correlation, status = _TAG.unpack_from(message.data)
        assert correlation == 7
        return status, message.data[_TAG.size:]


async def stream_status(port: int, context: ssl.SSLContext) -> int:
    """The HTTP status of opening a peer stream (101 once upgraded)."""
    async with aiohttp.ClientSession() as session:
        try:
            async with session.ws_connect(f"https://127.0.0.1:{port}{STREAM_PATH}",
                                          ssl=context) as socket_:
                await socket_.close()
                return 101
        except aiohttp.WSServerHandshakeError as error:
            return error.status


def test_a_node_certificate_speaks_only_as_its_node(cluster: InProcessCluster, pki: Pki,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    node_1 = context_of(pki, "quorum-node-1")
    before = state(cluster)
    caplog.set_level(logging.WARNING, logger="quorum_node.audit")
    # Node 1's certificate asks node 3 for its vote as node 2, over POST and over the stream.
    status, body = post(port_of(cluster, 3), node_1, "/raft/v1/Vote",
                        encode_frame(vote_as(cluster, 2, 3, epoch_ahead=5)))
    assert status == 403, body
    assert b"quorum-node-1 may speak as node 1 only, not as node 2" in body
    status, body = cluster.run(stream_call(port_of(cluster, 3), node_1,
                                           vote_as(cluster, 2, 3, epoch_ahead=5)))
    assert status == 1, body
    assert b"may speak as node 1 only, not as node 2" in body
    # Nor may it announce node 2 as a leader.
    begin = BeginQuorumEpochRequest(cluster_id=cluster.configs[0].cluster_id, leader_id=2,
                                    leader_epoch=before[3][0] + 5, voter_id=3)
    status, body = post(port_of(cluster, 3), node_1, "/raft/v1/BeginQuorumEpoch",
                        encode_frame(begin))
    assert status == 403, body
    status, body = cluster.run(stream_call(port_of(cluster, 3), node_1, begin))
    assert status == 1 and b"not as node 2" in body
    time.sleep(0.3)
    assert state(cluster) == before  # no epoch changed, the leader stayed
    assert any("denied status=403" in r.message and "/raft/v1/Vote" in r.message
               for r in caplog.records), caplog.text
    # The control: as itself (a stale epoch, so that nothing changes) it is answered.
    status, body = post(port_of(cluster, 3), node_1, "/raft/v1/Vote",
                        encode_frame(vote_as(cluster, 1, 3, epoch_ahead=-1)))
    assert status == 200, body
    status, body = cluster.run(stream_call(port_of(cluster, 3), node_1,
                                           vote_as(cluster, 1, 3, epoch_ahead=-1)))
    assert status == 0
    assert decode_frame(VoteResponse, body).vote_granted is False


def assert_closed_unanswered(cluster: InProcessCluster, context: ssl.SSLContext) -> None:
    """The controller listener closes a connection without a node's certificate once its
    handshake is done: neither a stream nor a POST gets an answer."""
    with pytest.raises((aiohttp.ClientError, OSError)):
        cluster.run(stream_status(port_of(cluster, 1), context))
    # Reset, or an EOF in the middle of TLS, as the close overtakes the request.
    with pytest.raises((ConnectionError, ssl.SSLEOFError)):
        post(port_of(cluster, 1), context, "/raft/v1/Vote",
             encode_frame(vote_as(cluster, 2, 1, epoch_ahead=5)))


@pytest.mark.parametrize("certificate", ["quorum-node-x9", "app-writer"])
def test_a_name_that_is_no_node_is_no_peer(cluster: InProcessCluster, pki: Pki,
                                           certificate: str) -> None:
    before = state(cluster)
    assert_closed_unanswered(cluster, context_of(pki, certificate))
    assert state(cluster) == before


def test_a_certificate_with_two_common_names_is_refused(cluster: InProcessCluster,
                                                        pki: Pki) -> None:
    before = state(cluster)
    assert_closed_unanswered(cluster, context_of(pki, "two-peers"))  # quorum-node-2, -1
    assert state(cluster) == before
    # As a client, too: quorum-operator (an administrator) and app-reader in one certificate.
    client = context_of(pki, "two-clients")
    status, body = post(client_port_of(cluster, 1), client, "/v1/kv/k/cas",
                        b'{"expected": null, "value": "x"}',
                        {"Content-Type": "application/json"})
    assert status == 401 and b"2 subject common names" in body, body


def test_tokens_in_the_query_string_are_not_logged(cluster: InProcessCluster, pki: Pki,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="quorum_node.audit")
    secret = "do-not-log-0123456789abcdef"
    context = pki.credentials().ssl_context()
    connection = http.client.HTTPSConnection("127.0.0.1", client_port_of(cluster, 1), timeout=10,
                                             context=context)
    connection.request("GET", f"/v1/quorum?access_token={secret}&x=1&client_secret={secret}"
                              f"&PASSWORD={secret}&api_token={secret}")
    assert connection.getresponse().status == 401
    connection.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "quorum_node.audit"]
    assert any("path=/v1/quorum?access_token=REDACTED&x=1&client_secret=REDACTED"
               "&PASSWORD=REDACTED&api_token=REDACTED " in line for line in lines), lines
    assert secret not in caplog.text


# --- raw connections ----------------------------------------------------------------------------


@pytest.fixture
def single(tmp_path: Path, pki: Pki, request: pytest.FixtureRequest
           ) -> Iterator[InProcessCluster]:
    """One secured node, with a CA bundle of its own (a test may replace it); overrides by
    ``@pytest.mark.parametrize("single", [{...}], indirect=True)``."""
    ca_path = shutil.copy(pki.ca_path, tmp_path / "ca.crt")
    overrides: dict[str, Any] = getattr(request, "param", {})
    configs = secured_configs(tmp_path, pki, 1, ssl_ca_location=Path(ca_path), **overrides)
    cluster = InProcessCluster(configs)
    try:
        wait_for_leader(cluster)
        yield cluster
    finally:
        cluster.stop()


def test_a_stream_message_over_the_limit_closes_the_stream(cluster: InProcessCluster,
                                                           pki: Pki) -> None:
    node_1 = context_of(pki, "quorum-node-1")
    # Within the limit, garbage is answered (an error frame) and the stream stays.
    connection = open_raw_stream(port_of(cluster, 2), node_1)
    connection.sendall(binary_frame_head(MAX_REQUEST_BYTES) + bytes(MAX_REQUEST_BYTES))
    connection.settimeout(10)
    assert connection.recv(2)[:1] == b"\x82"  # a binary answer
    connection.close()
    # One byte more and the stream is closed, before the message is read.
    connection = open_raw_stream(port_of(cluster, 2), node_1)
    connection.sendall(binary_frame_head(MAX_REQUEST_BYTES + 1))
    assert seconds_until_closed(connection, 5) is not None
    connection.close()


@pytest.mark.parametrize("single", [{"http_read_timeout_ms": 1000}], indirect=True)
def test_a_stream_that_stops_mid_message_is_closed(single: InProcessCluster, pki: Pki) -> None:
    connection = open_raw_stream(port_of(single, 1), context_of(pki, "quorum-node-2"))
    connection.sendall(binary_frame_head(60_000) + bytes(30_000))  # half a message, then nothing
    elapsed = seconds_until_closed(connection, 8)
    connection.close()
    assert elapsed is not None and elapsed < 3, elapsed


@pytest.mark.parametrize("single", [{"max_connections": 4}], indirect=True)
def test_connections_beyond_the_cap_are_closed_at_once(single: InProcessCluster,
                                                       pki: Pki) -> None:
    context = pki.credentials().ssl_context()

    def connect() -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", client_port_of(single, 1)), timeout=10)
        return context.wrap_socket(raw, server_hostname="127.0.0.1")

    held = [connect() for _ in range(4)]
    for connection in held:  # each is served
        connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert connection.recv(12) == b"HTTP/1.1 200"
    extra = connect()  # kept for a probe only: anything else closes it unanswered
    extra.sendall(b"GET /v1/kv/x HTTP/1.1\r\nHost: x\r\n\r\n")
    assert seconds_until_closed(extra, 2) is not None
    extra.close()
    held.pop().close()
    time.sleep(0.2)
    again = connect()  # room again
    again.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    again.settimeout(5)
    assert again.recv(12) == b"HTTP/1.1 200"
    for connection in [*held, again]:
        connection.close()


@pytest.mark.parametrize("single", [{"http_read_timeout_ms": 700}], indirect=True)
def test_a_client_that_never_speaks_tls_is_disconnected(single: InProcessCluster) -> None:
    raw = socket.create_connection(("127.0.0.1", port_of(single, 1)), timeout=10)
    elapsed = seconds_until_closed(raw, 10)  # asyncio's own handshake timeout is 60 s
    raw.close()
    assert elapsed is not None and 0.5 < elapsed < 3, elapsed


def test_a_ca_reload_closes_the_connections_made_under_the_old_one(
        single: InProcessCluster, pki: Pki, tmp_path: Path) -> None:
    node = single.nodes[1]
    port = port_of(single, 1)
    peer = open_raw_stream(port, context_of(pki, "quorum-node-2"))
    client = pki.credentials().ssl_context().wrap_socket(
        socket.create_connection(("127.0.0.1", client_port_of(single, 1)), timeout=10),
        server_hostname="127.0.0.1")
    client.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # a keep-alive connection
    assert client.recv(12) == b"HTTP/1.1 200"
    # The bundle now trusts another CA only.
    other = CertificateAuthority.create("another-quorum-ca")
    assert node.config.ssl_ca_location is not None
    reloads = node.security.tls.reloads if node.security.tls else 0
    other.write_ca(node.config.ssl_ca_location)
    assert seconds_until_closed(peer, 10) is not None
    assert seconds_until_closed(client, 5) is not None
    assert node.security.tls is not None and node.security.tls.reloads == reloads + 1
    # The peer of the old CA cannot come back.
    with pytest.raises((ssl.SSLError, ConnectionError, AssertionError)):
        open_raw_stream(port, context_of(pki, "quorum-node-2")).close()


def test_a_certificate_reload_closes_the_streams_both_ways(tmp_path: Path, pki: Pki,
                                                           caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    """Node 1's certificate is renewed: it closes the streams node 2 opened to it and those it
    opened to node 2, and the two talk again over new ones."""
    configs = secured_configs(tmp_path, pki, 2)
    cert, key = pki.ca.issue(tmp_path / "node-1-tls", "quorum-node-1")
    configs[0] = configs[0].model_copy(update={"ssl_certificate_location": cert,
                                               "ssl_key_location": key})
    cluster = InProcessCluster(configs)
    try:
        wait_for_leader(cluster)
        caplog.set_level(logging.INFO, logger="quorum_node.node.listener")
        node_1 = cluster.nodes[1]
        assert node_1.security.tls is not None
        reloads = node_1.security.tls.reloads
        # Both nodes have a stream open to the other: a leader and its follower talk both ways
        # (the follower's Fetch; the leader's BeginQuorumEpoch).
        streams_before = dict(node_1.peers._streams)
        assert streams_before, "node 1 has no stream to node 2"
        pki.ca.issue(tmp_path / "node-1-tls", "quorum-node-1")  # renewed in place
        deadline = time.monotonic() + 10
        while node_1.security.tls.reloads == reloads:
            assert time.monotonic() < deadline, "not reloaded"
            time.sleep(0.05)
        assert all(stream.closed for stream in streams_before.values())
        closed = [r.getMessage() for r in caplog.records if "TLS files reloaded" in r.getMessage()]
        assert closed and "closed 0 connection" not in closed[0], closed
        with QuorumClient(cluster.bootstrap, timeout_s=10,
                          credentials=pki.credentials(token="writer")) as client:
            client.put("after-renewal", "ok")  # committed by both again
    finally:
        cluster.stop()


def test_an_answer_larger_than_a_fetch_closes_the_stream() -> None:
    """The node's side of its own streams: a peer answering with more than a Fetch can hold
    (records and a header) is cut off, not buffered."""
    limit = 64 * 1024

    async def oversized_answers(request: web.Request) -> web.WebSocketResponse:
        socket_ = web.WebSocketResponse()
        await socket_.prepare(request)
        async for message in socket_:
            correlation, _ = _TAG.unpack_from(message.data)
            await socket_.send_bytes(_TAG.pack(correlation, 0) + bytes(limit))
        return socket_

    async def scenario() -> tuple[float, str]:
        app = web.Application()
        app.router.add_get(STREAM_PATH, oversized_answers)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        client = PeerClient({2: ("127.0.0.1", port)}, timeout_ms=5000,
                            max_response_bytes=limit - 1)
        start = time.monotonic()
        try:
            with pytest.raises(PeerUnavailable) as refused:
                await client.send(2, BeginQuorumEpochRequest(
                    cluster_id=None, leader_id=1, leader_epoch=1, voter_id=2))
            assert refused.value.failure is RequestFailure.UNANSWERED  # not the peer's end
            return time.monotonic() - start, str(refused.value)
        finally:
            await client.close()
            await runner.cleanup()

    elapsed, reason = asyncio.run(scenario())
    # The stream failed on the size (an ERROR message, naming it), at once; an answer within the
    # limit would have been read, and refused as a frame ("sent a bad response").
    assert "exceeds limit" in reason and elapsed < 2, (elapsed, reason)


# --- a node process under a flood of large stream messages -------------------------------------


def test_six_streams_of_near_limit_messages_do_not_grow_the_node(
        tmp_path: Path, pki: Pki, capsys: pytest.CaptureFixture[str]) -> None:
    """The attack that grew a node from 130 to 453 MiB: 6 streams, each holding 59 MiB of a
    60 MiB message. Each stream is now closed once its message outgrows a request."""

    def node_settings(_: int) -> dict[str, object]:
        cert, key = pki.certificates["quorum-node-1"]
        return {"ssl.certificate.location": cert, "ssl.key.location": key,
                "ssl.ca.location": pki.ca_path}

    cluster = ProcessCluster.create(tmp_path, 1, node_settings, tls=True, **FAST,
                                    http_read_timeout_ms=3000, max_connections=8)
    cluster.start_all()
    try:
        node = cluster.nodes[1]
        assert node.process is not None
        deadline = time.monotonic() + 20
        context = context_of(pki, "quorum-node-2")
        while True:
            try:
                open_raw_stream(node.peer_port, context).close()
                break
            except (OSError, AssertionError):
                assert time.monotonic() < deadline, cluster.logs()
                time.sleep(0.2)
        time.sleep(0.5)
        before = rss_bytes(node.process.pid)
        streams = [open_raw_stream(node.peer_port, context) for _ in range(6)]
        sent = []
        for stream in streams:
            stream.sendall(binary_frame_head(60 * 1024 * 1024))
            sent.append(send_until_refused(stream, 59 * 1024 * 1024))
        closed = [seconds_until_closed(stream, 5) for stream in streams]
        after = rss_bytes(node.process.pid)
        for stream in streams:
            stream.close()
        with capsys.disabled():
            print(f"\nnode RSS {before / 2**20:.1f} MiB before, {after / 2**20:.1f} MiB after "
                  f"6 streams of 60 MiB messages (MiB sent: {[round(s / 2**20) for s in sent]}; "
                  f"closed within: {[round(c, 2) if c is not None else c for c in closed]} s "
                  "after the last byte)")
        assert all(elapsed is not None for elapsed in closed)
        assert after - before < 32 * 2**20
        assert node.process.poll() is None
        # The process's own event loop (uvloop) bounds the TLS handshake and the connections too.
        silent = socket.create_connection(("127.0.0.1", node.peer_port), timeout=10)
        elapsed = seconds_until_closed(silent, 10)
        silent.close()
        assert elapsed is not None and 2.5 < elapsed < 6, elapsed
        held = [open_raw_stream(node.peer_port, context) for _ in range(8)]
        extra = socket.create_connection(("127.0.0.1", node.peer_port), timeout=10)
        with pytest.raises(OSError):  # closed before its handshake: it counts from its accept
            context.wrap_socket(extra, server_hostname="127.0.0.1")
        for connection in [*held, extra]:
            connection.close()
    finally:
        cluster.stop_all()

