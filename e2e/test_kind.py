"""End to end on a real kind cluster: the operator's scenarios (``tests/operator/kq_scenarios.py``,
the same functions the default suite runs on the emulated cluster) against a real API server,
kubelet, cluster DNS and volumes. The images are built and loaded, the operator installed with
helm, and each KafkaQuorum is created by the scenario itself.

    python -m pytest e2e -s         # needs docker, kind, kubectl and helm on PATH

It creates (and deletes) the kind cluster ``kq-e2e`` unless ``KIND_CLUSTER`` names an existing
one (kept). Without docker, kind, kubectl or helm every test is skipped with the reason.

Clients run in the cluster: a client pod (the node image, which has ``quorum_node.client``)
mounts the operator's client Secret of the quorum and talks to the nodes by their cluster DNS
names, as an application would; the test drives it with ``kubectl exec``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kq_kubectl import KubectlQuorum
from kq_scenarios import Load, Timings, lifecycle, scaling

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "kq-e2e"
NODE_IMAGE = "quorum-node:e2e"
NODE_IMAGE_V2 = "quorum-node:e2e-v2"
OPERATOR_IMAGE = "kafka-quorum-operator:e2e"
CLIENT_LABELS = {"app": "kq-e2e-client"}
CREDENTIALS = "/var/run/quorum-client"
LOG_DIR = "/var/lib/quorum/data"  # the node's log.dir on its volume (spec.LOG_DIR)


def _missing() -> str | None:
    for tool in ("docker", "kind", "kubectl", "helm"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    done = subprocess.run(["docker", "info"], capture_output=True, check=False)
    if done.returncode != 0:
        return "no Docker engine is running"
    return None


MISSING = _missing()
pytestmark = [pytest.mark.skipif(MISSING is not None, reason=f"kind e2e: {MISSING}"),
              pytest.mark.timeout(3600)]


def run(*command: str, check: bool = True, timeout_s: float = 600, stdin: str | None = None
        ) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                          input=stdin, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} -> {done.returncode}\n{done.stdout}\n"
                             f"{done.stderr}")
    return done.stdout


def kubectl(*args: str, check: bool = True, stdin: str | None = None) -> str:
    return run("kubectl", "--namespace", NAMESPACE, *args, check=check, stdin=stdin)


@pytest.fixture(scope="module")
def kind_cluster() -> Iterator[None]:
    existing = os.environ.get("KIND_CLUSTER")
    name = existing or "kq-e2e"
    if not existing:
        run("kind", "create", "cluster", "--name", name, "--wait", "120s")
    try:
        run("docker", "build", "-t", NODE_IMAGE, str(ROOT))
        run("docker", "tag", NODE_IMAGE, NODE_IMAGE_V2)
        run("docker", "build", "-f", str(ROOT / "operator" / "Dockerfile"), "-t",
            OPERATOR_IMAGE, str(ROOT))
        for image in (NODE_IMAGE, NODE_IMAGE_V2, OPERATOR_IMAGE):
            run("kind", "load", "docker-image", image, "--name", name)
        repository, tag = OPERATOR_IMAGE.split(":")
        # The operator's default timings: a pass every 5 s.
        run("helm", "install", "kqo", str(ROOT / "helm" / "kafka-quorum-operator"),
            "--namespace", NAMESPACE, "--create-namespace", "--wait",
            "--set", f"image.repository={repository},image.tag={tag},image.pullPolicy=Never")
        yield
    finally:
        if not existing:
            run("kind", "delete", "cluster", "--name", name, check=False)


# Run in the client pod: put unique keys until stdin closes, one "key value" line per
# acknowledged put, a "failed" line per failed try.
WRITER = """
import sys, threading, time
from quorum_node.client import QuorumClient, QuorumClientError
from quorum_node.security.client_credentials import ClientCredentials
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
credentials = ClientCredentials(ca_file=f"{D}/ca.crt", cert_file=f"{D}/tls.crt",
                                key_file=f"{D}/tls.key")
with QuorumClient(S, timeout_s=5, credentials=credentials) as client:
    count = 0
    while not done.is_set():
        key, value = f"{P}-{count}", f"value-{count}"
        try:
            client.put(key, value)
            print(key, value, flush=True)
        except QuorumClientError:
            print("failed", flush=True)
        count += 1
        time.sleep(0.02)
"""
# Reads "key value" lines from stdin; prints the keys a linearizable read does not return so.
CHECKER = """
import sys
from quorum_node.client import QuorumClient
from quorum_node.security.client_credentials import ClientCredentials
credentials = ClientCredentials(ca_file=f"{D}/ca.crt", cert_file=f"{D}/tls.crt",
                                key_file=f"{D}/tls.key")
with QuorumClient(S, timeout_s=30, credentials=credentials) as client:
    for line in sys.stdin:
        key, value = line.split()
        if client.get(key) != value:
            print(key, flush=True)
"""
# A client trusting the quorum's CA and presenting nothing: prints how it was refused.
ANONYMOUS = """
from quorum_node.client import QuorumClient, QuorumClientError
from quorum_node.security.client_credentials import ClientCredentials
with QuorumClient(S, timeout_s=10, credentials=ClientCredentials(ca_file=f"{D}/ca.crt")) as c:
    try:
        c.get("anything")
        print("served")
    except QuorumClientError as error:
        print(f"{error.code}: {error}")
"""


def _script(body: str, servers: list[str], prefix: str = "") -> str:
    return f"D = {CREDENTIALS!r}\nS = {servers!r}\nP = {prefix!r}\n{body}"


@dataclass
class KindLoad:
    """The writer, in the client pod."""

    pod: str
    servers: list[str]
    acknowledged: dict[str, str] = field(default_factory=dict)
    failures: int = 0
    _process: subprocess.Popen[str] | None = None
    _reader: threading.Thread | None = None

    def start(self) -> None:
        prefix = f"k{int(time.time())}"
        self._process = subprocess.Popen(
            ["kubectl", "--namespace", NAMESPACE, "exec", "-i", self.pod, "--", "python", "-c",
             _script(WRITER, self.servers, prefix)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            parts = line.split()
            if parts == ["failed"]:
                self.failures += 1
            elif len(parts) == 2:
                self.acknowledged[parts[0]] = parts[1]

    def stop(self) -> None:
        if self._process is None or self._process.poll() is not None:
            return
        assert self._process.stdin is not None
        self._process.stdin.close()  # the writer stops at end of input
        try:
            self._process.wait(60)
        except subprocess.TimeoutExpired:
            self._process.kill()
        if self._reader is not None:
            self._reader.join(30)

    def lost(self) -> list[str]:
        keys = "".join(f"{k} {v}\n" for k, v in self.acknowledged.items())
        out = kubectl("exec", "-i", self.pod, "--", "python", "-c",
                      _script(CHECKER, self.servers), stdin=keys)
        return out.split()


@dataclass
class KindQuorum(KubectlQuorum):
    """A KafkaQuorum on the kind cluster, its clients in a pod of the cluster."""

    _client_pod: str | None = None

    @classmethod
    def named(cls, name: str) -> KindQuorum:
        return cls(name, kubectl, NAMESPACE, spec={
            "image": NODE_IMAGE, "imagePullPolicy": "Never",
            "security": {"networkPolicy": {"allowFrom": [
                {"podSelector": {"matchLabels": CLIENT_LABELS}}]}}})

    async def empty_volume(self, node_id: int) -> None:
        pod = f"{self.name}-{node_id}"
        await asyncio.to_thread(kubectl, "exec", pod, "--", "sh", "-c",
                                f"rm -rf {LOG_DIR}/* {LOG_DIR}/.[!.]*", check=False)
        await self.delete_pod(node_id)

    async def _client(self) -> str:
        """The client pod, with the operator's client Secret of this quorum mounted."""
        if self._client_pod is None:
            pod = f"{self.name}-client"
            manifest = {"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": pod, "labels": CLIENT_LABELS},
                        "spec": {"containers": [{
                            "name": "client", "image": NODE_IMAGE, "imagePullPolicy": "Never",
                            "command": ["sleep", "infinity"],
                            "volumeMounts": [{"name": "credentials", "mountPath": CREDENTIALS,
                                              "readOnly": True}]}],
                            "volumes": [{"name": "credentials", "secret": {
                                "secretName": f"{self.name}-operator"}}]}}
            await asyncio.to_thread(kubectl, "apply", "-f", "-", stdin=json.dumps(manifest))
            await asyncio.to_thread(kubectl, "wait", "--for=condition=Ready", f"pod/{pod}",
                                    "--timeout=300s")
            self._client_pod = pod
        return self._client_pod

    async def load(self) -> Load:
        return KindLoad(await self._client(), self.servers())

    async def refused_without_credentials(self) -> str | None:
        out = await asyncio.to_thread(kubectl, "exec", await self._client(), "--", "python",
                                      "-c", _script(ANONYMOUS, self.servers(3)))
        return None if out.strip() == "served" else out.strip()

    def next_image(self) -> str:
        return NODE_IMAGE_V2


async def test_lifecycle(kind_cluster: None) -> None:
    await lifecycle(KindQuorum.named("lifecycle"), Timings("kind"), hold_s=30)


async def test_scaling(kind_cluster: None) -> None:
    await scaling(KindQuorum.named("scaling"), Timings("kind"))
