"""The fleet audit from backups, on real parts: two quorums of node processes are backed up under
write load (each node, and one node twice over time) into moto's S3 server, and ``quorum-audit run
s3://.../ --master spark://...`` runs on a Spark standalone cluster (a master and two workers from
PySpark's distribution). The clean fleet passes; a backup with a flipped byte and a diverged
replica are named, and an incomplete backup is a warning.

Slow (minutes: three JVMs, node processes, two Spark applications): run by its own CI step.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed")
pytest.importorskip("moto", reason="moto[server] (dev extra) is not installed")

import boto3
from audit_quorum import _wait
from backups import (
    LocalBackup,
    latest_snapshot_end,
    rewrite_manifest_entry,
    take_backup,
    upload,
)
from proc_cluster import ProcessCluster
from services import S3_CREDENTIALS, SparkCluster, moto_s3, spark_standalone

from quorum_node.client import QuorumClient
from quorum_node.raft.records import (
    HEADER_SIZE,
    BatchHeader,
    Record,
    decode_batch,
    encode_batch,
    read_batch_header,
)
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR

pytestmark = pytest.mark.slow
BUCKET = "quorum-backups"


@dataclass(frozen=True)
class BackedUpQuorum:
    cluster_id: str
    twice: int  # the node backed up a second time (the leader then)
    backups: list[LocalBackup]  # every node once, then one of them again


# Records of log every backup of a quorum holds past its snapshot: the damaged fleet below
# changes two of the data batches all three nodes' backups share (batches of 20 records), and
# the snapshots come every 400.
SHARED_LOG_RECORDS = 100
# Rounds of backups taken before giving up, a node's snapshot racing each one.
BACKUP_ROUNDS = 5


def _backed_up_quorum(root: Path) -> BackedUpQuorum:
    """A 3-node quorum written to without pause while its nodes are backed up (live, trimmed at
    the leader's high watermark), the leader a second time later on; then stopped."""
    cluster = ProcessCluster.create(root, 3, snapshot_interval_records=400,
                                    snapshot_retained_log_records=1000,
                                    log_segment_bytes=16 * 1024)
    stop = threading.Event()
    written: list[int] = []

    def load() -> None:
        # The whole bootstrap list: the client follows the leader if it changes.
        bootstrap = [f"127.0.0.1:{node.port}" for node in cluster.nodes.values()]
        with QuorumClient(bootstrap, timeout_s=30) as client:
            while not stop.is_set():
                client.append([b"record-%d" % (len(written) * 20 + i) for i in range(20)])
                written.append(1)

    backups: list[LocalBackup] = []
    try:
        cluster.start_all()
        cluster.wait_for_leader(timeout_s=30)
        writer = threading.Thread(target=load, daemon=True)
        writer.start()

        def log_past_snapshots(leader: int) -> dict[str, Any] | None:
            """The quorum's description once every node's log holds SHARED_LOG_RECORDS past
            its latest snapshot (a backup holds the log from there): a snapshot just below
            the high watermark would leave the backups too few batches in common."""
            described = cluster.quorum(leader) or {}
            high_watermark = described.get("high_watermark") or 0
            snapshot_end = max(latest_snapshot_end(cluster.directory / f"node-{node}",
                                                   high_watermark) for node in cluster.nodes)
            return described if high_watermark - snapshot_end >= SHARED_LOG_RECORDS else None

        def backup(nodes: tuple[int, ...] | None, after_batches: int) -> int:
            _wait(f"{after_batches} batches written", lambda: len(written) >= after_batches,
                  cluster)
            for _ in range(BACKUP_ROUNDS):
                leader = cluster.wait_for_leader(timeout_s=30)
                described = _wait(f"{SHARED_LOG_RECORDS} records past every node's snapshot",
                                  partial(log_past_snapshots, leader), cluster)
                voters = [{"id": v["id"], "directory_id": v["directory_id"], "endpoints": {}}
                          for v in described["voters"]]
                taken = [take_backup(cluster.directory / f"node-{node}",
                                     described["high_watermark"], root / "backups", voters)
                         for node in nodes or (leader,)]
                # A node may finish a snapshot below that high watermark between the look above
                # and its copy, which then holds too little log: the round is taken again.
                if all(b.end_offset - b.snapshot_end >= SHARED_LOG_RECORDS for b in taken):
                    backups.extend(taken)
                    return leader
                for b in taken:
                    shutil.rmtree(b.path)
            raise AssertionError(f"no round of backups in {BACKUP_ROUNDS} held "
                                 f"{SHARED_LOG_RECORDS} records past its snapshots")

        # Every node at one high watermark (while the writes go on), so that their backups hold
        # many offsets in common; then the leader again, later.
        backup((1, 2, 3), 60)
        twice = backup(None, 150)  # more log, a later snapshot
        stop.set()
        writer.join(30)
    finally:
        stop.set()
        cluster.stop_all()
    return BackedUpQuorum(cluster.cluster_id, twice, backups)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> list[BackedUpQuorum]:
    roots = [tmp_path_factory.mktemp(f"quorum-{i}") for i in range(2)]
    results: dict[int, BackedUpQuorum | BaseException] = {}

    def make(index: int) -> None:
        try:
            results[index] = _backed_up_quorum(roots[index])
        except BaseException as error:  # reraised below, in the test's thread
            results[index] = error

    threads = [threading.Thread(target=make, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    quorums = []
    for index in range(2):
        result = results[index]
        if isinstance(result, BaseException):
            raise result
        quorums.append(result)
    return quorums


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, SparkCluster]]:
    work = tmp_path_factory.mktemp("services")
    # The workers (and so the executors) get the credentials only: the endpoint travels from the
    # driver with each file.
    with moto_s3(work) as endpoint, spark_standalone(work / "spark",
                                                     worker_env=S3_CREDENTIALS) as cluster:
        yield endpoint, cluster


def _audit(cluster: SparkCluster, *args: str, env: dict[str, str] | None = None
           ) -> tuple[int, dict[str, Any], float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "quorum_audit.cli", "run", *args, "--master", cluster.master_url,
         "--json"], check=False, capture_output=True, text=True, timeout=600,
        env={**os.environ, **S3_CREDENTIALS, "SPARK_CONF_DIR": str(cluster.conf_dir),
             "SPARK_LOCAL_IP": "127.0.0.1", **(env or {})})
    elapsed = time.monotonic() - started
    assert done.returncode in (0, 1), done.stderr[-5000:]
    return done.returncode, json.loads(done.stdout), elapsed


def _data_batches(root: Path) -> list[tuple[Path, BatchHeader]]:
    found = []
    for segment in sorted((root / METADATA_PARTITION_DIR).glob("*.log")):
        data, position = segment.read_bytes(), 0
        while position < len(data):
            header = read_batch_header(data, position)
            if not header.is_control and header.record_count >= 3:
                found.append((segment, header))
            position = header.end
    return found


def _shared_batch(backups: list[LocalBackup], target: LocalBackup, skip: int
                  ) -> tuple[Path, BatchHeader]:
    """A data batch of ``target`` that every one of ``backups`` holds too."""
    ranges = []
    for backup in backups:
        batches = _data_batches(backup.path)
        ranges.append((batches[0][1].base_offset, backup.end_offset))
    low, high = max(r[0] for r in ranges), min(r[1] for r in ranges)
    shared = [(p, h) for p, h in _data_batches(target.path)
              if h.base_offset >= low and h.next_offset <= high]
    assert len(shared) > skip, f"the backups share too few batches: {ranges}"
    return shared[skip]


def _diverge(backups: list[LocalBackup], target: LocalBackup) -> int:
    """The 2nd record of a shared batch holds other bytes, its CRC valid and the manifest made to
    agree: a replica that silently diverged. The offset changed."""
    segment, header = _shared_batch(backups, target, skip=0)
    data = bytearray(segment.read_bytes())
    batch, _ = decode_batch(memoryview(data), header.position)
    records = list(batch.records)
    records[1] = Record(records[1].value.upper(), records[1].key)
    changed = encode_batch(batch.base_offset, batch.epoch, records, batch.timestamp_ms)
    assert len(changed) == header.end - header.position and records[1] != batch.records[1]
    data[header.position:header.end] = changed
    segment.write_bytes(bytes(data))
    rewrite_manifest_entry(target.path, f"{METADATA_PARTITION_DIR}/{segment.name}")
    return batch.base_offset + 1


def _flip(backups: list[LocalBackup], target: LocalBackup) -> tuple[str, BatchHeader, int]:
    """One byte of the 3rd record's value of another shared batch flipped, the manifest left as
    it was: a damaged backup. The file, the batch and the offset changed."""
    segment, header = _shared_batch(backups, target, skip=2)
    data = bytearray(segment.read_bytes())
    batch, _ = decode_batch(memoryview(data), header.position)
    cursor = header.position + HEADER_SIZE
    for record in batch.records[:2]:
        cursor += 8 + len(record.key or b"") + len(record.value)
    cursor += 8 + len(batch.records[2].key or b"")
    data[cursor] ^= 0x20
    segment.write_bytes(bytes(data))
    return f"{METADATA_PARTITION_DIR}/{segment.name}", header, batch.base_offset + 2


@pytest.mark.timeout(1200)  # with its fixtures: ~4 min on a shared 2-core machine
def test_fleet_audit_from_s3_backups_on_a_spark_cluster(
        fleet: list[BackedUpQuorum], services: tuple[str, SparkCluster],
        tmp_path: Path) -> None:
    endpoint, cluster = services
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
    s3.create_bucket(Bucket=BUCKET)
    for quorum in fleet:
        for backup in quorum.backups:
            upload(s3, BUCKET, f"fleet/{quorum.cluster_id}", backup.path)

    # The clean fleet: every backup a replica, several of one node among them; it passes, and the
    # outputs are written to the bucket.
    code, clean, clean_s = _audit(cluster, f"s3://{BUCKET}/fleet/", "--s3-endpoint-url",
                                  endpoint, "--out", f"s3://{BUCKET}/audit/")
    assert code == 0 and clean["passed"] and clean["findings"] == [], clean
    assert set(clean["high_watermarks"]) == {q.cluster_id for q in fleet}
    for quorum in fleet:  # the manifests' end offsets, not an estimate
        assert clean["high_watermarks"][quorum.cluster_id] == max(
            b.end_offset for b in quorum.backups)
    assert clean["records_compared"] > 0
    report = s3.get_object(Bucket=BUCKET, Key="audit/report.md")["Body"].read().decode()
    assert "**PASSED**" in report and report.count(f"s3://{BUCKET}/fleet/") == sum(
        len(q.backups) for q in fleet)

    # The damaged fleet: quorum 0's backups copied, one diverged, another with a flipped byte,
    # and an incomplete one (no manifest) beside them; quorum 1 as it was.
    first, second = fleet
    copies = [LocalBackup(tmp_path / b.name, b.cluster_id, b.node_id, b.created_at,
                          b.end_offset, b.snapshot_end) for b in first.backups]
    for backup, copy in zip(first.backups, copies, strict=True):
        shutil.copytree(backup.path, copy.path)
    once = [c for c in copies[:3] if c.node_id != first.twice]
    # Offsets all three nodes' backups hold, so that a majority of the nodes agree there.
    diverged_offset = _diverge(copies[:3], once[0])
    damaged_file, damaged_batch, flipped_offset = _flip(copies[:3], once[1])
    prefix = f"damaged/{first.cluster_id}"
    uris = {copy.path: upload(s3, BUCKET, prefix, copy.path) for copy in copies}
    incomplete = upload(s3, BUCKET, prefix, _renamed(copies[0], tmp_path / "incomplete"),
                        manifest=False)
    for backup in second.backups:
        upload(s3, BUCKET, f"damaged/{second.cluster_id}", backup.path)

    code, damaged, damaged_s = _audit(cluster, f"s3://{BUCKET}/damaged/",
                                      env={"AWS_ENDPOINT_URL": endpoint})
    assert code == 1 and not damaged["passed"]
    diverged_uri, flipped_uri = uris[once[0].path], uris[once[1].path]
    found = {(f["severity"], f["kind"], f["root"], f["first_offset"], f["last_offset"])
             for f in damaged["findings"]}
    assert found == {
        ("error", "divergence", diverged_uri, diverged_offset, diverged_offset),
        ("error", "backup_file", flipped_uri, None, None),
        ("error", "crc", flipped_uri, damaged_batch.base_offset,
         damaged_batch.next_offset - 1),
        ("error", "divergence", flipped_uri, flipped_offset, flipped_offset),
        ("warning", "incomplete_backup", incomplete, None, None),
    }, damaged["findings"]
    sha = next(f for f in damaged["findings"] if f["kind"] == "backup_file")
    assert sha["detail"].startswith(f"{damaged_file}: sha256 ")
    print(f"\nfleet audit on the Spark cluster: clean {clean_s:.1f} s, damaged {damaged_s:.1f} s, "
          f"{sum(len(q.backups) for q in fleet)} backups of {len(fleet)} quorums")


def _renamed(backup: LocalBackup, directory: Path) -> Path:
    """A copy of ``backup`` under a later backup name of its node (another backup, half
    written)."""
    later = backup.created_at.replace(year=backup.created_at.year + 1)
    target = directory / f"{later:%Y%m%dT%H%M%SZ}-node-{backup.node_id}"
    shutil.copytree(backup.path, target)
    return target
