"""The audit of backups (directories with a ``backup.json``), on local copies of a real quorum's
log directories: the manifest states the committed range, several backups of one node count as
one node where copies disagree, and each backup's files are checked against its manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed")

from audit_quorum import RealQuorum
from backups import LocalBackup, rewrite_manifest_entry, take_backup
from pyspark.sql import SparkSession

from quorum_audit.audit import AuditResult, run_audit
from quorum_node.raft.records import Record, decode_batch, encode_batch, read_batch_header
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR

EVERYTHING = 10**12  # the quorum was stopped caught up: its whole log is committed


def _backups(quorum: RealQuorum, destination: Path) -> list[LocalBackup]:
    """Every node's directory backed up, node 1's twice."""
    return [take_backup(quorum.root / f"node-{node}", EVERYTHING, destination, [])
            for node in (1, 2, 3, 1)]


def _kinds(result: AuditResult) -> set[tuple[str, str, str | None, int | None]]:
    return {(f.severity, f.kind, f.root, f.first_offset) for f in result.findings}


def test_backups_pass_and_state_their_committed_range(
        spark: SparkSession, real_quorum: RealQuorum, tmp_path: Path) -> None:
    backups = _backups(real_quorum, tmp_path)
    result = run_audit(spark, [str(tmp_path)])
    assert result.passed and result.findings == [], result.findings
    assert len(result.replicas) == 4
    assert sorted(r.root for r in result.replicas) == sorted(str(b.path) for b in backups)
    assert result.high_watermarks == {real_quorum.cluster_id: backups[0].end_offset}
    # One backup alone: its manifest states what is committed, no majority needed.
    alone = run_audit(spark, [str(backups[1].path)])
    assert alone.findings == [] and alone.high_watermarks == {
        real_quorum.cluster_id: backups[1].end_offset}


def _log_start(backup: LocalBackup) -> int:
    first = sorted((backup.path / METADATA_PARTITION_DIR).glob("*.log"))[0]
    return read_batch_header(first.read_bytes()).base_offset


def _diverge(backup: LocalBackup, offset: int | None = None, after: int = 0) -> int:
    """A data record of ``backup`` changed, its CRC valid and its manifest made to agree (the
    node diverged before it was backed up). ``offset``: the record's batch must hold it; else
    the first data batch from ``after`` on."""
    for segment in sorted((backup.path / METADATA_PARTITION_DIR).glob("*.log")):
        data, position = bytearray(segment.read_bytes()), 0
        while position < len(data):
            header = read_batch_header(memoryview(data), position)
            wanted = header.base_offset <= offset < header.next_offset if offset is not None \
                else not header.is_control and header.record_count >= 3 \
                and header.base_offset >= after
            if wanted:
                batch, _ = decode_batch(memoryview(data), position)
                records = list(batch.records)
                index = 1 if offset is None else offset - batch.base_offset
                records[index] = Record(records[index].value.upper(), records[index].key)
                changed = encode_batch(batch.base_offset, batch.epoch, records,
                                       batch.timestamp_ms)
                data[position:header.end] = changed
                segment.write_bytes(bytes(data))
                rewrite_manifest_entry(backup.path, f"{METADATA_PARTITION_DIR}/{segment.name}")
                return batch.base_offset + index
            position = header.end
    raise AssertionError(f"{backup.path}: no batch to change")


def test_a_node_backed_up_twice_does_not_outvote_the_others(
        spark: SparkSession, real_quorum: RealQuorum, tmp_path: Path) -> None:
    backups = _backups(real_quorum, tmp_path)
    # Node 1 diverged: both its backups hold the other record. Two copies against two, but one
    # node against two: node 1's backups are the ones named.
    offset = _diverge(backups[0], after=max(_log_start(b) for b in backups))
    assert _diverge(backups[3], offset) == offset
    result = run_audit(spark, [str(tmp_path)])
    assert _kinds(result) == {("error", "divergence", str(backups[0].path), offset),
                              ("error", "divergence", str(backups[3].path), offset)}


def test_files_and_ranges_are_checked_against_the_manifest(
        spark: SparkSession, real_quorum: RealQuorum, tmp_path: Path) -> None:
    one, two, three, again = _backups(real_quorum, tmp_path)
    # A file the manifest does not list.
    (one.path / METADATA_PARTITION_DIR / "stray.tmp").write_bytes(b"left over")
    # A manifest claiming one record more than the backup holds.
    manifest = json.loads((two.path / "backup.json").read_text())
    manifest["end_offset"] += 1
    (two.path / "backup.json").write_text(json.dumps(manifest))
    # A segment cut short after the backup was written: another size than listed, a torn batch,
    # and so records missing below the end offset.
    segment = sorted((three.path / METADATA_PARTITION_DIR).glob("*.log"))[-1]
    segment.write_bytes(segment.read_bytes()[:-1])
    # A backup whose manifest was never written: incomplete, not audited.
    (again.path / "backup.json").unlink()

    result = run_audit(spark, [str(tmp_path)])
    assert {(f.severity, f.kind, f.root) for f in result.findings} == {
        ("error", "backup_file", str(one.path)),
        ("error", "backup_manifest", str(two.path)),
        ("error", "backup_file", str(three.path)),
        ("warning", "torn_tail", str(three.path)),
        ("error", "backup_manifest", str(three.path)),
        ("warning", "incomplete_backup", str(again.path)),
    }, result.findings
    details = {(f.kind, f.root): f.detail for f in result.findings}
    assert details["backup_file", str(one.path)] == (
        f"{METADATA_PARTITION_DIR}/stray.tmp: not listed in its backup.json")
    assert details["backup_file", str(three.path)].startswith(
        f"{METADATA_PARTITION_DIR}/{segment.name}: {segment.stat().st_size} bytes, "
        "the manifest says")
    assert details["backup_manifest", str(two.path)].endswith(
        f"the manifest's end_offset is {manifest['end_offset']}")
    assert len(result.replicas) == 3  # the incomplete backup left out
