"""The log's start and snapshot base (KIP-630) on both logs: truncate_to_snapshot, delete_before,
restarts, and the crash between freezing a downloaded snapshot and truncating the log to it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorum_node.raft.log import DurableLog, MemoryLog
from quorum_node.raft.records import RecordBatch, decode_batches
from quorum_node.raft.snapshot_format import encode_snapshot
from quorum_node.raft.snapshots import SnapshotId
from quorum_node.raft.types import OffsetAndEpoch
from quorum_node.storage.errors import StorageError
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR, LogDirectory
from quorum_node.storage.meta_properties import format_log_dir
from quorum_node.storage.segment_log import SegmentLog

from .helpers import build_log, make_records, segment_files

CLUSTER = "MkU3OEVBNTcwNTJENDM2Qg"
# Epoch 1 at offsets 0-9, epoch 3 at 10-19, epoch 4 at 20-29: batches of 5.
EPOCHS = [1, 1, 3, 3, 4, 4]


def _fill(log: DurableLog, epochs: list[int], per_batch: int = 5) -> list[RecordBatch]:
    return [log.append_as_leader(make_records(per_batch, 20, n), epoch, n)
            for n, epoch in enumerate(epochs)]


@pytest.fixture(params=["memory", "segment"])
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DurableLog]:
    if request.param == "memory":
        yield MemoryLog()
        return
    opened = SegmentLog(tmp_path, segment_bytes=200)  # about one batch per segment
    yield opened
    opened.close()


def _epoch_answers(log: DurableLog, epochs: range = range(7)) -> list[tuple[int, int]]:
    answers = [log.end_offset_for_epoch(epoch) for epoch in epochs]
    return [(answer.offset, answer.epoch) for answer in answers]


# -- both logs ------------------------------------------------------------------------------------


def test_truncate_to_snapshot_discards_the_log_and_bases_the_epochs(log: DurableLog) -> None:
    _fill(log, EPOCHS)
    log.truncate_to_snapshot(SnapshotId(100, 5))
    assert (log.start_offset, log.end_offset, log.last_fetched_epoch()) == (100, 100, 5)
    assert log.end_offset_for_epoch(5) == OffsetAndEpoch(100, 5)
    assert log.end_offset_for_epoch(9) == OffsetAndEpoch(100, 5)
    assert log.end_offset_for_epoch(4) == OffsetAndEpoch(100, 0)  # only below the start
    assert log.read(0, 1 << 20) == log.read(100, 1 << 20) == b""
    assert log.flush() == 100
    with pytest.raises(ValueError, match="older"):
        log.append_as_leader(make_records(1, 5), 4, 0)
    with pytest.raises(ValueError, match="does not start at log end"):
        log.append_as_follower([RecordBatch(99, 5, tuple(make_records(1, 5)))])
    # The log goes on from the snapshot; the base stays under later epochs, and truncation.
    log.append_as_follower([RecordBatch(100, 5, tuple(make_records(2, 5)))])
    log.append_as_leader(make_records(3, 5), 7, 0)
    assert _epoch_answers(log, range(4, 9)) == [(100, 0), (102, 5), (102, 5), (105, 7), (105, 7)]
    assert [batch.base_offset for batch in decode_batches(log.read(100, 1 << 20))] == [100, 102]
    log.truncate_to(100)
    assert (log.end_offset, log.last_fetched_epoch()) == (100, 5)
    assert log.end_offset_for_epoch(6) == OffsetAndEpoch(100, 5)
    log.append_as_leader(make_records(1, 5), 6, 0)
    assert _epoch_answers(log, range(4, 8)) == [(100, 0), (100, 5), (101, 6), (101, 6)]


def test_truncate_to_snapshot_below_the_log_end(log: DurableLog) -> None:
    _fill(log, EPOCHS)
    log.truncate_to_snapshot(SnapshotId(12, 3))
    assert (log.start_offset, log.end_offset, log.last_fetched_epoch()) == (12, 12, 3)
    assert log.read(12, 1 << 20) == b""


def test_delete_before_keeps_everything_at_or_above_the_offset(log: DurableLog) -> None:
    batches = _fill(log, EPOCHS)
    log.delete_before(0)
    assert log.start_offset == 0
    log.delete_before(12)  # inside the batch 10-14: it stays
    assert log.start_offset == 10
    assert log.read(9, 1 << 20) == b""
    assert decode_batches(log.read(10, 1 << 20)) == batches[2:]
    assert decode_batches(log.read(12, 1 << 20)) == batches[2:]
    # Epoch 1 lies below the start: (start, 0). Epoch 3 was not deleted from and answers as
    # before; 12 is no batch boundary, so the epoch before the start is not known as a base.
    assert _epoch_answers(log) == [(10, 0), (10, 0), (10, 0), (20, 3), (30, 4), (30, 4), (30, 4)]
    log.delete_before(10)  # at or below the start: nothing to do
    assert log.start_offset == 10


def test_delete_before_at_a_boundary_keeps_the_epoch_before_the_start(log: DurableLog) -> None:
    _fill(log, EPOCHS)
    log.delete_before(20)  # where epoch 3 ends and epoch 4 begins, as a snapshot at 20-3 would
    assert log.start_offset == 20
    assert _epoch_answers(log) == [(20, 0), (20, 0), (20, 0), (20, 3), (30, 4), (30, 4), (30, 4)]
    log.truncate_to(20)  # (only to show the base survives a truncation)
    assert (log.end_offset, log.last_fetched_epoch()) == (20, 3)


def test_delete_before_never_empties_below_the_active_data(log: DurableLog) -> None:
    batches = _fill(log, EPOCHS)
    log.delete_before(1000)
    start = log.start_offset
    if isinstance(log, SegmentLog):  # never the active segment
        assert start == batches[-1].base_offset
        assert decode_batches(log.read(start, 1 << 20)) == batches[-1:]
    else:  # whole batches, however many
        assert start == log.end_offset == 30
    assert (log.end_offset, log.last_fetched_epoch()) == (30, 4)
    log.append_as_leader(make_records(1, 5), 4, 0)
    assert log.end_offset == 31


# -- SegmentLog across restarts -------------------------------------------------------------------


def test_segment_log_restart_after_truncate_to_snapshot(tmp_path: Path) -> None:
    build_log(tmp_path, EPOCHS, per_batch=5, segment_bytes=200)
    snapshot = SnapshotId(500, 6)
    with SegmentLog(tmp_path, 200) as log:
        fsyncs = log.fsync_count
        log.truncate_to_snapshot(snapshot)
        assert log.fsync_count == fsyncs + 2  # the new segment and the directory, at once
        assert [path.name for path in segment_files(tmp_path)] == ["00000000000000000500.log"]
    with SegmentLog(tmp_path, 200, snapshot) as log:
        assert (log.start_offset, log.end_offset, log.last_fetched_epoch()) == (500, 500, 6)
        assert log.end_offset_for_epoch(6) == OffsetAndEpoch(500, 6)
        log.append_as_leader(make_records(2, 5), 8, 0)
        log.flush()
    with SegmentLog(tmp_path, 200, snapshot) as log:
        assert _epoch_answers(log, range(5, 10)) == [(500, 0), (500, 6), (500, 6), (502, 8),
                                                     (502, 8)]
    # Without the snapshot, the offsets below 500 are in neither the log nor a snapshot.
    with pytest.raises(StorageError, match="starts at offset 500 but there is no snapshot"):
        SegmentLog(tmp_path, 200)
    with pytest.raises(StorageError, match=r"latest snapshot \(400-6\) ends at 400"):
        SegmentLog(tmp_path, 200, SnapshotId(400, 6))


def test_segment_log_restart_after_delete_before(tmp_path: Path) -> None:
    batches = build_log(tmp_path, EPOCHS, per_batch=5, segment_bytes=200)
    with SegmentLog(tmp_path, 200) as log:
        assert len(log.segment_paths) == 6
        fsyncs = log.fsync_count
        log.delete_before(20)
        assert log.fsync_count == fsyncs + 1  # the directory, at once
        assert [int(path.stem) for path in segment_files(tmp_path)] == [20, 25]
        before = (log.start_offset, log.end_offset, _epoch_answers(log))
    for snapshot, based in [(SnapshotId(20, 3), True), (SnapshotId(25, 4), False)]:
        with SegmentLog(tmp_path, 200, snapshot) as log:
            assert (log.start_offset, log.end_offset) == before[:2]
            assert decode_batches(log.read(0, 1 << 20)) == []
            assert decode_batches(log.read(20, 1 << 20)) == batches[4:]
            # The epoch before the start is known again only from a snapshot that ends there.
            unbased = [(20, 0), (20, 0), (20, 0), (20, 0), (30, 4), (30, 4), (30, 4)]
            assert _epoch_answers(log) == (before[2] if based else unbased)


def test_segment_log_crash_during_delete_before_leaves_a_suffix(tmp_path: Path) -> None:
    build_log(tmp_path, EPOCHS, per_batch=5, segment_bytes=200)
    # Deletion goes oldest first: a crash after the first unlink leaves the log from 5 on.
    segment_files(tmp_path)[0].unlink()
    with SegmentLog(tmp_path, 200, SnapshotId(20, 3)) as log:
        assert (log.start_offset, log.end_offset) == (5, 30)
        log.delete_before(20)
        assert log.start_offset == 20


def test_segment_log_refuses_a_snapshot_the_log_does_not_continue(tmp_path: Path) -> None:
    with SegmentLog(tmp_path) as log:
        log.truncate_to_snapshot(SnapshotId(10, 2))
        log.append_as_leader(make_records(1, 5), 2, 0)
        log.flush()
    with pytest.raises(StorageError, match="does not continue snapshot 10-5"):
        SegmentLog(tmp_path, snapshot_id=SnapshotId(10, 5))


# -- the crash between freezing a downloaded snapshot and truncating the log ----------------------


@pytest.mark.parametrize("damage", ["none", "newest segments gone", "every segment gone"])
def test_open_finishes_a_truncation_to_a_snapshot(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    build_log(tmp_path, EPOCHS, per_batch=5, segment_bytes=200)
    files = segment_files(tmp_path)
    # truncate_to_snapshot deletes newest first, then creates the new segment: a crash leaves
    # any prefix of the old log, or none of it.
    doomed = {"none": [], "newest segments gone": files[3:], "every segment gone": files}[damage]
    for path in doomed:
        path.unlink()
    snapshot = SnapshotId(40, 5)  # past the log end, as every snapshot a follower downloads
    with caplog.at_level(logging.WARNING), SegmentLog(tmp_path, 200, snapshot) as log:
        assert (log.start_offset, log.end_offset, log.last_fetched_epoch()) == (40, 40, 5)
        assert log.end_offset_for_epoch(5) == OffsetAndEpoch(40, 5)
    assert "before the latest snapshot 40-5" in caplog.text
    assert [path.name for path in segment_files(tmp_path)] == ["00000000000000000040.log"]
    with SegmentLog(tmp_path, 200, snapshot) as log:
        assert (log.start_offset, log.end_offset, log.last_fetched_epoch()) == (40, 40, 5)


def test_log_directory_opens_the_log_with_its_latest_snapshot(tmp_path: Path) -> None:
    format_log_dir(tmp_path, CLUSTER, 1)
    log_dir = LogDirectory.open(tmp_path, cluster_id=CLUSTER, node_id=1, segment_bytes=200)
    _fill(log_dir.log, EPOCHS)
    log_dir.log.flush()
    # A downloaded snapshot is frozen, and the node dies before truncating its log.
    partial = log_dir.snapshots.begin_download(SnapshotId(60, 5))
    partial.append(encode_snapshot(None, 0, make_records(3, 5)))
    partial.freeze(lambda data: None)
    log_dir.close()
    partition = tmp_path / METADATA_PARTITION_DIR
    assert (partition / "00000000000000000060-0000000005.checkpoint").is_file()
    reopened = LogDirectory.open(tmp_path, cluster_id=CLUSTER, node_id=1, segment_bytes=200)
    try:
        assert reopened.snapshots.latest() == SnapshotId(60, 5)
        log = reopened.log
        assert (log.start_offset, log.end_offset, log.last_fetched_epoch()) == (60, 60, 5)
    finally:
        reopened.close()


# -- MemoryLog's durability model ------------------------------------------------------------------


def test_memory_log_snapshot_operations_are_durable_at_once() -> None:
    log = MemoryLog()
    _fill(log, EPOCHS[:2])
    log.truncate_to_snapshot(SnapshotId(50, 2))  # no flush
    assert log.durable_end_offset == 50
    log.append_as_leader(make_records(2, 5), 3, 0)
    log.crash()
    assert (log.start_offset, log.end_offset, log.last_fetched_epoch()) == (50, 50, 2)
    assert log.end_offset_for_epoch(2) == OffsetAndEpoch(50, 2)
    batches = _fill(log, [3, 3, 4])
    log.flush()
    log.append_as_leader(make_records(1, 5), 4, 0)  # not flushed
    log.delete_before(60)
    assert log.start_offset == 60
    log.crash()
    assert (log.start_offset, log.end_offset) == (60, 65)
    assert log.batches == batches[2:]
    assert log.end_offset_for_epoch(3) == OffsetAndEpoch(60, 3)  # the base, kept
    assert (log.batch_containing(59), log.batch_containing(60)) == (None, batches[2])
    log.wipe()
    assert (log.start_offset, log.end_offset, log.last_fetched_epoch()) == (0, 0, 0)
    assert log.durable_end_offset == 0


def test_memory_log_delete_before_of_unflushed_data_keeps_a_prefix_durable() -> None:
    log = MemoryLog()
    _fill(log, [1])
    log.flush()
    _fill(log, [1, 2, 2])  # 5-19 not flushed
    log.delete_before(15)
    assert (log.start_offset, log.durable_end_offset) == (15, 15)
    log.crash()
    # What was deleted is gone for good; what is left was never flushed: an empty log at 15
    # whose last epoch is the one before its start.
    assert (log.start_offset, log.end_offset, log.last_fetched_epoch()) == (15, 15, 2)


