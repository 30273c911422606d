"""Builders shared by the storage tests."""

from __future__ import annotations

from pathlib import Path

from quorum_node.raft.records import Record, RecordBatch, decode_batch
from quorum_node.storage.segment_log import SegmentLog


def make_records(count: int, size: int, tag: int = 0) -> list[Record]:
    return [
        Record(value=bytes([(tag + i) % 256]) * size, key=None if i % 2 else b"k%d" % i)
        for i in range(count)
    ]


def build_log(
    directory: Path, epochs: list[int], *, per_batch: int = 2, size: int = 20,
    segment_bytes: int = 1 << 20,
) -> list[RecordBatch]:
    """A flushed and closed log with one batch per entry of ``epochs``."""
    with SegmentLog(directory, segment_bytes) as log:
        batches = [
            log.append_as_leader(make_records(per_batch, size, n), epoch, 1000 + n)
            for n, epoch in enumerate(epochs)
        ]
        log.flush()
    return batches


def snapshot(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def batch_spans(path: Path) -> list[tuple[int, int]]:
    """(position, size) of each batch in a segment file."""
    data = path.read_bytes()
    spans = []
    position = 0
    while position < len(data):
        _, end = decode_batch(data, position)
        spans.append((position, end - position))
        position = end
    return spans


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))
