"""The scenarios' emulated backend (``kq_scenarios.QuorumCluster``): the harness's cluster
(``kq_cluster.Cluster``: kmock's API server, the test kubelet running real node processes, the
real operator) as a platform engineer sees it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from kafka_quorum_operator import KIND
from kafka_quorum_operator import resources as r
from kafka_quorum_operator.kube import path
from kafka_quorum_operator.reconcile import CR_API
from kq_cluster import NAME, Cluster, Writer, anonymous_refusal
from kq_harness import NAMESPACE, cr_path, quorum_object
from kq_scenarios import Load

from quorum_node.security.client_credentials import ClientCredentials

NODE_CONFIG = {"electionTimeoutMs": 500, "fetchTimeoutMs": 1500, "requestTimeoutMs": 1000,
               "retryBackoffMs": 20}


@dataclass
class EmulatedQuorum:
    """KafkaQuorum ``kq`` on the emulated cluster. The operator's remediation timings are its
    defaults unless ``spec`` says otherwise."""

    cluster: Cluster
    spec: Mapping[str, Any]
    name: str = NAME
    # Generous: on a loaded 2-core machine a pass of the operator took up to 26 s.
    patience_s: float = 600.0
    max_nodes: int = 5

    async def create(self, replicas: int) -> None:
        body = quorum_object(self.name, replicas, **self.spec)
        body["spec"]["config"] = dict(NODE_CONFIG)
        # The operator's default caught-up window unless the backend's spec says otherwise.
        body["spec"]["remediation"] = dict(self.spec.get("remediation") or {"enabled": True})
        await self.cluster.kube.create(path(KIND, NAMESPACE, api=CR_API), body)

    async def quorum(self) -> dict[str, Any]:
        return await self.cluster.get()

    async def patch_spec(self, spec: Mapping[str, Any]) -> None:
        await self.cluster.kube.patch(cr_path(self.name), {"spec": dict(spec)})

    async def events(self) -> list[tuple[str, str]]:
        return await self.cluster.events()

    async def pods(self) -> list[dict[str, Any]]:
        return await self.cluster.kube.list(path("Pod", NAMESPACE), r.labels(self.name))

    async def claims(self) -> list[dict[str, Any]]:
        return await self.cluster.kube.list(path("PersistentVolumeClaim", NAMESPACE),
                                            r.labels(self.name))

    async def pod_config(self, pod: Mapping[str, Any]) -> dict[str, str]:
        name = pod["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"]
        config = await self.cluster.kube.get(path("ConfigMap", NAMESPACE, name))
        assert config is not None, f"pod {pod['metadata']['name']}: no ConfigMap {name}"
        return dict(config.get("data") or {})

    async def delete_claim_and_pod(self, node_id: int) -> None:
        await self.cluster.kube.delete(path("PersistentVolumeClaim", NAMESPACE,
                                            r.claim_name(self.name, node_id)))
        await self.delete_pod(node_id)

    async def empty_volume(self, node_id: int) -> None:
        await self.cluster.wipe(node_id)

    async def delete_pod(self, node_id: int) -> None:
        await self.cluster.kube.delete(path("Pod", NAMESPACE, r.pod_name(self.name, node_id)))

    async def evict(self, node_id: int, reason: str) -> None:
        pod = await self.cluster.kube.get(path("Pod", NAMESPACE, r.pod_name(self.name, node_id)))
        assert pod is not None, f"no pod of node {node_id}"
        self.cluster.kubelet.evict(pod["metadata"]["uid"], reason)

    async def _credentials(self) -> ClientCredentials:
        """The operator's client credentials, checking the node's name in its certificate."""
        return replace(await self.cluster.credentials(self.name), check_hostname=True)

    async def load(self) -> Load:
        return Writer(self.cluster.servers(range(1, self.max_nodes + 1)),
                      await self._credentials())

    async def refused_without_credentials(self) -> str | None:
        credentials = await self._credentials()
        assert credentials.ca_file is not None
        return await asyncio.to_thread(anonymous_refusal, self.cluster.servers(range(1, 4)),
                                       credentials.ca_file, 5)

    def next_image(self) -> str:
        return "quorum-node:next"
