from __future__ import annotations

import errno
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorum_node.raft.log import DurableLog, MemoryLog
from quorum_node.raft.records import RecordBatch, decode_batches
from quorum_node.raft.snapshots import SnapshotId
from quorum_node.raft.types import OffsetAndEpoch
from quorum_node.storage.errors import StorageError
from quorum_node.storage.segment_log import SegmentLog

from .helpers import build_log, make_records, segment_files

# -- the reference model: obviously correct, everything by linear scan ------------------------


class ModelLog:
    def __init__(self) -> None:
        self.batches: list[RecordBatch] = []
        self.start = 0
        self.snapshot: SnapshotId | None = None  # the latest

    @property
    def end_offset(self) -> int:
        return self.batches[-1].next_offset if self.batches else self.start

    @property
    def base(self) -> SnapshotId | None:
        """The snapshot the log starts at, whose epoch counts as held."""
        at_start = self.snapshot is not None and self.snapshot.end_offset == self.start
        return self.snapshot if at_start else None

    def last_fetched_epoch(self) -> int:
        if self.batches:
            return self.batches[-1].epoch
        return self.base.epoch if self.base is not None else 0

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        held = [batch.epoch for batch in self.batches]
        if self.base is not None:
            held.append(self.base.epoch)
        if not any(held_epoch <= epoch for held_epoch in held):
            return OffsetAndEpoch(self.start, 0)
        found = max(held_epoch for held_epoch in held if held_epoch <= epoch)
        later = [batch.base_offset for batch in self.batches if batch.epoch > found]
        return OffsetAndEpoch(later[0] if later else self.end_offset, found)

    def epoch_at(self, offset: int) -> int:
        (batch,) = [b for b in self.batches if b.base_offset <= offset <= b.last_offset]
        return batch.epoch

    def drop_below(self, start: int) -> None:
        """The log deleted whole batches: it now starts at ``start``."""
        assert start in [batch.base_offset for batch in self.batches] + [self.end_offset]
        self.batches = [batch for batch in self.batches if batch.base_offset >= start]
        self.start = start

    def load_snapshot(self, snapshot_id: SnapshotId) -> None:
        self.batches, self.start, self.snapshot = [], snapshot_id.end_offset, snapshot_id

    def read(self, offset: int, max_bytes: int) -> bytes:
        starts = [
            n for n, batch in enumerate(self.batches)
            if batch.base_offset <= offset <= batch.last_offset
        ]
        if not starts:
            return b""
        out = self.batches[starts[0]].encode()
        for batch in self.batches[starts[0] + 1 :]:
            if len(out) + len(batch.encode()) > max_bytes:
                break
            out += batch.encode()
        return out

    def read_size(self, offset: int, count: int) -> int:
        """Bytes of the ``count`` batches starting at ``offset``."""
        following = [batch for batch in self.batches if batch.last_offset >= offset]
        return sum(len(batch.encode()) for batch in following[:count])

    def append(self, batch: RecordBatch) -> None:
        """Append with the protocol's checks; ValueError leaves the model unchanged."""
        if batch.base_offset != self.end_offset or batch.epoch < self.last_fetched_epoch():
            raise ValueError("refused")
        self.batches.append(batch)

    def truncate_to(self, offset: int) -> None:
        self.batches = [batch for batch in self.batches if batch.last_offset < offset]

    @property
    def committed(self) -> int:
        """Below the latest snapshot nothing is ever truncated: it was committed."""
        return self.snapshot.end_offset if self.snapshot is not None else 0


# -- the implementations under test ----------------------------------------------------------


@dataclass
class Subject:
    name: str
    open: Callable[[Path], DurableLog]
    # Flush, then come back as after a reboot, told the latest snapshot.
    restart: Callable[[DurableLog, Path, SnapshotId | None], DurableLog]


def _memory_restart(log: DurableLog, _directory: Path, _snapshot: SnapshotId | None
                    ) -> DurableLog:
    assert isinstance(log, MemoryLog)
    log.flush()
    log.crash()
    return log


def _segment_subject(segment_bytes: int) -> Subject:
    def restart(log: DurableLog, directory: Path, snapshot: SnapshotId | None) -> DurableLog:
        assert isinstance(log, SegmentLog)
        log.flush()
        log.close()
        return SegmentLog(directory, segment_bytes, snapshot)

    return Subject(
        f"SegmentLog(segment_bytes={segment_bytes})",
        lambda directory: SegmentLog(directory, segment_bytes),
        restart,
    )


SUBJECTS = [
    Subject("MemoryLog", lambda _directory: MemoryLog(), _memory_restart),
    _segment_subject(300),  # rolls every few batches
    _segment_subject(1),  # one batch per segment
]

# Relative to the last epoch; -1 makes an invalid append (kept rare so that logs grow).
_epoch_step = st.sampled_from([0, 0, 0, 0, 0, 1, 1, 2, -1])
_follower_batch = st.tuples(st.integers(1, 3), _epoch_step, st.integers(0, 50))
# A byte limit, or (n, d): the size of the n batches from the read offset plus d, to hit the edges.
_read_limit = st.one_of(
    st.integers(0, 400), st.tuples(st.integers(1, 5), st.sampled_from([-1, 0, 1]))
)
_leader = st.tuples(st.just("leader"), st.integers(1, 4), _epoch_step, st.integers(0, 60),
                    st.booleans())
_follower = st.tuples(st.just("follower"), st.lists(_follower_batch, min_size=1, max_size=3),
                      st.sampled_from([0] * 8 + [-1, 1]))
OPERATIONS = st.lists(
    st.one_of(  # appends repeated so that they dominate and logs span several segments
        _leader,
        _leader,
        _leader,
        _follower,
        _follower,
        st.tuples(st.just("truncate"), st.integers(0, 10_000)),
        st.tuples(st.just("read"), st.integers(0, 10_000), st.booleans(), _read_limit),
        st.tuples(st.just("epoch"), st.integers(-1, 12)),
        st.tuples(st.just("flush")),
        st.tuples(st.just("restart")),
        st.tuples(st.just("retain"), st.integers(0, 10_000)),
        st.tuples(st.just("load"), st.integers(1, 30), st.integers(0, 2)),
    ),
    min_size=10,
    max_size=80,
)


def _outcome(action: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    try:
        return ("ok", action(*args))
    except ValueError:
        return ("ValueError", None)


def _check_same_state(log: DurableLog, model: ModelLog) -> None:
    assert log.start_offset == model.start
    assert log.end_offset == model.end_offset
    assert log.last_fetched_epoch() == model.last_fetched_epoch()


def _run(subject: Subject, directory: Path, operations: list[tuple[Any, ...]]) -> None:
    log, model = subject.open(directory), ModelLog()
    try:
        for step, (kind, *args) in enumerate(operations):
            if kind == "leader":
                _append_as_leader(log, model, step, args)
            elif kind == "follower":
                _append_as_follower(log, model, step, *args)
            elif kind == "truncate":
                offset = max(args[0] % (model.end_offset + 3), model.committed)
                log.truncate_to(offset)
                model.truncate_to(offset)
            elif kind == "read":
                _read(log, model, *args)
            elif kind == "epoch":
                assert log.end_offset_for_epoch(args[0]) == model.end_offset_for_epoch(args[0])
            elif kind == "flush":
                assert log.flush() == model.end_offset
            elif kind == "retain":
                _retain(log, model, args[0])
            elif kind == "load":
                delta, epoch_step = args
                snapshot = SnapshotId(log.end_offset + delta,
                                      model.last_fetched_epoch() + epoch_step)
                log.truncate_to_snapshot(snapshot)
                model.load_snapshot(snapshot)
            else:
                log = subject.restart(log, directory, model.snapshot)
            _check_same_state(log, model)
        assert log.read(0, 1 << 30) == model.read(0, 1 << 30)
        for epoch in range(-1, model.last_fetched_epoch() + 2):
            assert log.end_offset_for_epoch(epoch) == model.end_offset_for_epoch(epoch)
    finally:
        if isinstance(log, SegmentLog):
            log.close()


def _append_as_leader(log: DurableLog, model: ModelLog, step: int, args: list[Any]) -> None:
    count, epoch_step, size, control = args
    epoch = model.last_fetched_epoch() + epoch_step
    records = make_records(count, size, step)
    result = _outcome(log.append_as_leader, records, epoch, step, control)
    batch = RecordBatch(model.end_offset, epoch, tuple(records), step, control)
    expected = _outcome(model.append, batch)
    assert result[0] == expected[0]
    if result[0] == "ok":
        assert result[1] == model.batches[-1]


def _append_as_follower(log: DurableLog, model: ModelLog, step: int,
                        specs: list[tuple[int, int, int]], skew: int) -> None:
    batches, base, epoch = [], log.end_offset + skew, model.last_fetched_epoch()
    for count, epoch_step, size in specs:
        epoch += epoch_step
        replicated = tuple(make_records(count, size, step))
        batches.append(RecordBatch(base, epoch, replicated, timestamp_ms=7))
        base += count
    result = _outcome(log.append_as_follower, batches)
    expected = ("ok", None)
    for batch in batches:  # the protocol appends batch by batch
        if _outcome(model.append, batch)[0] != "ok":
            expected = ("ValueError", None)
            break
    assert result == expected


def _read(log: DurableLog, model: ModelLog, pick: int, at_batch: bool,
          limit: int | tuple[int, int]) -> None:
    """A read from an offset (``at_batch``: a batch's base), of a byte limit or (n, d): the size
    of the n batches from there plus d."""
    offset = pick % (model.end_offset + 3)
    if at_batch and model.batches:
        offset = model.batches[pick % len(model.batches)].base_offset
    max_bytes = limit if isinstance(limit, int) else \
        model.read_size(offset, limit[0]) + limit[1]
    assert log.read(offset, max_bytes) == model.read(offset, max_bytes)


def _retain(log: DurableLog, model: ModelLog, pick: int) -> None:
    """Take a snapshot at the end of a batch the log holds (as a state machine does), then
    delete the log below it, as far as the log's granularity allows: whole batches, or whole
    segments but the active one."""
    ends = [batch.next_offset for batch in model.batches if batch.next_offset >= model.committed]
    if not ends:
        return
    offset = ends[pick % len(ends)]
    snapshot = SnapshotId(offset, model.epoch_at(offset - 1))
    log.delete_before(offset)
    start = log.start_offset
    assert model.start <= start <= offset
    if isinstance(log, MemoryLog):
        assert start == min([b.base_offset for b in model.batches if b.next_offset > offset],
                            default=model.end_offset)
    else:
        assert isinstance(log, SegmentLog)
        paths = log.segment_paths
        assert int(paths[0].stem) == start
        assert len(paths) == 1 or int(paths[1].stem) > offset  # nothing more could go
    model.drop_below(start)
    model.snapshot = snapshot


@pytest.mark.parametrize("subject", SUBJECTS, ids=lambda subject: subject.name)
@settings(max_examples=50, deadline=None)
@given(operations=OPERATIONS)
def test_conformance_with_reference_model(
    subject: Subject, operations: list[tuple[Any, ...]]
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        _run(subject, Path(directory), operations)


# -- focused behaviour --------------------------------------------------------------------------


def test_is_a_durable_log(tmp_path: Path) -> None:
    log: DurableLog = SegmentLog(tmp_path)  # mypy checks the protocol here
    assert (log.start_offset, log.end_offset, log.last_fetched_epoch()) == (0, 0, 0)
    assert log.end_offset_for_epoch(3) == OffsetAndEpoch(0, 0)
    assert log.read(0, 100) == b""
    assert [path.name for path in segment_files(tmp_path)] == ["00000000000000000000.log"]


def test_segments_roll_when_full(tmp_path: Path) -> None:
    batches = build_log(tmp_path, [1] * 20, per_batch=3, size=30, segment_bytes=600)
    files = segment_files(tmp_path)
    assert len(files) > 3
    expected_bases = []
    position_in_segment = 0
    for batch in batches:
        size = len(batch.encode())
        if position_in_segment and position_in_segment + size > 600:
            position_in_segment = 0
        if position_in_segment == 0:
            expected_bases.append(batch.base_offset)
        position_in_segment += size
    assert [int(path.stem) for path in files] == expected_bases
    assert all(path.name == f"{int(path.stem):020d}.log" for path in files)
    assert all(path.stat().st_size <= 600 for path in files)
    on_disk = b"".join(path.read_bytes() for path in files)
    assert decode_batches(on_disk) == batches


def test_batch_larger_than_a_segment_gets_its_own(tmp_path: Path) -> None:
    with SegmentLog(tmp_path, segment_bytes=100) as log:
        for n in range(3):
            log.append_as_leader(make_records(2, 200, n), 1, 0)
        assert [path.stat().st_size > 100 for path in segment_files(tmp_path)] == [True] * 3


def test_reopen_after_flush_restores_everything(tmp_path: Path) -> None:
    with SegmentLog(tmp_path, segment_bytes=400) as log:
        for n in range(30):
            log.append_as_leader(make_records(1 + n % 3, 25, n), 1 + n // 10, n, n % 7 == 0)
        assert log.flush() == log.end_offset
        state = (log.end_offset, log.last_fetched_epoch(), log.read(0, 1 << 20),
                 [log.end_offset_for_epoch(epoch) for epoch in range(6)])
        bases = [batch.base_offset for batch in decode_batches(state[2])]
        reads = [log.read(base, 150) for base in bases]
    with SegmentLog(tmp_path, segment_bytes=400) as log:
        assert (log.end_offset, log.last_fetched_epoch(), log.read(0, 1 << 20),
                [log.end_offset_for_epoch(epoch) for epoch in range(6)]) == state
        assert [log.read(base, 150) for base in bases] == reads
        # Appending continues where the log left off.
        batch = log.append_as_leader(make_records(1, 5), 3, 0)
        assert batch.base_offset == state[0]


def test_epoch_cache_after_reopen_and_truncate(tmp_path: Path) -> None:
    # Epoch 1 at offsets 0-9, epoch 3 at 10-19, epoch 4 at 20-29 (batches of 5).
    build_log(tmp_path, [1, 1, 3, 3, 4, 4], per_batch=5, segment_bytes=300)
    expected = {0: (0, 0), 1: (10, 1), 2: (10, 1), 3: (20, 3), 4: (30, 4), 9: (30, 4)}
    with SegmentLog(tmp_path, segment_bytes=300) as log:
        assert len(log.segment_paths) > 1
        for epoch, answer in expected.items():
            assert log.end_offset_for_epoch(epoch) == OffsetAndEpoch(*answer)
        log.truncate_to(17)  # the batch 15-19 straddles 17: it goes whole
        assert (log.end_offset, log.last_fetched_epoch()) == (15, 3)
        assert log.end_offset_for_epoch(4) == OffsetAndEpoch(15, 3)
        log.flush()
    with SegmentLog(tmp_path, segment_bytes=300) as log:
        assert (log.end_offset, log.last_fetched_epoch()) == (15, 3)
        assert log.end_offset_for_epoch(3) == OffsetAndEpoch(15, 3)
        log.truncate_to(10)
        assert log.end_offset_for_epoch(3) == OffsetAndEpoch(10, 1)
        assert log.last_fetched_epoch() == 1
        log.append_as_leader(make_records(2, 5), 5, 0)
        assert log.end_offset_for_epoch(4) == OffsetAndEpoch(10, 1)
        assert log.end_offset_for_epoch(5) == OffsetAndEpoch(12, 5)
        log.flush()
    with SegmentLog(tmp_path, segment_bytes=300) as log:
        assert [log.end_offset_for_epoch(e) for e in (1, 4, 5)] == [
            OffsetAndEpoch(10, 1), OffsetAndEpoch(10, 1), OffsetAndEpoch(12, 5)]


def test_truncate_deletes_whole_segments_and_cuts_files(tmp_path: Path) -> None:
    build_log(tmp_path, [1] * 12, per_batch=2, size=40, segment_bytes=250)
    with SegmentLog(tmp_path, segment_bytes=250) as log:
        before = segment_files(tmp_path)
        assert len(before) >= 4
        cut_segment = before[1]
        log.truncate_to(int(cut_segment.stem) + 1)  # inside the first batch of segment 2
        assert segment_files(tmp_path) == before[:2]
        assert cut_segment.stat().st_size == 0
        assert log.end_offset == int(cut_segment.stem)
        log.append_as_leader(make_records(1, 5), 2, 0)
        assert cut_segment.stat().st_size > 0  # the emptied segment became the active one
        log.truncate_to(0)
        assert [path.name for path in segment_files(tmp_path)] == ["00000000000000000000.log"]
        assert (log.end_offset, log.last_fetched_epoch(), log.read(0, 100)) == (0, 0, b"")
        log.flush()
    with SegmentLog(tmp_path, segment_bytes=250) as log:
        assert log.end_offset == 0


def test_read_returns_whole_batches_across_segments(tmp_path: Path) -> None:
    batches = build_log(tmp_path, [1] * 10, per_batch=1, size=50, segment_bytes=200)
    sizes = [len(batch.encode()) for batch in batches]
    with SegmentLog(tmp_path, segment_bytes=200) as log:
        assert len(log.segment_paths) > 2
        assert log.read(0, 1) == batches[0].encode()  # always at least one batch
        three = sum(sizes[:3])
        assert decode_batches(log.read(0, three)) == batches[:3]
        assert decode_batches(log.read(0, three - 1)) == batches[:2]
        assert decode_batches(log.read(4, 10_000)) == batches[4:]
        assert log.read(10, 10_000) == b""  # the log end
        assert log.read(-1, 10_000) == b""


def test_open_makes_what_it_found_durable(tmp_path: Path) -> None:
    with SegmentLog(tmp_path) as log:
        assert log.fsync_count == 2  # the new segment and the directory
        log.append_as_leader(make_records(2, 5), 1, 0)
    # Closed without a flush, as by a process crash: the OS still holds the write.
    with SegmentLog(tmp_path) as log:
        assert log.end_offset == 2
        assert log.fsync_count == 2


def test_flush_counts_and_returns_the_end(tmp_path: Path) -> None:
    with SegmentLog(tmp_path, segment_bytes=100) as log:
        fsyncs = log.fsync_count
        assert log.flush() == 0
        assert log.fsync_count == fsyncs  # nothing to sync
        log.append_as_leader(make_records(2, 5), 1, 0)
        assert log.flush() == 2
        assert log.fsync_count == fsyncs + 1
        log.append_as_leader(make_records(2, 50), 1, 0)  # rolls: fsyncs the outgoing segment
        assert log.fsync_count == fsyncs + 1
        log.append_as_leader(make_records(2, 50), 1, 0)
        assert log.fsync_count == fsyncs + 2
        assert log.flush() == 6
        assert log.fsync_count == fsyncs + 4  # the new segment and the directory


@contextmanager
def _blocking_fsync(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event,
                                                                        threading.Event]]:
    entered, release = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if threading.current_thread() is not threading.main_thread():
            entered.set()
            assert release.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    yield entered, release


def test_flush_concurrent_with_truncation_never_overstates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SegmentLog(tmp_path) as log, _blocking_fsync(monkeypatch) as (entered, release):
        for n in range(5):
            log.append_as_leader(make_records(2, 5), 1, n)
        result: list[int] = []
        flusher = threading.Thread(target=lambda: result.append(log.flush()))
        flusher.start()
        assert entered.wait(10)
        # While the fsync runs, the log diverges: offsets 4.. are replaced, not yet durable.
        log.truncate_to(4)
        log.append_as_leader(make_records(6, 5), 2, 0)
        release.set()
        flusher.join()
        assert result == [4]
        assert log.flush() == 10


def test_failed_fsync_poisons_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = SegmentLog(tmp_path)
    log.append_as_leader(make_records(1, 5), 1, 0)

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(StorageError, match="fsync failed"):
        log.flush()
    monkeypatch.undo()
    with pytest.raises(StorageError, match="earlier I/O error"):
        log.append_as_leader(make_records(1, 5), 1, 0)
    with pytest.raises(StorageError, match="earlier I/O error"):
        log.flush()
    log.close()
    with SegmentLog(tmp_path) as reopened:
        assert reopened.end_offset == 1


def test_closed_log_refuses_use(tmp_path: Path) -> None:
    log = SegmentLog(tmp_path)
    log.close()
    log.close()
    with pytest.raises(StorageError, match="closed"):
        log.append_as_leader(make_records(1, 5), 1, 0)
    with pytest.raises(StorageError, match="closed"):
        log.read(0, 10)


def test_oversized_follower_batch_is_refused(tmp_path: Path) -> None:
    huge = RecordBatch(0, 1, tuple(make_records(1, 9 * 1024 * 1024)), 0)
    with SegmentLog(tmp_path) as log:
        with pytest.raises(ValueError, match="exceeds"):
            log.append_as_follower([huge])
        assert log.end_offset == 0
