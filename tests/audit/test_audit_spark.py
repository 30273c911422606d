"""The audit on Spark, end to end: a real quorum's data passes; a replica diverged on purpose and
a corrupted segment are reported at exactly the offsets that were changed, and nowhere else.

One SparkSession serves every test (the ``spark`` session fixture); the real quorum's data is
written once per session (``real_quorum``) and copied by the tests that damage it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed")

import pyarrow.parquet as pq
from audit_quorum import RealQuorum, data_copy
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from quorum_audit import cli
from quorum_audit.audit import AuditResult, run_audit
from quorum_audit.decode import DAMAGE_CRC
from quorum_audit.source import FORMAT, QuorumDataSource
from quorum_audit.synthetic import write_quorum
from quorum_node.raft.records import (
    HEADER_SIZE,
    BatchHeader,
    Record,
    decode_batch,
    encode_batch,
    read_batch_header,
)
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR


def errors(result: AuditResult) -> set[tuple[str, int | None, int | None, int | None]]:
    return {(f.kind, f.node_id, f.first_offset, f.last_offset)
            for f in result.findings if f.severity == "error"}


def test_real_quorum_passes_with_its_history(spark: SparkSession, real_quorum: RealQuorum,
                                             tmp_path: Path) -> None:
    out = tmp_path / "audit"
    # As a user runs it, then the tables it wrote; the CLI uses the active session (the tests'
    # one) and leaves it running.
    code = cli.main(["run", str(real_quorum.root), "--out", str(out)])
    assert SparkSession.getActiveSession() is spark
    findings = pq.read_table(out / "findings.parquet").to_pylist()
    assert code == cli.EXIT_PASSED and findings == []
    replicas = pq.read_table(out / "replicas.parquet").to_pylist()
    assert len(replicas) == 3
    # The compacted logs: snapshots, and logs that no longer start at 0.
    assert all(r["snapshots"] >= 1 for r in replicas)
    assert any((r["log_start_offset"] or 0) > 0 for r in replicas)
    # The leader change: the first leader resigned and another one took over in a later epoch
    # (whose LeaderChange the logs still hold; the first one's was compacted away).
    leadership = pq.read_table(out / "leadership.parquet").to_pylist()
    assert len(leadership) >= 2
    last = leadership[-1]
    assert last["leader_id"] == real_quorum.second_leader != real_quorum.first_leader
    assert last["held_by"] == 3 and last["granting_voters"]
    # The disk replacement: the new directory added, then the old one removed.
    victim, old_uuid, new_uuid = real_quorum.replaced
    membership = pq.read_table(out / "membership.parquet").to_pylist()
    changes = [(m["change"], m["node_id"], m["directory_id"]) for m in membership
               if m["change"] != "initial"]
    assert changes == [("add", victim, new_uuid), ("remove", victim, old_uuid)]
    assert pq.read_table(out / "write_rates.parquet").num_rows >= 1
    report = (out / "report.md").read_text()
    assert "**PASSED**" in report and "record copies compared" in report
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _data_batches(log_dir: Path) -> list[tuple[Path, BatchHeader]]:
    found = []
    for segment in sorted((log_dir / METADATA_PARTITION_DIR).glob("*.log")):
        data, position = segment.read_bytes(), 0
        while position < len(data):
            header = read_batch_header(data, position)
            if not header.is_control and header.record_count >= 3:
                found.append((segment, header))
            position = header.end
    return found


def _shared_batch(root: Path, node: int, skip: int = 0) -> tuple[Path, BatchHeader]:
    """A data batch of ``node`` that every replica holds, well below the high watermark."""
    starts = [_data_batches(root / f"node-{n}")[0][1].base_offset for n in (1, 2, 3)]
    candidates = [(p, h) for p, h in _data_batches(root / f"node-{node}")
                  if h.base_offset >= max(starts)]
    return candidates[skip]


def _diverge(root: Path) -> int:
    """Replica 2 holds other bytes at a batch's 2nd record, with a valid CRC: a silent divergence,
    not a damaged file (same length, so the file layout stays). The offset changed."""
    segment, header = _shared_batch(root, 2)
    data = bytearray(segment.read_bytes())
    batch, _ = decode_batch(memoryview(data), header.position)
    records = list(batch.records)
    records[1] = Record(records[1].value.upper(), records[1].key)
    changed = encode_batch(batch.base_offset, batch.epoch, records, batch.timestamp_ms)
    assert len(changed) == header.end - header.position and records[1] != batch.records[1]
    data[header.position:header.end] = changed
    segment.write_bytes(bytes(data))
    return batch.base_offset + 1


def _corrupt(root: Path) -> tuple[Path, BatchHeader, int]:
    """One byte of the third record's value of another batch of replica 3 flipped in place: its
    CRC32C no longer matches. The file, the batch and the offset changed."""
    segment, header = _shared_batch(root, 3, skip=1)
    data = bytearray(segment.read_bytes())
    batch, _ = decode_batch(memoryview(data), header.position)
    cursor = header.position + HEADER_SIZE
    for record in batch.records[:2]:
        cursor += 8 + len(record.key or b"") + len(record.value)
    cursor += 8 + len(batch.records[2].key or b"")
    data[cursor] ^= 0x20
    segment.write_bytes(bytes(data))
    return segment, header, batch.base_offset + 2


def test_diverged_replica_and_corrupted_segment_are_reported_at_exactly_those_offsets(
        spark: SparkSession, real_quorum: RealQuorum, tmp_path: Path) -> None:
    root = data_copy(real_quorum, tmp_path)
    diverged = _diverge(root)
    segment, header, flipped = _corrupt(root)

    result = run_audit(spark, [str(root)])
    first, last = header.base_offset, header.next_offset - 1
    # Nothing else: the diverged record on replica 2; on replica 3 the damaged batch as a whole
    # and, among its records, the one whose bytes differ from the other replicas'.
    assert errors(result) == {("divergence", 2, diverged, diverged),
                              (DAMAGE_CRC, 3, first, last),
                              ("divergence", 3, flipped, flipped)}
    assert {(d.offset, d.node_id, d.agrees_with_majority) for d in result.divergences} == {
        (diverged, 1, True), (diverged, 2, False), (diverged, 3, True),
        (flipped, 1, True), (flipped, 2, True), (flipped, 3, False)}
    damaged = next(f for f in result.findings if f.kind == DAMAGE_CRC)
    assert segment.name in damaged.detail and f"byte {header.position}" in damaged.detail
    assert not result.passed


def test_data_source_reads_a_partition_per_file(spark: SparkSession, tmp_path: Path) -> None:
    one = write_quorum(tmp_path / "a", 3000, replicas=2, segment_bytes=32 * 1024,
                       records_per_batch=100)
    two = write_quorum(tmp_path / "b", 500, replicas=1, records_per_batch=100)
    files = [p for q in (one, two) for d in q.directories.values()
             for p in (d / METADATA_PARTITION_DIR).glob("*.log")]
    spark.dataSource.register(QuorumDataSource)
    frame = spark.read.format(FORMAT).load([str(tmp_path / "a"), str(tmp_path / "b" / "node-1")])
    assert frame.rdd.getNumPartitions() == len(files) > 3
    rows = frame.groupBy("cluster_id", "node_id").count().collect()
    assert {(r["cluster_id"], r["node_id"], r["count"]) for r in rows} == {
        (one.cluster_id, 1, one.end_offset), (one.cluster_id, 2, one.end_offset),
        (two.cluster_id, 1, two.end_offset)}
    narrow = spark.read.format(FORMAT).option("columns", "offset, epoch").load(
        str(tmp_path / "b"))
    assert narrow.columns == ["offset", "epoch"]
    assert narrow.agg({"offset": "max"}).collect()[0][0] == two.end_offset - 1
    # A URI works as a path (pyarrow's filesystems: file://, s3://, gs://, hdfs://).
    assert spark.read.format(FORMAT).load(f"file://{tmp_path / 'b'}").count() == two.end_offset
    # A row per batch: headers only, every CRC32C checked.
    batches = spark.read.format(FORMAT).option("granularity", "batch").load(str(tmp_path / "b"))
    totals = batches.agg(F.sum("record_count"), F.min("checksum_ok"), F.max("last_offset"))
    assert list(totals.collect()[0]) == [two.end_offset, True, two.end_offset - 1]


def test_two_leaders_in_one_epoch_are_reported(spark: SparkSession, tmp_path: Path) -> None:
    quorum = write_quorum(tmp_path, 2000, records_per_batch=200)
    # Node 3's copy of epoch 2's LeaderChange names another leader (as a split brain would).
    segment = quorum.directories[3] / METADATA_PARTITION_DIR / f"{0:020d}.log"
    data = segment.read_bytes()
    position = 0
    while True:
        header = read_batch_header(data, position)
        if header.is_control and header.epoch == 2:
            break
        position = header.end
    batch, end = decode_batch(data, position)
    record = batch.records[0]
    forged = record.value.replace(b'"LeaderId":2', b'"LeaderId":3')
    changed = encode_batch(batch.base_offset, 2, [Record(forged, record.key)], batch.timestamp_ms,
                           is_control=True)
    segment.write_bytes(data[:position] + changed + data[end:])

    result = run_audit(spark, [str(tmp_path)])
    conflicts = [f for f in result.findings if f.kind == "leader_conflict"]
    assert len(conflicts) == 1 and "epoch 2 has 2 leaders" in conflicts[0].detail
    assert ("divergence", 3, batch.base_offset, batch.base_offset) in errors(result)
