"""Kafka's own ``kafka-metadata-quorum`` against a secured quorum (SSL listeners, the quorum's
CA, bearer tokens and certificate roles), as a Kafka user configures it in ``--command-config``:
SASL_SSL with SASL/PLAIN whose password is a bearer token, and SSL with a client certificate
(mutual TLS); the admin role is required, Kafka's CLUSTER_AUTHORIZATION_FAILED otherwise.

Slow (a JVM per command); skips with one line without Java or Maven (``test_kafka_metadata_quorum``
fetches Kafka's tools)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from proc_cluster import ProcessCluster
from secured_cluster import Pki
from test_kafka_metadata_quorum import (
    kafka_lib,
    kafka_tool,
    quorum_admin,
    status_fields,
    wait_until_every_voter_is_heard,
)

pytestmark = pytest.mark.slow
__all__ = ["kafka_lib"]  # the fixture, shared


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[ProcessCluster, Pki]]:
    (tmp_path / "pki").mkdir()
    pki = Pki.create(tmp_path / "pki", range(1, 4))
    started = ProcessCluster.create(tmp_path, 3, node_settings=pki.node_settings, tls=True,
                                    proxied=False, controller_quorum_election_timeout_ms=500,
                                    controller_quorum_fetch_timeout_ms=1000)
    try:
        started.start_all()
        for node in started.nodes.values():  # every controller listener accepts connections
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", node.peer_port), timeout=1).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, started.logs()
                    time.sleep(0.05)
        yield started, pki
    finally:
        started.stop_all()


def command_config(path: Path, pki: Pki, *, token: str | None = None,
                   certificate: str | None = None) -> str:
    lines = ["ssl.truststore.type=PEM", f"ssl.truststore.location={pki.ca_path}"]
    if token is not None:
        lines += ["security.protocol=SASL_SSL", "sasl.mechanism=PLAIN",
                  "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule "
                  f'required username="{token}" password="{pki.tokens[token]}";']
    else:
        lines.append("security.protocol=SSL")
    if certificate is not None:
        cert, key = pki.certificates[certificate]
        keystore = path.with_suffix(".pem")
        keystore.write_bytes(key.read_bytes() + cert.read_bytes())
        lines += ["ssl.keystore.type=PEM", f"ssl.keystore.location={keystore}"]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_kafkas_tool_over_ssl_with_a_token_or_a_certificate(
        kafka_lib: Path, secured: tuple[ProcessCluster, Pki], tmp_path: Path) -> None:
    cluster, pki = secured
    bootstrap = ["--bootstrap-controller", f"127.0.0.1:{cluster.nodes[1].peer_port}"]
    admin = [*bootstrap, "--ca-file", str(pki.ca_path), "--token-file",
             str(pki.token_path("admin")), "--timeout", "30"]
    # Once a leader is elected (quorum-admin waits for one) and has heard from every voter.
    wait_until_every_voter_is_heard(*admin, logs=cluster.logs)
    ours = quorum_admin(*admin, "describe", "--status").stdout
    for name, config in {
        "SASL_SSL, the admin token": command_config(tmp_path / "admin.properties", pki,
                                                    token="admin"),
        "SSL, quorum-operator's certificate": command_config(
            tmp_path / "operator.properties", pki, certificate="quorum-operator"),
    }.items():
        kafka = kafka_tool(kafka_lib, *bootstrap, "--command-config", config, "describe",
                           "--status").stdout
        print(f"\n=== describe --status ({name})\n{kafka}")
        assert status_fields(kafka)["CurrentVoters"] == status_fields(ours)["CurrentVoters"]

    for name, config in {
        "SASL_SSL, a reader's token": command_config(tmp_path / "reader.properties", pki,
                                                     token="reader"),
        "SSL, no certificate": command_config(tmp_path / "none.properties", pki),
    }.items():
        refused = kafka_tool(kafka_lib, *bootstrap, "--command-config", config, "describe",
                             "--status", ok=False)
        print(f"\n=== describe --status ({name})\n{refused.stderr.splitlines()[0]}")
        assert refused.returncode == 1
        assert "ClusterAuthorizationException" in refused.stderr
