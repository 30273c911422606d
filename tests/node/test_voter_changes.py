"""AddVoter and RemoveVoter (KIP-856) through the admin API, the Python client and quorum-admin:
real nodes in this process, and the CLI against a stand-in admin server."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from test_admin_api import LocalCluster, free_port, get_json, running_cluster
from test_admin_cli import run, status_lines
from test_metrics import scrape, value

from quorum_node.client import QuorumClient
from quorum_node.node.app import build_app
from quorum_node.node.metrics import metrics_for
from quorum_node.node.runtime import QuorumNode
from quorum_node.node.wiring import build_node
from quorum_node.raft.types import Errors, ReplicaKey, VoterChangeError
from quorum_node.storage.kafka_uuid import parse_uuid, random_uuid, to_kafka_string
from quorum_node.storage.meta_properties import format_log_dir

VOTERS = "/v1/quorum/voters"


async def request(method: str, url: str, body: Any = None, *, raw: bytes | None = None,
                  ) -> tuple[int, dict[str, Any], str | None]:
    async with aiohttp.ClientSession() as session, session.request(
            method, url, json=body, data=raw, allow_redirects=False) as response:
        return response.status, await response.json(), response.headers.get("Location")


def kafka(directory_id: uuid.UUID) -> str:
    return to_kafka_string(directory_id)


async def with_known_directories(cluster: LocalCluster) -> QuorumNode:
    """The leader, once it has learned every voter's directory id (its voter set names them)."""
    leader = await cluster.wait_for_leader()
    await cluster.wait_for(
        lambda: all(key.directory_id is not None for key in leader.core.voters), 15,
        "the leader to learn the voters' directory ids")
    return leader


def directory_of(cluster: LocalCluster, node_id: int) -> uuid.UUID:
    directory_id = cluster.nodes[node_id].log_dir.meta.directory_id
    assert directory_id is not None
    return directory_id


# --- the admin API ----------------------------------------------------------------------------


async def test_refusals_carry_kafkas_error_names(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as cluster:
        leader = await with_known_directories(cluster)
        url = cluster.url(leader.config.node_id) + VOTERS
        one = kafka(directory_of(cluster, 1))

        status, body, _ = await request("POST", url, {"id": 1, "directory_id": one})
        assert (status, body["code"]) == (409, "DUPLICATE_VOTER"), body
        assert body["message"]
        status, body, _ = await request("DELETE", f"{url}/2/{kafka(random_uuid())}")
        assert (status, body["code"]) == (409, "VOTER_NOT_FOUND"), body
        # Neither an observer nor a configured id.
        stranger = {"id": 7, "directory_id": kafka(random_uuid())}
        status, body, _ = await request("POST", url, stranger)
        assert (status, body["code"]) == (400, "INVALID_REQUEST"), body
        assert set(leader.core.voters) == {ReplicaKey(i, directory_of(cluster, i))
                                           for i in (1, 2, 3)}


module_loop = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lone(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    """One voter of three: it never has a leader, yet checks requests before anything else."""
    async with running_cluster(tmp_path_factory.mktemp("lone"), start=[1]) as cluster:
        yield cluster


@pytest.mark.parametrize(("method", "path", "body", "message"), [
    ("POST", "", b"{", "not valid JSON"),
    ("POST", "", b"[1]", "expected a JSON object"),
    ("POST", "", b'{"directory_id": "AAAAAAAAAAAAAAAAAAAAAQ"}', "id must be a node id"),
    ("POST", "", b'{"id": true, "directory_id": "AAAAAAAAAAAAAAAAAAAAAQ"}', "id must be"),
    ("POST", "", b'{"id": 3}', "directory_id must be a directory id string"),
    ("POST", "", b'{"id": 3, "directory_id": "nope"}', "directory_id: 'nope' is neither"),
    ("POST", "", b'{"id": 3, "directory_id": "AAAAAAAAAAAAAAAAAAAAAQ", "x": 1}',
     "unknown field 'x'"),
    ("POST", "?timeout_ms=0", b'{"id": 3, "directory_id": "AAAAAAAAAAAAAAAAAAAAAQ"}',
     "timeout_ms must be at least 1, got 0"),
    ("POST", "?timeout_ms=5", b'{"id": 3, "directory_id": "AAAAAAAAAAAAAAAAAAAAAQ", '
                              b'"timeout_ms": 5}', "timeout_ms is given more than once"),
    ("POST", "?wait=1", b'{"id": 3, "directory_id": "AAAAAAAAAAAAAAAAAAAAAQ"}',
     "unknown query parameter 'wait'"),
    ("DELETE", "/x/AAAAAAAAAAAAAAAAAAAAAQ", None, "id must be a node id"),
    ("DELETE", "/3/AAAAAAAAAAAAAAAAAAAAAQ?decommission=yes", None,
     "decommission must be true or false, got 'yes'"),
    ("DELETE", "/3/AAAAAAAAAAAAAAAAAAAAAQ?decommission=true&decommission=true", None,
     "query parameter 'decommission' is given more than once"),
    ("DELETE", "/3/AAAAAAAAAAAAAAAAAAAAAQ?force=true", None,
     "unknown query parameter 'force' (allowed: decommission, timeout_ms)"),
    ("DELETE", "/3/AAAA", None, "directory_id: 'AAAA' is neither"),
])
@module_loop
async def test_malformed_requests_are_bad_request(
        lone: LocalCluster, method: str, path: str, body: bytes | None, message: str) -> None:
    status, answer, _ = await request(method, lone.url(1) + VOTERS + path, raw=body)
    assert (status, answer["code"]) == (400, "BAD_REQUEST")
    assert message in answer["message"]


async def test_decommissioning_a_node_takes_its_id_out_of_the_voters(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as cluster:
        leader = await with_known_directories(cluster)
        leader_id = leader.config.node_id
        gone = next(i for i in (1, 2, 3) if i != leader_id)
        url = f"{cluster.url(leader_id)}{VOTERS}/{gone}/{kafka(directory_of(cluster, gone))}"
        # Its only directory: refused unless decommissioned.
        status, body, _ = await request("DELETE", url)
        assert (status, body["code"]) == (400, "INVALID_REQUEST"), body
        assert "decommission" in body["message"]
        status, body, _ = await request("DELETE", url + "?decommission=false")
        assert (status, body["code"]) == (400, "INVALID_REQUEST"), body
        assert len(leader.core.voters) == 3
        status, body, _ = await request("DELETE", url + "?decommission=true")
        assert status == 200, body
        remaining = {i for i in (1, 2, 3) if i != gone}
        assert {voter["id"] for voter in body["voters"]} == remaining
        assert {key.id for key in leader.core.voters} == remaining
        # Both remaining voters hold the change: the other one applied it from the log.
        other = cluster.nodes[next(iter(remaining - {leader_id}))]
        await cluster.wait_for(lambda: {k.id for k in other.core.voters} == remaining, 10,
                               "the follower to apply the new voter set")
        # The quorum of two still commits writes.
        async with aiohttp.ClientSession() as session, session.post(
                cluster.url(leader_id) + "/v1/records", json=["after"]) as response:
            assert response.status == 200, await response.text()


async def test_a_follower_redirects_and_without_a_leader_it_is_503(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as cluster:
        leader = await cluster.wait_for_leader()
        follower = next(i for i in cluster.nodes if i != leader.config.node_id)
        path = f"{VOTERS}/3/{kafka(random_uuid())}?timeout_ms=100"
        status, body, location = await request("DELETE", cluster.url(follower) + path)
        assert (status, body["code"]) == (307, "NOT_LEADER")
        assert location == cluster.url(leader.config.node_id) + path
        status, body, location = await request(
            "POST", cluster.url(follower) + VOTERS, {"id": 3, "directory_id": kafka(random_uuid())})
        assert (status, location) == (307, cluster.url(leader.config.node_id) + VOTERS)

    async with running_cluster(tmp_path / "lone", start=[1]) as cluster:  # it can never win
        status, body, _ = await request(
            "POST", cluster.url(1) + VOTERS, {"id": 3, "directory_id": kafka(random_uuid())})
        assert (status, body["code"]) == (503, "NO_LEADER")


async def test_a_change_not_done_in_time_is_504(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    async with running_cluster(tmp_path) as cluster:
        leader = await cluster.wait_for_leader()
        # A change that never ends (the core took no ticket: no outcome will come), and one
        # refused because another is pending.
        monkeypatch.setattr(leader.core, "add_voter", lambda now_ms, key, timeout_ms: 1)

        def pending(now_ms: int, key: ReplicaKey, timeout_ms: int, *,
                    decommission: bool = False) -> int:
            raise VoterChangeError(Errors.REQUEST_TIMED_OUT, "another voter change is pending")

        monkeypatch.setattr(leader.core, "remove_voter", pending)
        url = cluster.url(leader.config.node_id) + VOTERS
        status, body, _ = await request(
            "POST", url, {"id": 3, "directory_id": kafka(random_uuid()), "timeout_ms": 200})
        assert (status, body["code"]) == (504, "REQUEST_TIMED_OUT")
        assert body["message"] == "not done within 0.2 s; it may still complete"
        status, body, _ = await request("DELETE", f"{url}/3/{kafka(random_uuid())}")
        assert (status, body) == (504, {"code": "REQUEST_TIMED_OUT",
                                        "message": "another voter change is pending"})


# --- a replaced disk --------------------------------------------------------------------------


async def restart_on_a_new_disk(cluster: LocalCluster, node_id: int) -> QuorumNode:
    """Stop the node, wipe its log directory, format it again (a new directory id), restart."""
    config = cluster.nodes[node_id].config
    await cluster.stop(node_id)
    shutil.rmtree(config.log_dir)
    format_log_dir(config.log_dir, cluster.cluster_id, node_id)
    node = build_node(config)
    metrics_for(node)
    cluster.nodes[node_id] = node
    cluster.stopped.discard(node_id)
    await node.start(build_app(node))
    return node


async def test_replacing_a_voters_disk(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    async with running_cluster(tmp_path) as cluster:
        await with_known_directories(cluster)
        u1, u2, old = (directory_of(cluster, i) for i in (1, 2, 3))
        new = (await restart_on_a_new_disk(cluster, 3)).log_dir.meta.directory_id
        assert new is not None and new != old
        replacement = ReplicaKey(3, new)

        def observed() -> bool:
            leader = cluster.leader()
            return leader is not None and leader.core.high_watermark is not None and any(
                row.key == replacement
                for row in leader.core.describe_quorum(time.time_ns() // 1_000_000).observers)

        await cluster.wait_for(observed, 20, "the new disk to fetch as an observer")
        leader = cluster.leader()
        assert leader is not None
        leader_id = leader.config.node_id
        assert ReplicaKey(3, old) in leader.core.voters

        # DescribeQuorum, the CLI and the metrics show it as a possible voter.
        _, quorum, _ = await get_json(cluster.url(leader_id) + "/v1/quorum")
        assert [(o["id"], o["directory_id"], o["could_be_voter"]) for o in quorum["observers"]] \
            == [(3, kafka(new), True)]
        code, out, _ = await run(capsys, "--bootstrap-server",
                                 cluster.url(leader_id).removeprefix("http://"),
                                 "describe", "--status")
        assert code == 0
        assert [(v["id"], v["directoryId"]) for v in
                json.loads(status_lines(out)["CouldBeVoters"])] == [(3, kafka(new))]
        samples = await scrape(cluster, leader_id)
        assert value(samples, "quorum_number_of_possible_voters") == 1
        assert value(samples, "quorum_pending_add_voter") == 0

        # The leader last: the client follows the others' redirects to it.
        bootstrap = [cluster.url(i) for i in sorted(cluster.nodes, key=lambda i: i == leader_id)]
        with QuorumClient(bootstrap, timeout_s=30) as client:
            added = await asyncio.to_thread(client.add_voter, 3, kafka(new))
            assert {(v.id, v.directory_id) for v in added} == {
                (1, kafka(u1)), (2, kafka(u2)), (3, kafka(old)), (3, kafka(new))}
            removed = await asyncio.to_thread(client.remove_voter, 3, kafka(old))
        expected = {ReplicaKey(1, u1), ReplicaKey(2, u2), replacement}
        assert {ReplicaKey(v.id, uuid_of(v.directory_id)) for v in removed} == expected

        await cluster.wait_for(
            lambda: all(set(n.core.voters) == expected for n in cluster.running().values()),
            10, "every replica to apply the new voter set")
        leader = await cluster.wait_for_leader()
        samples = await scrape(cluster, leader.config.node_id)
        assert value(samples, "quorum_number_of_voters") == 3
        # As in Kafka, a removed voter stays listed as an observer until its fetch session
        # expires; the old disk, which no process runs, is marked retired and not offered back.
        observers = leader.core.describe_quorum(time.time_ns() // 1_000_000).observers
        assert {row.key for row in observers} <= {ReplicaKey(3, old)}
        assert value(samples, "quorum_number_of_possible_voters") == 0
        _, quorum, _ = await get_json(cluster.url(leader.config.node_id) + "/v1/quorum")
        assert all(o["retired"] and not o["could_be_voter"] for o in quorum["observers"]), quorum
        assert value(samples, "quorum_pending_remove_voter") == 0


def uuid_of(directory_id: str | None) -> uuid.UUID:
    assert directory_id is not None
    return parse_uuid(directory_id)


# --- quorum-admin add-voter / remove-voter, against a stand-in admin server --------------------


class StandIn:
    """Answers voter changes with a canned answer and records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, Any]] = []
        self.queries: list[dict[str, str]] = []
        self.answer: tuple[int, dict[str, Any]] = (200, {})
        self.delay_s = 0.0
        self.quorum: dict[str, Any] = {}

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        self.asked.append((request.method, request.path, body))
        self.queries.append(dict(request.query))
        await asyncio.sleep(self.delay_s)
        status, answer = self.answer
        return web.json_response(answer, status=status)

    async def describe(self, _: web.Request) -> web.Response:
        return web.json_response(self.quorum)


@pytest.fixture
async def stand_in() -> AsyncIterator[tuple[StandIn, str]]:
    server = StandIn()
    app = web.Application()
    app.add_routes([web.post(VOTERS, server.handle),
                    web.delete(VOTERS + "/{id}/{directory_id}", server.handle),
                    web.get("/v1/quorum", server.describe)])
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield server, f"127.0.0.1:{port}"
    await runner.cleanup()


ONE = "AAAAAAAAAAAAAAAAAAAAAQ"
NEW = "AAAAAAAAAAAAAAAAAAAACQ"
OLD = "AAAAAAAAAAAAAAAAAAAAAw"


async def test_cli_adds_and_removes(stand_in: tuple[StandIn, str],
                                    capsys: pytest.CaptureFixture[str]) -> None:
    server, address = stand_in
    voters = [{"id": 1, "directory_id": ONE}, {"id": 3, "directory_id": NEW}]
    server.answer = (200, {"error": "NONE", "id": 3, "directory_id": NEW, "voters": voters})
    code, out, err = await run(capsys, "--bootstrap-server", address, "add-voter",
                               "--id", "3", "--uuid", NEW)
    assert (code, err) == (0, "")
    assert out == (f"Added voter 3 with directory id {NEW}\n"
                   f'CurrentVoters:          [{{"id": 1, "directoryId": "{ONE}"}}, '
                   f'{{"id": 3, "directoryId": "{NEW}"}}]\n')
    # The canonical uuid form is accepted and sent in Kafka's form.
    canonical = str(uuid.UUID(bytes=b"\0" * 15 + b"\3"))
    code, out, err = await run(capsys, "remove-voter", "--id", "3", "--uuid", canonical,
                               "--bootstrap-server", address)
    assert (code, err) == (0, "")
    assert out.startswith(f"Removed voter 3 with directory id {OLD}\n")
    assert server.asked == [("POST", VOTERS, {"id": 3, "directory_id": NEW}),
                            ("DELETE", f"{VOTERS}/3/{OLD}", None)]
    assert "decommission" not in server.queries[-1]
    code, out, err = await run(capsys, "--bootstrap-server", address, "remove-voter",
                               "--id", "3", "--uuid", OLD, "--decommission")
    assert (code, err) == (0, "")
    assert server.asked[-1] == ("DELETE", f"{VOTERS}/3/{OLD}", None)
    assert server.queries[-1]["decommission"] == "true"


@pytest.mark.parametrize(("status", "code", "message"), [
    (409, "DUPLICATE_VOTER", "voter 3 is already a voter"),
    (400, "INVALID_REQUEST", "3 is not an observer"),
    (504, "REQUEST_TIMED_OUT", "another voter change is pending"),
])
async def test_cli_refusals_are_one_line_and_exit_1(
        stand_in: tuple[StandIn, str], capsys: pytest.CaptureFixture[str], status: int,
        code: str, message: str) -> None:
    server, address = stand_in
    server.answer = (status, {"code": code, "message": message})
    exit_code, out, err = await run(capsys, "--bootstrap-server", address, "add-voter",
                                    "--id", "3", "--uuid", NEW)
    assert (exit_code, out) == (1, "")
    assert err == (f"quorum-admin: error: cannot add voter 3 with directory id {NEW}: "
                   f"{code}: {message}\n")


async def test_cli_tells_the_progress_of_a_long_wait(
        stand_in: tuple[StandIn, str], capsys: pytest.CaptureFixture[str]) -> None:
    server, address = stand_in
    voters = [{"id": 1, "directory_id": ONE}, {"id": 3, "directory_id": NEW}]
    server.answer = (200, {"error": "NONE", "id": 3, "directory_id": NEW, "voters": voters})
    server.delay_s = 2.5

    def row(node_id: int, directory_id: str, end: int) -> dict[str, Any]:
        return {"id": node_id, "directory_id": directory_id, "log_end_offset": end,
                "lag": 10 - end, "last_fetch_timestamp": 5, "last_caught_up_timestamp": 5,
                "endpoint": None}

    server.quorum = {"cluster_id": "c", "leader_id": 1, "leader_epoch": 4, "high_watermark": 10,
                     "voters": [row(1, ONE, 10)],
                     "observers": [row(3, NEW, 7) | {"could_be_voter": True}]}
    code, out, err = await run(capsys, "-b", address, "add-voter", "--id", "3", "--uuid", NEW)
    assert code == 0 and out.startswith("Added voter 3")
    lines = err.splitlines()
    assert len(lines) == 2, err  # at 1 s and 2 s
    assert lines[0] == (f"quorum-admin: adding voter 3 with directory id {NEW}: 1 s; an observer "
                        "at offset 7 of leader 1's 10 (lag 3)")


async def test_cli_with_no_node_reachable_gives_up_at_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    code, out, err = await run(capsys, "--bootstrap-server", f"127.0.0.1:{free_port()}",
                               "remove-voter", "--id", "3", "--uuid", OLD)
    assert time.monotonic() - started < 2  # not the 30 s a voter change may wait
    assert (code, out) == (1, "")
    assert err.count("\n") == 1
    assert err.startswith(f"quorum-admin: error: cannot remove voter 3 with directory id {OLD}: "
                          f"UNAVAILABLE: no node reachable: ")
