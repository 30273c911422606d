"""Two operator processes (``kafka-quorum-operator``, as the chart runs them with replicas: 2)
against the harness: the active one is frozen (SIGSTOP) in the middle of a disk replacement; the
other takes over only once the lease has expired, finishes the replacement, and the voter set
never holds more than one extra directory; the frozen one, resumed, changes nothing. And the
chart's rolling update in the middle of a replacement: the active one, stopped, releases the
lease and another takes over at once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import kmock
import pytest
from kafka_quorum_operator import KIND
from kafka_quorum_operator.kube import Kube, path
from kafka_quorum_operator.lease import LEASE_DURATION_S, RETRY_PERIOD_S
from kafka_quorum_operator.nodes import NodeClient
from kafka_quorum_operator.reconcile import CR_API
from kq_cluster import NAME, Cluster
from kq_harness import (
    NAMESPACE,
    K8s,
    Kubelet,
    condition,
    declare_resources,
    quorum_object,
    wait_for,
)
from test_kq_process import free_port

pytestmark = pytest.mark.timeout(240)
LEASE = path("Lease", NAMESPACE, "kafka-quorum-operator")


def start_operator(url: str, identity: str, log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "kafka_quorum_operator", "--namespace", NAMESPACE,
         f"--liveness=http://127.0.0.1:{free_port()}/healthz"],
        stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "KQ_OPERATOR_API_SERVER": url, "KQ_OPERATOR_INTERVAL": "0.5",
             "KQ_OPERATOR_NAMESPACE": NAMESPACE, "KQ_OPERATOR_IDENTITY": identity})


@contextlib.asynccontextmanager
async def operators(tmp_path: Path, names: str
                    ) -> AsyncIterator[tuple[Cluster, dict[str, subprocess.Popen[bytes]],
                                             Callable[[str], None]]]:
    """The emulated cluster with an operator process for each of ``names`` (and a function
    that starts another); every process is stopped at the end."""
    async with K8s() as emulator:
        declare_resources(emulator)
        async with kmock.Server(emulator) as server:
            url = str(server.url).rstrip("/")
            kube = Kube.connect(url)
            kubelet = Kubelet(kube, tmp_path)
            logs: dict[str, IO[bytes]] = {}
            processes: dict[str, subprocess.Popen[bytes]] = {}

            def start(name: str) -> None:
                logs[name] = (tmp_path / f"operator-{name}.log").open("wb")
                processes[name] = start_operator(url, name, logs[name])

            for name in names:
                start(name)
            kubelet.start()
            cluster = Cluster(kube, kubelet, None, emulator)  # type: ignore[arg-type]
            try:
                yield cluster, processes, start
            finally:
                for process in processes.values():
                    with contextlib.suppress(ProcessLookupError):
                        process.send_signal(signal.SIGCONT)
                        process.send_signal(signal.SIGINT)
                for process in processes.values():
                    try:
                        await asyncio.to_thread(process.wait, 20)
                    except subprocess.TimeoutExpired:
                        process.kill()
                for log in logs.values():
                    log.close()
                await kubelet.stop()
                kube.close()


@pytest.mark.slow  # tens of seconds: CI's slow operator step
async def test_a_frozen_operator_is_replaced_and_fenced(tmp_path: Path) -> None:
    async with operators(tmp_path, "ab") as (cluster, processes, _):
        await scenario(cluster, processes, tmp_path)


async def holder(kube: Kube) -> str | None:
    lease = await kube.get(LEASE)
    return None if lease is None else (lease.get("spec") or {}).get("holderIdentity")


@dataclass
class Watch:
    """What the test sees all along: the voter set's size (and the largest), and the Lease's
    holder each time it changed (with when)."""

    voters: int = 0
    largest: int = 0
    holders: list[tuple[float, str | None]] = field(default_factory=list)

    async def run(self, cluster: Cluster, nodes: NodeClient) -> None:
        while True:
            for address in cluster.addresses(range(1, 4)):
                view = await nodes.describe(address)
                if view is not None:
                    self.voters = len(view.voters)
                    self.largest = max(self.largest, self.voters)
                    break
            found = await holder(cluster.kube)
            if not self.holders or self.holders[-1][1] != found:
                self.holders.append((time.monotonic(), found))
            await asyncio.sleep(0.02)


@dataclass
class Replacement:
    """A disk replacement stopped between AddVoter and RemoveVoter: the new directory is a
    voter, the old one not removed yet."""

    node_id: int
    before: dict[int, str]
    active: str  # the operator holding the lease

    async def finished(self, cluster: Cluster) -> bool:
        body = await cluster.get()
        now = await cluster.voter_directories()
        last = (body.get("status") or {}).get("lastRemediation") or {}
        return condition(body, "Ready") == "True" and len(now) == 3 and \
            now.get(self.node_id) not in (None, self.before[self.node_id]) and \
            last.get("result") == "Succeeded" and not body["status"].get("pendingChange")


@contextlib.asynccontextmanager
async def mid_replacement(cluster: Cluster, processes: dict[str, subprocess.Popen[bytes]]
                          ) -> AsyncIterator[tuple[Replacement, Watch]]:
    """A ready quorum of three whose non-leader's volume was emptied, once its replacement's
    AddVoter is in force (the watch runs until the end)."""
    await cluster.kube.create(path(KIND, NAMESPACE, api=CR_API), quorum_object(NAME, 3))
    await cluster.ready_with(3, 90)
    await cluster.credentials()
    nodes = await cluster.node_client()
    watch = Watch()
    watcher = asyncio.get_running_loop().create_task(watch.run(cluster, nodes))
    try:
        active = await holder(cluster.kube)
        assert active in processes, active
        leader = (await cluster.status())["leaderId"]
        replacement = Replacement(next(i for i in (1, 2, 3) if i != leader),
                                  await cluster.voter_directories(), active)
        await cluster.wipe(replacement.node_id)

        async def added() -> bool:
            return watch.voters == 4

        await wait_for("AddVoter", added, 90, cluster.describe, interval_s=0.01)
        yield replacement, watch
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await nodes.close()


async def scenario(cluster: Cluster, processes: dict[str, subprocess.Popen[bytes]],
                   tmp_path: Path) -> None:
    kube = cluster.kube
    async with mid_replacement(cluster, processes) as (replacement, watch):
        active = replacement.active
        standby = next(name for name in processes if name != active)
        processes[active].send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        await asyncio.sleep(1)
        in_between = watch.voters

        async def taken_over() -> bool:
            return await holder(kube) == standby

        await cluster.wait("the standby to take the lease", taken_over, 60)
        takeover_s = time.monotonic() - frozen

        async def healed() -> bool:
            return await replacement.finished(cluster)

        await cluster.wait("the standby to finish the replacement", healed, 90)
        healed_s = time.monotonic() - frozen
        directories = await cluster.voter_directories()
        events = len(await cluster.events())
        processes[active].send_signal(signal.SIGCONT)
        await asyncio.sleep(4 * RETRY_PERIOD_S)
        assert await holder(kube) == standby
        assert await cluster.voter_directories() == directories
        reasons = [reason for reason, _ in await cluster.events()][events:]
        assert not {"VoterAdded", "VoterRemoved", "PodDeleted", "ClaimDeleted"} & set(reasons), \
            reasons
        resumed_log = (tmp_path / f"operator-{active}.log").read_text(errors="replace")
        print(f"\n[ha] {active} frozen during {(await cluster.status()).get('lastRemediation')}"
              f"; {standby} took the lease after {takeover_s:.1f} s, finished the replacement "
              f"{healed_s:.1f} s after the freeze; largest voter set {watch.largest}, "
              f"{in_between} voters 1 s after the freeze")
        assert "lost the lease" in resumed_log
    assert takeover_s >= LEASE_DURATION_S - RETRY_PERIOD_S, takeover_s
    assert watch.largest <= 4, watch.largest
    assert in_between == 4, "the active operator was not frozen between AddVoter and RemoveVoter"


@pytest.mark.slow
async def test_an_upgrade_mid_replacement_hands_over_at_once(tmp_path: Path) -> None:
    """The chart's rolling update of the operator in the middle of a disk replacement: the new
    operator's pod starts, then the active one is stopped (SIGTERM, as the kubelet stops a pod).
    It ends its pass and releases the Lease; another takes it within seconds, not the lease
    duration, and finishes the replacement. One holder at a time (the Lease goes from the old
    one to nobody to the new one, once), the old one changes nothing after its release, and the
    voter set never holds two extra directories."""
    async with operators(tmp_path, "ab") as (cluster, processes, start):
        start("c")  # the new ReplicaSet's pod, started before an old one is stopped
        async with mid_replacement(cluster, processes) as (replacement, watch):
            active = replacement.active
            processes[active].send_signal(signal.SIGTERM)
            stopped = time.monotonic()
            await upgraded(cluster, processes, replacement, watch, stopped)


async def upgraded(cluster: Cluster, processes: dict[str, subprocess.Popen[bytes]],
                   replacement: Replacement, watch: Watch, stopped: float) -> None:
    """The checks of ``test_an_upgrade_mid_replacement_hands_over_at_once`` once the active
    operator was sent SIGTERM (at ``stopped``)."""
    active = replacement.active

    async def taken_over() -> str | None:
        found = await holder(cluster.kube)
        return found if found not in (None, active) else None

    successor = await cluster.wait("another operator to take the lease", taken_over, 60)
    takeover_s = time.monotonic() - stopped
    reported = {e["metadata"]["name"]: e.get("count") for e in await _events(cluster)
                if e.get("reportingInstance") == active}
    exit_code = await asyncio.to_thread(processes[active].wait, 30)

    async def healed() -> bool:
        return await replacement.finished(cluster)

    await cluster.wait("the successor to finish the replacement", healed, 90)
    healed_s = time.monotonic() - stopped
    after = await _events(cluster)
    log = (cluster.kubelet.root / f"operator-{active}.log").read_text(errors="replace")
    handovers = [who for _, who in watch.holders]
    released = [at for at, who in watch.holders if who is None]
    release = f"released {released[0] - stopped:.1f} s after it" if released else \
        "never released"
    print(f"\n[upgrade] {active} stopped (SIGTERM) between AddVoter and RemoveVoter; holders "
          f"{handovers}; {successor} took the lease {takeover_s:.1f} s after the stop "
          f"({release}); the replacement finished {healed_s:.1f} s after the stop; largest "
          f"voter set {watch.largest}")
    assert exit_code == 0 and "released the lease" in log, exit_code
    assert handovers == [active, None, successor], handovers
    assert takeover_s < LEASE_DURATION_S - RETRY_PERIOD_S, takeover_s
    assert watch.largest <= 4, watch.largest
    # Nothing from the old operator once it let go; voter changes from the two holders only.
    assert {e["metadata"]["name"]: e.get("count") for e in after
            if e.get("reportingInstance") == active} == reported
    changes = {e.get("reportingInstance") for e in after
               if e.get("reason") in ("VoterAdded", "VoterRemoved")}
    assert changes <= {active, successor}, changes


async def _events(cluster: Cluster) -> list[dict[str, Any]]:
    return await cluster.kube.list(path("Event", NAMESPACE), {})
