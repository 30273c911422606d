"""A KafkaQuorum deleted and made again with the same name over its kept volume claims comes back
with its data and its cluster id (written on every claim); a claim of another cluster id is
refused (condition ClaimsRefused), never mounted."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kafka_quorum_operator import ANNOTATION_CLUSTER_ID, KIND
from kafka_quorum_operator.kube import path
from kafka_quorum_operator.reconcile import CR_API
from kq_cluster import NAME, Cluster, create_ready
from kq_harness import NAMESPACE, condition, cr_path, quorum_object

pytestmark = pytest.mark.timeout(240)


def _path(resource: Any, name: str) -> str:
    prefix = "/api/v1" if not resource.group else f"/apis/{resource.group}/{resource.version}"
    return f"{prefix}/namespaces/{NAMESPACE}/{resource.plural}/{name}"


async def delete_quorum(cluster: Cluster) -> None:
    """Delete the KafkaQuorum, then what the API server's garbage collector would delete with
    it (the emulator has none): every object it owns. Claims are not owned (kept)."""
    uid = (await cluster.get())["metadata"]["uid"]
    await cluster.kube.delete(cr_path(NAME))

    async def gone() -> bool:
        return await cluster.kube.get(cr_path(NAME)) is None

    await cluster.wait("the KafkaQuorum deleted", gone, 30)
    owned = [(resource, name) for (resource, _, name), obj in cluster.emulator.objects.items()
             if not obj.deleted and any(o.get("uid") == uid for o in
                                        obj.raw.get("metadata", {}).get("ownerReferences") or [])]
    assert not any(resource.plural == "persistentvolumeclaims" for resource, _ in owned)
    for resource, name in owned:
        await cluster.kube.delete(_path(resource, name))

    async def no_pods() -> bool:
        return not await cluster.kube.list(path("Pod", NAMESPACE), {})

    await cluster.wait("the pods gone", no_pods, 30)


@pytest.mark.slow  # tens of seconds: CI's slow operator step
async def test_recreated_over_kept_claims(cluster: Cluster) -> None:
    await create_ready(cluster)
    before = await cluster.status()
    directories = await cluster.voter_directories()
    await delete_quorum(cluster)
    # One claim replaced by one of another quorum's (another cluster id).
    foreign = path("PersistentVolumeClaim", NAMESPACE, f"data-{NAME}-3")
    claim = await cluster.kube.get(foreign)
    assert claim is not None
    assert claim["metadata"]["annotations"][ANNOTATION_CLUSTER_ID] == before["clusterId"]
    await cluster.kube.patch(foreign, {"metadata": {"annotations": {
        ANNOTATION_CLUSTER_ID: "AnotherClusterIdAAAAAA"}}})

    await cluster.kube.create(path(KIND, NAMESPACE, api=CR_API), quorum_object(NAME, 3))

    async def back() -> dict[str, Any] | None:
        body = await cluster.get()
        high_watermark = (body.get("status") or {}).get("highWatermark")
        if condition(body, "Quorate") == "True" and \
                condition(body, "ClaimsRefused") == "True" and \
                isinstance(high_watermark, int) and high_watermark >= before["highWatermark"]:
            return body
        return None

    body = await cluster.wait("the quorum back on its claims, one refused", back, 90)
    status = body["status"]
    assert status["clusterId"] == before["clusterId"]
    now = await cluster.voter_directories()
    assert {i: now.get(i) for i in (1, 2)} == {i: directories[i] for i in (1, 2)}
    refused = next(c for c in status["conditions"] if c["type"] == "ClaimsRefused")
    assert "AnotherClusterIdAAAAAA" in refused["message"], refused
    await asyncio.sleep(2)
    assert await cluster.kube.get(path("Pod", NAMESPACE, f"{NAME}-3")) is None
    reasons = [reason for reason, _ in await cluster.events()]
    assert "ClusterIdRecovered" in reasons, reasons
