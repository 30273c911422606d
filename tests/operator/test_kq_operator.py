"""The real operator against kmock's emulated Kubernetes API, with every pod's quorum node a real
process (``kq_harness``). A client writes all along; no acknowledged write may be lost.

The operator's scenarios (Ready, heals, scaling, rolling update, pause, quorum loss) are in
``test_kq_scenarios.py``; an operator killed in the middle of a replacement in
``test_kq_crash.py``. Here: the watches, the configuration per revision, volume expansion, and
the TLS switch.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field

import pytest
from kafka_quorum_operator import KIND
from kafka_quorum_operator.kube import path
from kafka_quorum_operator.reconcile import CR_API
from kq_cluster import NAME, Cluster, Writer, create_ready
from kq_harness import NAMESPACE, condition, cr_path, quorum_object

from quorum_node.client import QuorumClient, QuorumClientError

pytestmark = pytest.mark.timeout(240)


async def test_pods_and_claims_are_watched_by_label_on_the_server(cluster: Cluster) -> None:
    """kopf's watches of pods and claims ask the API server for the operator's own only (a
    cluster's other pods never reach it), and the emulator honours the selector."""
    foreign = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "someone-elses", "namespace": NAMESPACE,
                            "labels": {"app": "other"}},
               "spec": {"containers": [{"name": "c", "image": "x"}], "volumes": [
                   {"name": "v", "persistentVolumeClaim": {"claimName": "absent"}}]}}
    await cluster.kube.create(path("Pod", NAMESPACE), foreign)

    def watches() -> list[dict[str, str]]:
        return [dict(r.params) for r in cluster.emulator.seen
                if r.resource is not None and r.resource.plural in
                ("pods", "persistentvolumeclaims") and r.params.get("watch") == "true"]

    async def both_watched() -> bool:
        return {p.get("labelSelector") for p in watches()} == \
            {"app.kubernetes.io/managed-by=kafka-quorum-operator"} and len(watches()) >= 2

    await cluster.wait("the operator's watches of pods and claims", both_watched, 20)
    selected = await cluster.kube.list(path("Pod", NAMESPACE),
                                       {"app.kubernetes.io/managed-by": "kafka-quorum-operator"})
    assert selected == []
    assert [p["metadata"]["name"] for p in await cluster.kube.list(path("Pod", NAMESPACE), {})] \
        == ["someone-elses"]


async def test_configuration_per_revision(cluster: Cluster) -> None:
    """A changed configuration is a new immutable ConfigMap; pods not rolled yet keep reading
    theirs (a container restarted meanwhile starts with its pod's configuration), and the old
    one goes once no pod refers to it."""
    await create_ready(cluster)
    before = await cluster.configs()
    assert len(set(map(str, before.values()))) == 1
    await cluster.kube.patch(cr_path(NAME), {"spec": {"config": {"electionTimeoutMs": 600}}})
    key = "QUORUM_CONTROLLER_QUORUM_ELECTION_TIMEOUT_MS"
    mixed_seen = False

    async def rolled() -> bool:
        nonlocal mixed_seen
        configs = await cluster.configs()
        values = {c.get(key) for c in configs.values()}
        mixed_seen |= values == {"500", "600"}
        maps = await cluster.kube.list(path("ConfigMap", NAMESPACE),
                                       {"app.kubernetes.io/instance": NAME,
                                        "app.kubernetes.io/component": "config"})
        assert all(m.get("immutable") is True for m in maps)
        return len(configs) == 3 and values == {"600"} and len(maps) == 1 and \
            condition(await cluster.get(), "Ready") == "True"

    await cluster.wait("every pod rolled onto the new ConfigMap, the old one gone", rolled, 120)
    assert mixed_seen, "never saw pods of both revisions, each with its own configuration"


async def test_volume_expansion(cluster: Cluster) -> None:
    """A larger spec.storage.size grows the claims where the StorageClass allows expansion,
    and is refused with a condition and a Warning Event where it does not."""
    classes = "/apis/storage.k8s.io/v1/storageclasses"
    await cluster.kube.create(classes, {
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": "expandable"}, "provisioner": "test",
        "allowVolumeExpansion": True})
    await cluster.kube.create(path(KIND, NAMESPACE, api=CR_API), quorum_object(
        NAME, 3, storage={"size": "1Gi", "storageClassName": "expandable"}))
    await cluster.ready_with(3)

    async def sizes() -> set[str]:
        claims = await cluster.kube.list(path("PersistentVolumeClaim", NAMESPACE),
                                         {"app.kubernetes.io/instance": NAME})
        return {c["spec"]["resources"]["requests"]["storage"] for c in claims}

    await cluster.kube.patch(cr_path(NAME), {"spec": {"storage": {"size": "2Gi"}}})

    async def grown() -> bool:
        return await sizes() == {"2Gi"}

    await cluster.wait("the claims grown to 2Gi", grown, 30)
    await cluster.kube.patch(f"{classes}/expandable", {"allowVolumeExpansion": False})
    await cluster.kube.patch(cr_path(NAME), {"spec": {"storage": {"size": "3Gi"}}})

    async def blocked() -> bool:
        return condition(await cluster.get(), "VolumeResizeBlocked") == "True"

    await cluster.wait("VolumeResizeBlocked", blocked, 30)
    assert await sizes() == {"2Gi"}
    reasons = [reason for reason, _ in await cluster.events()]
    assert reasons.count("VolumeExpanding") == 3 and "VolumeResizeBlockedTrue" in reasons


@dataclass
class SwitchWriter(Writer):
    """A Writer that follows a TLS switch: it puts to whichever protocol the nodes speak (HTTPS
    with the operator's certificate, else plain HTTP), and remembers when each write was
    acknowledged."""

    times: list[float] = field(default_factory=list)

    def _run(self) -> None:
        secure = QuorumClient([f"https://{s}" for s in self.servers], timeout_s=2,
                              credentials=self.credentials)
        plain = QuorumClient([f"http://{s}" for s in self.servers], timeout_s=2)
        clients = [secure, plain]
        count = 0
        with secure, plain:
            while not self._stop.is_set():
                key, value = f"key-{count}", f"value-{count}"
                for client in list(clients):
                    try:
                        client.put(key, value)
                    except QuorumClientError:
                        self.failures += 1
                        clients.reverse()  # the other protocol first next time
                        continue
                    self.acknowledged[key] = value
                    self.times.append(time.monotonic())
                    break
                count += 1
                time.sleep(0.02)

    def longest_gap(self, since: float, until: float) -> float:
        """The longest time without an acknowledged write between ``since`` and ``until``."""
        marks = [since, *(t for t in self.times if since < t < until), until]
        return max(b - a for a, b in itertools.pairwise(marks))

    def lost_over(self, tls: bool) -> list[str]:
        """``lost``, read over HTTPS or plain HTTP."""
        scheme, credentials = ("https", self.credentials) if tls else ("http", None)
        with QuorumClient([f"{scheme}://{s}" for s in self.servers], timeout_s=20,
                          credentials=credentials) as client:
            return [key for key, value in self.acknowledged.items() if client.get(key) != value]


@pytest.mark.slow  # minutes: its own CI step (.ci/run)
@pytest.mark.timeout(1500)
async def test_tls_switched_off_and_on_by_staged_rolls_keeping_the_quorum(
        cluster: Cluster) -> None:
    """A TLS switch is rolled one pod at a time through a second controller listener (four
    stages and the steady configuration): a writer keeps getting writes acknowledged all along
    (no gap longer than a leader's restart), and none is lost."""
    await create_ready(cluster)
    directories = await cluster.voter_directories()
    writer = SwitchWriter(cluster.servers(range(1, 4)), await cluster.credentials())
    writer.start()
    timings, gaps = {}, {}
    try:
        for enabled in (False, True):
            started = time.monotonic()
            await cluster.kube.patch(cr_path(NAME), {"spec": {"security": {"tls": {
                "enabled": enabled}}}})
            protocol = "SSL" if enabled else "PLAINTEXT"

            async def switched(protocol: str = protocol, enabled: bool = enabled) -> bool:
                try:
                    configs = await cluster.configs()
                except AssertionError:
                    return False  # a deleted pod whose revision's ConfigMap is collected
                body = await cluster.get()
                return len(configs) == 3 and all(
                    c["QUORUM_LISTENER_SECURITY_PROTOCOL_MAP"] ==
                    f"CLIENT:{protocol},CONTROLLER:{protocol}" for c in configs.values()) and \
                    "tlsSwitch" not in (body.get("status") or {}) and \
                    condition(body, "Ready") == "True" and \
                    condition(body, "Secured") == ("True" if enabled else "False")

            await cluster.wait(f"TLS {'on' if enabled else 'off'} on every node", switched, 600)
            timings[enabled] = time.monotonic() - started
            gaps[enabled] = writer.longest_gap(started, time.monotonic())
    finally:
        writer.stop()
    lost = await asyncio.to_thread(writer.lost_over, True)
    reasons = [reason for reason, _ in await cluster.events()]
    print(f"\n[operator] staged TLS switch: off in {timings[False]:.1f} s (longest time without "
          f"an acknowledged write {gaps[False]:.1f} s), on in {timings[True]:.1f} s "
          f"({gaps[True]:.1f} s); {len(writer.acknowledged)} writes acknowledged, "
          f"{writer.failures} failed tries, {len(lost)} lost")
    assert await cluster.voter_directories() == directories  # the same volumes, no remediation
    assert lost == [] and len(writer.acknowledged) > 100
    assert reasons.count("TLSSwitch") >= 10  # 4 stages and the end, both ways
    # No outage: the longest gap is a leader's restart (it resigns; a follower takes over:
    # 0.2-4.1 s measured), where the restart of every pod together took 8-19 s, before pods
    # started with the harness's realistic delay.
    assert max(gaps.values()) < 7, gaps
