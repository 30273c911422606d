"""``GET /v1/quorum`` on real nodes in this process (loopback HTTP, real log directories).

``running_cluster`` is shared with the metrics and CLI tests (imported from this module).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from quorum_node.node.api.admin import admin_routes
from quorum_node.node.api.metrics import metrics_routes
from quorum_node.node.app import build_app
from quorum_node.node.config import NodeConfig
from quorum_node.node.metrics import metrics_for
from quorum_node.node.runtime import QuorumNode
from quorum_node.node.wiring import build_node
from quorum_node.raft.config import QuorumConfig, VoterEndpoint
from quorum_node.raft.records import Record
from quorum_node.raft.state import RaftState
from quorum_node.raft.status import NodeStatus
from quorum_node.storage.kafka_uuid import to_kafka_string
from quorum_node.storage.meta_properties import format_log_dir, random_cluster_id

FAST = QuorumConfig(election_timeout_ms=300, fetch_timeout_ms=600, request_timeout_ms=500,
                    fetch_max_wait_ms=100, append_linger_ms=1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def add_routes_once(app: web.Application, routes: Iterable[web.RouteDef]) -> None:
    """Add routes the app does not serve yet (app.py may already include ours)."""
    served = {(route.method, route.resource.canonical) for route in app.router.routes()
              if route.resource is not None}
    app.add_routes([r for r in routes if (r.method, r.path) not in served])


@dataclass
class LocalCluster:
    nodes: dict[int, QuorumNode]
    cluster_id: str

    def url(self, node_id: int) -> str:
        return self.nodes[node_id].config.client_url

    def running(self) -> dict[int, QuorumNode]:
        return {i: n for i, n in self.nodes.items() if i not in self.stopped}

    def __post_init__(self) -> None:
        self.stopped: set[int] = set()

    async def wait_for(self, condition: Callable[[], bool], timeout_s: float = 10,
                       what: str = "condition") -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                states = {i: (n.core.state, n.core.epoch) for i, n in self.nodes.items()}
                raise AssertionError(f"timed out waiting for {what}: {states}")
            await asyncio.sleep(0.02)

    def leader(self) -> QuorumNode | None:
        for node in self.running().values():
            if node.core.state is RaftState.LEADER:
                return node
        return None

    async def wait_for_leader(self, timeout_s: float = 10) -> QuorumNode:
        """A leader whose LeaderChange is committed, and every running replica caught up."""

        def settled() -> bool:
            leader = self.leader()
            if leader is None or leader.core.high_watermark is None:
                return False
            end = leader.core.log.end_offset
            return all(node.core.leader_id == leader.config.node_id
                       and node.core.high_watermark == end
                       for node in self.running().values())

        await self.wait_for(settled, timeout_s, "a settled leader")
        leader = self.leader()
        assert leader is not None
        return leader

    async def stop(self, node_id: int) -> None:
        self.stopped.add(node_id)
        await shutdown(self.nodes[node_id], timeout_s=2)


async def shutdown(node: QuorumNode, timeout_s: float) -> None:
    stopping = asyncio.ensure_future(node.shutdown(timeout_s=timeout_s))
    while not stopping.done():
        await asyncio.wait({stopping}, timeout=0.1)
        # Work around a runtime bug (reported): Python 3.11's asyncio.wait_for swallows a
        # cancellation that arrives just as its awaitable completes, which shutdown() provokes
        # by waking the timer loop right before cancelling it; shutdown() then waits forever.
        for task in list(node._tasks):
            task.cancel()


@contextlib.asynccontextmanager
async def running_cluster(tmp_path: Path, size: int = 3, start: Iterable[int] | None = None,
                          ) -> AsyncIterator[LocalCluster]:
    """``size`` voters on loopback; only the ids in ``start`` (default all) are started."""
    ports = {i: free_port() for i in range(1, size + 1)}
    voters = tuple(VoterEndpoint(id=i, host="127.0.0.1", port=p) for i, p in ports.items())
    cluster_id = random_cluster_id()
    cluster = LocalCluster({}, cluster_id)
    try:
        for node_id in start if start is not None else ports:
            log_dir = tmp_path / f"node-{node_id}"
            format_log_dir(log_dir, cluster_id, node_id)
            node = build_node(NodeConfig(
                node_id=node_id, cluster_id=cluster_id, log_dir=log_dir,
                listeners=f"127.0.0.1:{ports[node_id]}", voters=voters, quorum=FAST,
            ))
            metrics_for(node)  # before the first election, so that it is measured
            app = build_app(node)
            add_routes_once(app, [*admin_routes(node), *metrics_routes(node)])
            cluster.nodes[node_id] = node
            await node.start(app)
        yield cluster
    finally:
        await asyncio.gather(*(shutdown(node, timeout_s=0.5) for node in cluster.nodes.values()))


async def get_json(url: str, *, follow: bool = True) -> tuple[int, dict[str, Any], str | None]:
    async with aiohttp.ClientSession() as session, \
            session.get(url, allow_redirects=follow) as response:
        return response.status, await response.json(), response.headers.get("Location")


async def test_describe_quorum_on_the_leader(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as cluster:
        leader = await cluster.wait_for_leader()
        await leader.append([Record(b"a"), Record(b"b"), Record(b"c")], timeout_s=5)
        await cluster.wait_for_leader()  # followers caught up with the appended records
        leader_id = leader.config.node_id

        status, quorum, _ = await get_json(cluster.url(leader_id) + "/v1/quorum")
        assert status == 200
        end = leader.core.log.end_offset
        assert end >= 4  # a LeaderChange record and ours
        assert quorum["cluster_id"] == cluster.cluster_id
        assert quorum["leader_id"] == leader_id
        assert quorum["leader_epoch"] == leader.core.epoch >= 1
        assert quorum["high_watermark"] == end
        assert quorum["observers"] == []
        voters = {v["id"]: v for v in quorum["voters"]}
        assert set(voters) == {1, 2, 3}
        now_ms = time.time_ns() // 1_000_000
        for node_id, voter in voters.items():
            node = cluster.nodes[node_id]
            own_directory = to_kafka_string(node.log_dir.meta.directory_id)
            # Static voters are known to the leader by id only (as in Kafka's static quorums).
            assert voter["directory_id"] in ({own_directory} if node_id == leader_id
                                             else {own_directory, None})
            assert len(own_directory) == 22
            assert voter["log_end_offset"] == end
            assert voter["lag"] == 0
            assert now_ms - 10_000 < voter["last_fetch_timestamp"] <= now_ms
            assert now_ms - 10_000 < voter["last_caught_up_timestamp"] <= now_ms
            assert voter["endpoint"] == cluster.url(node_id)


async def test_node_status_is_the_node_s_own_view_on_every_node(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as cluster:
        leader = await cluster.wait_for_leader()
        await leader.append([Record(b"a")], timeout_s=5)
        await cluster.wait_for_leader()  # followers caught up with the appended record
        for node_id, node in cluster.nodes.items():
            while True:  # a view that held while it was asked for (a busy machine may elect)
                before = settled(node.status())
                answer_status, answer, _ = await get_json(cluster.url(node_id) + "/v1/node")
                status = node.status()
                if settled(status) == before:
                    break
            assert answer_status == 200
            # The documented shape (docs/openapi.json's NodeStatus), every field of it.
            assert answer == {
                "node_id": node_id,
                "directory_id": directory(node),
                "cluster_id": cluster.cluster_id,
                "state": str(status.state),
                "epoch": status.epoch,
                "leader_id": status.leader_id,
                "is_voter": True,
                "high_watermark": status.high_watermark,
                "voters_unheard": [],
                "log_start_offset": 0,
                "log_end_offset": status.log_end_offset,
                # The bootstrap VotersRecord's: every voter with its directory.
                "voters": [{"id": i, "directory_id": directory(cluster.nodes[i])}
                           for i in (1, 2, 3)],
                "client_endpoints": [{"id": i, "url": cluster.url(i)} for i in (1, 2, 3)],
                "failure": None,
            }
            assert status.state in (RaftState.LEADER, RaftState.FOLLOWER)
            assert status.high_watermark is not None and status.log_end_offset >= 2


def settled(status: NodeStatus) -> NodeStatus:
    """``status`` but for what moves while nothing happens (its time, the leader's rows)."""
    return dataclasses.replace(status, as_of_ms=0, quorum=None)


def directory(node: QuorumNode) -> str:
    return to_kafka_string(node.log_dir.meta.directory_id)


async def test_a_follower_redirects_to_the_leader(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as cluster:
        leader = await cluster.wait_for_leader()
        follower = next(i for i in cluster.nodes if i != leader.config.node_id)

        status, body, location = await get_json(cluster.url(follower) + "/v1/quorum?x=1",
                                                follow=False)
        assert status == 307
        assert location == cluster.url(leader.config.node_id) + "/v1/quorum?x=1"
        assert body["code"] == "NOT_LEADER"
        assert body["leader"] == {"id": leader.config.node_id,
                                  "url": cluster.url(leader.config.node_id)}

        status, quorum, _ = await get_json(cluster.url(follower) + "/v1/quorum")
        assert (status, quorum["leader_id"]) == (200, leader.config.node_id)


async def test_without_a_leader_the_answer_is_503_no_leader(tmp_path: Path) -> None:
    # One voter of three: it can never win an election.
    async with running_cluster(tmp_path, start=[1]) as cluster:
        await asyncio.sleep(0.4)  # past its first election timeout: campaigning, not elected
        status, body, _ = await get_json(cluster.url(1) + "/v1/quorum")
        assert status == 503
        assert body["code"] == "NO_LEADER"
        assert body["leader"] == {"id": None, "url": None}
        assert f"epoch {cluster.nodes[1].core.epoch}" in body["message"]


async def test_after_a_failover_the_new_leader_describes_the_quorum(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as cluster:
        old = await cluster.wait_for_leader()
        old_id, old_epoch = old.config.node_id, old.core.epoch
        await cluster.stop(old_id)
        new = await cluster.wait_for_leader()
        assert new.config.node_id != old_id

        await new.append([Record(b"after")], timeout_s=5)  # two of three voters commit it
        survivor = next(i for i in cluster.running() if i != new.config.node_id)
        status, quorum, _ = await get_json(cluster.url(survivor) + "/v1/quorum")
        assert status == 200
        assert quorum["leader_id"] == new.config.node_id
        assert quorum["leader_epoch"] > old_epoch
        assert quorum["high_watermark"] == new.core.log.end_offset
        rows = {v["id"]: v for v in quorum["voters"]}
        # The old leader may have fetched once from its successor before it stopped, never since.
        assert rows[old_id]["lag"] == -1 or rows[old_id]["lag"] >= 1
        assert rows[old_id]["log_end_offset"] < quorum["high_watermark"]
        assert rows[survivor]["lag"] == 0  # it holds all that is committed, i.e. everything
