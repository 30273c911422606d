"""The scenarios' backend on the real control plane (``kq_scenarios.QuorumCluster``, through
``kq_kubectl.KubectlQuorum``): the operator installed by ``helm install`` runs as the chart's
Deployment; the quorum's pods run on the process kubelets; the test's clients run in the test
process, reaching the pods on the bridge by their cluster DNS names and verifying them, with the
operator's client certificate from its Secret."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from cluster import Cluster
from kq_cluster import Writer, anonymous_refusal
from kq_kubectl import Kubectl, KubectlQuorum
from kq_scenarios import Load

from quorum_node.security.client_credentials import ClientCredentials

NAMESPACE = "quorum"
OPERATOR_RELEASE = "kqo"
NEXT_IMAGE = "ghcr.io/quorum-node/quorum-node:0.1.1"
CHART = Path(__file__).resolve().parents[2] / "helm" / "kafka-quorum-operator"


def namespaced(cluster: Cluster, namespace: str = NAMESPACE) -> Kubectl:
    def kubectl(*args: str, stdin: str | None = None) -> str:
        return cluster.kubectl("--namespace", namespace, *args, stdin=stdin)

    return kubectl


def create_namespace(cluster: Cluster, namespace: str = NAMESPACE) -> None:
    """The quorum's namespace, under the restricted Pod Security Standard."""
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": namespace, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}))


def install_operator(cluster: Cluster, namespace: str = NAMESPACE, *more: str) -> None:
    """``helm install`` of the chart (its defaults: the release namespace only), waiting for the
    Deployment."""
    cluster.helm("install", OPERATOR_RELEASE, str(CHART), "--namespace", namespace, "--wait",
                 "--timeout", "5m", *more)


@dataclass
class RealQuorum(KubectlQuorum):
    cluster: Cluster | None = None
    credentials_dir: Path | None = None
    _credentials: ClientCredentials | None = field(default=None, repr=False)

    @classmethod
    def named(cls, cluster: Cluster, name: str, namespace: str = NAMESPACE,
              **spec: object) -> RealQuorum:
        return cls(name, namespaced(cluster, namespace), namespace, spec=spec, cluster=cluster,
                   credentials_dir=cluster.root / "clients" / namespace / name)

    def credentials(self) -> ClientCredentials:
        """The operator's client certificate for this quorum (admin), as files."""
        if self._credentials is None:
            secret = json.loads(self.kubectl("get", "secret", f"{self.name}-operator", "-o",
                                             "json"))
            assert self.credentials_dir is not None
            self.credentials_dir.mkdir(parents=True, exist_ok=True)
            files = {}
            for key in ("ca.crt", "tls.crt", "tls.key"):
                files[key] = self.credentials_dir / key
                files[key].write_bytes(base64.b64decode(secret["data"][key]))
            self._credentials = ClientCredentials(
                ca_file=files["ca.crt"], cert_file=files["tls.crt"], key_file=files["tls.key"])
        return self._credentials

    async def load(self) -> Load:
        credentials = await asyncio.to_thread(self.credentials)
        return Writer(self.servers(), credentials)

    async def refused_without_credentials(self) -> str | None:
        credentials = await asyncio.to_thread(self.credentials)
        assert credentials.ca_file is not None
        return await asyncio.to_thread(anonymous_refusal, self.servers(3), credentials.ca_file,
                                       10)

    async def volume_path(self, node_id: int) -> Path:
        """The host directory of the member's volume (its claim's PersistentVolume)."""
        claim = json.loads(await self.run("get", "pvc", f"data-{self.name}-{node_id}", "-o",
                                          "json"))
        assert self.cluster is not None
        volume = json.loads(await asyncio.to_thread(
            self.cluster.kubectl, "get", "pv", claim["spec"]["volumeName"], "-o", "json"))
        return Path(volume["spec"]["hostPath"]["path"])

    async def empty_volume(self, node_id: int) -> None:
        """The volume's contents removed on the node, under the running pod (a disk replaced
        behind its claim), then the pod deleted."""
        directory = await self.volume_path(node_id)
        for entry in directory.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        await self.delete_pod(node_id)

    def next_image(self) -> str:
        return NEXT_IMAGE
