"""Failover between real node processes on loopback: a leader killed with SIGKILL is replaced
as soon as its followers find its address refusing connections, not when their fetch timeout
runs out (``quorum_node/raft/follower.py`` says why that is safe).

Slow (node processes start and elect: seconds): run by its own step in ``.ci/run``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from proc_cluster import ProcessCluster, http_json

pytestmark = pytest.mark.slow

# Far above what the failover takes, so that only an election started on the refusal can beat
# it, on however busy a machine.
FETCH_TIMEOUT_MS = 20_000


def _following(cluster: ProcessCluster, leader: int, timeout_s: float = 30) -> None:
    """Until every node names ``leader`` as its leader (``GET /v1/node``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        statuses = [http_json("GET", f"{node.url}/v1/node") for node in cluster.nodes.values()]
        if all(status["leader_id"] == leader for status in statuses):
            return
        time.sleep(0.05)
    raise AssertionError(f"not every node follows {leader}\n{cluster.logs()}")


def test_a_killed_leader_is_replaced_well_before_the_fetch_timeout(tmp_path: Path) -> None:
    # The voters are named by their own ports (no fault proxy, which would accept the
    # connections of a dead node), as in a deployment.
    cluster = ProcessCluster.create(tmp_path, 3, proxied=False,
                                    controller_quorum_fetch_timeout_ms=FETCH_TIMEOUT_MS)
    cluster.start_all()
    try:
        first = cluster.wait_for_leader(timeout_s=30)
        http_json("POST", f"{cluster.nodes[first].url}/v1/records", ["before"])
        _following(cluster, first)
        cluster.kill(first)
        killed_at = time.monotonic()
        others = {node_id for node_id in cluster.nodes if node_id != first}
        second = cluster.wait_for_leader(among=others, timeout_s=FETCH_TIMEOUT_MS / 1000)
        took_s = time.monotonic() - killed_at
        http_json("POST", f"{cluster.nodes[second].url}/v1/records", ["after"])
        survivors = "".join(cluster.nodes[node_id].log_path.read_text(errors="replace")
                            for node_id in others)
    finally:
        cluster.stop_all()
    print(f"failover after kill -9 of the leader: {took_s:.3f} s")
    assert took_s < FETCH_TIMEOUT_MS / 1000 / 2, cluster.logs()
    assert f"leader {first} refused a connection" in survivors, cluster.logs()
