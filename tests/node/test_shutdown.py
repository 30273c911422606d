"""A stopping leader resigns and waits for a successor, unless none can come."""

from __future__ import annotations

import time
from pathlib import Path

from test_admin_api import running_cluster, shutdown

from quorum_node.raft.records import Record


async def test_a_leader_waits_for_its_successor(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as cluster:
        leader = await cluster.wait_for_leader()
        old_id = leader.config.node_id
        await cluster.stop(old_id)
        # It waited until another voter was elected (or learned of it on its way out).
        others = [node for i, node in cluster.running().items() if i != old_id]
        assert any(node.core.leader_id not in (None, old_id) for node in others)
        new = await cluster.wait_for_leader()
        await new.append([Record(b"after the handover")], timeout_s=5)


async def test_a_leader_whose_voters_are_gone_stops_at_once(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as cluster:
        leader = await cluster.wait_for_leader()
        for node_id in list(cluster.running()):
            if node_id != leader.config.node_id:
                await cluster.stop(node_id)  # a follower does not wait
        started = time.monotonic()
        await shutdown(leader, timeout_s=20)
        # Its EndQuorumEpoch finds nobody: no successor can come, so it does not wait 20 s.
        assert time.monotonic() - started < 10
