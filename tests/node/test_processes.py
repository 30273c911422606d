"""Real node processes on loopback with real disks: elections, kill -9, SIGSTOP, partitions.

The acceptance rule in every test: a write the quorum acknowledged is never lost, and every
replica ends with the same committed records.
"""

from __future__ import annotations

import base64
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from proc_cluster import FAST, PEER_SECRET_HEADER, ProcessCluster, http_json

from quorum_node.node.transport import decode_frame, encode_frame
from quorum_node.raft.messages import FetchRequest, FetchResponse
from quorum_node.raft.types import Errors


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    cluster = ProcessCluster.create(tmp_path, 3, **FAST)
    cluster.start_all()
    try:
        yield cluster
    finally:
        cluster.stop_all()


class Writer:
    """Appends numbered records to whichever node leads, in the background, remembering every
    value the quorum acknowledged."""

    def __init__(self, cluster: ProcessCluster) -> None:
        self._cluster = cluster
        self.acknowledged: list[str] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def _run(self) -> None:
        sequence = 0
        leader: int | None = None
        while not self._stop.is_set():
            if leader is None:
                leader = self._find_leader()
                if leader is None:
                    time.sleep(0.05)
                    continue
            value = f"w-{sequence}"
            sequence += 1
            try:
                http_json("POST", f"{self._cluster.nodes[leader].url}/v1/records", [value],
                          follow=False, timeout_s=3)
            except (OSError, urllib.error.HTTPError):
                self.failures += 1
                leader = None  # unknown outcome: it may or may not commit; not counted
                continue
            self.acknowledged.append(value)

    def _find_leader(self) -> int | None:
        for node_id in self._cluster.nodes:
            described = self._cluster.quorum(node_id)
            if described is not None and described.get("leader_id") == node_id:
                return node_id
        return None

    def wait_for(self, count: int, timeout_s: float = 40) -> None:
        deadline = time.monotonic() + timeout_s
        start = len(self.acknowledged)
        while len(self.acknowledged) < start + count:
            assert time.monotonic() < deadline, (
                f"only {len(self.acknowledged) - start} of {count} writes acknowledged in "
                f"{timeout_s} s ({self.failures} failed)\n{self._cluster.logs()}")
            time.sleep(0.02)


def committed_values(cluster: ProcessCluster, node_id: int) -> list[str]:
    """Every committed record value on a node, in offset order."""
    values: list[str] = []
    offset = 0
    while True:
        page = http_json("GET", f"{cluster.nodes[node_id].url}/v1/records?offset={offset}"
                                f"&max_records=1000&wait_ms=0")
        values += [base64.b64decode(r["value"]).decode() for r in page["records"]]
        high_watermark = page["high_watermark"]  # None until the node hears from a leader
        if high_watermark is None or page["next_offset"] >= high_watermark \
                or page["next_offset"] == offset:
            return values
        offset = page["next_offset"]


def wait_converged(cluster: ProcessCluster, nodes: list[int], timeout_s: float = 60) -> list[str]:
    """Wait until the nodes hold the same committed records; return them."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            logs = [committed_values(cluster, node_id) for node_id in nodes]
        except OSError:
            logs = []
        if logs and all(log == logs[0] for log in logs):
            return logs[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"replicas did not converge: {[len(x) for x in logs]}\n"
                                 f"{cluster.logs()}")
        time.sleep(0.2)


def test_elect_write_and_read_on_every_replica(cluster: ProcessCluster) -> None:
    leader = cluster.wait_for_leader()
    answer = http_json("POST", f"{cluster.nodes[leader].url}/v1/records", ["a", "b", "c"])
    assert answer["last_offset"] - answer["first_offset"] == 2
    described = cluster.quorum(leader)
    assert described is not None and len(described["voters"]) == 3
    assert wait_converged(cluster, [1, 2, 3]) == ["a", "b", "c"]


def test_leader_killed_under_load_loses_no_acknowledged_write(cluster: ProcessCluster) -> None:
    first = cluster.wait_for_leader()
    with Writer(cluster) as writer:
        writer.wait_for(50)
        cluster.kill(first)  # kill -9: no resignation, un-flushed page cache is all it loses
        killed_at = time.monotonic()
        others = {n for n in cluster.nodes if n != first}
        second = cluster.wait_for_leader(among=others)
        failover_s = time.monotonic() - killed_at
        writer.wait_for(50)
        cluster.start(first)  # the old leader rejoins and catches up
        writer.wait_for(50)
    assert second != first and failover_s < 15, f"failover took {failover_s:.1f} s"
    committed = wait_converged(cluster, [1, 2, 3])
    missing = set(writer.acknowledged) - set(committed)
    assert not missing, f"acknowledged writes lost: {sorted(missing)[:10]}"
    assert len(committed) == len(set(committed))  # nothing applied twice


def test_paused_follower_catches_up(cluster: ProcessCluster) -> None:
    leader = cluster.wait_for_leader()
    follower = next(n for n in cluster.nodes if n != leader)
    with Writer(cluster) as writer:
        writer.wait_for(20)
        cluster.signal(follower, signal.SIGSTOP)
        writer.wait_for(100)  # the other two are a majority: writes go on
        cluster.signal(follower, signal.SIGCONT)
        writer.wait_for(20)
    committed = wait_converged(cluster, [1, 2, 3])
    assert set(writer.acknowledged) <= set(committed)


def test_partitioned_leader_heals_without_losing_writes(cluster: ProcessCluster) -> None:
    first = cluster.wait_for_leader()
    with Writer(cluster) as writer:
        writer.wait_for(30)
        cluster.nodes[first].proxy.cut()  # no peer reaches it any more: a new leader is elected
        others = {n for n in cluster.nodes if n != first}
        cluster.wait_for_leader(among=others)
        writer.wait_for(50)
        cluster.nodes[first].proxy.heal()
        writer.wait_for(30)
    committed = wait_converged(cluster, [1, 2, 3])
    assert set(writer.acknowledged) <= set(committed)


def test_wrong_cluster_id_is_refused(cluster: ProcessCluster) -> None:
    leader = cluster.wait_for_leader()
    request = FetchRequest(cluster_id="b3RoZXJDbHVzdGVySWRYWA", replica_id=9, max_wait_ms=0,
                           current_leader_epoch=0, fetch_offset=0, last_fetch_epoch=0)
    raw = urllib.request.Request(f"{cluster.nodes[leader].peer_url}/raft/v1/Fetch",
                                 data=encode_frame(request), method="POST",
                                 headers={PEER_SECRET_HEADER: cluster.peer_secret})
    with urllib.request.urlopen(raw, timeout=5) as reply:
        response = decode_frame(FetchResponse, reply.read())
    assert response.error_code is Errors.INCONSISTENT_CLUSTER_ID
    assert response.records == b""


def test_node_refuses_another_clusters_directory(tmp_path: Path) -> None:
    cluster = ProcessCluster.create(tmp_path, 1, **FAST)
    try:
        config = cluster.nodes[1].config_path
        text = config.read_text().replace(cluster.cluster_id, "b3RoZXJDbHVzdGVySWRYWA")
        config.write_text(text)
        result = subprocess.run(
            [sys.executable, "-m", "quorum_node.cli.node", "run", "--config", str(config)],
            check=False, capture_output=True, text=True, timeout=30,
        )
        assert result.returncode != 0
        assert "does not match the configured cluster id" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    finally:
        cluster.stop_all()
