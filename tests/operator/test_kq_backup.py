"""Backups in the operator's harness (real node processes, moto's S3 server on loopback):
scheduled backups of a secured quorum under writes, taken from a caught-up follower, with
status, Events and retention; then a second KafkaQuorum bootstrapped from the last backup serves
every key acknowledged before it."""

from __future__ import annotations

import base64
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kafka_quorum_operator import API_VERSION, KIND
from kafka_quorum_operator import resources as r
from kafka_quorum_operator.backups import (
    apply_retention,
    backup_source,
    export_last_backup,
    restore_init_container,
)
from kafka_quorum_operator.kube import path
from kafka_quorum_operator.reconcile import CR_API
from kafka_quorum_operator.spec import Bootstrap, parse_spec
from kq_builders import healthy, quorum, row
from kq_cluster import NAME, Cluster, Writer
from kq_harness import NAMESPACE, condition, cr_path, quorum_object
from prometheus_client import REGISTRY
from test_kq_manifests import K8S_VERSION, schema_errors

from quorum_node.backup.manifest import MANIFEST_NAME
from quorum_node.backup.store import LocalStore, S3Options, open_store, s3_client
from quorum_node.client import QuorumClient

pytestmark = pytest.mark.timeout(360)

BUCKET = "kq-backups"
SECRET = "s3-credentials"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "kq-test", "AWS_SECRET_ACCESS_KEY": "kq-test-secret"}


@pytest.fixture
def s3_endpoint() -> Iterator[str]:
    server_module = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    port = free_port()
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        options = S3Options(endpoint_url=endpoint, access_key_id="kq-test",
                            secret_access_key="kq-test-secret")
        s3_client(options).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        server.stop()


# --- the parts -------------------------------------------------------------------------------


def test_the_source_is_a_caught_up_follower() -> None:
    assert backup_source(healthy()) == 2  # the leader is 1
    lagging = healthy(quorum=quorum([row(1), row(2, lag=5), row(3)]))
    assert backup_source(lagging) == 3
    # Caught up a moment ago (a write under way): still a source, the least lag first.
    recent = healthy(quorum=quorum([row(1), row(2, lag=3, caught_up_ago_ms=100),
                                    row(3, lag=2, caught_up_ago_ms=100)]))
    assert backup_source(recent) == 3
    behind = quorum([row(1), row(2, lag=1, caught_up_ago_ms=60_000),
                     row(3, lag=2, caught_up_ago_ms=60_000)])
    assert backup_source(healthy(quorum=behind)) is None
    assert backup_source(healthy(ids=(1,))) == 1  # one voter: the leader is all there is
    assert backup_source(healthy(quorum=None)) is None


def test_the_last_backup_gauge_is_read_from_status() -> None:
    """After an operator restart too (the chart's KafkaQuorumBackupTooOld alert reads it); gone
    with spec.backup."""
    owner = r.Owner("kq", "gauge-test", "uid")
    labels = {"namespace": "gauge-test", "name": "kq"}
    backed_up = parse_spec({"replicas": 3, "backup": {"target": {"bucket": "b"}}})

    def gauge() -> float | None:
        return REGISTRY.get_sample_value("kafka_quorum_operator_last_backup_timestamp_seconds",
                                         labels)

    export_last_backup(owner, backed_up, {})
    assert gauge() is None  # never backed up: nothing to be old
    export_last_backup(owner, backed_up, {"backup": {"lastTime": "2026-01-02T03:04:05Z"}})
    assert gauge() == 1767323045.0
    export_last_backup(owner, parse_spec({"replicas": 3}), {
        "backup": {"lastTime": "2026-01-02T03:04:05Z"}})
    assert gauge() is None


def test_retention_keeps_the_newest_complete_backups(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    names = ["20260101T000000Z-node-2", "20260101T010000Z-node-3",
             "20260101T020000Z-node-2", "20260101T030000Z-node-2", "20260101T040000Z-node-3"]
    for index, name in enumerate(names):
        store.child(name).write_bytes("meta.properties", b"x")
        if index != 2:  # an upload that failed before its manifest
            store.child(name).write_bytes(MANIFEST_NAME, b"{}")
    assert apply_retention(store, 2) == names[:3]
    assert store.children() == names[3:]
    assert apply_retention(store, 2) == []


def test_a_quorum_from_a_backup_restores_each_pod_with_the_chosen_ids() -> None:
    spec = parse_spec({"bootstrap": {"fromBackup": {
        "location": "s3://b/fleet/C/20260101T000000Z-node-2", "endpoint": "http://s3:9000",
        "credentialsSecret": SECRET}}})
    assert spec.bootstrap == Bootstrap("s3://b/fleet/C/20260101T000000Z-node-2",
                                       "http://s3:9000", None, SECRET)
    restore = {"location": spec.bootstrap.from_backup,
               "directoryIds": {"1": "A" * 22, "2": "B" * 22, "3": "C" * 22}}
    container = restore_init_container(spec, restore, 2)
    assert container is not None
    command = container["command"]
    assert command[:2] == ["quorum-node", "restore"]
    assert command[command.index("--voters") + 1] == f"1:{'A' * 22},2:{'B' * 22},3:{'C' * 22}"
    assert command[command.index("--node-id") + 1] == "2"
    assert "--skip-formatted" in command and "http://s3:9000" in command
    assert container["envFrom"] == [{"secretRef": {"name": SECRET}}]
    assert restore_init_container(spec, restore, 4) is None  # no id chosen for it
    assert restore_init_container(parse_spec({}), restore, 2) is None
    owner = r.Owner("kq", "default", "0b6f2a52-7c1e-4c43-8d43-1ac39b0d2d3e")
    pod = r.pod(owner, spec, 2, "hash", init_containers=[container])
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    assert pod["spec"]["initContainers"][0]["volumeMounts"] == \
        pod["spec"]["containers"][0]["volumeMounts"][:1]  # the node's data volume


def test_the_status_fields_fit_the_schema() -> None:
    status = {"backup": {"lastAttemptTime": "2026-01-01T00:00:00Z",
                         "lastTime": "2026-01-01T00:00:00Z", "lastEndOffset": 42,
                         "lastLocation": "s3://b/p", "lastNodeId": 2,
                         "lastFailure": {"time": "2026-01-01T00:00:00Z", "message": "no"}},
              "restore": {"location": "s3://b/p", "endOffset": 42,
                          "directoryIds": {"1": "A" * 22}}}
    doc = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "kq"},
           "spec": {"replicas": 3, "backup": {"target": {"bucket": "bucket"}},
                    "bootstrap": {"fromBackup": {"location": "s3://b/p"}}},
           "status": status}
    assert schema_errors(doc) == []


# --- in the harness ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _complete_backups(endpoint: str, cluster_id: str) -> list[str]:
    options = S3Options(endpoint_url=endpoint,
                        access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                        secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
    store = open_store(f"s3://{BUCKET}/fleet/{cluster_id}", options)
    return [name for name in store.children() if store.child(name).read_bytes(MANIFEST_NAME)]


async def test_scheduled_backups_and_a_quorum_bootstrapped_from_one(
        cluster: Cluster, s3_endpoint: str) -> None:
    await cluster.kube.create(path("Secret", NAMESPACE), {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": NAMESPACE},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in CREDENTIALS.items()}})
    backup = {"intervalSeconds": 2, "retentionCount": 2, "target": {
        "endpoint": s3_endpoint, "bucket": BUCKET, "prefix": "fleet",
        "credentialsSecret": SECRET}}
    await cluster.kube.create(path(KIND, NAMESPACE, api=CR_API),
                              quorum_object(NAME, 3, backup=backup))
    await cluster.ready_with(3)
    await cluster.credentials()
    writer = Writer(cluster.addresses(range(1, 4)))
    writer.start()
    try:
        async def backups_taken() -> list[str] | None:
            events = await cluster.events()
            taken = [message for reason, message in events if reason == "BackupTaken"]
            deleted = [reason for reason, _ in events if reason == "BackupsDeleted"]
            return taken if len(taken) >= 3 and deleted else None

        await cluster.wait("three backups and a retention run", backups_taken, 90)
    finally:
        writer.stop()
    assert writer.acknowledged and writer.failures == 0
    cluster_id = (await cluster.status())["clusterId"]
    leader = await cluster.leader()
    with QuorumClient(cluster.addresses(range(1, 4)), timeout_s=10,
                      credentials=writer.credentials) as client:
        marker = client.put("marker", "after every acknowledged write").offset

    async def covering() -> dict[str, Any] | None:
        # A backup that holds the marker holds every write acknowledged before it.
        found = (await cluster.status()).get("backup") or {}
        return found if found.get("lastEndOffset", -1) > marker else None

    last = await cluster.wait("a backup after the writes", covering, 30)
    assert last["lastNodeId"] != leader, "taken from a follower, not the leader"
    assert last["lastLocation"].startswith(f"s3://{BUCKET}/fleet/{cluster_id}/")
    assert last.get("lastFailure") is None
    assert not [m for r, m in await cluster.events() if r == "BackupFailed"]
    complete = _complete_backups(s3_endpoint, cluster_id)
    assert 1 <= len(complete) <= 2, complete  # retention: 2 (a third may be on its way)

    # Quorum lost, say: a new KafkaQuorum made from the last backup.
    await cluster.kube.patch(cr_path(NAME), {"spec": {"paused": True}})
    restored = quorum_object("kq2", 3, bootstrap={"fromBackup": {
        "location": last["lastLocation"], "endpoint": s3_endpoint,
        "credentialsSecret": SECRET}})
    await cluster.kube.create(path(KIND, NAMESPACE, api=CR_API), restored)

    async def ready() -> dict[str, Any] | None:
        body = await cluster.kube.get(cr_path("kq2"))
        status = (body or {}).get("status") or {}
        return status if condition(body, "Ready") == "True" and status.get("voters") == 3 \
            else None

    status2 = await cluster.wait("kq2 Ready with 3 voters", ready, 150)
    assert status2["clusterId"] == cluster_id  # kept, as restore does by default
    chosen = status2["restore"]["directoryIds"]
    voters = {m["nodeId"]: m["directoryId"] for m in status2["members"]}
    assert voters == {int(i): d for i, d in chosen.items()}
    credentials = await cluster.credentials("kq2")
    servers = [cluster.kubelet.address(i, "kq2") for i in range(1, 4)]
    with QuorumClient(servers, timeout_s=20, credentials=credentials) as client:
        missing = [k for k, v in writer.acknowledged.items() if client.get(k) != v]
        assert not missing, f"{len(missing)} of {len(writer.acknowledged)} keys missing"
        client.put("after-restore", "yes")
