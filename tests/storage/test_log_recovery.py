"""Opening a log after a crash or with damaged files: cut a torn tail, refuse anything else."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from quorum_node.raft.records import HEADER_SIZE, encode_batch
from quorum_node.storage.errors import CorruptLogError
from quorum_node.storage.segment_log import SegmentLog

from .helpers import batch_spans, build_log, make_records, segment_files, snapshot

SEGMENT_BYTES = 600
# Byte positions inside a batch: base_offset 0-7, length 8-11, epoch 12-15, magic 16, crc 17-20,
# attributes 21-22, then the rest of the header and the records (covered by the CRC).
LENGTH, MAGIC, CRC, ATTRIBUTES, RECORDS = 10, 16, 18, 22, HEADER_SIZE + 5
END = 28


def _open(directory: Path) -> SegmentLog:
    return SegmentLog(directory, SEGMENT_BYTES)


def _flip(path: Path, position: int, mask: int = 0x10) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= mask
    path.write_bytes(bytes(data))


def _cut(path: Path, size: int) -> None:
    with path.open("r+b") as file:
        file.truncate(size)


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    """A flushed log of 14 batches of 2 records (offsets 0-27) in segments of 5, 5 and 4."""
    build_log(tmp_path, [1, 1, 1, 2, 2, 2, 2] + [3] * 7, per_batch=2, size=30,
              segment_bytes=SEGMENT_BYTES)
    assert [len(batch_spans(path)) for path in segment_files(tmp_path)] == [5, 5, 4]
    return tmp_path


def _full_read(directory: Path) -> bytes:
    with _open(directory) as log:
        return log.read(0, 1 << 20)


# -- a torn or corrupt tail is cut ------------------------------------------------------------


@pytest.mark.parametrize("keep", [1, 11, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 1, -1])
def test_torn_tail_is_cut_to_the_last_whole_batch(
    log_dir: Path, keep: int, caplog: pytest.LogCaptureFixture
) -> None:
    last = segment_files(log_dir)[-1]
    position, size = batch_spans(last)[-1]
    before = _full_read(log_dir)
    _cut(last, position + (keep if keep > 0 else size + keep))
    with caplog.at_level(logging.WARNING), _open(log_dir) as log:
        assert log.end_offset == END - 2
        assert log.read(0, 1 << 20) == before[: len(before) - size]
    assert last.stat().st_size == position
    (warning,) = caplog.records
    assert warning.levelno == logging.WARNING
    assert str(last) in warning.getMessage() and f"at byte {position}" in warning.getMessage()


def test_torn_tail_within_the_only_batch_of_the_last_segment(log_dir: Path) -> None:
    with _open(log_dir) as log:  # start a fresh segment holding a single batch
        while len(segment_files(log_dir)) == 3:
            log.append_as_leader(make_records(2, 30), 4, 0)
        end = log.end_offset
        log.flush()
    last = segment_files(log_dir)[-1]
    _cut(last, 30)
    with _open(log_dir) as log:
        assert log.end_offset == int(last.stem) == end - 2
        log.append_as_leader(make_records(1, 1), 4, 0)
        assert [path.name for path in segment_files(log_dir)][-1] == last.name


def test_zero_filled_tail_is_cut(log_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    last = segment_files(log_dir)[-1]
    size = last.stat().st_size
    with last.open("ab") as file:
        file.write(bytes(4096))  # some file systems leave zeroed blocks after a crash
    with caplog.at_level(logging.WARNING), _open(log_dir) as log:
        assert log.end_offset == END
    assert last.stat().st_size == size
    assert "invalid batch length 0" in caplog.text


@pytest.mark.parametrize("where", [LENGTH, MAGIC, CRC, ATTRIBUTES, RECORDS, -1])
def test_bit_flip_in_the_last_batch_drops_it(
    log_dir: Path, where: int, caplog: pytest.LogCaptureFixture
) -> None:
    last = segment_files(log_dir)[-1]
    position, size = batch_spans(last)[-1]
    _flip(last, position + (where if where >= 0 else size + where))
    with caplog.at_level(logging.WARNING), _open(log_dir) as log:
        assert log.end_offset == END - 2
        assert log.last_fetched_epoch() == 3
    assert last.stat().st_size == position
    assert str(last) in caplog.text and f"at byte {position}" in caplog.text


def test_corrupt_batch_followed_only_by_a_torn_one_is_a_tail(log_dir: Path) -> None:
    last = segment_files(log_dir)[-1]
    spans = batch_spans(last)
    assert len(spans) >= 2
    (corrupt, _), (torn, torn_size) = spans[-2], spans[-1]
    _flip(last, corrupt + RECORDS)
    _cut(last, torn + torn_size - 3)
    with _open(log_dir) as log:
        assert log.end_offset == END - 4
    assert last.stat().st_size == corrupt


# -- anything else is refused, and nothing is touched ------------------------------------------


def _assert_refused(directory: Path, path: Path, position: int) -> None:
    before = snapshot(directory)
    with pytest.raises(CorruptLogError) as info:
        _open(directory)
    error = info.value
    assert (error.path, error.position) == (path, position)
    message = str(error)
    assert f"{path} at byte {position}" in message and "\n" not in message
    assert snapshot(directory) == before


@pytest.mark.parametrize("where", [LENGTH, MAGIC, CRC, ATTRIBUTES, RECORDS, -1])
def test_bit_flip_in_a_middle_batch_is_refused(log_dir: Path, where: int) -> None:
    last = segment_files(log_dir)[-1]
    spans = batch_spans(last)
    assert len(spans) >= 3
    position, size = spans[1]
    _flip(last, position + (where if where >= 0 else size + where))
    _assert_refused(log_dir, last, position)


@pytest.mark.parametrize("mask", [0x01, 0x80])
def test_damaged_length_is_refused_when_valid_data_follows(
    log_dir: Path, mask: int
) -> None:
    last = segment_files(log_dir)[-1]
    position, _ = batch_spans(last)[0]
    _flip(last, position + LENGTH, mask)  # the length now overshoots, or undershoots
    _assert_refused(log_dir, last, position)


def test_message_names_file_position_and_reason(log_dir: Path) -> None:
    last = segment_files(log_dir)[-1]
    position, _ = batch_spans(last)[1]
    _flip(last, position + RECORDS)
    with pytest.raises(CorruptLogError, match=r"CRC32C mismatch .*, followed by a valid batch"):
        _open(log_dir)


@pytest.mark.parametrize("where", [LENGTH, MAGIC, 3])
def test_header_damage_in_an_older_segment_is_refused(log_dir: Path, where: int) -> None:
    older = segment_files(log_dir)[1]
    position, _ = batch_spans(older)[-1]  # even its last batch: only the log's tail may be cut
    _flip(older, position + where)
    _assert_refused(log_dir, older, position)


def test_record_damage_in_an_older_segment_is_refused(log_dir: Path) -> None:
    older = segment_files(log_dir)[0]
    position, _ = batch_spans(older)[1]
    _flip(older, position + RECORDS)  # only the CRC32C can see this
    _assert_refused(log_dir, older, position)


def test_torn_older_segment_is_refused(log_dir: Path) -> None:
    older = segment_files(log_dir)[1]
    position, _ = batch_spans(older)[-1]
    _cut(older, position + 20)
    _assert_refused(log_dir, older, position)


def test_missing_segment_is_refused(log_dir: Path) -> None:
    files = segment_files(log_dir)
    files[1].unlink()
    _assert_refused(log_dir, files[2], 0)


def test_empty_older_segment_is_refused(log_dir: Path) -> None:
    files = segment_files(log_dir)
    _cut(files[1], 0)
    _assert_refused(log_dir, files[1], 0)


def _write_segment(path: Path, batches: list[tuple[int, int, int]]) -> list[int]:
    """Write (base, epoch, count) batches; return their positions."""
    data, positions = b"", []
    for base, epoch, count in batches:
        positions.append(len(data))
        data += encode_batch(base, epoch, make_records(count, 10), 0)
    path.write_bytes(data)
    return positions


def test_offset_gap_inside_a_segment_is_refused(tmp_path: Path) -> None:
    path = tmp_path / f"{0:020d}.log"
    positions = _write_segment(path, [(0, 1, 2), (2, 1, 2), (5, 1, 2), (7, 1, 1)])
    _assert_refused(tmp_path, path, positions[2])


def test_offset_gap_between_segments_is_refused(tmp_path: Path) -> None:
    _write_segment(tmp_path / f"{0:020d}.log", [(0, 1, 2)])
    gap = tmp_path / f"{3:020d}.log"
    _write_segment(gap, [(3, 1, 2)])
    _assert_refused(tmp_path, gap, 0)


def test_segment_name_disagreeing_with_its_batches_is_refused(tmp_path: Path) -> None:
    _write_segment(tmp_path / f"{0:020d}.log", [(0, 1, 2)])
    misnamed = tmp_path / f"{2:020d}.log"
    _write_segment(misnamed, [(4, 1, 2)])
    _assert_refused(tmp_path, misnamed, 0)


def test_decreasing_epoch_is_refused(tmp_path: Path) -> None:
    first = tmp_path / f"{0:020d}.log"
    _write_segment(first, [(0, 3, 2)])
    second = tmp_path / f"{2:020d}.log"
    positions = _write_segment(second, [(2, 3, 1), (3, 2, 1), (4, 3, 1)])
    _assert_refused(tmp_path, second, positions[1])
    second.unlink()
    positions = _write_segment(first, [(0, 3, 2), (2, 1, 1), (3, 3, 1)])
    _assert_refused(tmp_path, first, positions[1])


def test_out_of_sequence_last_batch_is_refused_not_cut(tmp_path: Path) -> None:
    # The base offset is outside the CRC: a damaged one decodes, so it is no torn write.
    path = tmp_path / f"{0:020d}.log"
    positions = _write_segment(path, [(0, 1, 2), (2, 1, 2), (9, 1, 2)])
    _assert_refused(tmp_path, path, positions[2])


def test_truncation_then_reopen(log_dir: Path) -> None:
    before = _full_read(log_dir)
    with _open(log_dir) as log:
        log.truncate_to(9)  # the batch 8-9 goes whole
        assert log.end_offset == 8
        kept = log.read(0, 1 << 20)
        log.flush()
    assert before.startswith(kept)
    with _open(log_dir) as log:
        assert (log.end_offset, log.last_fetched_epoch()) == (8, 2)
        assert log.read(0, 1 << 20) == kept
        log.append_as_leader(make_records(2, 30), 5, 0)
        log.flush()
    with _open(log_dir) as log:
        assert (log.end_offset, log.last_fetched_epoch()) == (10, 5)


def test_files_that_are_not_segments_are_left_alone(log_dir: Path) -> None:
    (log_dir / "meta.properties").write_text("version=1\n")
    (log_dir / "quorum-state").write_text("{}\n")
    (log_dir / "12.log").write_bytes(b"not a segment: the name has the wrong width")
    before = snapshot(log_dir)
    with _open(log_dir) as log:
        assert log.end_offset == END
    assert snapshot(log_dir) == before
