"""The secured variant of the multi-process tests: three node processes with TLS, mutual TLS
between them (through the fault proxies) and tokens. With credentials everything works (writes
across a leader kill -9, reads, describe, a disk replacement with the admin token); without,
or with the wrong role, nothing changes; every replica ends the same."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from proc_cluster import FAST, ProcessCluster
from secured_cluster import Pki

from quorum_node.cli.admin import Access, AdminError, fetch_quorum
from quorum_node.cli.admin import main as admin_main
from quorum_node.client import QuorumClient, QuorumClientError
from quorum_node.storage.kafka_uuid import to_kafka_string
from quorum_node.storage.meta_properties import format_log_dir


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[ProcessCluster, Pki]]:
    (tmp_path / "pki").mkdir()
    pki = Pki.create(tmp_path / "pki", range(1, 4))

    cluster = ProcessCluster.create(tmp_path, 3, pki.node_settings, tls=True, **FAST)
    cluster.start_all()
    try:
        yield cluster, pki
    finally:
        cluster.stop_all()


def describe(cluster: ProcessCluster, pki: Pki) -> dict[str, Any]:
    """DescribeQuorum with the admin token, once the nodes listen and have a leader."""
    servers = [("127.0.0.1", node.port) for node in cluster.nodes.values()]
    deadline = time.monotonic() + 20
    while True:
        try:
            return fetch_quorum(servers, 5, Access(pki.credentials(token="admin"), "https"))
        except AdminError:
            if time.monotonic() > deadline:
                raise AssertionError(cluster.logs()) from None
            time.sleep(0.1)


def test_a_secured_quorum_of_processes(secured: tuple[ProcessCluster, Pki],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    cluster, pki = secured
    bootstrap = [node.url for node in cluster.nodes.values()]
    quorum = describe(cluster, pki)
    leader = quorum["leader_id"]
    assert isinstance(leader, int)

    acknowledged: list[str] = []
    with QuorumClient(bootstrap, timeout_s=20, credentials=pki.credentials(token="writer")) as c:
        for i in range(20):
            c.put(f"k{i}", f"v{i}")
            acknowledged.append(f"k{i}")
        cluster.kill(leader)  # kill -9: the others elect a leader over mutual TLS
        for i in range(20, 40):
            c.put(f"k{i}", f"v{i}")
            acknowledged.append(f"k{i}")
    cluster.start(leader)

    # Without a credential, or with a reader's, nothing can be written.
    for credentials in (pki.credentials(), pki.credentials(token="reader")):
        with QuorumClient(bootstrap, timeout_s=5, credentials=credentials) as stranger, \
                pytest.raises(QuorumClientError) as refused:
            stranger.put("k0", "overwritten")
        assert refused.value.code in ("UNAUTHENTICATED", "FORBIDDEN")

    # KIP-856 disk replacement: node 3 comes back on a new disk; the writer may not change
    # the voters, the admin adds the new directory and removes the old one.
    old = {v["id"]: v["directory_id"] for v in describe(cluster, pki)["voters"]}[3]
    cluster.kill(3)
    log_dir = cluster.directory / "node-3"
    shutil.rmtree(log_dir)
    new = to_kafka_string(format_log_dir(log_dir, cluster.cluster_id, 3).directory_id)
    cluster.start(3)
    deadline = time.monotonic() + 20
    while not any(o["directory_id"] == new for o in describe(cluster, pki)["observers"]):
        assert time.monotonic() < deadline, "the new disk does not fetch"
        time.sleep(0.1)
    common = ["--bootstrap-server", ",".join(n.url for n in cluster.nodes.values()),
              "--timeout", "30", "--ca-file", str(pki.ca_path)]
    assert admin_main([*common, "--token-file", str(pki.token_path("writer")), "add-voter",
                       "--id", "3", "--uuid", new]) == 1
    assert "FORBIDDEN" in capsys.readouterr().err
    admin = ["--token-file", str(pki.token_path("admin"))]
    assert admin_main([*common, *admin, "add-voter", "--id", "3", "--uuid", new]) == 0, \
        capsys.readouterr().err
    assert admin_main([*common, *admin, "remove-voter", "--id", "3", "--uuid", str(old)]) == 0, \
        capsys.readouterr().err
    assert {v["id"]: v["directory_id"] for v in describe(cluster, pki)["voters"]}[3] == new

    # Every acknowledged write is there, on every replica once it has caught up.
    with QuorumClient(bootstrap, timeout_s=20, credentials=pki.credentials(token="reader")) as r:
        assert [r.get(key) for key in acknowledged] == [f"v{key[1:]}" for key in acknowledged]
    deadline = time.monotonic() + 20
    while True:
        contents = []
        for node in cluster.nodes.values():
            with QuorumClient([node.url], timeout_s=5,
                              credentials=pki.credentials(token="reader")) as one:
                contents.append(json.dumps([one.get(k, stale=True) for k in acknowledged]))
        if len(set(contents)) == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(set(contents)) == 1, cluster.logs()
    assert "overwritten" not in contents[0]
