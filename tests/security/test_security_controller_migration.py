"""Two controller listeners at once, as while a quorum moves its peers between PLAINTEXT and
SSL: each serves the peer RPCs with its own protocol's checks (the secret on the PLAINTEXT one,
the node's certificate on the SSL one), and a node connects to its peers on the first one."""

from __future__ import annotations

import http.client
import ssl
import time
from pathlib import Path

import pytest
from proc_cluster import free_port
from secured_cluster import FAST, InProcessCluster, Pki

from quorum_node.client import QuorumClient
from quorum_node.node.config import Listener, NodeConfig
from quorum_node.node.transport import REQUEST_TYPES
from quorum_node.raft.config import VoterEndpoint
from quorum_node.security.peer_secret import PEER_SECRET_HEADER
from quorum_node.storage.meta_properties import format_log_dir, random_cluster_id

SECRET = "the-secret-of-the-quorum"


def migrating_configs(directory: Path, pki: Pki, ssl_first: set[int]) -> list[NodeConfig]:
    """Three nodes serving peers on CONTROLLER (PLAINTEXT) and CONTROLLER_SSL; those in
    ``ssl_first`` connect to their peers over SSL, the others over PLAINTEXT."""
    secret = directory / "secret"
    secret.write_text(SECRET + "\n")
    cluster_id = random_cluster_id()
    ids = range(1, 4)
    client, plain, tls = ({i: free_port() for i in ids} for _ in range(3))

    def endpoints(ports: dict[int, int]) -> tuple[VoterEndpoint, ...]:
        return tuple(VoterEndpoint(id=i, host="127.0.0.1", port=ports[i]) for i in ids)

    configs = []
    for i in ids:
        cert, key = pki.certificates[f"quorum-node-{i}"]
        names = "CONTROLLER_SSL,CONTROLLER" if i in ssl_first else "CONTROLLER,CONTROLLER_SSL"
        config = NodeConfig(
            node_id=i, cluster_id=cluster_id, log_dir=directory / f"node-{i}",
            listeners=(Listener(name="CLIENT", host="127.0.0.1", port=client[i]),
                       Listener(name="CONTROLLER", host="127.0.0.1", port=plain[i]),
                       Listener(name="CONTROLLER_SSL", host="127.0.0.1", port=tls[i], tls=True)),
            controller_listener_names=names,
            voters=endpoints(tls if i in ssl_first else plain), client_endpoints=endpoints(client),
            ssl_certificate_location=cert, ssl_key_location=key, ssl_ca_location=pki.ca_path,
            controller_listener_secret_file=secret, quorum=FAST)
        format_log_dir(config.log_dir, cluster_id, i)
        configs.append(config)
    return configs


def post(port: int, context: ssl.SSLContext | None, headers: dict[str, str]) -> int:
    """A Vote POST without a body: refused before it is read, or 400 once it is."""
    connection = (http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
                  if context is not None else
                  http.client.HTTPConnection("127.0.0.1", port, timeout=10))
    try:
        connection.request("POST", f"/raft/v1/{next(iter(REQUEST_TYPES))}", body=b"",
                           headers=headers)
        return connection.getresponse().status
    finally:
        connection.close()


def test_a_quorum_half_way_between_plaintext_and_ssl_peers(tmp_path: Path) -> None:
    (tmp_path / "pki").mkdir()
    pki = Pki.create(tmp_path / "pki", range(1, 4))
    # Node 1 connects over SSL, nodes 2 and 3 over PLAINTEXT: the writes replicate whichever
    # node leads, and each listener lets in a peer by its own protocol's check only.
    cluster = InProcessCluster(migrating_configs(tmp_path, pki, ssl_first={1}))
    try:
        with QuorumClient(cluster.bootstrap, timeout_s=20) as client:
            for i in range(10):
                client.put(f"key-{i}", f"value-{i}")
        deadline = time.monotonic() + 10
        while len({node.log_dir.log.end_offset for node in cluster.nodes.values()}) > 1:
            assert time.monotonic() < deadline, "the nodes did not all replicate the writes"
            time.sleep(0.05)
        # The secret goes to the peers over PLAINTEXT only.
        assert cluster.nodes[1].security.current_peer_secret() is None
        assert cluster.nodes[2].security.current_peer_secret() == SECRET
        for node_id, node in cluster.nodes.items():
            plain, tls = node.config.listeners[1], node.config.listeners[2]
            # The PLAINTEXT one wants the secret, the SSL one a node's certificate.
            assert post(plain.port, None, {}) == 401
            assert post(plain.port, None, {PEER_SECRET_HEADER: SECRET}) == 400
            writer = pki.credentials(certificate="app-writer").ssl_context()
            with pytest.raises(ConnectionError):  # closed once its handshake is done
                post(tls.port, writer, {PEER_SECRET_HEADER: SECRET})
            peer = pki.credentials(certificate=f"quorum-node-{node_id % 3 + 1}").ssl_context()
            assert post(tls.port, peer, {}) == 400
    finally:
        cluster.stop()
