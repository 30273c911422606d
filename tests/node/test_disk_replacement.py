"""KIP-856's disk failure recovery scenario, end to end: real node processes, real disks, and only
the command-line tools for the recovery itself (kill, wipe, ``quorum-node format``, restart,
``quorum-admin describe``, ``add-voter``, ``remove-voter``).

Three variants: a follower's disk replaced, the leader's disk replaced, and a follower's disk
replaced after the others compacted their logs into snapshots, so that the new replica can only
catch up through FetchSnapshot. Each step's duration is printed (run with ``-s`` to see them).
"""

from __future__ import annotations

import concurrent.futures
import json
import shutil
import subprocess
import sys
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import pytest
from proc_cluster import ProcessCluster, http_json

from quorum_node.client import QuorumClient

RECORDS = 10_000
KV_KEYS = 300
BATCH = 500


def cli(tool: str, *args: str, timeout_s: float = 60) -> str:
    """Run one of the console tools as a user would; its stdout. Fails the test on a non-zero
    exit, with what it printed."""
    module = {"quorum-node": "quorum_node.cli.node", "quorum-admin": "quorum_node.cli.admin",
              "quorum-client": "quorum_node.cli.client"}[tool]
    done = subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True, timeout=timeout_s, check=False)
    assert done.returncode == 0, f"{tool} {' '.join(args)} -> {done.returncode}\n" \
                                 f"{done.stdout}\n{done.stderr}"
    return done.stdout


class Steps:
    """Times the scenario's steps."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.durations: list[tuple[str, float]] = []

    def run(self, what: str, action: Any) -> Any:
        started = time.monotonic()
        result = action()
        self.durations.append((what, time.monotonic() - started))
        return result

    def report(self) -> None:
        print(f"\n[{self.name}]")
        for what, seconds in self.durations:
            print(f"  {what:<58} {seconds * 1000:9.0f} ms")


class ClusterSettings(TypedDict, total=False):
    """What a variant sets on every node (the ``cluster`` fixture's parameter)."""

    snapshot_interval_records: int
    log_segment_bytes: int


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ProcessCluster]:
    settings: ClusterSettings = request.param if hasattr(request, "param") else {}
    started = ProcessCluster.create(tmp_path, 3, **settings)
    try:
        started.start_all()
        yield started
    finally:
        started.stop_all()


def describe(cluster: ProcessCluster, via: int) -> dict[str, Any]:
    server = f"127.0.0.1:{cluster.nodes[via].port}"
    status: dict[str, Any] = json.loads(cli("quorum-admin", "--bootstrap-server", server,
                                            "describe", "--status", "--json"))
    return status


def wait_until(what: str, condition: Any, cluster: ProcessCluster, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            found = condition()
        except (AssertionError, OSError, urllib.error.URLError):
            found = None
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}\n{cluster.logs()}")


def write_data(cluster: ProcessCluster, leader: int) -> None:
    """RECORDS records in batches, then KV_KEYS KV puts from a few clients."""
    server = f"127.0.0.1:{cluster.nodes[leader].port}"
    with QuorumClient(server, timeout_s=30) as client:
        for first in range(0, RECORDS, BATCH):
            client.append([b"record-%d" % i for i in range(first, first + BATCH)])

    def put(i: int) -> None:
        with QuorumClient(server, timeout_s=30) as client:
            client.put(f"key-{i}", f"v{i}")

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(KV_KEYS)))


def records_on(cluster: ProcessCluster, node_id: int) -> list[bytes]:
    """Every committed record from offset 0 on ``node_id`` (no redirect: its own log)."""
    values: list[bytes] = []
    offset = 0
    with QuorumClient(f"127.0.0.1:{cluster.nodes[node_id].port}", timeout_s=30) as client:
        while True:
            page = client.read(offset, max_records=10_000)
            values += [record.value for record in page.records]
            if page.high_watermark is None or page.next_offset >= page.high_watermark:
                return values
            offset = page.next_offset


def check_all_data(cluster: ProcessCluster, compacted: bool) -> bool:
    """Every node serves every key (stale reads: its own store) and, unless the logs were
    compacted, the same records as every other node: True (for ``wait_until``), else an
    AssertionError."""
    for node_id, node in cluster.nodes.items():
        with QuorumClient(f"127.0.0.1:{node.port}", timeout_s=10) as client:
            for i in range(KV_KEYS):
                assert client.get(f"key-{i}", stale=True) == f"v{i}", (node_id, i)
    if not compacted:
        reference = records_on(cluster, 1)
        assert [v for v in reference if v.startswith(b"record-")] == \
               [b"record-%d" % i for i in range(RECORDS)]
        for node_id in (2, 3):
            assert records_on(cluster, node_id) == reference
    return True


def replace_disk(cluster: ProcessCluster, victim: int, steps: Steps, compacted: bool) -> None:
    server = f"127.0.0.1:{cluster.nodes[1 if victim != 1 else 2].port}"
    before = describe(cluster, 1 if victim != 1 else 2)
    old_uuid = next(uuid for node, uuid in voter_keys(before) if node == victim)
    log_dir = cluster.directory / f"node-{victim}"

    steps.run(f"kill -9 node {victim}", lambda: cluster.kill(victim))
    steps.run("wipe its directory", lambda: shutil.rmtree(log_dir))
    new_uuid = steps.run("quorum-node format (new directory id)", lambda: cli(
        "quorum-node", "format", "--log-dir", str(log_dir), "--node-id", str(victim),
        "--cluster-id", cluster.cluster_id).strip())
    assert new_uuid != old_uuid
    steps.run(f"restart node {victim}", lambda: cluster.start(victim))
    others = [n for n in cluster.nodes if n != victim]

    def observer_caught_up() -> bool:
        status = describe(cluster, others[0])
        return any(o["id"] == victim and o["directory_id"] == new_uuid and o["could_be_voter"]
                   and o["lag"] == 0 for o in status["observers"])

    steps.run("it shows up as an observer that could be a voter",
              lambda: wait_until("the new replica as an observer", observer_caught_up, cluster))
    if compacted:
        log = (cluster.directory / f"node-{victim}.log").read_text(errors="replace")
        assert "fetching snapshot" in log, "the new replica did not catch up from a snapshot"
    steps.run("quorum-admin add-voter", lambda: cli(
        "quorum-admin", "--bootstrap-server", server, "add-voter", "--id", str(victim),
        "--uuid", new_uuid))
    steps.run("quorum-admin remove-voter (the old directory)", lambda: cli(
        "quorum-admin", "--bootstrap-server", server, "remove-voter", "--id", str(victim),
        "--uuid", old_uuid))
    after = wait_until("a leader after the change", lambda: describe(cluster, others[0]),
                       cluster)
    expected = {key for key in voter_keys(before) if key[0] != victim}
    assert voter_keys(after) == expected | {(victim, new_uuid)}
    steps.run("all data reads back from every node",
              lambda: wait_until("every node to serve all data",
                                 lambda: check_all_data(cluster, compacted), cluster))


def voter_keys(status: dict[str, Any]) -> set[tuple[int, str]]:
    return {(v["id"], v["directory_id"]) for v in status["voters"]}


COMPACTING: ClusterSettings = {"snapshot_interval_records": 1000, "log_segment_bytes": 64 * 1024}


@pytest.mark.parametrize(
    ("cluster", "victim_is_leader", "compacted"),
    [({}, False, False), ({}, True, False), (COMPACTING, False, True)],
    ids=["follower-disk", "leader-disk", "follower-disk-compacted-log"],
    indirect=["cluster"],
)
def test_disk_failure_recovery_scenario(cluster: ProcessCluster, victim_is_leader: bool,
                                        compacted: bool) -> None:
    steps = Steps("leader disk" if victim_is_leader else
                  "follower disk, compacted log" if compacted else "follower disk")
    leader = steps.run("elect a leader", lambda: cluster.wait_for_leader(timeout_s=30))
    steps.run(f"write {RECORDS} records and {KV_KEYS} keys",
              lambda: write_data(cluster, leader))
    victim = leader if victim_is_leader else next(n for n in (3, 2) if n != leader)
    if compacted:
        def compacted_everywhere() -> bool:
            return all(_log_start(cluster, n) > 0 for n in cluster.nodes if n != victim)
        steps.run("the others snapshot and delete their log prefix",
                  lambda: wait_until("log compaction", compacted_everywhere, cluster))
    replace_disk(cluster, victim, steps, compacted)
    steps.report()


def _log_start(cluster: ProcessCluster, node_id: int) -> int:
    return int(http_json("GET", f"{cluster.nodes[node_id].url}/v1/node")["log_start_offset"])
