"""``SegmentLog.find_damage`` and ``SegmentLog.repair``: a log damaged in the middle is cut back to
its last valid batch, only when asked; what it drops is reported first."""

from __future__ import annotations

from pathlib import Path

import pytest

from quorum_node.storage.errors import CorruptLogError
from quorum_node.storage.segment_log import SegmentLog

from .helpers import batch_spans, build_log, segment_files, snapshot

SEGMENT_BYTES = 600


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    """14 batches of 2 records (offsets 0-27) in segments of 5, 5 and 4 batches."""
    build_log(tmp_path, [1] * 7 + [2] * 7, per_batch=2, size=30, segment_bytes=SEGMENT_BYTES)
    assert [len(batch_spans(path)) for path in segment_files(tmp_path)] == [5, 5, 4]
    return tmp_path


def zero(path: Path, start: int, count: int) -> None:
    """Overwrite a run of bytes with zeros, as a lost write-back of a block does."""
    with path.open("r+b") as file:
        file.seek(start)
        file.write(bytes(count))


def read_all(directory: Path) -> tuple[int, bytes]:
    with SegmentLog(directory, SEGMENT_BYTES) as log:
        return log.end_offset, log.read(0, 1 << 20)


def test_zeroed_bytes_in_the_middle_of_the_last_segment(log_dir: Path) -> None:
    last = segment_files(log_dir)[-1]
    _, (second, size), _, _ = batch_spans(last)
    intact = read_all(log_dir)[1]
    zero(last, second, size)  # its second batch (offsets 22-23); the two after it stay whole
    with pytest.raises(CorruptLogError, match=r"invalid batch length 0, followed by a valid batch"
                                              r".*see 'quorum-node repair-log --help'"):
        SegmentLog(log_dir, SEGMENT_BYTES)

    before = snapshot(log_dir)
    damage = SegmentLog.find_damage(log_dir)
    assert damage is not None and not damage.torn_tail
    assert (damage.path, damage.position) == (last, second)
    assert damage.valid_end_offset == 22
    (part,) = damage.dropped
    assert (part.position, part.size, part.deleted) == (second, 3 * size, False)
    assert (part.batches, part.first_offset, part.end_offset) == (2, 24, 28)
    assert snapshot(log_dir) == before  # finding changes nothing

    repaired = SegmentLog.repair(log_dir)
    assert repaired == damage
    assert last.stat().st_size == second
    assert SegmentLog.find_damage(log_dir) is None
    end, data = read_all(log_dir)
    assert end == 22 and data == intact[: 11 * size]  # the first 11 batches, all of the same size


def test_damage_in_an_older_segment_deletes_every_later_one(log_dir: Path) -> None:
    files = segment_files(log_dir)
    position, _ = batch_spans(files[1])[2]
    zero(files[1], position, 8)  # its base offset: out of sequence, not a torn write
    damage = SegmentLog.find_damage(log_dir)
    assert damage is not None and damage.valid_end_offset == 14
    assert [(p.path, p.deleted) for p in damage.dropped] == [
        (files[1], False), (files[2], True)]
    assert damage.dropped_batches == 2 + 4 and damage.dropped_end_offset == 28
    assert damage.dropped_bytes == files[1].stat().st_size - position + files[2].stat().st_size
    SegmentLog.repair(log_dir)
    assert segment_files(log_dir) == files[:2]
    assert read_all(log_dir)[0] == 14


def test_a_gap_between_segments_deletes_the_segment_after_it(log_dir: Path) -> None:
    files = segment_files(log_dir)
    files[1].unlink()  # offsets 10-19 are gone: the log ends at 10
    damage = SegmentLog.find_damage(log_dir)
    assert damage is not None and (damage.path, damage.position) == (files[2], 0)
    assert damage.valid_end_offset == 10 and damage.dropped[0].deleted
    SegmentLog.repair(log_dir)
    assert segment_files(log_dir) == files[:1]
    assert read_all(log_dir)[0] == 10


def test_a_torn_tail_is_left_to_recovery(log_dir: Path) -> None:
    last = segment_files(log_dir)[-1]
    position, size = batch_spans(last)[-1]
    zero(last, position + 5, size - 5)
    before = snapshot(log_dir)
    damage = SegmentLog.repair(log_dir)
    assert damage is not None and damage.torn_tail and damage.position == position
    assert snapshot(log_dir) == before  # the node cuts it when it opens the log


def test_a_whole_log_or_none_has_nothing_to_repair(log_dir: Path, tmp_path: Path) -> None:
    before = snapshot(log_dir)
    assert SegmentLog.find_damage(log_dir) is None
    assert SegmentLog.repair(log_dir) is None
    assert snapshot(log_dir) == before
    assert SegmentLog.repair(tmp_path / "absent") is None
    assert not (tmp_path / "absent").exists()
