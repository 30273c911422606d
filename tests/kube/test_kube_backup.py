"""A QuorumBackup on the real control plane: the operator installed by ``helm install`` (the
chart's CRDs and RBAC) takes it from a quorum of process-kubelet pods to moto's S3 server on the
cluster's bridge, and fills its status; the real API server shows its printer columns, refuses a
change of ``spec.quorum`` (its CEL rule), and its garbage collector deletes it with its
KafkaQuorum (the owner reference).
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cluster import Cluster
from kq_real import NAMESPACE, RealQuorum, namespaced
from kq_scenarios import Timings, create_and_ready, wait_for
from netns import GATEWAY
from test_kq_backup import BUCKET, CREDENTIALS, SECRET

from quorum_node.backup.manifest import MANIFEST_NAME
from quorum_node.backup.store import S3Options, open_store, s3_client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture
def s3_on_the_bridge() -> Iterator[S3Options]:
    """moto's S3 server on the bridge's address, where the operator's pod reaches it."""
    server_module = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    with socket.socket() as sock:
        sock.bind((GATEWAY, 0))
        port = int(sock.getsockname()[1])
    server = server_module.ThreadedMotoServer(ip_address=GATEWAY, port=port, verbose=False)
    server.start()
    try:
        options = S3Options(endpoint_url=f"http://{GATEWAY}:{port}",
                            access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                            secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
        s3_client(options).create_bucket(Bucket=BUCKET)
        yield options
    finally:
        server.stop()


def _quorum_backup(cluster: Cluster, name: str) -> dict[str, Any] | None:
    done = cluster.control_plane.kubectl("--namespace", NAMESPACE, "get", "quorumbackup", name,
                                         "-o", "json", check=False)
    if done.returncode != 0:
        assert "NotFound" in done.stderr, done.stderr
        return None
    found: dict[str, Any] = json.loads(done.stdout)
    return found


async def test_a_quorum_backup_on_the_real_control_plane(
        kube_cluster: Cluster, operator_installed: None, s3_on_the_bridge: S3Options) -> None:
    kubectl = namespaced(kube_cluster)
    kubectl("apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in CREDENTIALS.items()}}))
    quorum = RealQuorum.named(kube_cluster, "qbk", backup={
        "intervalSeconds": 3600, "retentionCount": 2, "target": {
            "endpoint": s3_on_the_bridge.endpoint_url, "bucket": BUCKET, "prefix": "fleet",
            "credentialsSecret": SECRET}})
    timings = Timings("real")
    await create_and_ready(quorum, timings)
    started = time.monotonic()
    kubectl("apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "kraft.quorum.dev/v1alpha1", "kind": "QuorumBackup",
        "metadata": {"name": "before-upgrade"}, "spec": {"quorum": "qbk"}}))

    async def completed() -> dict[str, Any] | None:
        found = await asyncio.to_thread(_quorum_backup, kube_cluster, "before-upgrade")
        phase = ((found or {}).get("status") or {}).get("phase")
        assert phase != "Failed", found
        return found if phase == "Completed" else None

    body = await wait_for(quorum, "the QuorumBackup Completed", completed, 300)
    timings.record("QuorumBackup Completed", time.monotonic() - started)
    status = body["status"]
    quorum_body = await quorum.quorum()
    cluster_id = quorum_body["status"]["clusterId"]
    assert status["location"].startswith(f"s3://{BUCKET}/fleet/{cluster_id}/")
    assert status["location"].endswith("-before-upgrade")
    assert status["sizeBytes"] > 0 and status["endOffset"] > 0
    assert status["node"] in (1, 2, 3) and status["durationSeconds"] >= 0
    assert status["startedAt"] <= status["completedAt"]
    assert [(ref["kind"], ref["uid"]) for ref in body["metadata"]["ownerReferences"]] == [
        ("KafkaQuorum", quorum_body["metadata"]["uid"])]
    store = open_store(status["location"], s3_on_the_bridge)
    assert store.read_bytes(MANIFEST_NAME) is not None

    # The printer columns, as users see them.
    table = kubectl("get", "qbk")
    header = table.splitlines()[0].split()
    assert header == ["NAME", "QUORUM", "PHASE", "LOCATION", "AGE"], table
    assert "before-upgrade   qbk      Completed   s3://" in table, table

    # spec.quorum is immutable (the CRD's CEL rule, run by the API server).
    with pytest.raises(AssertionError, match=r"spec\.quorum is immutable"):
        kubectl("patch", "quorumbackup", "before-upgrade", "--type=merge", "-p",
                json.dumps({"spec": {"quorum": "other"}}))

    # Garbage-collected with its KafkaQuorum.
    kubectl("delete", "kafkaquorum", "qbk", "--wait=true", "--timeout=120s")

    async def gone() -> bool | None:
        found = await asyncio.to_thread(_quorum_backup, kube_cluster, "before-upgrade")
        return True if found is None else None

    await wait_for(quorum, "the QuorumBackup garbage-collected", gone, 120)
    print(f"\n[kube backup] {timings.summary()}", flush=True)
