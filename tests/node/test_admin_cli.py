"""``quorum-admin describe``: against real in-process nodes (the CLI runs in a worker thread while
the nodes serve on the test's event loop), and its formatting on crafted answers."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from test_admin_api import LocalCluster, free_port, running_cluster

from quorum_node.cli.admin import (
    REPLICATION_COLUMNS,
    STATUS_COLUMNS,
    format_replication,
    format_status,
    main,
    max_follower_lag,
    parse_bootstrap,
    unreachable_voters,
)
from quorum_node.raft.records import Record
from quorum_node.storage.kafka_uuid import to_kafka_string

module_loop = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def trio(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    async with running_cluster(tmp_path_factory.mktemp("trio")) as cluster:
        leader = await cluster.wait_for_leader()
        await leader.append([Record(b"x"), Record(b"y")], timeout_s=5)
        await cluster.wait_for_leader()
        yield cluster


def address(cluster: LocalCluster, node_id: int) -> str:
    return cluster.url(node_id).removeprefix("http://")


def followers(cluster: LocalCluster) -> list[int]:
    leader = cluster.leader()
    assert leader is not None
    return [i for i in cluster.nodes if i != leader.config.node_id]


async def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def status_lines(out: str) -> dict[str, str]:
    lines = out.splitlines()
    # Kafka's layout: every value starts in column 24.
    assert all(len(line) > 24 and line[23] == " " and line[24] != " " for line in lines), out
    return {line[:24].strip().rstrip(":"): line[24:] for line in lines}


@module_loop
async def test_status_through_a_follower(trio: LocalCluster,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    follower = followers(trio)[0]
    leader = trio.leader()
    assert leader is not None
    code, out, err = await run(capsys, "--bootstrap-server", address(trio, follower),
                               "describe", "--status")
    assert (code, err) == (0, "")
    lines = status_lines(out)
    assert list(lines) == ["ClusterId", "LeaderId", "LeaderEpoch", "HighWatermark",
                           "MaxFollowerLag", "MaxFollowerLagTimeMs", "CurrentVoters",
                           "CurrentObservers", "CouldBeVoters", "RetiredObservers",
                           "UnreachableVoters"]
    assert lines["ClusterId"] == trio.cluster_id
    assert lines["LeaderId"] == str(leader.config.node_id)
    assert lines["LeaderEpoch"] == str(leader.core.epoch)
    assert lines["HighWatermark"] == str(leader.core.log.end_offset)
    assert lines["MaxFollowerLag"] == "0"
    assert lines["MaxFollowerLagTimeMs"] == "0"  # nobody behind the leader
    voters = json.loads(lines["CurrentVoters"])
    assert [v["id"] for v in voters] == [1, 2, 3]
    for voter in voters:
        assert list(voter) == ["id", "directoryId", "endpoints"]
        assert voter["endpoints"] == [trio.url(voter["id"])]
        if voter["id"] == leader.config.node_id:
            assert voter["directoryId"] == to_kafka_string(leader.log_dir.meta.directory_id)
    assert json.loads(lines["CurrentObservers"]) == []
    assert json.loads(lines["CouldBeVoters"]) == []
    assert json.loads(lines["UnreachableVoters"]) == []
    assert re.search(r'CurrentVoters:\s+\[\{"id": 1, "directoryId": ', out)


@module_loop
async def test_replication_table(trio: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    leader = trio.leader()
    assert leader is not None
    bootstrap = ",".join(address(trio, i) for i in trio.nodes)
    code, out, err = await run(capsys, "--bootstrap-server", bootstrap,
                               "describe", "--replication")
    assert (code, err) == (0, "")
    header, *rows = out.splitlines()
    assert header.split() == list(REPLICATION_COLUMNS)
    starts = [header.index(column) for column in REPLICATION_COLUMNS]
    cells = []
    for row in rows:
        # Aligned: every cell starts under its column's title.
        assert all(row[s] != " " and row[s - 1] == " " for s in starts[1:]), out
        cells.append(row.split())
    assert [c[-1] for c in cells] == ["Leader", "Follower", "Follower"]
    assert int(cells[0][0]) == leader.config.node_id
    assert sorted(int(c[0]) for c in cells) == [1, 2, 3]
    assert cells[0][1] == to_kafka_string(leader.log_dir.meta.directory_id)
    end = str(leader.core.log.end_offset)
    assert all(c[2] == end and c[3] == "0" and int(c[4]) > 0 and int(c[5]) > 0 for c in cells)


@module_loop
async def test_human_readable_timestamps(trio: LocalCluster,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = await run(capsys, "--bootstrap-server", address(trio, 1),
                             "describe", "--replication", "--human-readable")
    assert code == 0
    for row in out.splitlines()[1:]:
        assert len(re.findall(r"\b\d+ ms ago\b", row)) == 2, row


@module_loop
async def test_json_is_the_leaders_answer(trio: LocalCluster,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = await run(capsys, "describe", "--status", "--json",
                             "--bootstrap-server", address(trio, followers(trio)[1]))
    assert code == 0
    quorum = json.loads(out)
    assert quorum["cluster_id"] == trio.cluster_id
    assert len(quorum["voters"]) == 3
    assert quorum["observers"] == []


@module_loop
async def test_an_unreachable_server_is_skipped(trio: LocalCluster,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    dead = f"127.0.0.1:{free_port()}"
    code, out, err = await run(capsys, "--bootstrap-server", f"{dead},{address(trio, 2)}",
                               "describe", "--status")
    assert (code, err) == (0, "")
    assert status_lines(out)["ClusterId"] == trio.cluster_id


async def test_no_reachable_server_is_one_line_and_exit_1(
        capsys: pytest.CaptureFixture[str]) -> None:
    ports = [free_port(), free_port()]
    code, out, err = await run(capsys, "--bootstrap-server",
                               ",".join(f"127.0.0.1:{p}" for p in ports), "describe", "--status")
    assert (code, out) == (1, "")
    assert err == (f"quorum-admin: error: cannot describe the quorum: "
                   f"http://127.0.0.1:{ports[0]}/v1/quorum: Connection refused; "
                   f"http://127.0.0.1:{ports[1]}/v1/quorum: Connection refused\n")


async def test_without_a_leader_it_waits_then_gives_up(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async with running_cluster(tmp_path, start=[1]) as cluster:  # one voter of three
        code, out, err = await run(capsys, "--bootstrap-server", address(cluster, 1),
                                   "--timeout", "0.4", "describe", "--replication")
    assert (code, out) == (1, "")
    assert err.count("\n") == 1
    assert err.startswith(f"quorum-admin: error: cannot describe the quorum: "
                          f"{cluster.url(1)}/v1/quorum: no leader is known in epoch ")


@pytest.mark.parametrize(("argv", "message"), [
    (["--bootstrap-server", "localhost", "describe", "--status"],
     "--bootstrap-server: 'localhost' is not HOST:PORT"),
    (["--bootstrap-server", "h:99999", "describe", "--status"],
     "--bootstrap-server: 'h:99999' is not HOST:PORT"),
    (["describe"], "one of the arguments --status --replication is required"),
    (["describe", "--status", "--replication"], "argument --replication: not allowed with "
                                                "argument --status"),
    (["describe", "--status", "--human-readable"],
     "--human-readable is only valid with --replication"),
    ([], "the following arguments are required: COMMAND"),
    (["add-voter", "--id", "3"], "the following arguments are required: --uuid"),
    (["remove-voter", "--uuid", "AAAAAAAAAAAAAAAAAAAAAw"],
     "the following arguments are required: --id"),
    (["add-voter", "--id", "x", "--uuid", "AAAAAAAAAAAAAAAAAAAAAw"],
     "argument --id: invalid int value: 'x'"),
    (["add-voter", "--id", "-1", "--uuid", "AAAAAAAAAAAAAAAAAAAAAw"],
     "--id must be a node id (>= 0), got -1"),
    (["add-voter", "--id", "3", "--uuid", "nope"], "--uuid: 'nope' is neither"),
    (["--timeout", "0", "add-voter", "--id", "3", "--uuid", "AAAAAAAAAAAAAAAAAAAAAw"],
     "argument --timeout: must be a positive number, got '0'"),
    (["-b", "h:99999", "describe", "--status"], "--bootstrap-server: 'h:99999' is not HOST:PORT"),
])
def test_usage_errors_are_one_line_and_exit_2(argv: list[str], message: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("quorum-admin: error: ")
    assert message in err


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "usage: quorum-admin" in capsys.readouterr().out
    assert main(["describe", "--help"]) == 0
    assert "--replication" in capsys.readouterr().out


def test_runs_as_a_module() -> None:
    result = subprocess.run([sys.executable, "-m", "quorum_node.cli.admin", "--help"],
                            capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0
    assert result.stdout.startswith("usage: quorum-admin")


def test_bootstrap_forms() -> None:
    assert parse_bootstrap("a:1, http://b:2/ ,[::1]:3") == [("a", 1), ("b", 2), ("::1", 3)]


# --- formatting, on crafted answers -----------------------------------------------------------


def replica(node_id: int, end: int, fetched: int, caught_up: int,
            directory_id: str | None = None) -> dict[str, Any]:
    return {"id": node_id, "directory_id": directory_id, "log_end_offset": end,
            "lag": -1 if end < 0 else 100 - end, "last_fetch_timestamp": fetched,
            "last_caught_up_timestamp": caught_up, "endpoint": None}


def quorum(*voters: dict[str, Any], observers: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    return {"cluster_id": "c", "leader_id": 1, "leader_epoch": 7, "high_watermark": 90,
            "voters": list(voters), "observers": list(observers)}


def test_max_follower_lag_is_the_laggiest_voter() -> None:
    leader = replica(1, 100, 5000, 5000, "AAAAAAAAAAAAAAAAAAAAAQ")
    answer = quorum(leader, replica(2, 95, 4990, 4000), replica(3, 80, 4900, 3000))
    assert max_follower_lag(answer) == (20, 2000)
    assert max_follower_lag(quorum(leader, replica(2, 100, 4990, 4990))) == (0, 0)


def test_max_follower_lag_ignores_unreachable_voters_and_lists_them() -> None:
    leader = replica(1, 100, 50_000, 50_000, "AAAAAAAAAAAAAAAAAAAAAQ")
    never_fetched = replica(2, -1, -1, -1)
    gone = replica(3, 40, 40_000, 39_000)  # no fetch for 10 s
    behind = replica(4, 95, 49_990, 49_000)
    answer = quorum(leader, never_fetched, gone, behind)
    # The reachable follower's lag, not -1 (hidden) nor the dead voter's stale 60.
    assert max_follower_lag(answer) == (5, 1000)
    assert [v["id"] for v in unreachable_voters(answer)] == [2, 3]
    lines = status_lines(format_status(answer))
    assert lines["MaxFollowerLag"] == "5"
    assert lines["UnreachableVoters"].startswith('[{"id": 2, ')
    assert max_follower_lag(quorum(leader, never_fetched)) == (0, 0)


def test_status_format() -> None:
    leader = replica(1, 100, 5000, 5000, "AAAAAAAAAAAAAAAAAAAAAQ")
    leader["endpoint"] = "http://h:1"
    candidate = replica(2, 90, 4000, 3000, "AAAAAAAAAAAAAAAAAAAAAg") | {"could_be_voter": True}
    retired = replica(2, 60, 2000, 2000, "AAAAAAAAAAAAAAAAAAAABw") | {"could_be_voter": False,
                                                                     "retired": True}
    answer = quorum(leader, replica(2, 95, 4990, 4000),
                    observers=(candidate, retired,
                               replica(9, 90, 4000, 3000, "AAAAAAAAAAAAAAAAAAAACQ")
                               | {"could_be_voter": False}))
    assert format_status(answer) == "\n".join([
        "ClusterId:              c",
        "LeaderId:               1",
        "LeaderEpoch:            7",
        "HighWatermark:          90",
        "MaxFollowerLag:         5",
        "MaxFollowerLagTimeMs:   1000",
        'CurrentVoters:          [{"id": 1, "directoryId": "AAAAAAAAAAAAAAAAAAAAAQ", '
        '"endpoints": ["http://h:1"]}, {"id": 2, "directoryId": null, "endpoints": []}]',
        'CurrentObservers:       [{"id": 2, "directoryId": "AAAAAAAAAAAAAAAAAAAAAg", '
        '"endpoints": []}, {"id": 2, "directoryId": "AAAAAAAAAAAAAAAAAAAABw", "endpoints": []}, '
        '{"id": 9, "directoryId": "AAAAAAAAAAAAAAAAAAAACQ", "endpoints": []}]',
        'CouldBeVoters:          [{"id": 2, "directoryId": "AAAAAAAAAAAAAAAAAAAAAg", '
        '"endpoints": []}]',
        'RetiredObservers:       [{"id": 2, "directoryId": "AAAAAAAAAAAAAAAAAAAABw", '
        '"endpoints": []}]',
        "UnreachableVoters:      []",
    ])
    # A voter whose client listener refuses connections (stopped) is unreachable at once, and
    # left out of MaxFollowerLag, though the leader heard from it 10 ms ago.
    stopped = status_lines(format_status(answer, stopped={2}))
    assert json.loads(stopped["UnreachableVoters"])[0]["id"] == 2
    assert (stopped["MaxFollowerLag"], stopped["MaxFollowerLagTimeMs"]) == ("0", "0")


def test_replication_format() -> None:
    leader = replica(1, 100, 5000, 5000, "AAAAAAAAAAAAAAAAAAAAAQ")
    answer = quorum(replica(3, 95, 4990, 4000), leader, replica(2, -1, -1, -1),
                    observers=(replica(9, 90, 4000, 3000),))
    assert format_replication(answer, human_readable=False, now_ms=6000) == "\n".join([
        "NodeId  DirectoryId             LogEndOffset  Lag  LastFetchTimestamp  "
        "LastCaughtUpTimestamp  Status",
        "1       AAAAAAAAAAAAAAAAAAAAAQ  100           0    5000                5000       "
        "            Leader",
        "2       -                       -1            -1   -1                  -1         "
        "            Follower",
        "3       -                       95            5    4990                4000       "
        "            Follower",
        "9       -                       90            10   4000                3000       "
        "            Observer",
    ])
    human = format_replication(answer, human_readable=True, now_ms=6000).splitlines()
    assert human[1].split()[4:] == ["1000", "ms", "ago", "1000", "ms", "ago", "Leader"]
    assert human[2].split()[4:] == ["unknown", "unknown", "Follower"]
    retired = quorum(leader, observers=(replica(1, 90, 4000, 3000) | {"retired": True},))
    assert format_replication(retired, human_readable=False, now_ms=6000).splitlines()[2] \
        .endswith(" Observer (retired)")


# --- status: every node's own view ----------------------------------------------------------------


@module_loop
async def test_status_finds_every_node_from_one(trio: LocalCluster,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    deadline = time.monotonic() + 20
    while True:  # a view between elections (a busy machine may miss a fetch timeout)
        await trio.wait_for_leader()
        follower = followers(trio)[0]
        code, out, err = await run(capsys, "-b", address(trio, follower), "status", "--json")
        assert (code, err) == (0, "")
        rows = json.loads(out)
        assert [row["node_id"] for row in rows] == [1, 2, 3]
        leaders = [row["node_id"] for row in rows if row["state"] == "leader"]
        if (len(leaders) == 1 and all(row["leader_id"] == leaders[0] for row in rows)) \
                or time.monotonic() > deadline:
            break
    for row in rows:
        node = trio.nodes[row["node_id"]]
        assert row["endpoint"] == trio.url(row["node_id"]) and row["reachable"] is True
        assert row["directory_id"] == to_kafka_string(node.log_dir.meta.directory_id)
        assert row["state"] in ("leader", "follower")
        assert row["leader_id"] == leaders[0]
        assert row["is_voter"] is True and row["failure"] is None
        assert row["lag"] >= 0
    code, out, err = await run(capsys, "-b", address(trio, follower), "status")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert [c.strip() for c in lines[1].split("|")[1:-1]] == list(STATUS_COLUMNS)
    assert len(lines) == 3 + 3 + 1  # rules, header, three nodes
    assert all(line.count("|") == len(STATUS_COLUMNS) + 1 for line in lines[1::2])


async def test_status_and_describe_with_a_voter_down(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async with running_cluster(tmp_path, start=[1, 2]) as cluster:  # voter 3 never started
        await cluster.wait_for_leader()
        code, out, err = await run(capsys, "-b", address(cluster, 1), "status", "--json")
        assert (code, err) == (1, "")
        rows = {row["endpoint"]: row for row in json.loads(out)}
        assert len(rows) == 3
        down = [row for row in rows.values() if not row["reachable"]]
        assert len(down) == 1 and "Connection refused" in down[0]["error"]
        code, out, _ = await run(capsys, "-b", address(cluster, 1), "status")
        assert code == 1 and "unreachable: Connection refused" in out
        code, out, err = await run(capsys, "-b", address(cluster, 1), "describe", "--status")
        assert (code, err) == (0, "")
        lines = status_lines(out)
        assert lines["MaxFollowerLag"] != "-1"  # the live follower's lag, not hidden
        assert [v["id"] for v in json.loads(lines["UnreachableVoters"])] == [3]
