"""Two operator processes (``kafka-quorum-operator``, as the chart runs them with replicas: 2)
against the harness: the active one is frozen (SIGSTOP) in the middle of a disk replacement; the
other takes over only once the lease has expired, finishes the replacement, and the voter set
never holds more than one extra directory; the frozen one, resumed, changes nothing."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import kmock
import pytest
from kafka_quorum_operator import KIND
from kafka_quorum_operator.kube import Kube, path
from kafka_quorum_operator.lease import LEASE_DURATION_S, RETRY_PERIOD_S
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


async def test_a_frozen_operator_is_replaced_and_fenced(tmp_path: Path) -> None:
    async with K8s() as emulator:
        declare_resources(emulator)
        async with kmock.Server(emulator) as server:
            url = str(server.url).rstrip("/")
            kube = Kube.connect(url)
            kubelet = Kubelet(kube, tmp_path)
            logs = {name: (tmp_path / f"operator-{name}.log").open("wb") for name in "ab"}
            processes = {name: start_operator(url, name, logs[name]) for name in "ab"}
            kubelet.start()
            cluster = Cluster(kube, kubelet, None, emulator)  # type: ignore[arg-type]
            try:
                await scenario(cluster, processes, tmp_path)
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


async def holder(kube: Kube) -> str | None:
    lease = await kube.get(LEASE)
    return None if lease is None else (lease.get("spec") or {}).get("holderIdentity")


async def scenario(cluster: Cluster, processes: dict[str, subprocess.Popen[bytes]],
                   tmp_path: Path) -> None:
    kube = cluster.kube
    await kube.create(path(KIND, NAMESPACE, api=CR_API), quorum_object(NAME, 3))
    await cluster.ready_with(3, 90)
    await cluster.credentials()
    nodes = await cluster.node_client()
    largest = 0
    voters = 0

    async def watch_voters() -> None:
        nonlocal largest, voters
        while True:
            for address in cluster.addresses(range(1, 4)):
                view = await nodes.describe(address)
                if view is not None:
                    voters = len(view.voters)
                    largest = max(largest, voters)
                    break
            await asyncio.sleep(0.02)

    watcher = asyncio.get_running_loop().create_task(watch_voters())
    try:
        active = await holder(kube)
        assert active in processes, active
        standby = next(name for name in processes if name != active)
        before = await cluster.voter_directories()
        leader = (await cluster.status())["leaderId"]
        replaced = next(i for i in (1, 2, 3) if i != leader)
        await cluster.wipe(replaced)

        async def added() -> bool:
            return voters == 4

        # Frozen between AddVoter and RemoveVoter: the new directory is a voter, the old one
        # not removed yet.
        await wait_for("AddVoter", added, 90, cluster.describe, interval_s=0.01)
        processes[active].send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        await asyncio.sleep(1)
        in_between = voters

        async def taken_over() -> bool:
            return await holder(kube) == standby

        await cluster.wait("the standby to take the lease", taken_over, 60)
        takeover_s = time.monotonic() - frozen

        async def healed() -> bool:
            body = await cluster.get()
            now = await cluster.voter_directories()
            last = (body.get("status") or {}).get("lastRemediation") or {}
            return condition(body, "Ready") == "True" and len(now) == 3 and \
                now.get(replaced) not in (None, before[replaced]) and \
                last.get("result") == "Succeeded" and not body["status"].get("pendingChange")

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
              f"{healed_s:.1f} s after the freeze; largest voter set {largest}, "
              f"{in_between} voters 1 s after the freeze")
        assert "lost the lease" in resumed_log
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await nodes.close()
    assert takeover_s >= LEASE_DURATION_S - RETRY_PERIOD_S, takeover_s
    assert largest <= 4, largest
    assert in_between == 4, "the active operator was not frozen between AddVoter and RemoveVoter"
