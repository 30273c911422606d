"""Rotating the peer secret (its file rewritten in place, as a Kubernetes Secret is) takes away
what the old secret let in: the streams and connections peers opened with it are closed by the
node that accepted them, and the node's own streams to its peers, opened with it, are closed and
opened again with the new one. A quorum whose nodes all took the new secret goes on."""

from __future__ import annotations

import os
import time
from pathlib import Path

import aiohttp
from proc_cluster import FAST, ProcessCluster
from raw_clients import connect, request, seconds_until_closed, upgrade
from secured_cluster import InProcessCluster, secret_configs

from quorum_node.client import QuorumClient
from quorum_node.node.transport import STREAM_PATH
from quorum_node.security.peer_secret import PEER_SECRET_HEADER

NEW_SECRET = "the-secret-after-the-rotation"


def rotate(path: Path, secret: str) -> None:
    path.write_text(secret + "\n")
    os.utime(path, ns=(time.time_ns() + 10**9,) * 2)  # a change, whatever the clock's grain


def test_a_rotated_secret_closes_the_streams_opened_with_the_old_one(tmp_path: Path) -> None:
    cluster = ProcessCluster.create(tmp_path, 3, **FAST, security_reload_interval_ms=200)
    cluster.start_all()
    try:
        cluster.wait_all_serving()
        cluster.wait_for_leader()
        old_secret = cluster.peer_secret
        node = cluster.nodes[1]
        # A stream opened with the old secret (a peer's, or one who took the secret and
        # should lose what it gives once it is rotated).
        stream = upgrade(connect(node.peer_port), node.peer_port, STREAM_PATH,
                         {PEER_SECRET_HEADER: old_secret})
        assert seconds_until_closed(stream, 0.5) is None  # held while the secret holds
        rotate(cluster.secret_path, NEW_SECRET)  # every node's file
        elapsed = seconds_until_closed(stream, 5)
        stream.close()
        assert elapsed is not None, "a stream of the old secret outlived its rotation"
        # The old secret lets nothing in any more; the new one does.
        with connect(node.peer_port) as refused:
            assert request(refused, STREAM_PATH,
                           headers={PEER_SECRET_HEADER: old_secret})[0] == 401
        upgrade(connect(node.peer_port), node.peer_port, STREAM_PATH,
                {PEER_SECRET_HEADER: NEW_SECRET}).close()
        # The nodes talk again over streams of the new secret.
        with QuorumClient(",".join(f"127.0.0.1:{n.port}" for n in cluster.nodes.values()),
                          timeout_s=20) as client:
            client.put("after-rotation", "ok")
        log = node.log_path.read_text()
        assert "peer secret changed; closed" in log, log
        print(f"\na stream of the old secret was closed {elapsed:.2f} s after the rotation "
              "(reload interval 0.2 s)")
    finally:
        cluster.stop_all()


def test_a_node_closes_its_own_streams_of_the_old_secret(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("the-secret-before-the-rotation\n")
    configs = secret_configs(tmp_path, secret, 2, 2, security_reload_interval_ms=100)
    cluster = InProcessCluster(configs)
    try:
        deadline = time.monotonic() + 15
        while cluster.leader() is None or not cluster.nodes[1].peers._streams:
            assert time.monotonic() < deadline, "no leader, or no stream from node 1"
            time.sleep(0.05)
        streams_before = dict(cluster.nodes[1].peers._streams)
        rotate(secret, NEW_SECRET)
        deadline = time.monotonic() + 5
        while not all(stream.closed for stream in streams_before.values()):
            assert time.monotonic() < deadline, "node 1's streams of the old secret stay open"
            time.sleep(0.05)

        async def peers_talk() -> None:
            async with aiohttp.ClientSession() as session:
                for node_id in (1, 2):
                    url = f"http://{cluster.address(node_id)}/v1/kv/k"
                    async with session.put(url, data="v", allow_redirects=True) as answer:
                        assert answer.status == 200, await answer.text()

        cluster.run(peers_talk())
    finally:
        cluster.stop()
