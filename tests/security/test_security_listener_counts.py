"""A listener's counts come back to nothing once its clients are gone, whichever way each went:
answered and closed, closed mid-request, refused at once, kept for a probe, a TLS handshake
failed, given up or never begun. A count left behind would keep its address out for good."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from raw_clients import closed_unanswered, connect, request
from secured_cluster import InProcessCluster, Pki, secured_configs

from quorum_node.node.listener import BoundedSite


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[InProcessCluster, Pki]]:
    pki = Pki.create(tmp_path, range(1, 2))
    cluster = InProcessCluster(secured_configs(tmp_path, pki, 1, http_read_timeout_ms=700,
                                               max_connections=6, max_connections_per_ip=3))
    try:
        yield cluster, pki
    finally:
        cluster.stop()


def sites(cluster: InProcessCluster) -> list[BoundedSite]:
    return list(cluster.nodes[1].listeners._sites)


def counts(site: BoundedSite) -> tuple[int, int, int, int, int]:
    return (site.open_connections, site._regular, site._reserved, len(site._by_address),
            len(site._reserved_by_address) + len(site._by_principal))


def test_every_way_of_leaving_gives_the_place_back(secured: tuple[InProcessCluster, Pki]
                                                   ) -> None:
    cluster, pki = secured
    node = cluster.nodes[1]
    port = node.config.client_listeners[0].port
    context = pki.credentials(token="reader").ssl_context()
    token = {"Authorization": f"Bearer {pki.tokens['reader']}"}
    left: list[socket.socket] = []
    for _ in range(2):  # twice: what the first round gave back, the second takes again
        answered = [connect(port, context=context) for _ in range(3)]
        for connection in answered:
            assert request(connection, "/v1/kv/k?stale=true", headers=token)[0] == 404
        probe = connect(port, context=context)  # over the address's share: a probe's place
        assert request(probe, "/healthz")[0] == 200
        idle = socket.create_connection(("127.0.0.1", port))  # the reserve's second place
        beyond = socket.create_connection(("127.0.0.1", port))  # none left: closed at once
        half = connect(port, source="127.0.0.2", context=context)
        half.sendall(b"GET /v1/kv/k HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        silent = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.3", 0))
        plain = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.4", 0))
        plain.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # no TLS: the handshake fails
        left += [*answered, probe, idle, beyond, half, silent, plain]
        time.sleep(0.2)
        assert any(counts(site)[0] for site in sites(cluster))
        for connection in left:
            connection.close()
        left.clear()
        deadline = time.monotonic() + 5  # the handshake timeout ends the silent one
        while any(any(counts(site)) for site in sites(cluster)):
            assert time.monotonic() < deadline, [counts(site) for site in sites(cluster)]
            time.sleep(0.05)
    # And everyone is served as at the start.
    with connect(port, context=context) as again:
        assert request(again, "/v1/kv/k?stale=true", headers=token)[0] == 404


def test_a_tls_reload_closes_connections_mid_handshake_too(
        secured: tuple[InProcessCluster, Pki]) -> None:
    cluster, _ = secured
    port = cluster.nodes[1].config.client_listeners[0].port
    silent = socket.create_connection(("127.0.0.1", port))  # a handshake not begun
    time.sleep(0.1)
    closed = cluster.run(_close_all(cluster))
    assert closed >= 1
    assert closed_unanswered(silent, 2)
    silent.close()
    assert not any(any(counts(site)) for site in sites(cluster))


async def _close_all(cluster: InProcessCluster) -> int:
    return sum(site.close_connections() for site in sites(cluster))

