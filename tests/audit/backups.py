"""Backups in the backup format for the audit tests, made from real log directories.

``take_backup`` copies a (possibly running) node's log directory as a backup: meta.properties, the
latest snapshot at or below the high watermark, and the segments after it, the last one cut at the
last batch boundary at or below the high watermark, then ``backup.json`` last. It is a test
helper, not the product's backup command: it only has to produce the format the audit reads.
``upload`` puts a backup under an S3 prefix, named as the format names backups.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from quorum_node.raft.records import TruncatedBatchError, read_batch_header
from quorum_node.storage.kafka_uuid import to_kafka_string
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR
from quorum_node.storage.meta_properties import META_PROPERTIES, read_meta_properties

_SEGMENT = re.compile(r"([0-9]{20})\.log")
_SNAPSHOT = re.compile(r"([0-9]{20})-([0-9]{10})\.checkpoint")
MANIFEST = "backup.json"


@dataclass(frozen=True)
class LocalBackup:
    path: Path
    cluster_id: str
    node_id: int
    created_at: datetime
    end_offset: int
    snapshot_end: int = 0  # where its log starts: the end of the snapshot it holds (0: none)

    @property
    def name(self) -> str:
        return f"{self.created_at:%Y%m%dT%H%M%SZ}-node-{self.node_id}"


class _Raced(Exception):
    """A file went away or was cut while it was copied (a running node compacts): copy again."""


@dataclass(frozen=True)
class _Snapshot:
    end_offset: int
    epoch: int
    name: str


def _latest_snapshot(names: list[str], high_watermark: int) -> _Snapshot | None:
    """The latest snapshot among a partition's file ``names`` at or below ``high_watermark``:
    the one a backup taken now holds, its log starting at the snapshot's end."""
    return max((_Snapshot(int(m.group(1)), int(m.group(2)), name) for name in names
                if (m := _SNAPSHOT.fullmatch(name)) and int(m.group(1)) <= high_watermark),
               key=lambda snapshot: (snapshot.end_offset, snapshot.epoch), default=None)


def latest_snapshot_end(log_dir: Path, high_watermark: int) -> int:
    """Where a backup of a node's log directory taken at ``high_watermark`` starts its log: the
    end offset of its latest snapshot at or below it (0 if none)."""
    names = [p.name for p in (log_dir / METADATA_PARTITION_DIR).iterdir()]
    snapshot = _latest_snapshot(names, high_watermark)
    return snapshot.end_offset if snapshot else 0


def take_backup(log_dir: Path, high_watermark: int, destination: Path,
                voters: list[dict[str, Any]], *, created_at: datetime | None = None,
                attempts: int = 20) -> LocalBackup:
    for _ in range(attempts):
        try:
            return _take(log_dir, high_watermark, destination, voters,
                         created_at or datetime.now(UTC))
        except (_Raced, FileNotFoundError):
            continue
    raise AssertionError(f"{log_dir}: no consistent copy in {attempts} attempts")


def _take(log_dir: Path, high_watermark: int, destination: Path, voters: list[dict[str, Any]],
          created_at: datetime) -> LocalBackup:
    partition = log_dir / METADATA_PARTITION_DIR
    names = sorted(p.name for p in partition.iterdir())
    snapshot = _latest_snapshot(names, high_watermark)
    snapshot_end = snapshot.end_offset if snapshot else 0
    contents: dict[str, bytes] = {}
    if snapshot is not None:
        contents[snapshot.name] = (partition / snapshot.name).read_bytes()
    segments = [(int(m.group(1)), name) for name in names if (m := _SEGMENT.fullmatch(name))]
    # The segments holding offsets from the snapshot's end on: the one it ends in and the later.
    start = max((i for i, (base, _) in enumerate(segments) if base <= snapshot_end), default=0)
    end_offset, last_epoch = snapshot_end, snapshot.epoch if snapshot else 0
    expected: int | None = None
    for base, name in segments[start:]:
        if base >= high_watermark:
            break
        data = (partition / name).read_bytes()
        if expected is None and base > snapshot_end:
            raise _Raced(f"{name} starts at {base}, after the snapshot's end {snapshot_end}")
        if expected is not None and base != expected:
            raise _Raced(f"{name} starts at {base}, not {expected}")
        cut = position = 0
        while position < len(data):
            try:
                header = read_batch_header(data, position)
            except TruncatedBatchError:
                break  # the node is appending to it
            if header.next_offset > high_watermark:
                break
            cut, position = header.end, header.end
            end_offset, last_epoch, expected = header.next_offset, header.epoch, header.next_offset
        if cut:
            contents[name] = data[:cut]
        if cut < len(data):
            break
    if end_offset < snapshot_end or (not segments and snapshot is None):
        raise _Raced("nothing to back up yet")
    meta = read_meta_properties(log_dir / META_PROPERTIES)
    while (destination / f"{created_at:%Y%m%dT%H%M%SZ}-node-{meta.node_id}").exists():
        created_at += timedelta(seconds=1)  # two backups of a node in one second
    backup = LocalBackup(destination, meta.cluster_id, meta.node_id, created_at, end_offset)
    root = destination / backup.name
    (root / METADATA_PARTITION_DIR).mkdir(parents=True)
    files = {META_PROPERTIES: (log_dir / META_PROPERTIES).read_bytes()}
    files |= {f"{METADATA_PARTITION_DIR}/{name}": data for name, data in contents.items()}
    for path, data in files.items():
        (root / path).write_bytes(data)
    log_start = min((int(name[:20]) for name in contents if _SEGMENT.fullmatch(name)),
                    default=snapshot_end)
    manifest = {
        "format_version": 1, "cluster_id": meta.cluster_id, "node_id": meta.node_id,
        "directory_id": to_kafka_string(meta.directory_id),
        "created_at": created_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "snapshot": None if snapshot is None else {"end_offset": snapshot.end_offset,
                                                   "epoch": snapshot.epoch},
        "log_start_offset": log_start, "end_offset": end_offset, "last_epoch": last_epoch,
        "voters": voters,
        "files": [{"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                  for path, data in sorted(files.items())],
    }
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return LocalBackup(root, meta.cluster_id, meta.node_id, created_at, end_offset, snapshot_end)


def rewrite_manifest_entry(root: Path, path: str) -> None:
    """The manifest made to agree with the file as it is now (a replica that diverged, not a
    file damaged after the backup was taken)."""
    manifest = json.loads((root / MANIFEST).read_text())
    data = (root / path).read_bytes()
    for entry in manifest["files"]:
        if entry["path"] == path:
            entry.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2))


def upload(s3: Any, bucket: str, prefix: str, root: Path, *, manifest: bool = True) -> str:
    """``root``'s files under ``s3://bucket/prefix/<root's name>/``, the manifest last (or not at
    all: an incomplete backup). Returns the backup's URI."""
    key = f"{prefix.strip('/')}/{root.name}"
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)
    if manifest:
        files.append(root / MANIFEST)
    for path in files:
        s3.put_object(Bucket=bucket, Key=f"{key}/{path.relative_to(root).as_posix()}",
                      Body=path.read_bytes())
    return f"s3://{bucket}/{key}"
