"""The real operator against kmock's emulated Kubernetes API, with every pod's quorum node a real
process (``kq_harness``). A client writes all along; no acknowledged write may be lost.

Acceptance scenarios of issue 5: a 3-voter KafkaQuorum becomes Ready; wiping one voter's volume
(its directory, then deleting its pod) heals to 3 voters with a new directory id; the same for
the leader's volume; wiping 2 of 3 leaves QuorumLost and changes nothing. Timings are printed
(``-s``). Scaling is in ``test_kq_scaling.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import threading
import time
from dataclasses import dataclass, field

import pytest
from kafka_quorum_operator import KIND, handlers
from kafka_quorum_operator.kube import path
from kafka_quorum_operator.reconcile import CR_API
from kq_cluster import NAME, Cluster, Writer, create_ready, heal
from kq_harness import NAMESPACE, OperatorThread, condition, cr_path, quorum_object

from quorum_node.client import QuorumClient, QuorumClientError
from quorum_node.security.client_credentials import ClientCredentials

pytestmark = pytest.mark.timeout(240)


async def test_ready_then_heal_a_follower_and_the_leader(cluster: Cluster) -> None:
    time_to_ready = await create_ready(cluster)
    status = await cluster.status()
    assert status["clusterId"] and status["bootstrapped"] is True
    writer = Writer(cluster.addresses(range(1, 4)))
    writer.start()
    try:
        await asyncio.sleep(1)
        leader = await cluster.leader()
        follower = next(i for i in (1, 2, 3) if i != leader)
        follower_s = await heal(cluster, follower, writer)
        leader = await cluster.leader()
        leader_s = await heal(cluster, leader, writer)
        await asyncio.sleep(1)
    finally:
        writer.stop()
    lost = await asyncio.to_thread(writer.lost)
    quorum_lost_s = await lose_the_majority(cluster)
    reasons = [reason for reason, _ in await cluster.events()]
    print(f"\n[operator] time to Ready {time_to_ready:.1f} s; heal follower {follower_s:.1f} s, "
          f"leader {leader_s:.1f} s; QuorumLost after {quorum_lost_s:.1f} s; "
          f"{len(writer.acknowledged)} acknowledged writes, "
          f"{writer.failures} failed tries, {len(lost)} lost")
    assert len(writer.acknowledged) > 100
    assert lost == []
    for reason in ("ClusterIdGenerated", "PodCreated", "VolumeReplaced", "VoterAdded",
                   "VoterRemoved", "RemediationCompleted"):
        assert reason in reasons, reasons
    last = (await cluster.status())["lastRemediation"]
    print("[operator] last remediation:",
          [(s["name"], s["durationSeconds"]) for s in last["steps"]], last["durationSeconds"])
    assert [s["name"] for s in last["steps"]] == ["Detected", "CaughtUp", "AddVoter",
                                                   "RemoveVoter"]
    assert cluster.operator.alive and cluster.operator.error is None


async def lose_the_majority(cluster: Cluster) -> float:
    """Wipe 2 voters of 3: QuorumLost, and from then on nothing is changed."""
    before = await cluster.voter_directories()
    started = time.monotonic()
    await cluster.wipe(2, 3)

    async def lost() -> bool:
        return condition(await cluster.get(), "QuorumLost") == "True"

    await cluster.wait("QuorumLost", lost, 60)
    elapsed = time.monotonic() - started
    objects = await cluster.objects()
    events = len(await cluster.events())
    await asyncio.sleep(3)  # ten passes of the operator
    body = await cluster.get()
    assert condition(body, "QuorumLost") == "True", (body["status"], await cluster.events())
    assert condition(body, "Ready") == "False" and condition(body, "Quorate") == "False"
    assert "docs/operator.md" in next(c["message"] for c in body["status"]["conditions"]
                                      if c["type"] == "QuorumLost")
    assert await cluster.objects() == objects  # no pod or claim created or deleted
    later = [reason for reason, _ in (await cluster.events())[events:]]
    assert not {"VoterAdded", "VoterRemoved", "PodCreated", "PodDeleted", "ClaimCreated",
                "ClaimDeleted", "VoterChangePending"} & set(later), later
    assert await cluster.voter_directories() == before  # the record is kept for recovery
    return elapsed


@pytest.mark.slow
async def test_operator_restart_between_add_voter_and_remove_voter(cluster: Cluster) -> None:
    """The operator stops right after AddVoter of a replacement (its intent in status); a new
    operator process finishes the replacement with RemoveVoter, and adds nothing twice."""
    await create_ready(cluster)
    old = (await cluster.voter_directories())[3]
    await asyncio.to_thread(cluster.operator.stop)
    # Node 3's disk replaced under its running pod: the kubelet restarts it on the empty volume.
    claim = await cluster.kube.get(path("PersistentVolumeClaim", NAMESPACE, f"data-{NAME}-3"))
    assert claim is not None
    pod = await cluster.kube.get(path("Pod", NAMESPACE, f"{NAME}-3"))
    assert pod is not None
    process = cluster.kubelet.processes[pod["metadata"]["uid"]]
    process.popen.kill()
    await asyncio.to_thread(process.popen.wait, 10)
    volume = cluster.kubelet.claim_dir(claim["metadata"]["uid"])
    shutil.rmtree(volume)
    volume.mkdir()
    nodes = await cluster.node_client()
    leader = await cluster.leader()

    async def observer() -> str | None:
        described = await nodes.describe(cluster.kubelet.address(leader))
        rows = [r for r in described.observers if r.node_id == 3 and r.lag == 0] \
            if described else []
        return rows[0].directory_id if rows else None

    new = await cluster.wait("node 3 back as a caught-up observer", observer, 60)
    assert new != old
    intent = {"kind": "AddVoter", "nodeId": 3, "directoryId": new, "oldDirectoryId": old,
              "reason": "Remediation", "started": "2026-01-01T00:00:00Z"}
    await cluster.kube.patch(cr_path(NAME) + "/status", {"status": {"pendingChange": intent}})
    result = await nodes.add_voter(cluster.kubelet.address(leader), 3, new)
    assert result.ok, result
    await nodes.close()
    events = len(await cluster.events())

    handlers.STATE = handlers._State()  # a new operator process: nothing in memory
    cluster.operator = OperatorThread()
    cluster.operator.start()

    async def finished() -> bool:
        status = await cluster.status()
        directories = {m["nodeId"]: m.get("directoryId") for m in status["members"]}
        return condition(await cluster.get(), "Ready") == "True" and \
            directories[3] == new and "pendingChange" not in status

    await cluster.wait("the replacement finished by the new operator", finished, 60)
    later = [reason for reason, _ in (await cluster.events())[events:]]
    assert "VoterRemoved" in later and "VoterAdded" not in later, later


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
class SwitchWriter:
    """Puts unique keys continuously to whichever protocol the nodes speak (as a client that
    follows a TLS switch would: HTTPS with the operator's certificate, else plain HTTP), and
    remembers when each write was acknowledged."""

    servers: list[str]
    credentials: ClientCredentials
    acknowledged: dict[str, str] = field(default_factory=dict)
    times: list[float] = field(default_factory=list)
    failures: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

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

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(15)

    def longest_gap(self, since: float, until: float) -> float:
        """The longest time without an acknowledged write between ``since`` and ``until``."""
        marks = [since, *(t for t in self.times if since < t < until), until]
        return max(b - a for a, b in itertools.pairwise(marks))

    def lost(self, tls: bool) -> list[str]:
        scheme, credentials = ("https", self.credentials) if tls else ("http", None)
        with QuorumClient([f"{scheme}://{s}" for s in self.servers], timeout_s=20,
                          credentials=credentials) as client:
            return [key for key, value in self.acknowledged.items() if client.get(key) != value]


@pytest.mark.timeout(1500)
async def test_tls_switched_off_and_on_by_staged_rolls_keeping_the_quorum(
        cluster: Cluster) -> None:
    """A TLS switch is rolled one pod at a time through a second controller listener (four
    stages and the steady configuration): a writer keeps getting writes acknowledged all along
    (no gap longer than a leader's restart), and none is lost."""
    await create_ready(cluster)
    directories = await cluster.voter_directories()
    writer = SwitchWriter(cluster.addresses(range(1, 4)), await cluster.credentials())
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
    lost = await asyncio.to_thread(writer.lost, True)
    reasons = [reason for reason, _ in await cluster.events()]
    print(f"\n[operator] staged TLS switch: off in {timings[False]:.1f} s (longest time without "
          f"an acknowledged write {gaps[False]:.1f} s), on in {timings[True]:.1f} s "
          f"({gaps[True]:.1f} s); {len(writer.acknowledged)} writes acknowledged, "
          f"{writer.failures} failed tries, {len(lost)} lost")
    assert await cluster.voter_directories() == directories  # the same volumes, no remediation
    assert lost == [] and len(writer.acknowledged) > 100
    assert reasons.count("TLSSwitch") >= 10  # 4 stages and the end, both ways
    # No outage: the longest gap is a leader's restart (it resigns; a follower takes over),
    # where the restart of every pod together took 8-19 s.
    assert max(gaps.values()) < 5, gaps
