"""The acceptance harness's shared parts: a client writing all along, the cluster (emulated API,
kubelet, operator) and its fixture, and the steps the scenarios share.

Quorums are secured (the default): test clients use the operator's client certificate (admin,
which may also read and write) from its Secret; ``Cluster.credentials`` checks no name in the
node's certificate (for tests that connect to pod IPs); clients given ``Cluster.servers`` (DNS
names) may check it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import shutil
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kmock
import pytest
from kafka_quorum_operator import KIND, handlers
from kafka_quorum_operator import resources as r
from kafka_quorum_operator.kube import Kube, path
from kafka_quorum_operator.nodes import NodeClient, Route, client_context
from kafka_quorum_operator.reconcile import CR_API
from kq_harness import (
    NAMESPACE,
    K8s,
    Kubelet,
    OperatorThread,
    condition,
    cr_path,
    declare_resources,
    environment,
    quorum_object,
    wait_for,
)

from quorum_node.client import QuorumClient, QuorumClientError
from quorum_node.security.client_credentials import ClientCredentials

NAME = "kq"
# The credentials of the quorum the running test made (create_ready, Cluster.credentials): what
# a Writer uses unless given others. One test at a time runs a cluster.
CURRENT: dict[str, ClientCredentials] = {}


@dataclass
class Writer:
    """Puts unique keys continuously, through any node; remembers what was acknowledged."""

    servers: list[str]
    credentials: ClientCredentials | None = field(default_factory=lambda: CURRENT.get(NAME))
    acknowledged: dict[str, str] = field(default_factory=dict)
    failures: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        count = 0
        with QuorumClient(self.servers, timeout_s=3, credentials=self.credentials) as client:
            while not self._stop.is_set():
                key, value = f"key-{count}", f"value-{count}"
                try:
                    client.put(key, value)
                    self.acknowledged[key] = value
                except QuorumClientError:
                    self.failures += 1
                count += 1
                time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(15)

    def lost(self) -> list[str]:
        """Acknowledged keys a linearizable read does not return as written."""
        missing = []
        with QuorumClient(self.servers, timeout_s=20, credentials=self.credentials) as client:
            for key, value in self.acknowledged.items():
                if client.get(key) != value:
                    missing.append(key)
        return missing


def anonymous_refusal(servers: list[str], ca_file: Path, timeout_s: float) -> str | None:
    """How a client that trusts the quorum's CA and presents nothing is refused a read (None:
    it was served). Blocking."""
    anonymous = ClientCredentials(ca_file=ca_file)
    with QuorumClient(servers, timeout_s=timeout_s, credentials=anonymous) as client:
        try:
            client.get("anything")
        except QuorumClientError as error:
            return f"{error.code}: {error}"
    return None


@dataclass
class Cluster:
    kube: Kube
    kubelet: Kubelet
    operator: OperatorThread
    emulator: Any
    timings: dict[str, float] = field(default_factory=dict)

    async def get(self) -> dict[str, Any]:
        body = await self.kube.get(cr_path(NAME))
        assert body is not None
        return body

    async def status(self) -> dict[str, Any]:
        return dict((await self.get()).get("status") or {})

    def describe(self) -> str:
        """What a failed wait shows: the quorum's status, the pods, the last events, the
        operator's log and the nodes' logs."""
        lines = []
        for key, obj in self.emulator.objects.items():
            if obj.deleted:
                continue
            raw = obj.raw
            if "kafkaquorum" in str(key):
                lines.append(f"status: {raw.get('status')}")
            elif raw.get("kind") == "Pod" or "pods" in str(key):
                lines.append(f"pod {raw['metadata']['name']} {raw['metadata'].get('uid')} "
                             f"deleting={raw['metadata'].get('deletionTimestamp')} "
                             f"status={raw.get('status')}")
            elif "events" in str(key):
                lines.append(f"event {raw.get('lastTimestamp')} {raw.get('reason')}: "
                             f"{raw.get('message')}")
        log = self.kubelet.root / "operator.log"
        operator_log = log.read_text(errors="replace")[-6000:] if log.exists() else ""
        return "\n".join(lines[-80:]) + f"\n--- operator\n{operator_log}\n" + \
            self.kubelet.logs()

    async def secret(self, name: str) -> dict[str, bytes]:
        secret = await self.kube.get(path("Secret", NAMESPACE, name))
        assert secret is not None, f"no Secret {name}"
        return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}

    async def credentials(self, name: str = NAME) -> ClientCredentials:
        """The operator's client certificate for quorum ``name``, as files (and the current
        test's, for Writers)."""
        data = await self.secret(r.operator_secret_name(name))
        directory = self.kubelet.root / "client" / name
        directory.mkdir(parents=True, exist_ok=True)
        files = {}
        for key in ("ca.crt", "tls.crt", "tls.key"):
            files[key] = directory / key
            files[key].write_bytes(data[key])
        credentials = ClientCredentials(ca_file=files["ca.crt"], cert_file=files["tls.crt"],
                                        key_file=files["tls.key"], check_hostname=False)
        CURRENT[name] = credentials
        return credentials

    async def node_client(self, name: str = NAME, ids: range = range(1, 4)) -> NodeClient:
        """A NodeClient as the operator's: to each node's IP, verifying its DNS name."""
        data = await self.secret(r.operator_secret_name(name))
        context = client_context(data["ca.crt"], data["tls.crt"], data["tls.key"])
        nodes = NodeClient()
        for i in ids:
            nodes.route(self.kubelet.address(i, name),
                        Route(r.node_host(name, NAMESPACE, i), context))
        return nodes

    async def wait(self, what: str, check: Any, timeout_s: float = 60) -> Any:
        return await wait_for(what, check, timeout_s, self.describe)

    async def ready_with(self, voters: int, timeout_s: float = 60) -> dict[str, Any]:
        async def ready() -> dict[str, Any] | None:
            body = await self.get()
            status = body.get("status") or {}
            if condition(body, "Ready") == "True" and status.get("voters") == voters:
                return status
            return None

        result: dict[str, Any] = await self.wait(f"Ready with {voters} voters", ready,
                                                 timeout_s)
        return result

    async def voter_directories(self) -> dict[int, str]:
        status = await self.status()
        return {m["nodeId"]: m["directoryId"] for m in status.get("members") or []
                if m.get("directoryId")}

    async def events(self) -> list[tuple[str, str]]:
        items = await self.kube.list(path("Event", NAMESPACE), {})
        # In the order they were posted (a list is in name order, as the API server's).
        items.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
        return [(e.get("reason", ""), e.get("message", "")) for e in items]

    def addresses(self, ids: range | list[int]) -> list[str]:
        """The nodes' current pods' client addresses, by IP (as the operator reaches them)."""
        return [self.kubelet.address(i) for i in ids]

    def servers(self, ids: range | list[int]) -> list[str]:
        """The nodes' client addresses by DNS name (as a client in the cluster uses them)."""
        return [self.kubelet.server(i) for i in ids]

    async def wipe(self, *node_ids: int) -> None:
        """The volumes' contents gone (replaced disks under the same claims) under running
        nodes, then their pods deleted, as an administrator would."""
        for node_id in node_ids:
            pod = await self.kube.get(path("Pod", NAMESPACE, f"{NAME}-{node_id}"))
            claim = await self.kube.get(path("PersistentVolumeClaim", NAMESPACE,
                                             f"data-{NAME}-{node_id}"))
            assert pod is not None and claim is not None
            process = self.kubelet.processes[pod["metadata"]["uid"]]
            process.popen.kill()
            await asyncio.to_thread(process.popen.wait, 10)
            volume: Path = self.kubelet.claim_dir(claim["metadata"]["uid"])
            shutil.rmtree(volume)
            volume.mkdir()
        for node_id in node_ids:
            await self.kube.delete(path("Pod", NAMESPACE, f"{NAME}-{node_id}"))

    async def configs(self) -> dict[str, dict[str, str]]:
        """Each running pod's configuration: the data of the ConfigMap its container reads. A
        terminating pod is left out: the operator may already have deleted the ConfigMap of its
        revision (its container read it when it started)."""
        found = {}
        for pod in await self.kube.list(path("Pod", NAMESPACE), r.labels(NAME)):
            if pod["metadata"].get("deletionTimestamp"):
                continue
            name = pod["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"]
            config = await self.kube.get(path("ConfigMap", NAMESPACE, name))
            assert config is not None, f"pod {pod['metadata']['name']}: no ConfigMap {name}"
            found[pod["metadata"]["name"]] = dict(config.get("data") or {})
        return found

    async def objects(self) -> tuple[set[str], set[str]]:
        """The uids of the quorum's pods and claims."""
        pods = await self.kube.list(path("Pod", NAMESPACE), {})
        claims = await self.kube.list(path("PersistentVolumeClaim", NAMESPACE), {})
        return ({p["metadata"]["uid"] for p in pods},
                {c["metadata"]["uid"] for c in claims})

    async def leader(self) -> int:
        status = await self.status()
        leader = status.get("leaderId")
        assert isinstance(leader, int)
        return leader


@contextlib.asynccontextmanager
async def running_cluster(root: Path, **settings: str) -> AsyncIterator[Cluster]:
    """The emulated API server, the kubelet and the operator (in a thread), with the operator's
    ``settings`` (environment, e.g. ``KQ_OPERATOR_INTERVAL``)."""
    handlers.STATE = handlers._State()
    async with K8s() as emulator:
        declare_resources(emulator)
        async with kmock.Server(emulator) as server:
            url = str(server.url).rstrip("/")
            kube = Kube.connect(url)
            kubelet = Kubelet(kube, root)
            operator = OperatorThread()
            handler = logging.FileHandler(root / "operator.log")
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            logging.getLogger("kopf").addHandler(handler)
            logging.getLogger("kopf").setLevel(logging.DEBUG)
            with environment(KQ_OPERATOR_API_SERVER=url, KQ_OPERATOR_NAMESPACE=NAMESPACE,
                             KQ_OPERATOR_IDENTITY="test-operator", **settings):
                kubelet.start()
                operator.start()
                cluster = Cluster(kube, kubelet, operator, emulator)
                try:
                    yield cluster
                    assert kubelet.errors == [], kubelet.errors[0]
                finally:
                    CURRENT.clear()
                    logging.getLogger("kopf").removeHandler(handler)
                    # The test may have replaced the operator (a restart): stop the current one.
                    await asyncio.to_thread(cluster.operator.stop)
                    await kubelet.stop()
                    kube.close()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """The emulated cluster with the operator passing every 0.5 s."""
    async with running_cluster(tmp_path, KQ_OPERATOR_INTERVAL="0.5") as found:
        yield found


async def create_ready(cluster: Cluster, replicas: int = 3) -> float:
    started = time.monotonic()
    await cluster.kube.create(path(KIND, NAMESPACE, api=CR_API), quorum_object(NAME, replicas))
    await cluster.ready_with(replicas)
    elapsed = time.monotonic() - started
    await cluster.credentials()
    return elapsed
