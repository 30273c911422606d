"""A KafkaQuorum on a real Kubernetes cluster as the scenarios see it
(``kq_scenarios.QuorumCluster``), driven through ``kubectl`` as an administrator drives it:
``apply``, ``get -o json``, ``patch``, ``delete``. Shared by the two real backends: kind
(``e2e/test_kind.py``, clients in a pod) and the control plane built from source
(``tests/kube/``, clients in the test process). Each backend gives its ``kubectl``, where
clients run and how a volume is emptied."""

from __future__ import annotations

import abc
import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kq_scenarios import Load

Kubectl = Callable[..., str]  # kubectl(*args, stdin=None) -> stdout, in the quorum's namespace
LABELS = "app.kubernetes.io/instance={name},app.kubernetes.io/component=node"
CLIENT_PORT = 9093


@dataclass
class KubectlQuorum(abc.ABC):
    """KafkaQuorum ``name``, made from ``spec`` (the backend's image and settings)."""

    name: str
    kubectl: Kubectl
    namespace: str
    spec: Mapping[str, Any] = field(default_factory=dict)
    patience_s: float = 600.0

    async def run(self, *args: str, stdin: str | None = None) -> str:
        return await asyncio.to_thread(self.kubectl, *args, stdin=stdin)

    async def create(self, replicas: int) -> None:
        manifest = {"apiVersion": "kraft.quorum.dev/v1alpha1", "kind": "KafkaQuorum",
                    "metadata": {"name": self.name},
                    "spec": {"replicas": replicas, **self.spec}}
        await self.run("apply", "-f", "-", stdin=json.dumps(manifest))

    async def quorum(self) -> dict[str, Any]:
        return dict(json.loads(await self.run("get", "kafkaquorum", self.name, "-o", "json")))

    async def patch_spec(self, spec: Mapping[str, Any]) -> None:
        await self.run("patch", "kafkaquorum", self.name, "--type=merge", "-p",
                       json.dumps({"spec": dict(spec)}))

    async def events(self) -> list[tuple[str, str]]:
        out = await self.run("get", "events", "-o", "json", "--field-selector",
                             f"involvedObject.kind=KafkaQuorum,involvedObject.name={self.name}")
        items = json.loads(out)["items"]
        items.sort(key=lambda e: (e.get("firstTimestamp") or e.get("eventTime") or "",
                                  int(e["metadata"]["resourceVersion"])))
        return [(e.get("reason", ""), e.get("message", "")) for e in items]

    async def _list(self, kind: str) -> list[dict[str, Any]]:
        out = await self.run("get", kind, "-o", "json", "-l", LABELS.format(name=self.name))
        return list(json.loads(out)["items"])

    async def pods(self) -> list[dict[str, Any]]:
        return await self._list("pods")

    async def claims(self) -> list[dict[str, Any]]:
        return await self._list("persistentvolumeclaims")

    async def pod_config(self, pod: Mapping[str, Any]) -> dict[str, str]:
        name = pod["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"]
        return dict(json.loads(await self.run("get", "configmap", name, "-o", "json"))
                    .get("data") or {})

    async def delete_claim_and_pod(self, node_id: int) -> None:
        await self.run("delete", "pvc", f"data-{self.name}-{node_id}", "--wait=false")
        await self.delete_pod(node_id)

    async def delete_pod(self, node_id: int) -> None:
        await self.run("delete", "pod", f"{self.name}-{node_id}", "--wait=false")

    def servers(self, count: int = 5) -> list[str]:
        """The nodes' client addresses by their DNS names, as clients in the cluster use them."""
        return [f"{self.name}-{i}.{self.name}-nodes.{self.namespace}.svc:{CLIENT_PORT}"
                for i in range(1, count + 1)]

    # The backend's part: where clients run, how a volume is emptied, which image is next.

    @abc.abstractmethod
    async def empty_volume(self, node_id: int) -> None: ...

    @abc.abstractmethod
    async def load(self) -> Load: ...

    @abc.abstractmethod
    async def refused_without_credentials(self) -> str | None: ...

    @abc.abstractmethod
    def next_image(self) -> str: ...
