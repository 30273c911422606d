"""``quorum-node repair-log`` on a voter of a running quorum whose log was damaged in the middle
(a zeroed run of bytes followed by valid batches): the node refuses to start and points at the
command; the dry run reports and changes nothing; the repair cuts the log back; the node rejoins
as a follower and catches up, holding every record the quorum acknowledged."""

from __future__ import annotations

import base64
import subprocess
import sys
import time
from pathlib import Path

from proc_cluster import FAST, ProcessCluster, http_json

from quorum_node.raft.records import Record, decode_batch
from quorum_node.storage.dir_lock import LOCK_FILE
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR
from quorum_node.storage.meta_properties import format_log_dir, random_cluster_id
from quorum_node.storage.segment_log import SegmentLog

CLI = [sys.executable, "-m", "quorum_node.cli.node"]


def files(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Bytes and modification time of every file but the lock file (which holds the pid of the
    last process that held the lock: repair-log holds it too)."""
    return {str(p.relative_to(directory)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != LOCK_FILE}


def batch_spans(path: Path) -> list[tuple[int, int]]:
    data = path.read_bytes()
    spans, position = [], 0
    while position < len(data):
        _, end = decode_batch(data, position)
        spans.append((position, end - position))
        position = end
    return spans


def committed_values(cluster: ProcessCluster, node_id: int) -> tuple[list[str], int | None]:
    """The node's committed record values, read from it, and its high watermark."""
    values: list[str] = []
    offset = 0
    while True:
        page = http_json("GET", f"{cluster.nodes[node_id].url}/v1/records?offset={offset}"
                                "&max_records=1000&wait_ms=0")
        values += [base64.b64decode(r["value"]).decode() for r in page["records"]]
        high_watermark = page["high_watermark"]
        if high_watermark is None or page["next_offset"] in (offset, high_watermark):
            return values, high_watermark
        offset = page["next_offset"]


def write(cluster: ProcessCluster, values: list[str]) -> None:
    """One batch per value, each acknowledged (committed) before the next."""
    for value in values:
        leader = cluster.wait_for_leader()
        http_json("POST", f"{cluster.nodes[leader].url}/v1/records", [value])


def repair_log(log_dir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "repair-log", "--log-dir", str(log_dir), *flags],
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_repaired_voter_rejoins_as_a_follower_and_catches_up(tmp_path: Path) -> None:
    cluster = ProcessCluster.create(tmp_path, 3, **FAST)
    try:
        cluster.start_all()
        leader = cluster.wait_for_leader()
        damaged = next(n for n in cluster.nodes if n != leader)
        acknowledged = [f"before-{i}" for i in range(40)]
        write(cluster, acknowledged)
        deadline = time.monotonic() + 30
        while committed_values(cluster, damaged)[0] != acknowledged:
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.1)
        cluster.signal(damaged, 15)
        process = cluster.nodes[damaged].process
        assert process is not None and process.wait(30) == 0

        # A lost write-back in the middle of the segment: one whole batch of zeros, valid
        # batches after it.
        log_dir = tmp_path / f"node-{damaged}"
        (segment,) = sorted((log_dir / METADATA_PARTITION_DIR).glob("*.log"))
        spans = batch_spans(segment)
        position, size = spans[len(spans) // 2]
        with segment.open("r+b") as file:
            file.seek(position)
            file.write(bytes(size))

        refused = subprocess.run([*CLI, "run", "--config", str(cluster.nodes[damaged].config_path)],
                                 capture_output=True, text=True, timeout=60, check=False)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert (f"{segment} at byte {position}: invalid batch length 0, followed by a valid batch "
                f"at byte {position + size}") in refused.stderr
        assert "see 'quorum-node repair-log --help'" in refused.stderr

        before = files(log_dir)
        dry = repair_log(log_dir)
        assert dry.returncode == 1, dry.stderr
        assert f"would truncate at byte {position}: {segment}" in dry.stdout
        assert "rerun with --yes" in dry.stdout
        assert files(log_dir) == before

        done = repair_log(log_dir, "--yes")
        assert done.returncode == 0, done.stderr
        assert f"truncated at byte {position}: {segment}" in done.stdout, done.stdout
        assert segment.stat().st_size == position
        again = repair_log(log_dir)
        assert again.returncode == 0
        assert again.stdout == "nothing to repair: every segment is whole\n"

        cluster.start(damaged)
        later = [f"after-{i}" for i in range(10)]
        write(cluster, later)
        deadline = time.monotonic() + 60
        while True:
            leader = cluster.wait_for_leader()
            described = cluster.quorum(leader)
            ends = {voter["id"]: voter["log_end_offset"]
                    for voter in (described or {}).get("voters", [])}
            try:
                values, _ = committed_values(cluster, damaged)
            except OSError:  # not listening yet
                values = []
            if ends and ends.get(damaged) == ends.get(leader) and values == acknowledged + later:
                break
            assert time.monotonic() < deadline, f"{ends} {len(values)}\n{cluster.logs()}"
            time.sleep(0.2)
        assert leader != damaged  # it came back as a follower (and stayed one)
    finally:
        cluster.stop_all()


def test_repair_log_refuses_what_is_not_a_log_directory(tmp_path: Path) -> None:
    result = repair_log(tmp_path, "--yes")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"quorum-node repair-log: error: {tmp_path / 'meta.properties'}"
                                    ": not found")
    assert list(tmp_path.iterdir()) == []  # not even a lock file


def test_repair_log_leaves_a_torn_tail_to_the_node(tmp_path: Path) -> None:
    log_dir = tmp_path / "node-1"
    format_log_dir(log_dir, random_cluster_id(), 1)
    partition = log_dir / METADATA_PARTITION_DIR
    with SegmentLog(partition) as log:
        for n in range(3):
            log.append_as_leader([Record(value=b"v%d" % n)], 1, 1000)
        log.flush()
    (segment,) = partition.glob("*.log")
    with segment.open("r+b") as file:
        file.truncate(segment.stat().st_size - 3)  # a crash in the middle of the last append
    before = files(log_dir)
    result = repair_log(log_dir, "--yes")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"nothing to repair: {segment} ends in a torn batch at byte ")
    assert result.stdout.endswith("which the node cuts by itself when it starts\n")
    assert files(log_dir) == before
