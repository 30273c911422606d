"""The operator killed (SIGKILL, as an OOM kill or a crashed container: not asked to stop) at each
step of a disk replacement, and a new operator process started with nothing handed to it (as
the kubelet restarts the container in its pod: the same identity, so it takes its Lease at
once) finishes the replacement.

The operator runs as its own process (``python -m kafka_quorum_operator``). Its crash points
are found from outside it, without any hook in the operator:

- after the intent is recorded: the API server (the emulator) applies the status patch that
  holds ``pendingChange`` AddVoter, then the operator is killed before it hears the answer,
  so AddVoter is never sent;
- after AddVoter is sent: at that status patch the other healthy follower is frozen
  (SIGSTOP), so the leader cannot commit the new voter set (3 of 4 needed: the leader and the
  new replica only); once the leader's log says it adopted 4 voters the operator is killed,
  then the follower thawed;
- after AddVoter is committed: the operator is killed when it posts its ``VoterAdded`` Event
  (it has the node's answer; ``pendingChange`` still says AddVoter);
- after RemoveVoter is sent: at the status patch holding ``pendingChange`` RemoveVoter the
  follower and the new replica are frozen (the leader alone cannot commit the set of 3); once
  the leader's log says it adopted 3 voters the operator is killed, then both thawed;
- after RemoveVoter is committed: killed when it posts ``VoterRemoved``.

Every node logs each voter set it adopts ("voters now ...", committed or not, and again when a
truncation reverts one); from every log of every node process the set never holds more than
one extra directory. A client writes all along; no acknowledged write is lost.

This stays on the emulated backend: only there can a request be trapped at an exact point. On
the real control plane (``tests/kube/test_kube_day_two.py``) the operator's pod is killed once,
between AddVoter and RemoveVoter, and its Deployment brings it back.

The crash windows matter, not the timings: the operator passes every second and a
replacement waits 1 s caught up (``minCaughtUpSeconds``) instead of its defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

import kmock
import pytest
from kafka_quorum_operator import KIND
from kafka_quorum_operator.kube import Kube, path
from kafka_quorum_operator.reconcile import CR_API
from kq_cluster import NAME, Cluster, Writer
from kq_harness import NAMESPACE, K8s, Kubelet, condition, declare_resources, quorum_object
from test_kq_process import free_port

pytestmark = pytest.mark.timeout(900)
POINTS = ("intent recorded", "AddVoter sent", "AddVoter committed", "RemoveVoter sent",
          "RemoveVoter committed")
IDENTITY = "kafka-quorum-operator-0"
VOTERS_NOW = re.compile(r"node (\d+): voters now (.*)$")


class TrappingK8s(K8s):
    """The emulator, calling ``trap`` with every request it has handled (or, for an Event
    trapped before, instead of handling it)."""

    trap: Any = None

    async def _handle(self, request: Any) -> Any:
        trap = self.trap
        if trap is not None and await trap.before(request):
            raise ConnectionResetError("the operator was killed")
        response = await super()._handle(request)
        if trap is not None:
            await trap.after(request)
        return response


@dataclass
class Operator:
    """The operator's process, killed and started again."""

    url: str
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None
    kills: int = 0

    def start(self) -> None:
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kafka_quorum_operator", "--namespace", NAMESPACE,
             f"--liveness=http://127.0.0.1:{free_port()}/healthz"],
            stdout=self._log, stderr=subprocess.STDOUT,
            env={**os.environ, "KQ_OPERATOR_API_SERVER": self.url, "KQ_OPERATOR_INTERVAL": "1",
                 "KQ_OPERATOR_NAMESPACE": NAMESPACE, "KQ_OPERATOR_IDENTITY": IDENTITY})

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()  # SIGKILL: nothing is flushed, nothing handed over
        self.process.wait(10)
        self.kills += 1
        if self._log is not None:
            self._log.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self._log is not None:
            self._log.close()


@dataclass
class Trap:
    """Kills the operator at one point of a replacement of node ``victim``."""

    point: str
    cluster: Cluster
    operator: Operator
    victim: int
    fired: asyncio.Event = field(default_factory=asyncio.Event)
    seen: dict[str, Any] = field(default_factory=dict)
    frozen: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    _leader_log: tuple[Path, int] = (Path(), 0)

    async def before(self, request: Any) -> bool:
        """An Event that marks a committed change: killed before it is stored."""
        if self.fired.is_set() or request.action != kmock.action.CREATE or \
                request.resource is None or request.resource.plural != "events":
            return False
        reason = (request.data or {}).get("reason")
        if (self.point, reason) in (("AddVoter committed", "VoterAdded"),
                                    ("RemoveVoter committed", "VoterRemoved")):
            self._kill(f"posting {reason}")
            return True
        return False

    async def after(self, request: Any) -> None:
        """The status patch that records the intent."""
        if self.fired.is_set() or self._task is not None or \
                request.action != kmock.action.UPDATE or request.resource is None or \
                request.resource.plural != "kafkaquorums" or request.subresource != "status":
            return
        pending = ((request.data or {}).get("status") or {}).get("pendingChange") or {}
        kind = pending.get("kind")
        if self.point == "intent recorded" and kind == "AddVoter":
            self._kill("the AddVoter intent recorded")
        elif self.point == "AddVoter sent" and kind == "AddVoter":
            leader = await self._leader()
            await self._freeze(others_than=(leader, self.victim))
            self._task = asyncio.get_running_loop().create_task(
                self._kill_when_voters(leader, 4))
        elif self.point == "RemoveVoter sent" and kind == "RemoveVoter":
            leader = await self._leader()
            await self._freeze(others_than=(leader,))
            self._task = asyncio.get_running_loop().create_task(
                self._kill_when_voters(leader, 3))

    async def _leader(self) -> int:
        """The node that answers DescribeQuorum (the others redirect)."""
        nodes = await self.cluster.node_client()
        try:
            for node_id in (1, 2, 3):
                if await nodes.describe(self.cluster.kubelet.address(node_id)) is not None:
                    return node_id
        finally:
            await nodes.close()
        raise AssertionError("no node answers DescribeQuorum")

    async def _freeze(self, others_than: tuple[int, ...]) -> None:
        """Freeze the nodes other than ``others_than`` (the leader first), and note where the
        leader's log ends: the change can only be sent after this returns (the operator waits
        for the answer to its status patch)."""
        leader = others_than[0]
        process = next(p for p in self.cluster.kubelet.processes.values()
                       if p.pod == f"{NAME}-{leader}" and p.popen.poll() is None)
        self._leader_log = (process.log, process.log.stat().st_size)
        for process in self.cluster.kubelet.processes.values():
            node_id = int(process.pod.rsplit("-", 1)[1])
            if node_id not in others_than and process.popen.poll() is None:
                process.popen.send_signal(signal.SIGSTOP)
                self.frozen.append(process.popen)
        self.seen["frozen"] = len(self.frozen)

    def thaw(self) -> None:
        for popen in self.frozen:
            with contextlib.suppress(ProcessLookupError):
                popen.send_signal(signal.SIGCONT)
        self.frozen.clear()

    async def _kill_when_voters(self, leader: int, count: int) -> None:
        """Kill once the leader has adopted a set of ``count`` voters (the change appended,
        not committable while the others are frozen), as its log says at once. The leader,
        fetched from by too few voters, resigns about 2 s after the freeze: asking it over
        HTTP on a loaded machine missed that window."""
        log_path, offset = self._leader_log
        try:
            with log_path.open("rb") as log:
                log.seek(offset)
                deadline = time.monotonic() + 20
                buffered = b""
                while time.monotonic() < deadline:
                    buffered += log.read()
                    *lines, buffered = buffered.split(b"\n")
                    for line in lines:
                        match = VOTERS_NOW.search(line.decode(errors="replace"))
                        if match and int(match.group(1)) == leader and \
                                len(match.group(2).split(", ")) == count:
                            self._kill(f"{count} voters adopted by the leader (node {leader}), "
                                       f"not committable")
                            return
                    await asyncio.sleep(0.005)
            self.seen["error"] = f"the leader never adopted {count} voters"
            self.fired.set()
        finally:
            self.thaw()

    def _kill(self, why: str) -> None:
        self.operator.kill()
        self.seen["killed"] = why
        self.fired.set()


@contextlib.asynccontextmanager
async def crash_cluster(root: Path) -> AsyncIterator[tuple[Cluster, TrappingK8s, Operator]]:
    async with TrappingK8s() as emulator:
        declare_resources(emulator)
        async with kmock.Server(emulator) as server:
            url = str(server.url).rstrip("/")
            kube = Kube.connect(url)
            kubelet = Kubelet(kube, root)
            operator = Operator(url, root / "operator.log")
            kubelet.start()
            operator.start()
            cluster = Cluster(kube, kubelet, None, emulator)  # type: ignore[arg-type]
            try:
                yield cluster, emulator, operator
                assert kubelet.errors == [], kubelet.errors[0]
            finally:
                emulator.trap = None
                await asyncio.to_thread(operator.stop)
                await kubelet.stop()
                kube.close()


def voter_sets(logs: Path) -> list[tuple[str, int, list[str]]]:
    """(log file, node id, voters) of every voter set any node process adopted."""
    found = []
    for log in sorted(logs.glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            match = VOTERS_NOW.search(line)
            if match:
                found.append((log.name, int(match.group(1)), match.group(2).split(", ")))
    return found


def more_than_one_extra(voters: list[str], replicas: int = 3) -> bool:
    ids = [v.split(":", 1)[0] for v in voters]
    return len(voters) > replicas + 1 or len(ids) - len(set(ids)) > 1


def test_the_voter_bound_check_can_fail() -> None:
    assert more_than_one_extra(["1:a", "1:b", "2:c", "3:d", "3:e"])
    assert more_than_one_extra(["1:a", "1:b", "2:c", "2:d"])
    assert not more_than_one_extra(["1:a", "1:b", "2:c", "3:d"])


@pytest.mark.slow
async def test_operator_killed_at_each_step_of_a_replacement(tmp_path: Path) -> None:
    async with crash_cluster(tmp_path) as (cluster, emulator, operator):
        body = quorum_object(NAME, 3)
        await cluster.kube.create(path(KIND, NAMESPACE, api=CR_API), body)
        await cluster.ready_with(3, 90)
        credentials = replace(await cluster.credentials(), check_hostname=True)
        writer = Writer(cluster.servers(range(1, 4)), credentials)
        writer.start()
        timings: dict[str, float] = {}
        try:
            for index, point in enumerate(POINTS):
                timings[point] = await replace_with_a_crash(cluster, emulator, operator, point,
                                                            victim=_victim(cluster, index))
        finally:
            writer.stop()
        lost = await asyncio.to_thread(writer.lost)
        sets = voter_sets(cluster.kubelet.root / "logs")
        largest = max(len(v) for _, _, v in sets)
        print(f"\n[crash] {', '.join(f'{k} {v:.1f} s' for k, v in timings.items())}; "
              f"{operator.kills} kills; {len(sets)} voter sets adopted in the nodes' logs, "
              f"largest {largest}; {len(writer.acknowledged)} acknowledged writes, "
              f"{writer.failures} failed tries, {len(lost)} lost")
        assert operator.kills == len(POINTS)
        too_large = [s for s in sets if more_than_one_extra(s[2])]
        assert too_large == [], too_large
        assert largest == 4, "no replacement was seen in the nodes' logs"
        assert lost == [] and len(writer.acknowledged) > 50


def _victim(cluster: Cluster, index: int) -> int:
    return (1, 2, 3)[index % 3]


async def replace_with_a_crash(cluster: Cluster, emulator: TrappingK8s, operator: Operator,
                               point: str, victim: int) -> float:
    """Node ``victim``'s volume emptied; the operator killed at ``point`` of its replacement;
    a new operator process finishes it."""
    body = await cluster.get()
    if body["status"].get("leaderId") == victim:  # a follower's volume: the leader is needed
        victim = next(i for i in (1, 2, 3) if i != victim)  # to hold commits back
    before = await cluster.voter_directories()
    since = len(await cluster.events())
    trap = Trap(point, cluster, operator, victim)
    emulator.trap = trap
    started = time.monotonic()
    await cluster.wipe(victim)
    try:
        await asyncio.wait_for(trap.fired.wait(), 240)
    except TimeoutError:
        raise AssertionError(f"{point}: the operator never reached it\n"
                             f"{cluster.describe()}") from None
    finally:
        emulator.trap = None
        trap.thaw()
    assert "error" not in trap.seen, (point, trap.seen)
    status = await cluster.status()
    pending = status.get("pendingChange") or {}
    expected = "RemoveVoter" if point.startswith("RemoveVoter") else "AddVoter"
    assert pending.get("kind") == expected and pending.get("nodeId") == victim, (point, status)

    operator.start()  # nothing handed over: status and the nodes are all it has

    async def finished() -> bool:
        body = await cluster.get()
        now = await cluster.voter_directories()
        last = (body.get("status") or {}).get("lastRemediation") or {}
        return condition(body, "Ready") == "True" and len(now) == 3 and \
            now.get(victim) not in (None, before[victim]) and \
            last.get("result") == "Succeeded" and last.get("nodeId") == victim and \
            not body["status"].get("pendingChange")

    await cluster.wait(f"the replacement of node {victim} finished after a crash ({point})",
                       finished, 240)
    elapsed = time.monotonic() - started
    later = [reason for reason, _ in (await cluster.events())[since:]]
    # Each change made once (a new operator that finds it in force does not make it again,
    # and posts no Event for it).
    assert later.count("VoterAdded") <= 1 and later.count("VoterRemoved") <= 1, (point, later)
    assert "RemediationCompleted" in later, (point, later)
    assert "QuorumLostTrue" not in later, (point, later)
    print(f"\n[crash] {point}: killed at {trap.seen['killed']}; node {victim} replaced "
          f"{elapsed:.1f} s after its volume was emptied")
    return elapsed
