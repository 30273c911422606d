"""What one client can hold of a node process's listeners: at most max.connections.per.ip of
them from one address and max.connections.per.principal of one credential, so it cannot lock
the others out; the probes are answered even when a client listener is full (its reserve); and a
controller listener keeps no connection that has not shown a peer's credential: a refused first
request closes it (the secret), and over SSL one without a node's certificate is closed as soon
as its handshake is done. A voter restarted while a client holds all it can of the leader's
controller listener rejoins."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from proc_cluster import FAST, ProcessCluster
from raw_clients import closed_unanswered, connect, request, seconds_until_closed, upgrade
from secured_cluster import Pki

from quorum_node.client import QuorumClient
from quorum_node.node.listener import PROBE_RESERVE_PER_ADDRESS
from quorum_node.node.transport import STREAM_PATH
from quorum_node.security.peer_secret import PEER_SECRET_HEADER

PER_IP = 4
TOTAL = 12


def wait_ready(port: int, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with connect(port) as connection:
                if request(connection, "/readyz")[0] == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"port {port} never ready"
        time.sleep(0.1)


def held(port: int, source: str, count: int, path: str = "/healthz",
         headers: dict[str, str] | None = None) -> list[socket.socket]:
    """``count`` kept-alive connections from ``source``, each answered once."""
    connections = []
    for _ in range(count):
        connection = connect(port, source=source)
        status, body = request(connection, path, headers=headers)
        assert status < 500, (status, body)
        connections.append(connection)
    return connections


@pytest.fixture
def node(tmp_path: Path) -> Iterator[ProcessCluster]:
    tokens = tmp_path / "tokens"
    tokens.write_text("token-of-the-app-0123456789 app read\n"
                      "token-of-another-app-012345 other read\n")
    cluster = ProcessCluster.create(tmp_path, 1, **FAST, max_connections=TOTAL,
                                    max_connections_per_ip=PER_IP,
                                    max_connections_per_principal=3,
                                    node_settings=lambda _: {"auth.token.file": tokens})
    cluster.start_all()
    try:
        wait_ready(cluster.nodes[1].port)
        yield cluster
    finally:
        cluster.stop_all()


def test_one_address_holds_its_share_and_no_more(node: ProcessCluster) -> None:
    port = node.nodes[1].port
    mine = held(port, "127.0.0.2", PER_IP)
    # Beyond its share, a connection of that address is kept for a probe only.
    extra = connect(port, source="127.0.0.2")
    extra.sendall(b"GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n")
    assert closed_unanswered(extra)
    probe = connect(port, source="127.0.0.2")
    assert request(probe, "/healthz")[0] == 200
    assert closed_unanswered(probe)  # one probe, then closed
    # Another address is served as ever, and so is the first once it lets one go.
    other = held(port, "127.0.0.3", 1, "/v1/openapi.json")
    mine.pop().close()
    time.sleep(0.2)
    mine += held(port, "127.0.0.2", 1, "/v1/openapi.json")
    for connection in [*mine, *other, extra, probe]:
        connection.close()
    log = node.nodes[1].log_path.read_text()
    assert ("keeping a connection for one probe only (max.connections.per.ip): 4 open from "
            "127.0.0.2") in log, log


def test_the_probes_are_answered_while_the_listener_is_full(node: ProcessCluster) -> None:
    port = node.nodes[1].port
    full = [c for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4")
            for c in held(port, source, PER_IP)]
    assert len(full) == TOTAL
    kubelet = "127.0.0.9"
    probes = [connect(port, source=kubelet) for _ in range(PROBE_RESERVE_PER_ADDRESS)]
    # The reserve holds so many of one address at once: the next is closed at once.
    beyond = connect(port, source=kubelet)
    assert closed_unanswered(beyond)
    for connection, path in zip(probes, ("/healthz", "/readyz"), strict=True):
        assert request(connection, path)[0] == 200
        assert closed_unanswered(connection)
    # Anything but a probe closes a reserved connection unanswered.
    sneaky = connect(port, source=kubelet)
    sneaky.sendall(b"GET /v1/kv/k?stale=true HTTP/1.1\r\nHost: x\r\n\r\n")
    assert closed_unanswered(sneaky)
    for connection in [*full, beyond, sneaky]:
        connection.close()


def test_one_credential_holds_its_share_and_no_more(node: ProcessCluster) -> None:
    port = node.nodes[1].port
    app = {"Authorization": "Bearer token-of-the-app-0123456789"}
    # From three addresses, so that the address bound is not the one that counts.
    mine = [c for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4")
            for c in held(port, source, 1, "/v1/kv/k?stale=true", app)]
    extra = connect(port, source="127.0.0.5")
    extra.sendall(b"GET /v1/kv/k?stale=true HTTP/1.1\r\nHost: x\r\n"
                  b"Authorization: Bearer token-of-the-app-0123456789\r\n\r\n")
    assert closed_unanswered(extra)
    # Another principal, and requests that need no credential, are not counted as the app's.
    other = held(port, "127.0.0.5", 1, "/v1/kv/k?stale=true",
                 {"Authorization": "Bearer token-of-another-app-012345"})
    anonymous = held(port, "127.0.0.6", 1, "/healthz")
    for connection in [*mine, extra, *other, *anonymous]:
        connection.close()
    log = node.nodes[1].log_path.read_text()
    assert "closing a connection (max.connections.per.principal): 3 open of app" in log, log


def test_a_refused_request_closes_its_controller_connection(node: ProcessCluster) -> None:
    peer_port = node.nodes[1].peer_port
    for path, headers in [(STREAM_PATH, {}), (STREAM_PATH, {PEER_SECRET_HEADER: "x" * 20}),
                          ("/healthz", {})]:
        connection = connect(peer_port)
        status, _ = request(connection, path, headers=headers)
        assert status in (401, 421), (path, status)
        assert closed_unanswered(connection, 2), path  # not kept alive for another try
        connection.close()
    # With the secret, the connection is kept.
    connection = upgrade(connect(peer_port), peer_port, STREAM_PATH,
                         {PEER_SECRET_HEADER: node.peer_secret})
    assert not closed_unanswered(connection, 1)
    connection.close()


def test_an_ssl_controller_listener_closes_a_connection_without_a_node_certificate(
        tmp_path: Path) -> None:
    (tmp_path / "pki").mkdir()
    pki = Pki.create(tmp_path / "pki", range(1, 2))

    cluster = ProcessCluster.create(tmp_path, 1, lambda i: pki.node_settings(i, clients=False),
                                    tls=True, **FAST)
    cluster.start_all()
    try:
        node = cluster.nodes[1]
        deadline = time.monotonic() + 20
        while True:
            try:
                connect(node.peer_port, context=pki.credentials(
                    certificate="quorum-node-1").ssl_context()).close()
                break
            except OSError:
                assert time.monotonic() < deadline, cluster.logs()
                time.sleep(0.1)
        for certificate in (None, "app-reader"):
            connection = connect(node.peer_port, context=pki.credentials(
                certificate=certificate).ssl_context())
            elapsed = seconds_until_closed(connection, 5)  # without sending a byte
            connection.close()
            assert elapsed is not None and elapsed < 1, (certificate, elapsed)
        peer = connect(node.peer_port, context=pki.credentials(
            certificate="quorum-node-1").ssl_context())
        assert seconds_until_closed(peer, 1) is None  # a node's certificate: kept
        peer.close()
        log = node.log_path.read_text()
        assert "closing a connection (admission): no node certificate" in log, log
    finally:
        cluster.stop_all()


def test_a_voter_rejoins_while_a_client_holds_what_it_can_of_the_controller_listener(
        tmp_path: Path) -> None:
    cluster = ProcessCluster.create(tmp_path, 3, **FAST, max_connections=TOTAL,
                                    max_connections_per_ip=PER_IP)
    cluster.start_all()
    holders: list[socket.socket] = []
    try:
        cluster.wait_all_serving()
        leader = cluster.wait_for_leader()
        follower = next(i for i in cluster.nodes if i != leader)
        cluster.kill(follower)
        # Every connection the listener would take, each with an unanswered keep-alive
        # request or none: most are closed at once, the rest once refused.
        for _ in range(TOTAL * 2):
            try:
                connection = connect(cluster.nodes[leader].peer_port, source="127.0.0.2")
                connection.sendall(f"GET {STREAM_PATH} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
                                   if len(holders) % 2 else b"")
                holders.append(connection)
            except OSError:
                pass
        time.sleep(0.5)
        cluster.start(follower)
        started = time.monotonic()
        with QuorumClient(",".join(f"127.0.0.1:{n.port}" for n in cluster.nodes.values()),
                          timeout_s=20) as client:
            client.put("after", "restart")
        deadline = time.monotonic() + 20
        while not _caught_up(cluster.nodes[follower].port):
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.1)
        print(f"\nvoter {follower} caught up {time.monotonic() - started:.1f} s after its "
              f"restart, {len(holders)} connections tried against leader {leader}'s controller "
              "listener from one address")
    finally:
        for connection in holders:
            connection.close()
        cluster.stop_all()


def _caught_up(port: int) -> bool:
    """Whether the node at ``port`` has the write made after its restart."""
    try:
        with connect(port) as connection:
            status, body = request(connection, "/v1/kv/after?stale=true")
            return status == 200 and b"restart" in body
    except OSError:
        return False

