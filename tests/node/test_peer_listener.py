"""Peers on a listener of their own, and the shared secret that every plaintext peer RPC must
carry: forged Raft RPCs (built with the project's own ``encode_frame``) change nothing unless they
come with the secret.

Without these, any client of a PLAINTEXT quorum could POST a Vote with a higher epoch to a
follower and depose the leader, or Fetch every record past the client API's credentials.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from proc_cluster import FAST, PEER_SECRET_HEADER, ProcessCluster, free_port, http_json

from quorum_node.node.app import build_app
from quorum_node.node.config import NodeConfig
from quorum_node.node.transport import decode_frame, encode_frame
from quorum_node.node.wiring import build_node
from quorum_node.raft.config import VoterEndpoint
from quorum_node.raft.messages import (
    BeginQuorumEpochRequest,
    EndQuorumEpochRequest,
    FetchRequest,
    FetchResponse,
    Message,
    VoteRequest,
    VoteResponse,
)
from quorum_node.raft.records import decode_batches
from quorum_node.storage.meta_properties import format_log_dir, random_cluster_id

VALUE = "written-before-the-forgeries"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    cluster = ProcessCluster.create(tmp_path_factory.mktemp("peers"), 3, **FAST)
    cluster.start_all()
    try:
        leader = cluster.wait_for_leader()
        http_json("POST", f"{cluster.nodes[leader].url}/v1/records", [VALUE])
        yield cluster
    finally:
        cluster.stop_all()


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


_EPOCH = re.compile(r"epoch (\d+)")
_FOLLOWING = re.compile(r"following (\d+) ")


def views(cluster: ProcessCluster) -> dict[int, tuple[int, int | None]]:
    """Each node's (epoch, leader), from its /readyz ("leader of epoch 3", "following 2 in
    epoch 3", "candidate in epoch 4", ...)."""
    seen: dict[int, tuple[int, int | None]] = {}
    for node_id, node in cluster.nodes.items():
        _, body = get(f"{node.url}/readyz")
        text = body.decode()
        epoch = _EPOCH.search(text)
        assert epoch is not None, text
        following = _FOLLOWING.search(text)
        leader = node_id if text.startswith("leader of") else (
            int(following.group(1)) if following is not None else None)
        seen[node_id] = (int(epoch.group(1)), leader)
    return seen


def settled_views(cluster: ProcessCluster) -> dict[int, tuple[int, int]]:
    """The nodes' views once they agree on one leader and epoch."""
    deadline = time.monotonic() + 20
    while True:
        seen = views(cluster)
        agreed = set(seen.values())
        if len(agreed) == 1:
            epoch, leader = agreed.pop()
            if leader is not None:
                return dict.fromkeys(seen, (epoch, leader))
        assert time.monotonic() < deadline, f"{seen}\n{cluster.logs()}"
        time.sleep(0.05)


def forgeries(cluster: ProcessCluster, epoch: int, leader: int, target: int
              ) -> list[tuple[str, int, Message]]:
    """(RPC name, node to send it to, request) for each kind of forged RPC: a Vote and a
    BeginQuorumEpoch claiming another voter 1000 epochs ahead, an EndQuorumEpoch in the
    leader's name (all to a follower), and a Fetch of every record from the leader."""
    cluster_id = cluster.cluster_id
    other = next(n for n in cluster.nodes if n not in (leader, target))
    return [
        ("Vote", target, VoteRequest(
            cluster_id=cluster_id, voter_id=target, replica_epoch=epoch + 1000,
            replica_id=other, last_offset_epoch=epoch + 999, last_offset=1_000_000)),
        ("BeginQuorumEpoch", target, BeginQuorumEpochRequest(
            cluster_id=cluster_id, leader_id=other, leader_epoch=epoch + 1000, voter_id=target)),
        ("EndQuorumEpoch", target, EndQuorumEpochRequest(
            cluster_id=cluster_id, leader_id=leader, leader_epoch=epoch, voter_id=target)),
        ("Fetch", leader, FetchRequest(
            cluster_id=cluster_id, replica_id=other, max_wait_ms=0, current_leader_epoch=epoch,
            fetch_offset=0, last_fetch_epoch=0)),
    ]


def assert_nothing_changes(cluster: ProcessCluster,
                           before: dict[int, tuple[int, int]]) -> None:
    # A granted forged Vote or BeginQuorumEpoch moves the target's epoch at once; an election
    # it set off would take an election timeout (500 ms). Watch for twice that.
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert views(cluster) == dict(before)
        time.sleep(0.1)


def test_peer_rpcs_on_the_client_listener_are_not_routed(cluster: ProcessCluster) -> None:
    before = settled_views(cluster)
    epoch, leader = next(iter(before.values()))
    target = next(n for n in cluster.nodes if n != leader)
    for name, node_id, request in forgeries(cluster, epoch, leader, target):
        status, _ = post(f"{cluster.nodes[node_id].url}/raft/v1/{name}", encode_frame(request),
                         {PEER_SECRET_HEADER: cluster.peer_secret})
        assert status == 404, name
    assert get(f"{cluster.nodes[target].url}/raft/v1/stream")[0] == 404
    # Nor do the client API, probes or metrics answer on the controller listener: a client
    # that came there is told, in the one error body, where they are served.
    for path in ("/v1/quorum", "/v1/records", "/readyz", "/metrics"):
        status, body = get(f"{cluster.nodes[leader].peer_url}{path}")
        assert status == 421, path
        answer = json.loads(body)
        assert answer["code"] == "WRONG_LISTENER"
        assert f"CLIENT://127.0.0.1:{cluster.nodes[leader].port}" in answer["message"]
    assert_nothing_changes(cluster, before)


@pytest.mark.parametrize("offered", [None, "not-the-quorums-secret"])
def test_peer_rpcs_without_the_secret_are_refused(cluster: ProcessCluster,
                                                  offered: str | None) -> None:
    before = settled_views(cluster)
    epoch, leader = next(iter(before.values()))
    target = next(n for n in cluster.nodes if n != leader)
    headers = {PEER_SECRET_HEADER: offered} if offered is not None else {}
    for name, node_id, request in forgeries(cluster, epoch, leader, target):
        status, body = post(f"{cluster.nodes[node_id].peer_url}/raft/v1/{name}",
                            encode_frame(request), headers)
        assert status == 401, name
        assert body.decode().count("\n") == 1 and PEER_SECRET_HEADER in body.decode(), body
        assert VALUE.encode() not in body
    # The stream's handshake too.
    assert get(f"{cluster.nodes[target].peer_url}/raft/v1/stream", headers)[0] == 401
    assert_nothing_changes(cluster, before)


def test_peer_rpcs_with_the_secret_are_processed(cluster: ProcessCluster) -> None:
    """The control: the same requests with the secret get through, so what refused them above
    is the secret (this one disturbs the quorum, so it runs last)."""
    before = settled_views(cluster)
    epoch, leader = next(iter(before.values()))
    target = next(n for n in cluster.nodes if n != leader)
    secret = {PEER_SECRET_HEADER: cluster.peer_secret}
    sent = {name: (node_id, request)
            for name, node_id, request in forgeries(cluster, epoch, leader, target)}
    node_id, request = sent["Fetch"]
    status, body = post(f"{cluster.nodes[node_id].peer_url}/raft/v1/Fetch",
                        encode_frame(request), secret)
    assert status == 200
    fetched = decode_frame(FetchResponse, body)
    values = [record.value for batch in decode_batches(fetched.records)
              for record in batch.records]
    assert f'"{VALUE}"'.encode() in values or VALUE.encode() in values, values
    node_id, request = sent["Vote"]
    status, body = post(f"{cluster.nodes[node_id].peer_url}/raft/v1/Vote",
                        encode_frame(request), secret)
    assert status == 200
    decode_frame(VoteResponse, body)
    # The target moved to the forged epoch: a peer's request is acted on.
    deadline = time.monotonic() + 5
    while views(cluster)[target][0] < epoch + 1000:
        assert time.monotonic() < deadline, views(cluster)
        time.sleep(0.05)


def test_plaintext_token_file_without_a_secret_refuses_to_start(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("0123456789abcdef0123 operator admin\n")
    port, peer_port = free_port(), free_port()
    config = tmp_path / "node.properties"
    config.write_text(
        f"node.id=1\ncluster.id={random_cluster_id()}\nlog.dir={tmp_path / 'log'}\n"
        f"listeners=CLIENT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{peer_port}\n"
        "listener.security.protocol.map=CLIENT:PLAINTEXT,CONTROLLER:PLAINTEXT\n"
        "controller.listener.names=CONTROLLER\n"
        f"controller.quorum.voters=1@127.0.0.1:{peer_port}\n"
        f"controller.quorum.client.endpoints=1@127.0.0.1:{port}\n"
        f"format.if.empty=true\nauth.token.file={tokens}\n")
    result = subprocess.run(
        [sys.executable, "-m", "quorum_node.cli.node", "run", "--config", str(config)],
        check=False, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "controller.listener.secret.file" in result.stderr
    assert "required with auth.token.file" in result.stderr
    assert not (tmp_path / "log").exists()  # refused before anything was written


def test_one_combined_listener_still_serves_everything(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    cluster_id = random_cluster_id()
    config = NodeConfig(node_id=1, cluster_id=cluster_id, log_dir=tmp_path / "node-1",
                        listeners=f"PLAINTEXT://127.0.0.1:{port}",
                        voters=(VoterEndpoint(id=1, host="127.0.0.1", port=port),))
    format_log_dir(config.log_dir, cluster_id, 1)

    async def scenario() -> tuple[int, int]:
        node = build_node(config)
        await node.start(build_app(node))
        try:
            deadline = time.monotonic() + 10
            while not node.core.leader_has_committed:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            loop = asyncio.get_running_loop()
            written = await loop.run_in_executor(None, lambda: http_json(
                "POST", f"http://127.0.0.1:{port}/v1/records", ["x"]))
            request = FetchRequest(cluster_id=cluster_id, replica_id=2, max_wait_ms=0,
                                   current_leader_epoch=node.core.epoch, fetch_offset=0,
                                   last_fetch_epoch=0)
            status, _ = await loop.run_in_executor(None, lambda: post(
                f"http://127.0.0.1:{port}/raft/v1/Fetch", encode_frame(request)))
            return int(written["last_offset"]), status
        finally:
            await node.shutdown(timeout_s=0.5)

    with caplog.at_level(logging.WARNING, logger="quorum_node.security.node_security"):
        last_offset, fetch_status = asyncio.run(scenario())
    assert last_offset >= 0 and fetch_status == 200  # client API and peer RPCs on one port
    warnings = [r.getMessage() for r in caplog.records]
    assert any("serves peers, clients and admin" in w for w in warnings), warnings
    assert any("peer RPCs on the PLAINTEXT listener" in w and "are open" in w
               for w in warnings), warnings
