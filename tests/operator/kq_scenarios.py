"""The operator's scenarios, written once against a small cluster interface (``QuorumCluster``)
and run by three backends: the emulated cluster of ``kq_cluster`` (the default suite), a real
control plane built from source (``tests/kube/``) and a real kind cluster
(``e2e/test_kind.py``). Each scenario waits on what a platform engineer would look at (the
KafkaQuorum's status and conditions, its Events, its pods and claims), acts as an administrator
would (delete a claim and a pod, patch the spec), and returns how long it took;
``Timings`` prints every measurement (``-s``) and keeps them for the summary.

This module imports no backend: only the interface, the standard library and the
operator's names.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

ROLLING = "(RollingUpdate)"
# What the operator does; none of it may happen while it must not change anything.
CHANGES = frozenset({"VoterAdded", "VoterRemoved", "PodCreated", "PodDeleted", "ClaimCreated",
                     "ClaimDeleted", "VoterChangePending"})


class Load(Protocol):
    """A client writing unique keys all along with the operator's credentials; it remembers
    what was acknowledged."""

    acknowledged: dict[str, str]
    failures: int

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def lost(self) -> list[str]:
        """Acknowledged keys a linearizable read does not return as written (blocking)."""
        ...


class QuorumCluster(Protocol):
    """One KafkaQuorum on a cluster with the operator running, as the scenarios see it."""

    name: str
    # How long the slowest step may take here (a real cluster pulls images and attaches
    # volumes; seconds).
    patience_s: float

    async def create(self, replicas: int) -> None:
        """Apply a KafkaQuorum of ``replicas`` (the backend's image and spec defaults)."""

    async def quorum(self) -> dict[str, Any]:
        """The KafkaQuorum as the API server has it."""

    async def patch_spec(self, spec: Mapping[str, Any]) -> None:
        """A merge patch of the KafkaQuorum's spec."""

    async def events(self) -> list[tuple[str, str]]:
        """The quorum's Events (reason, message), in the order they were posted."""

    async def pods(self) -> list[dict[str, Any]]:
        """The quorum's pods (terminating ones too)."""

    async def claims(self) -> list[dict[str, Any]]:
        """The quorum's volume claims (terminating ones too)."""

    async def pod_config(self, pod: Mapping[str, Any]) -> dict[str, str]:
        """The node configuration a running pod was made with (its ConfigMap's data)."""

    async def delete_claim_and_pod(self, node_id: int) -> None:
        """Delete a member's volume claim, then its pod (the claim goes once the pod is gone):
        what an administrator does to replace a broken disk."""

    async def empty_volume(self, node_id: int) -> None:
        """The member's volume emptied under the same claim (a disk replaced behind the
        claim), its pod then deleted."""

    async def delete_pod(self, node_id: int) -> None:
        """Delete a member's pod (gracefully)."""

    async def load(self) -> Load:
        """A new writer (not started), with the operator's client credentials."""

    async def refused_without_credentials(self) -> str | None:
        """Why a client without credentials got nothing from a node (None: it was served)."""

    def next_image(self) -> str:
        """An image the nodes may be updated to."""


class EvictingCluster(QuorumCluster, Protocol):
    """A cluster whose kubelet can be made to end a pod for good."""

    async def evict(self, node_id: int, reason: str) -> None:
        """The member's pod ends for good, its container stopped, in phase Failed with
        ``reason`` (Evicted: node pressure; Terminated: a graceful node shutdown); the pod
        object stays, as the kubelet leaves it."""


@dataclass
class Timings:
    """What each scenario took, printed as it is measured."""

    backend: str
    seconds: dict[str, float] = field(default_factory=dict)

    def record(self, what: str, seconds: float) -> float:
        self.seconds[what] = seconds
        print(f"\n[scenario {self.backend}] {what}: {seconds:.1f} s", flush=True)
        return seconds

    def summary(self) -> str:
        return ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items())


def condition(body: Mapping[str, Any] | None, kind: str) -> str | None:
    for entry in ((body or {}).get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind:
            return str(entry.get("status"))
    return None


def members(body: Mapping[str, Any]) -> dict[int, str]:
    """Recorded voter directories by node id."""
    return {m["nodeId"]: m["directoryId"] for m in (body.get("status") or {}).get("members")
            or [] if m.get("directoryId")}


async def wait_for(cluster: QuorumCluster, what: str, check: Callable[[], Awaitable[Any]],
                   timeout_s: float | None = None, interval_s: float = 0.5) -> Any:
    """``check``'s first truthy answer; an AssertionError naming ``what`` and the status last
    seen after ``timeout_s`` (default: the backend's patience)."""
    deadline = time.monotonic() + (timeout_s if timeout_s is not None else cluster.patience_s)
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = await check()
        except (OSError, KeyError, ValueError) as error:  # a transient API error: ask again
            last = error
        if last and not isinstance(last, Exception):
            return last
        await asyncio.sleep(interval_s)
    body = await cluster.quorum()
    reasons = [reason for reason, _ in await cluster.events()][-30:]
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})\n"
                         f"status: {body.get('status')}\nevents: {reasons}")


async def ready_with(cluster: QuorumCluster, voters: int,
                     timeout_s: float | None = None) -> dict[str, Any]:
    async def ready() -> dict[str, Any] | None:
        body = await cluster.quorum()
        status = body.get("status") or {}
        if condition(body, "Ready") == "True" and status.get("voters") == voters:
            return body
        return None

    found: dict[str, Any] = await wait_for(cluster, f"Ready with {voters} voters", ready,
                                           timeout_s)
    return found


async def leader(cluster: QuorumCluster) -> int:
    found = (await cluster.quorum()).get("status", {}).get("leaderId")
    assert isinstance(found, int), found
    return found


async def running_pods(cluster: QuorumCluster) -> list[dict[str, Any]]:
    return [p for p in await cluster.pods() if not p["metadata"].get("deletionTimestamp")]


# --- the scenarios ------------------------------------------------------------------------


async def create_and_ready(cluster: QuorumCluster, timings: Timings, replicas: int = 3) -> float:
    """A new KafkaQuorum becomes Ready with ``replicas`` voters, a cluster id and every member
    recorded."""
    started = time.monotonic()
    await cluster.create(replicas)
    body = await ready_with(cluster, replicas)
    elapsed = timings.record("Ready", time.monotonic() - started)
    status = body["status"]
    assert status["clusterId"] and status["bootstrapped"] is True, status
    assert sorted(members(body)) == list(range(1, replicas + 1)), status
    return elapsed


async def tls_by_default(cluster: QuorumCluster, load: Load) -> None:
    """Security is on without asking: every node serves TLS only and requires client
    credentials; a client with the operator's credentials reads and writes."""
    body = await cluster.quorum()
    assert condition(body, "Secured") == "True", body.get("status")
    pods = await running_pods(cluster)
    for pod in pods:
        config = await cluster.pod_config(pod)
        assert config["QUORUM_LISTENER_SECURITY_PROTOCOL_MAP"] == \
            "CLIENT:SSL,CONTROLLER:SSL", (pod["metadata"]["name"], config)
    refusal = await cluster.refused_without_credentials()
    assert refusal is not None and "UNAUTHENTICATED" in refusal, refusal

    async def written() -> bool:
        return len(load.acknowledged) >= 10

    await wait_for(cluster, "writes acknowledged with the operator's credentials", written, 60)


async def heal_deleted_claim(cluster: QuorumCluster, timings: Timings, node_id: int,
                             what: str) -> float:
    """The member's claim and pod deleted: a new claim, a new directory id, the old one
    replaced in the voter set (AddVoter, then RemoveVoter), Ready again with the same number of
    voters; the other members keep theirs."""
    before = members(await cluster.quorum())
    since = len(await cluster.events())
    started = time.monotonic()
    await cluster.delete_claim_and_pod(node_id)
    await _healed(cluster, node_id, before, what, since)
    return timings.record(what, time.monotonic() - started)


async def heal_emptied_volume(cluster: QuorumCluster, timings: Timings, node_id: int,
                              what: str) -> float:
    """The member's volume emptied under the same claim: healed the same way."""
    before = members(await cluster.quorum())
    claims = {c["metadata"]["name"]: c["metadata"]["uid"] for c in await cluster.claims()}
    since = len(await cluster.events())
    started = time.monotonic()
    await cluster.empty_volume(node_id)
    await _healed(cluster, node_id, before, what, since)
    elapsed = timings.record(what, time.monotonic() - started)
    after = {c["metadata"]["name"]: c["metadata"]["uid"] for c in await cluster.claims()}
    assert after == claims, "the claims were replaced"
    return elapsed


async def _healed(cluster: QuorumCluster, node_id: int, before: Mapping[int, str],
                  what: str, since: int) -> None:
    """Healed; at no time on the way did the operator say the quorum was lost (one volume of
    three is not a majority)."""
    async def healed() -> bool:
        body = await cluster.quorum()
        now = members(body)
        last = (body.get("status") or {}).get("lastRemediation") or {}
        return condition(body, "Ready") == "True" and len(now) == len(before) and \
            now.get(node_id) not in (None, before[node_id]) and \
            last.get("result") == "Succeeded" and last.get("nodeId") == node_id and \
            not body["status"].get("pendingChange")

    await wait_for(cluster, what, healed)
    reasons = [reason for reason, _ in (await cluster.events())[since:]]
    assert "QuorumLostTrue" not in reasons, reasons
    now = members(await cluster.quorum())
    assert {i: d for i, d in now.items() if i != node_id} == \
        {i: d for i, d in before.items() if i != node_id}
    last = (await cluster.quorum())["status"]["lastRemediation"]
    assert [s["name"] for s in last["steps"]] == ["Detected", "CaughtUp", "AddVoter",
                                                   "RemoveVoter"], last


async def rolling_update(cluster: QuorumCluster, timings: Timings) -> float:
    """A new image and a changed node configuration: one pod at a time, the leader last; every
    pod then runs the new image with the new configuration."""
    image = cluster.next_image()
    body = await cluster.quorum()
    timeout = int((body["spec"].get("config") or {}).get("electionTimeoutMs") or 1000) + 100
    first_leader = await leader(cluster)
    since = len(await cluster.events())
    started = time.monotonic()
    await cluster.patch_spec({"image": image, "config": {"electionTimeoutMs": timeout}})
    key = "QUORUM_CONTROLLER_QUORUM_ELECTION_TIMEOUT_MS"

    async def rolled() -> bool:
        pods = await running_pods(cluster)
        if len(pods) != 3 or condition(await cluster.quorum(), "Ready") != "True":
            return False
        for pod in pods:
            if pod["spec"]["containers"][0]["image"] != image or \
                    (await cluster.pod_config(pod)).get(key) != str(timeout):
                return False
        return True

    await wait_for(cluster, "the image and configuration rolled out", rolled)
    elapsed = timings.record("rolling update", time.monotonic() - started)
    rolled_pods = [message.split()[1] for reason, message in (await cluster.events())[since:]
                   if reason == "PodDeleted" and ROLLING in message]
    assert sorted(rolled_pods) == [f"{cluster.name}-{i}" for i in (1, 2, 3)], rolled_pods
    assert rolled_pods[-1] == f"{cluster.name}-{first_leader}", (rolled_pods, first_leader)
    return elapsed


async def scale(cluster: QuorumCluster, timings: Timings, replicas: int) -> float:
    """``replicas`` voters, each a pod and a claim of its own; every node configured with
    ``replicas`` voters. Up: the voters list rolled out first, then AddVoter one at a time;
    down: RemoveVoter (decommission), the pod, the claim, then the list shrinks."""
    before = len(await running_pods(cluster))
    started = time.monotonic()
    await cluster.patch_spec({"replicas": replicas})

    async def done() -> bool:
        body = await cluster.quorum()
        if condition(body, "Ready") != "True" or body["status"].get("voters") != replicas:
            return False
        pods, claims = await cluster.pods(), await cluster.claims()
        if len(pods) != replicas or len(claims) != replicas or \
                any(p["metadata"].get("deletionTimestamp") for p in pods):
            return False
        voters = {(await cluster.pod_config(p))["QUORUM_CONTROLLER_QUORUM_VOTERS"].count("@")
                  for p in pods}
        return voters == {replicas}

    await wait_for(cluster, f"{replicas} voters, pods, claims, and configured so", done)
    elapsed = timings.record(f"scale {before} -> {replicas}", time.monotonic() - started)
    body = await cluster.quorum()
    assert sorted(members(body)) == list(range(1, replicas + 1)), body["status"]
    assert condition(body, "ScalingBlocked") != "True", body["status"]
    reasons = {reason for reason, _ in await cluster.events()}
    assert ("VoterAdded" if replicas > before else "VoterRemoved") in reasons
    assert "VoterChangeRefused" not in reasons, reasons
    return elapsed


async def pause(cluster: QuorumCluster, timings: Timings, node_id: int,
                hold_s: float) -> float:
    """``spec.paused``: a deleted pod is not made again for ``hold_s`` and nothing else is
    changed (condition Paused); unpaused, the pod is back and the quorum Ready."""
    await cluster.patch_spec({"paused": True})

    async def paused() -> bool:
        return condition(await cluster.quorum(), "Paused") == "True"

    await wait_for(cluster, "Paused", paused, 60)
    since = len(await cluster.events())
    await cluster.delete_pod(node_id)
    name = f"{cluster.name}-{node_id}"

    async def gone() -> bool:
        return all(p["metadata"]["name"] != name for p in await cluster.pods())

    await wait_for(cluster, f"pod {name} gone", gone, 60)
    await asyncio.sleep(hold_s)
    assert all(p["metadata"]["name"] != name for p in await cluster.pods()), \
        "a pod was made while paused"
    later = [reason for reason, _ in (await cluster.events())[since:]]
    assert not CHANGES & set(later), later
    started = time.monotonic()
    await cluster.patch_spec({"paused": False})
    await ready_with(cluster, 3)
    assert condition(await cluster.quorum(), "Paused") == "False"
    return timings.record("unpaused to Ready", time.monotonic() - started)


async def quorum_loss(cluster: QuorumCluster, timings: Timings, hold_s: float) -> float:
    """2 of 3 volumes emptied: QuorumLost (pointing at the manual recovery), and from then on
    nothing is created, deleted or changed in the voter set; the record of the voters kept."""
    before = members(await cluster.quorum())
    victims = [i for i in (1, 2, 3) if i != await leader(cluster)]
    started = time.monotonic()
    for node_id in victims:
        await cluster.empty_volume(node_id)

    async def lost() -> bool:
        return condition(await cluster.quorum(), "QuorumLost") == "True"

    await wait_for(cluster, "QuorumLost", lost)
    elapsed = timings.record("QuorumLost", time.monotonic() - started)
    # Pods being recreated on the emptied volumes settle first (they were deleted before
    # the loss was known).
    await asyncio.sleep(2)

    async def uids() -> tuple[set[str], set[str]]:
        return ({p["metadata"]["uid"] for p in await cluster.pods()},
                {c["metadata"]["uid"] for c in await cluster.claims()})

    objects = await uids()
    since = len(await cluster.events())
    await asyncio.sleep(hold_s)
    body = await cluster.quorum()
    assert condition(body, "QuorumLost") == "True", body["status"]
    assert condition(body, "Ready") == "False" and condition(body, "Quorate") == "False"
    message = next(c["message"] for c in body["status"]["conditions"]
                   if c["type"] == "QuorumLost")
    assert "docs/operator.md" in message, message
    assert await uids() == objects, "a pod or claim was created or deleted"
    later = [reason for reason, _ in (await cluster.events())[since:]]
    assert not CHANGES & set(later), later
    assert members(body) == before  # kept for the manual recovery
    return elapsed


async def heal_evicted(cluster: EvictingCluster, timings: Timings) -> float:
    """Both followers' pods end in phase Failed (one evicted, one stopped by a node shutdown):
    the leader alone is no majority, and nothing but their replacement brings it back. The
    operator deletes each Failed pod (Event PodDeleted, reason Failed) and makes it again on its
    volume: the same directories, so no voter change; Ready again."""
    body = await ready_with(cluster, 3)
    before = members(body)
    first = await leader(cluster)
    followers = [i for i in (1, 2, 3) if i != first]
    names = {f"{cluster.name}-{i}" for i in followers}
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in await cluster.pods()}
    since = len(await cluster.events())
    started = time.monotonic()
    for node_id, reason in zip(followers, ("Evicted", "Terminated"), strict=True):
        await cluster.evict(node_id, reason)

    async def back() -> bool:
        pods = {p["metadata"]["name"]: p for p in await running_pods(cluster)}
        return all(name in pods and pods[name]["metadata"]["uid"] != uids[name] and
                   (pods[name].get("status") or {}).get("phase") == "Running"
                   for name in names) and \
            condition(await cluster.quorum(), "Ready") == "True"

    await wait_for(cluster, "the Failed pods made again, the quorum Ready", back)
    elapsed = timings.record("evicted followers back", time.monotonic() - started)
    later = await cluster.events()
    deleted = sorted(message.split()[1] for reason, message in later[since:]
                     if reason == "PodDeleted" and "(Failed)" in message)
    assert deleted == sorted(names), [m for _, m in later[since:]]
    reasons = {reason for reason, _ in later[since:]}
    assert not reasons & {"VoterAdded", "VoterRemoved", "QuorumLostTrue"}, reasons
    assert members(await cluster.quorum()) == before
    return elapsed


async def no_write_lost(load: Load, minimum: int) -> str:
    """Stop the load; every acknowledged write reads back as written."""
    load.stop()
    lost = await asyncio.to_thread(load.lost)
    summary = f"{len(load.acknowledged)} acknowledged writes, {load.failures} failed tries, " \
              f"{len(lost)} lost"
    assert lost == [], f"{summary}: {lost[:10]}"
    assert len(load.acknowledged) >= minimum, summary
    return summary


async def lifecycle(cluster: QuorumCluster, timings: Timings, hold_s: float) -> None:
    """Create, TLS by default, then under a writer all along: heal a follower's and the
    leader's deleted claim, an emptied volume, a rolling update of image and configuration,
    pause; no acknowledged write lost; last, the loss of 2 of 3 volumes."""
    await create_and_ready(cluster, timings)
    load = await cluster.load()
    load.start()
    try:
        await tls_by_default(cluster, load)
        current = await leader(cluster)
        follower = next(i for i in (1, 2, 3) if i != current)
        await heal_deleted_claim(cluster, timings, follower, "heal follower")
        await heal_deleted_claim(cluster, timings, await leader(cluster), "heal leader")
        current = await leader(cluster)
        await heal_emptied_volume(cluster, timings, next(i for i in (3, 2, 1) if i != current),
                                  "heal emptied volume")
        await rolling_update(cluster, timings)
        current = await leader(cluster)
        await pause(cluster, timings, next(i for i in (1, 2, 3) if i != current), hold_s)
    finally:
        load.stop()
    print(f"\n[scenario {timings.backend}] {await no_write_lost(load, 50)}")
    await quorum_loss(cluster, timings, hold_s)
    print(f"\n[scenario {timings.backend}] lifecycle: {timings.summary()}")


async def scaling(cluster: QuorumCluster, timings: Timings) -> None:
    """3 -> 5 -> 3 under a writer; no acknowledged write lost."""
    await create_and_ready(cluster, timings)
    load = await cluster.load()
    load.start()
    try:
        await scale(cluster, timings, 5)
        await scale(cluster, timings, 3)
    finally:
        load.stop()
    print(f"\n[scenario {timings.backend}] {await no_write_lost(load, 50)}")
    print(f"\n[scenario {timings.backend}] scaling: {timings.summary()}")
