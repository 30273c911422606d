"""A real quorum's data for the audit tests: node processes write it (with a leader change, a
disk replacement and compacted logs), then stop; the tests read the directories they leave."""

from __future__ import annotations

import shutil
import signal
import sys
import time
import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1] / "node"))  # proc_cluster, shared with node tests

from proc_cluster import ProcessCluster

from quorum_node.client import QuorumClient
from quorum_node.storage.kafka_uuid import to_kafka_string
from quorum_node.storage.meta_properties import (
    format_log_dir,
    read_meta_properties,
)


@dataclass(frozen=True)
class RealQuorum:
    """Log directories node-1..3 of a stopped quorum that saw a leader change, a disk
    replacement (``replaced``: node id, old and new directory id) and log compaction."""

    root: Path
    cluster_id: str
    replaced: tuple[int, str, str]
    first_leader: int
    second_leader: int


RETAINED = 600


def _wait(what: str, condition: Any, cluster: ProcessCluster, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            found = condition()
        except (OSError, urllib.error.URLError, AssertionError):
            found = None
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}\n{cluster.logs()}")


def _write(cluster: ProcessCluster, leader: int, first: int, batches: int) -> None:
    with QuorumClient(f"127.0.0.1:{cluster.nodes[leader].port}", timeout_s=30) as client:
        for batch in range(batches):
            client.append([b"record-%d" % (first + batch * 50 + i) for i in range(50)])
            client.put(f"key-{batch % 7}", f"v{first + batch}")


def _directory_id(path: Path) -> str:
    return to_kafka_string(read_meta_properties(path / "meta.properties").directory_id)


def make_real_quorum(root: Path) -> RealQuorum:
    """Writes (the logs compacted into snapshots as they go), a follower's disk replaced (it
    catches up from a snapshot), then a leader change, a few more writes, and a clean stop."""
    # Small snapshots and segments: the logs are compacted several times over, and the last
    # RETAINED records stay in the log, which keeps the late leader change's record there.
    cluster = ProcessCluster.create(root, 3, snapshot_interval_records=300,
                                    snapshot_retained_log_records=RETAINED,
                                    log_segment_bytes=8 * 1024)
    try:
        cluster.start_all()
        leader = cluster.wait_for_leader(timeout_s=30)
        _write(cluster, leader, 0, 30)
        victim = next(n for n in (3, 2, 1) if n != leader)
        old_uuid, new_uuid = _replace_disk(cluster, leader, victim)
        # A leader change: the leader resigns on SIGTERM, another one is elected.
        cluster.signal(leader, signal.SIGTERM)
        cluster.nodes[leader].process.wait(15)  # type: ignore[union-attr]
        second = cluster.wait_for_leader(among=set(cluster.nodes) - {leader}, timeout_s=30)
        cluster.start(leader)
        _write(cluster, second, 20_000, 3)

        def all_caught_up() -> bool:
            described = cluster.quorum(second) or {}
            voters = described.get("voters", [])
            return len(voters) == 3 and all(v["lag"] == 0 for v in voters)

        _wait("every voter to catch up", all_caught_up, cluster)
    finally:
        cluster.stop_all()
    return RealQuorum(root, cluster.cluster_id, (victim, old_uuid, new_uuid), leader, second)


def _replace_disk(cluster: ProcessCluster, leader: int, victim: int) -> tuple[str, str]:
    """KIP-856's recovery of a lost disk: a new directory id, add it, remove the old one."""
    log_dir = cluster.directory / f"node-{victim}"
    old_uuid = _directory_id(log_dir)
    cluster.kill(victim)
    shutil.rmtree(log_dir)
    new_uuid = to_kafka_string(format_log_dir(log_dir, cluster.cluster_id, victim).directory_id)
    cluster.start(victim)

    def observer_caught_up() -> bool:
        described = cluster.quorum(leader) or {}
        return any(o["id"] == victim and o["directory_id"] == new_uuid and o["lag"] == 0
                   for o in described.get("observers", []))

    _wait("the new disk to catch up as an observer", observer_caught_up, cluster)
    with QuorumClient(f"127.0.0.1:{cluster.nodes[leader].port}", timeout_s=30) as client:
        client.add_voter(victim, new_uuid)
        client.remove_voter(victim, old_uuid)
    return old_uuid, new_uuid


def data_copy(quorum: RealQuorum, destination: Path) -> Path:
    """The three log directories alone, to damage on purpose without touching the originals."""
    for node in (1, 2, 3):
        shutil.copytree(quorum.root / f"node-{node}", destination / f"node-{node}")
    return destination
