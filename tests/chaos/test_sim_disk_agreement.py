"""The simulator's disk and the real one agree on what a crash loses: the same seeded sequence of
appends, truncations and flushes goes to the simulator's ``MemoryLog`` and to a ``SegmentLog`` on
the lazy file system, with crashes in between (``MemoryLog.crash``; a power loss and a reopen for
the real log), and after each crash both must hold the very same batches, byte for byte. So the
simulator's seeds explore what real processes on a real disk can lose in a power loss, neither
more nor less, but for one difference, checked too: a segment roll fsyncs the segment it leaves,
which the simulated disk (no segments) does not model."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from lazyfs import LazyFs, unavailable_reason

from quorum_node.raft.log import MemoryLog
from quorum_node.raft.records import Record
from quorum_node.storage.segment_log import SegmentLog

pytestmark = pytest.mark.skipif(unavailable_reason() is not None,
                                reason=f"lazyfs: {unavailable_reason()}")

OPERATIONS = 120


@pytest.fixture
def lazy(tmp_path: Path) -> Iterator[LazyFs]:
    mounted = LazyFs(tmp_path / "disk")
    try:
        yield mounted
    finally:
        mounted.unmount()


def contents(log: MemoryLog | SegmentLog) -> tuple[int, int, bytes]:
    return log.start_offset, log.end_offset, log.read(log.start_offset, 1 << 30)


def run(lazy: LazyFs, seed: int, segment_bytes: int) -> tuple[int, int, int]:
    """The seeded sequence on both logs; (crashes, offsets compared after them, rolls)."""
    rng = random.Random(seed)
    directory = lazy.mountpoint / "log"
    real = SegmentLog(directory, segment_bytes)
    model = MemoryLog()
    epoch, crashes, compared, rolls = 1, 0, 0, 0
    try:
        for step in range(OPERATIONS):
            roll = rng.random()
            if roll < 0.55:
                records = [Record(rng.randbytes(rng.randrange(1, 200)))
                           for _ in range(rng.randrange(1, 4))]
                segments = len(real.segment_paths)
                real.append_as_leader(records, epoch, step)
                if len(real.segment_paths) > segments:
                    # A roll fsyncs the segment it leaves (and ext4 commits its journal with
                    # it): a flush of everything before this batch, which the simulated disk,
                    # having no segments, never does by itself.
                    model.flush()
                    rolls += 1
                model.append_as_leader(records, epoch, step)
            elif roll < 0.7 and model.end_offset > 0:
                offset = rng.randrange(model.end_offset)
                real.truncate_to(offset)
                model.truncate_to(offset)
                epoch += 1  # a new leader's records follow a truncation
            elif roll < 0.88:
                assert real.flush() == model.flush()
            else:
                real.close()
                lazy.power_loss()
                model.crash()
                real = SegmentLog(directory, segment_bytes)
                crashes += 1
                assert contents(real) == contents(model), f"seed {seed}, step {step}"
                compared += model.end_offset - model.start_offset
                epoch = max(epoch, model.last_fetched_epoch())
    finally:
        real.close()
    return crashes, compared, rolls


@pytest.mark.parametrize("seed", range(8))
def test_a_crash_loses_the_same_on_the_simulated_and_the_lazy_disk(lazy: LazyFs,
                                                                     seed: int) -> None:
    crashes, compared, rolls = run(lazy, seed, 1 << 30)
    assert crashes >= 5 and compared > 0 and rolls == 0


@pytest.mark.parametrize("seed", range(8))
def test_a_segment_roll_is_a_flush_of_what_came_before(lazy: LazyFs, seed: int) -> None:
    """Small segments: the one difference between the two disks is the roll, after which the
    real disk keeps the segment it left (fsynced) where the simulated disk keeps only what was
    flushed. With a flush of the simulated disk at each roll they agree again, byte for byte:
    the simulator loses at least what a real disk loses, and more only at a roll."""
    crashes, compared, rolls = run(lazy, seed, 700)
    assert crashes >= 5 and compared > 0 and rolls > 0

