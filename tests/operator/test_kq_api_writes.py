"""The operator's writes to the API server on a cluster's day two, against the emulated cluster
(``kq_cluster``): a create the API server refuses (a ResourceQuota) is a condition and a Warning
Event and is tried again with a growing back-off; a repeated Event is counted on one Event
object; the status is written when it changes, its volatile figures (offsets, lag) at most every
``VOLATILE_STATUS_S`` under a steady write load."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import kmock
import pytest
from kafka_quorum_operator import ANNOTATION_REJECTIONS, KIND
from kafka_quorum_operator import reconcile as rc
from kafka_quorum_operator import resources as r
from kafka_quorum_operator.events import EventRecorder
from kafka_quorum_operator.kube import Kube, KubeError, path
from kafka_quorum_operator.nodes import NodeClient
from kafka_quorum_operator.observe import CreateRefused
from kafka_quorum_operator.reconcile import CR_API
from kq_cluster import NAME, Cluster, Writer, create_ready
from kq_harness import NAMESPACE, condition, cr_path, quorum_object

pytestmark = pytest.mark.timeout(240)
QUOTAS = f"/api/v1/namespaces/{NAMESPACE}/resourcequotas"


def creates(cluster: Cluster, plural: str, name: str) -> int:
    """How many times the operator asked the API server to create that object."""
    return sum(1 for q in cluster.emulator.seen
               if q.action == kmock.action.CREATE and q.resource is not None and
               q.resource.plural == plural and isinstance(q.data, dict) and
               (q.data.get("metadata") or {}).get("name") == name)


def status_patches(cluster: Cluster) -> int:
    return sum(1 for q in cluster.emulator.seen
               if q.action == kmock.action.UPDATE and q.resource is not None and
               q.resource.plural == "kafkaquorums" and q.subresource == "status")


async def events(kube: Kube, reason: str) -> list[dict[str, Any]]:
    return [e for e in await kube.list(path("Event", NAMESPACE), {}) if e.get("reason") == reason]


def attempts_by(elapsed_s: float) -> int:
    """Attempts a refused create may make in ``elapsed_s`` after its first: the back-off's
    schedule."""
    attempts, at = 1, 0.0
    while True:
        at += min(rc.CREATE_BACKOFF_MAX_S, rc.CREATE_BACKOFF_S * 2 ** (attempts - 1))
        if at > elapsed_s:
            return attempts
        attempts += 1


@pytest.mark.slow
async def test_a_refused_create_is_a_condition_a_counted_event_and_backed_off(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ResourceQuota of two pods refuses the third pod: condition CreateRefused (the API
    server's reason and message, the pod named), one Warning Event counting every attempt, no
    attempt before the back-off runs out, one at once when the spec changes, and the pod made
    once the quota is gone."""
    monkeypatch.setattr(rc, "CREATE_BACKOFF_S", 1000.0)
    monkeypatch.setattr(rc, "CREATE_BACKOFF_MAX_S", 1000.0)
    await cluster.kube.create(QUOTAS, {
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "compute", "namespace": NAMESPACE}, "spec": {"hard": {"pods": "2"}}})
    await cluster.kube.create(path(KIND, NAMESPACE, api=CR_API), quorum_object(NAME, 3))

    async def refused() -> dict[str, Any] | None:
        body = await cluster.get()
        found = [c for c in (body.get("status") or {}).get("conditions") or []
                 if c["type"] == "CreateRefused" and c["status"] == "True"]
        return found[0] if found else None

    shown = await cluster.wait("condition CreateRefused", refused, 60)
    pod = r.pod_name(NAME, 3)
    assert shown["reason"] == "Forbidden", shown
    assert f"Pod {pod}: " in shown["message"] and "exceeded quota: compute" in shown["message"]
    await asyncio.sleep(3)  # six passes
    assert creates(cluster, "pods", pod) == 1, "tried again before the back-off ran out"

    # A new spec is tried at once, and the back-off starts over (short, from here on).
    monkeypatch.setattr(rc, "CREATE_BACKOFF_S", 1.0)
    monkeypatch.setattr(rc, "CREATE_BACKOFF_MAX_S", 4.0)
    # (The emulator makes a new generation of a spec patch that carries metadata.)
    await cluster.kube.patch(cr_path(NAME), {"metadata": {}, "spec": {"paused": False}})

    async def tried_again() -> bool:
        return creates(cluster, "pods", pod) == 2

    await cluster.wait("an attempt after the spec changed", tried_again, 30)
    since = time.monotonic()
    await asyncio.sleep(10)
    elapsed = time.monotonic() - since
    attempts = creates(cluster, "pods", pod)
    # The schedule since the second attempt, plus one pass's lateness in observing it.
    assert 3 <= attempts <= 1 + attempts_by(elapsed + 1), (attempts, elapsed)

    async def counted() -> list[dict[str, Any]]:
        found = await events(cluster.kube, "CreateRefused")
        return found if found and found[0].get("count") == creates(cluster, "pods", pod) \
            else []

    warned = await cluster.wait("the Warning counting every attempt", counted, 10)
    assert len(warned) == 1 and warned[0]["type"] == "Warning", warned
    assert warned[0]["message"].startswith(f"Pod {pod}: Forbidden: pods \"{pod}\" is forbidden")
    print(f"\n[refused] {attempts} attempts in {elapsed + 0:.1f} s after the spec change "
          f"(back-off 1 s doubling to 4 s; passes every 0.5 s); one Event, count "
          f"{warned[0]['count']}")

    await cluster.kube.delete(f"{QUOTAS}/compute")

    async def made() -> bool:
        return await cluster.kube.get(path("Pod", NAMESPACE, pod)) is not None and \
            condition(await cluster.get(), "CreateRefused") == "False"

    await cluster.wait("the pod made once the quota is gone", made, 30)
    await cluster.ready_with(3, 120)


def test_create_backoff_doubles_to_its_cap() -> None:
    error = KubeError(422, 'Pod "kq-1" is invalid', "Invalid")
    obj = {"kind": "Pod", "metadata": {"name": "kq-1"}}
    refusal: CreateRefused | None = None
    delays = []
    for _ in range(10):
        refusal = rc.create_refused(refusal, obj, error, 1000.0, 4)
        delays.append(refusal.retry_at - 1000.0)
    assert delays == [5, 10, 20, 40, 80, 160, 300, 300, 300, 300]
    assert refusal is not None and (refusal.reason, refusal.attempts, refusal.generation) == (
        "Invalid", 10, 4)
    assert rc.refused_create(KubeError(403, "forbidden", "Forbidden"))
    assert rc.refused_create(error)
    assert not rc.refused_create(KubeError(409, "exists", "AlreadyExists"))
    assert not rc.refused_create(KubeError(500, "etcd", "InternalError"))
    assert not rc.refused_create(KubeError(0, "connection refused"))


async def test_a_repeated_event_is_counted_on_one_event(kube: Kube) -> None:
    """The same Event over N passes is one Event with count N, as client-go's recorder makes it;
    another message is another Event; one gone (expired) is posted again."""
    now = [1_700_000_000.0]
    recorder = EventRecorder(kube, lambda: now[0], "operator-a")
    owner = r.Owner("kq", NAMESPACE, "uid-1")
    for _ in range(5):
        await recorder.post(owner, "CreateRefused", "Pod kq-3: Forbidden", "Warning")
        now[0] += 7
    await recorder.post(owner, "CreateRefused", "Pod kq-2: Forbidden", "Warning")
    found = sorted(await events(kube, "CreateRefused"), key=lambda e: -e["count"])
    assert [(e["message"], e["count"]) for e in found] == [
        ("Pod kq-3: Forbidden", 5), ("Pod kq-2: Forbidden", 1)]
    repeated = found[0]
    assert (repeated["firstTimestamp"], repeated["lastTimestamp"]) == (
        "2023-11-14T22:13:20Z", "2023-11-14T22:13:48Z")
    assert repeated["reportingInstance"] == "operator-a"
    assert repeated["involvedObject"]["uid"] == "uid-1"
    await kube.delete(path("Event", NAMESPACE, repeated["metadata"]["name"]))
    await recorder.post(owner, "CreateRefused", "Pod kq-3: Forbidden", "Warning")
    again = [e for e in await events(kube, "CreateRefused") if e["message"].startswith("Pod kq-3")]
    assert [e["count"] for e in again] == [1]


@pytest.mark.slow
async def test_status_is_written_when_it_changes_not_every_pass(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a steady writer the offsets move every pass: the status is written at most every
    ``VOLATILE_STATUS_S`` (shortened here), and still follows the figures."""
    monkeypatch.setattr(rc, "VOLATILE_STATUS_S", 4.0)
    await create_ready(cluster)
    writer = Writer(cluster.servers(range(1, 4)))
    writer.start()
    try:
        await asyncio.sleep(3)  # the writer under way
        before, high = status_patches(cluster), (await cluster.status()).get("highWatermark")
        started = time.monotonic()
        await asyncio.sleep(20)
        written = status_patches(cluster) - before
        elapsed = time.monotonic() - started
        after = (await cluster.status()).get("highWatermark")
    finally:
        writer.stop()
    assert len(writer.acknowledged) > 100, "the writer did not write"
    print(f"\n[status] {written} status writes in {elapsed:.1f} s under a writer "
          f"({len(writer.acknowledged)} writes acknowledged), passes every 0.5 s, volatile "
          f"figures at most every {rc.VOLATILE_STATUS_S} s")
    assert isinstance(high, int) and isinstance(after, int) and after > high
    assert 2 <= written <= elapsed / rc.VOLATILE_STATUS_S + 2, written
    assert condition(await cluster.get(), "Ready") == "True"


@pytest.mark.slow
async def test_a_roll_waits_while_the_budget_allows_no_disruption(cluster: Cluster) -> None:
    """A rolling update restarts each pod through the Eviction API: while the quorum's budget
    allows no disruption (a drain holds it), no pod is restarted and an Event says why; once it
    allows one, the roll goes on, one pod at a time."""
    await create_ready(cluster)
    budget = path("PodDisruptionBudget", NAMESPACE, NAME)
    await cluster.kube.patch(f"{budget}/status", {"status": {"disruptionsAllowed": 0}})
    await cluster.kube.patch(cr_path(NAME), {"metadata": {},
                                             "spec": {"config": {"electionTimeoutMs": 1100}}})

    async def refused() -> list[dict[str, Any]] | None:
        return await events(cluster.kube, "EvictionRefused") or None

    shown = await cluster.wait("Event EvictionRefused", refused, 60)
    assert "disruption budget allows no disruption" in shown[0]["message"], shown
    pods = await cluster.kube.list(path("Pod", NAMESPACE), {})
    assert not [p["metadata"]["name"] for p in pods if p["metadata"].get("deletionTimestamp")]
    assert not await events(cluster.kube, "PodDeleted")

    await cluster.kube.patch(f"{budget}/status", {"status": {"disruptionsAllowed": 1}})

    async def rolled() -> list[dict[str, Any]] | None:
        deleted = await events(cluster.kube, "PodDeleted")
        return deleted if len(deleted) == 3 else None

    deleted = await cluster.wait("every pod restarted", rolled, 120)
    assert all("(RollingUpdate)" in e["message"] for e in deleted), deleted
    evictions = [q for q in cluster.emulator.seen if q.subresource == "eviction"]
    assert len({q.name for q in evictions}) == 3, [q.name for q in evictions]
    await cluster.ready_with(3)


async def test_a_spec_the_operator_refuses_is_a_condition_and_an_event(cluster: Cluster
                                                                        ) -> None:
    """A spec an older CRD let through (an unknown node setting): Ready False, reason
    InvalidSpec, the reason in its message, one Warning Event; no child is made."""
    body = quorum_object(NAME, 3, config={"colour": 1})
    await cluster.kube.create(path(KIND, NAMESPACE, api=CR_API), body)

    async def refused() -> dict[str, Any] | None:
        found = [c for c in (await cluster.status()).get("conditions") or []
                 if c["type"] == "Ready" and c.get("reason") == "InvalidSpec"]
        return found[0] if found else None

    shown = await cluster.wait("condition Ready InvalidSpec", refused, 60)
    assert shown["status"] == "False" and "spec.config.colour" in shown["message"], shown
    warned = await events(cluster.kube, "InvalidSpec")
    assert len(warned) == 1 and warned[0]["type"] == "Warning", warned
    assert not await cluster.kube.list(path("Pod", NAMESPACE), {})


REJECTED = {"phase": "Failed", "reason": "OutOfcpu", "message": "Pod was rejected: Node didn't "
            "have enough resource: cpu, requested: 250, used: 3900, capacity: 4000"}


async def test_a_pod_rejected_at_admission_is_made_again_after_a_growing_back_off(
        kube: Kube) -> None:
    """The kubelet rejects the quorum's pod at admission (phase Failed, no container started)
    every time it is made: each replacement waits for the create back-off (5 s, then 10 s, on
    the reconciler's clock), not one per pass; a Warning Event PodRejected and condition
    CreateRefused (reason OutOfcpu) say why; a restarted operator keeps the count (the new pod
    carries it); a new spec replaces the pod at once."""
    now = [1_700_000_000.0]
    pod_path = path("Pod", NAMESPACE, r.pod_name(NAME, 1))
    await kube.create(path(KIND, NAMESPACE, api=CR_API), quorum_object(
        NAME, 1, security={"tls": {"enabled": False}, "networkPolicy": {"enabled": False}}))

    def operator() -> rc.Reconciler:
        return rc.Reconciler(kube, NodeClient(), clock=lambda: now[0])

    async def passes(reconciler: rc.Reconciler, count: int = 1) -> dict[str, Any] | None:
        for _ in range(count):
            body = await kube.get(cr_path(NAME))
            assert body is not None
            await reconciler.reconcile(body)
        return await kube.get(pod_path)

    async def deleted() -> bool:
        """Whether the operator deleted the pod; if so it goes (its kubelet finalizer
        dropped, as the harness's kubelet would)."""
        found = await kube.get(pod_path)
        if found is None or not found["metadata"].get("deletionTimestamp"):
            return False
        await kube.patch(pod_path, {"metadata": {"finalizers": None}})
        return await kube.get(pod_path) is None

    async def reject() -> str:
        await kube.patch(f"{pod_path}/status", {"status": REJECTED})
        made = await kube.get(pod_path)
        assert made is not None
        return str(made["metadata"]["uid"])

    first = operator()
    try:
        made = await passes(first, 2)  # the claim, then the pod
        assert made is not None
        uid = await reject()
        kept = await passes(first, 3)  # three passes at the same instant
        assert kept is not None and kept["metadata"]["uid"] == uid
        assert not kept["metadata"].get("deletionTimestamp"), "replaced at once"
        refused = next(c for c in (await kube.get(cr_path(NAME)) or {})["status"]["conditions"]
                       if c["type"] == "CreateRefused")
        assert (refused["status"], refused["reason"]) == ("True", "OutOfcpu"), refused
        assert "rejected by the kubelet at admission, 1 in a row" in refused["message"]
        warned = await events(kube, "PodRejected")
        assert len(warned) == 1 and warned[0]["count"] == 1 and warned[0]["type"] == "Warning"
        assert "OutOfcpu" in warned[0]["message"] and "in 5 s" in warned[0]["message"]

        now[0] += 5
        await passes(first)
        assert await deleted(), "not deleted once the back-off ran out"
        made = await passes(first)
        assert made is not None and made["metadata"]["uid"] != uid
        assert made["metadata"]["annotations"][ANNOTATION_REJECTIONS] == "1"
        assert condition(await kube.get(cr_path(NAME)), "CreateRefused") == "False"
        await reject()
        now[0] += 5
        await passes(first)
        assert not await deleted()  # 10 s now
    finally:
        await first.nodes.close()

    restarted = operator()  # nothing in memory: the count is on the pod
    try:
        now[0] += 5
        await passes(restarted)
        assert not await deleted()
        now[0] += 10
        await passes(restarted)
        assert await deleted()
        made = await passes(restarted)
        assert made is not None
        assert made["metadata"]["annotations"][ANNOTATION_REJECTIONS] == "2"
        await reject()
        await passes(restarted)
        assert not await deleted()  # 20 s now
        # A new spec (more room, another node) is tried at once.
        await kube.patch(cr_path(NAME), {"metadata": {}, "spec": {"paused": False}})
        await passes(restarted)
        assert await deleted()
        made = await passes(restarted)
        assert made is not None
        assert ANNOTATION_REJECTIONS not in made["metadata"]["annotations"]
    finally:
        await restarted.nodes.close()
