"""Replica directories written directly with the node's encoders, for tests and the benchmark.

A real quorum takes minutes to write millions of records through its network path; the audit only
reads files, so a big data set is made by encoding each batch once (``encode_batch``, the
LeaderChange and VotersRecord the core writes, ``encode_snapshot``) and writing the same bytes into
every replica's segment files, laid out as ``SegmentLog`` lays them out.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from quorum_node.kv.ops import KV_RECORD_KEY
from quorum_node.raft.messages import LeaderChangeMessage, ReplicaInfo
from quorum_node.raft.records import Record, control_record, encode_batch, read_batch_header
from quorum_node.raft.snapshot_format import encode_snapshot
from quorum_node.raft.snapshots import SnapshotId
from quorum_node.raft.state import ElectionState
from quorum_node.raft.types import ControlRecordType, ReplicaKey
from quorum_node.raft.voters import voters_record
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR
from quorum_node.storage.meta_properties import format_log_dir, random_cluster_id
from quorum_node.storage.quorum_state import QuorumStateStore
from quorum_node.storage.snapshot_store import snapshot_file_name

START_MS = 1_700_000_000_000


@dataclass(frozen=True)
class SyntheticQuorum:
    cluster_id: str
    voters: tuple[ReplicaKey, ...]
    directories: dict[int, Path]  # node id -> log directory
    end_offset: int
    epochs: int


def batches(voters: Sequence[ReplicaKey], records: int, *, records_per_batch: int = 1000,
            value_size: int = 32, epochs: int = 2, kv_every: int = 10, ms_per_batch: int = 5
            ) -> Iterator[bytes]:
    """The log of a quorum whose leadership passes from voter to voter ``epochs`` times: each
    epoch opens with the LeaderChange its leader writes, the first also with the bootstrap
    VotersRecord, then data batches; every ``kv_every``-th record is a KV put."""
    offset, timestamp = 0, START_MS
    per_epoch = -(-records // epochs)
    written = 0
    for epoch in range(1, epochs + 1):
        leader = voters[(epoch - 1) % len(voters)]
        change = LeaderChangeMessage(
            leader_id=leader.id, voters=tuple(ReplicaInfo.of(k) for k in voters),
            granting_voters=tuple(ReplicaInfo.of(k) for k in voters[:len(voters) // 2 + 1]))
        control = [control_record(ControlRecordType.LEADER_CHANGE,
                                  change.model_dump_json(by_alias=True).encode())]
        yield encode_batch(offset, epoch, control, timestamp, is_control=True)
        offset += 1
        if epoch == 1:
            yield encode_batch(offset, epoch, [voters_record(voters)], timestamp, is_control=True)
            offset += 1
        target = min(records, written + per_epoch)
        while written < target:
            count = min(records_per_batch, target - written)
            yield encode_batch(offset, epoch, [_record(written + i, value_size, kv_every)
                                               for i in range(count)], timestamp)
            offset += count
            written += count
            timestamp += ms_per_batch


def _record(index: int, value_size: int, kv_every: int) -> Record:
    if index % kv_every == 0:
        document = {"op": "put", "key": f"key-{index % 1000}", "value": str(index)}
        return Record(value=json.dumps(document).encode(), key=KV_RECORD_KEY)
    text = b"record-%d-" % index
    return Record(value=text + b"x" * max(0, value_size - len(text)))


def write_quorum(root: Path, records: int, *, replicas: int = 3,
                 segment_bytes: int = 64 * 1024 * 1024, snapshot_at: int | None = None,
                 **options: int) -> SyntheticQuorum:
    """``replicas`` formatted directories ``root/node-<id>`` holding the same log (see
    ``batches``), each with a quorum-state naming the last leader. With ``snapshot_at`` (an
    offset at a batch boundary of the log) each also holds a snapshot ending there."""
    cluster_id = random_cluster_id()
    directories = {node: root / f"node-{node}" for node in range(1, replicas + 1)}
    keys = tuple(ReplicaKey(node, format_log_dir(path, cluster_id, node).directory_id)
                 for node, path in directories.items())
    epochs = options.get("epochs", 2)
    first = directories[1] / METADATA_PARTITION_DIR
    first.mkdir()
    end_offset, snapshot = _write_segments(first, batches(keys, records, **options),
                                           segment_bytes, snapshot_at)
    for node, path in directories.items():
        partition = path / METADATA_PARTITION_DIR
        if node != 1:
            shutil.copytree(first, partition)
        last_leader = keys[(epochs - 1) % len(keys)]
        QuorumStateStore(partition).write(ElectionState(epochs, last_leader.id, None))
        if snapshot is not None:
            snapshot_id, timestamp = snapshot
            # Every replica's state at the same offset is the same: one record naming no node.
            contents = encode_snapshot(keys, timestamp, [Record(b"state-at-%d" % snapshot_id
                                                                .end_offset)])
            (partition / snapshot_file_name(snapshot_id)).write_bytes(contents)
    return SyntheticQuorum(cluster_id, keys, directories, end_offset, epochs)


def _write_segments(directory: Path, encoded: Iterator[bytes], segment_bytes: int,
                    snapshot_at: int | None) -> tuple[int, tuple[SnapshotId, int] | None]:
    """Segment files as SegmentLog rolls them; the end offset, and the snapshot id (with its
    batch's timestamp) at ``snapshot_at``."""
    base, size, end = 0, 0, 0
    snapshot: tuple[SnapshotId, int] | None = None
    segment = (directory / f"{0:020d}.log").open("wb")
    try:
        for batch in encoded:
            header = read_batch_header(batch, verify_crc=False)
            if size > 0 and size + len(batch) > segment_bytes:
                segment.close()
                base, size = header.base_offset, 0
                segment = (directory / f"{base:020d}.log").open("wb")
            segment.write(batch)
            size += len(batch)
            end = header.next_offset
            if end == snapshot_at:
                snapshot = (SnapshotId(end, header.epoch), header.timestamp_ms)
    finally:
        segment.close()
    return end, snapshot
