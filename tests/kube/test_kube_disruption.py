"""Voluntary disruptions on the real control plane: a node drained (``kubectl drain``, the
Eviction API against the quorum's PodDisruptionBudget) while the operator rolls the quorum.

The operator's own restarts and a drain's evictions are counted against one budget: a voter
evicted the moment the operator restarts another is refused, the drain waits until the rolled
pod is back, and at no moment are two voters down; no acknowledged write is lost.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from cluster import Cluster
from kafka_quorum_operator.resources import selector
from kq_real import NAMESPACE, RealQuorum
from kq_scenarios import (
    Timings,
    condition,
    create_and_ready,
    leader,
    no_write_lost,
    running_pods,
    wait_for,
)
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


@dataclass
class VoterWatch:
    """The quorum's pods as the API server reports them: which members are down (absent,
    terminating or unready) at each change, and the first pod the operator restarts."""

    api: client.CoreV1Api
    name: str
    members: tuple[int, ...]
    up: dict[int, bool] = field(default_factory=dict)
    most_down: int = 0
    down_at_most: list[tuple[float, list[int]]] = field(default_factory=list)
    first_restarted: int | None = None
    restarted: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)

    def record(self, pod: dict[str, Any], deleted: bool) -> None:
        node_id = int(pod["metadata"]["name"].rsplit("-", 1)[1])
        terminating = bool(pod["metadata"].get("deletionTimestamp"))
        ready = any(c["type"] == "Ready" and c["status"] == "True"
                    for c in (pod.get("status") or {}).get("conditions") or [])
        self.up[node_id] = ready and not terminating and not deleted
        if terminating and self.first_restarted is None:
            self.first_restarted = node_id
            self.restarted.set()
        if len(self.up) < len(self.members):
            return  # the first listing still arriving
        down = sorted(i for i in self.members if not self.up.get(i, False))
        if len(down) > self.most_down:
            self.most_down = len(down)
            self.down_at_most.append((time.monotonic(), down))

    def run(self) -> None:
        stream = watch.Watch()  # type: ignore[no-untyped-call]
        while not self.stop.is_set():
            for event in stream.stream(  # type: ignore[no-untyped-call]
                    self.api.list_namespaced_pod, NAMESPACE,
                    label_selector=selector(self.name), timeout_seconds=5):
                pod = self.api.api_client.sanitize_for_serialization(event["object"])
                self.record(pod, event["type"] == "DELETED")
                if self.stop.is_set():
                    break


def evict(api: client.CoreV1Api, pod: str) -> int:
    """The Eviction API's answer for ``pod``: 201 evicted, 429 refused by the budget."""
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=NAMESPACE))
    try:
        api.create_namespaced_pod_eviction(pod, NAMESPACE, body)
    except ApiException as refused:
        return int(refused.status)
    return 201


@contextmanager
def watching(api: client.CoreV1Api, name: str, members: tuple[int, ...]
             ) -> Iterator[VoterWatch]:
    voters = VoterWatch(api, name, members)
    thread = threading.Thread(target=voters.run, daemon=True)
    thread.start()
    try:
        yield voters
    finally:
        voters.stop.set()
        thread.join(15)


async def test_drain_during_a_rolling_update(kube_cluster: Cluster, operator_installed: None
                                             ) -> None:
    quorum = RealQuorum.named(kube_cluster, "drain")
    timings = Timings("real")
    await create_and_ready(quorum, timings)
    api = client.CoreV1Api(config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kube_cluster.control_plane.admin)))
    load = await quorum.load()
    load.start()
    try:
        with watching(api, quorum.name, (1, 2, 3)) as voters:
            current = await leader(quorum)
            started = time.monotonic()
            await quorum.patch_spec({"config": {"electionTimeoutMs": 1100}})
            assert await asyncio.to_thread(voters.restarted.wait, 120), "no pod was rolled"
            rolled = voters.first_restarted
            # Another voter (not the leader, which rolls last), evicted the moment the operator
            # restarts the first: the budget has no disruption left to give.
            other = next(i for i in (1, 2, 3) if i not in (rolled, current))
            answer = await asyncio.to_thread(evict, api, f"{quorum.name}-{other}")
            pod = json.loads(await quorum.run("get", "pod", f"{quorum.name}-{other}", "-o",
                                              "json"))
            drained = pod["spec"]["nodeName"]
            # The drain: cordon, then evictions retried until the budget allows one.
            drain = asyncio.create_task(asyncio.to_thread(
                kube_cluster.kubectl, "drain", drained, "--ignore-daemonsets",
                "--delete-emptydir-data", "--timeout=300s", timeout_s=330))
            await drain
            timings.record("drain finished, after the roll started", time.monotonic() - started)
            # The drained member's volume is on that node: it comes back once it is uncordoned.
            await asyncio.to_thread(kube_cluster.kubectl, "uncordon", drained)

            async def rolled_out() -> bool:
                pods = await running_pods(quorum)
                if len(pods) != 3 or condition(await quorum.quorum(), "Ready") != "True":
                    return False
                key = "QUORUM_CONTROLLER_QUORUM_ELECTION_TIMEOUT_MS"
                return [(await quorum.pod_config(p)).get(key) for p in pods] == ["1100"] * 3

            await wait_for(quorum, "the roll finished after the drain", rolled_out)
            timings.record("roll finished", time.monotonic() - started)
        assert answer == 429, f"{quorum.name}-{other} evicted while {quorum.name}-{rolled} " \
                              f"restarted (answer {answer})"
        assert voters.most_down <= 1, f"members down at once: {voters.down_at_most}"
    finally:
        load.stop()
    print(f"\n[scenario real] {await no_write_lost(load, 20)}\n{timings.summary()}")
    await asyncio.to_thread(kube_cluster.kubectl, "--namespace", NAMESPACE, "delete",
                            "kafkaquorum", quorum.name, "--wait=false")
