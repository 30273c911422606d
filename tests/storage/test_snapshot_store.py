"""Snapshot stores: the file store on disk, and the behaviour it shares with the memory one."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from quorum_node.raft.memory_snapshots import MemorySnapshotStore
from quorum_node.raft.records import Record
from quorum_node.raft.snapshot_format import (
    check_snapshot,
    encode_snapshot,
    encode_snapshot_batches,
    read_snapshot,
)
from quorum_node.raft.snapshots import (
    Buffer,
    CorruptSnapshotError,
    SnapshotId,
    SnapshotStore,
)
from quorum_node.raft.types import ReplicaKey
from quorum_node.storage.errors import StorageError
from quorum_node.storage.snapshot_store import FileSnapshotStore, snapshot_file_name

VOTERS = (ReplicaKey(1, uuid.UUID(int=1)), ReplicaKey(2, uuid.UUID(int=2)))


def _contents(tag: int = 0, count: int = 50, voters: tuple[ReplicaKey, ...] | None = VOTERS
              ) -> bytes:
    records = [Record(value=b"%d-%d" % (tag, n) * 5, key=b"k%d" % n) for n in range(count)]
    return encode_snapshot(voters, 1000 + tag, records, records_per_batch=8)


def _accept(data: Buffer) -> None:
    """A contents check that accepts anything."""


def _files(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


STORES: dict[str, Callable[[Path], SnapshotStore]] = {
    "memory": lambda _directory: MemorySnapshotStore(),
    "file": FileSnapshotStore,
}


@pytest.fixture(params=sorted(STORES))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> SnapshotStore:
    return STORES[request.param](tmp_path)


# -- what every store does ----------------------------------------------------------------------


def test_round_trip(store: SnapshotStore) -> None:
    assert store.latest() is None
    data = _contents()
    store.save(SnapshotId(100, 3), data)
    assert store.latest() == SnapshotId(100, 3)
    assert store.size(SnapshotId(100, 3)) == len(data)
    assert store.size(SnapshotId(100, 4)) is None
    assert store.read(SnapshotId(100, 3), 0, len(data) + 10) == data
    assert store.voters(SnapshotId(100, 3)) == VOTERS


def test_chunked_reads_by_position(store: SnapshotStore) -> None:
    data = _contents()
    snapshot_id = SnapshotId(7, 1)
    store.save(snapshot_id, data)
    for chunk in (1, 7, 100, len(data) - 1, len(data)):
        pieces = [store.read(snapshot_id, position, chunk)
                  for position in range(0, len(data), chunk)]
        assert all(len(piece) == chunk for piece in pieces[:-1])
        assert b"".join(pieces) == data
    assert store.read(snapshot_id, len(data) - 3, 100) == data[-3:]
    assert store.read(snapshot_id, 5, 0) == b""
    for position in (-1, len(data), len(data) + 5):
        with pytest.raises(ValueError, match="position"):
            store.read(snapshot_id, position, 10)
    with pytest.raises(KeyError):
        store.read(SnapshotId(8, 1), 0, 10)


def test_download_is_invisible_until_frozen(store: SnapshotStore) -> None:
    data = _contents(1)
    partial = store.begin_download(SnapshotId(50, 2))
    assert (partial.snapshot_id, partial.written) == (SnapshotId(50, 2), 0)
    for start in range(0, len(data), 33):
        partial.append(data[start : start + 33])
        assert partial.written == min(start + 33, len(data))
        assert store.latest() is None
        assert store.size(SnapshotId(50, 2)) is None
    partial.freeze(_accept)
    assert store.latest() == SnapshotId(50, 2)
    assert store.read(SnapshotId(50, 2), 0, 1 << 20) == data


@pytest.mark.parametrize("damage", ["truncated", "bit flip", "trailing garbage", "empty"])
def test_corrupt_download_is_refused_and_dropped(store: SnapshotStore, damage: str) -> None:
    store.save(SnapshotId(10, 1), _contents(0))
    data = bytearray(_contents(1))
    if damage == "truncated":
        del data[-5:]
    elif damage == "bit flip":
        data[len(data) // 2] ^= 0x10
    elif damage == "trailing garbage":
        data += b"\x00\x01"
    else:
        data.clear()
    partial = store.begin_download(SnapshotId(20, 2))
    partial.append(bytes(data))
    with pytest.raises(CorruptSnapshotError):
        partial.freeze(_accept)
    assert store.latest() == SnapshotId(10, 1)
    assert store.size(SnapshotId(20, 2)) is None
    # The same snapshot can be fetched again from the start.
    again = store.begin_download(SnapshotId(20, 2))
    assert again.written == 0
    again.append(_contents(1))
    again.freeze(_accept)
    assert store.latest() == SnapshotId(20, 2)


def test_a_download_its_check_refuses_is_dropped(store: SnapshotStore, tmp_path: Path) -> None:
    """The contents check (the core's: voters, the state machine's records) runs over exactly
    the downloaded bytes, after the framing passed, and a refusal keeps nothing: not the
    snapshot, not a part file."""
    store.save(SnapshotId(10, 1), _contents(0))
    seen: list[bytes] = []

    def refuse(data: Buffer) -> None:
        seen.append(bytes(data))
        raise CorruptSnapshotError("its voter set names voters [7]")

    partial = store.begin_download(SnapshotId(20, 2))
    partial.append(_contents(1))
    with pytest.raises(CorruptSnapshotError, match="voters"):
        partial.freeze(refuse)
    assert seen == [_contents(1)]
    assert store.latest() == SnapshotId(10, 1) and store.size(SnapshotId(20, 2)) is None
    assert not any(name.endswith(".part") for name in _files(tmp_path))
    # Damaged framing is refused before the check ever sees the bytes.
    partial = store.begin_download(SnapshotId(30, 2))
    partial.append(_contents(1)[:-1])
    with pytest.raises(CorruptSnapshotError):
        partial.freeze(refuse)
    assert len(seen) == 1


def test_save_refuses_what_it_could_not_read_back(store: SnapshotStore) -> None:
    with pytest.raises(CorruptSnapshotError):
        store.save(SnapshotId(5, 1), _contents()[:-1])
    assert store.latest() is None


def test_latest_orders_by_end_offset_then_epoch(store: SnapshotStore) -> None:
    for end, epoch in [(10, 5), (20, 1), (15, 9), (20, 3), (3, 12)]:
        store.save(SnapshotId(end, epoch), _contents(end))
    assert store.latest() == SnapshotId(20, 3)


def test_delete_before(store: SnapshotStore) -> None:
    ids = [SnapshotId(10, 1), SnapshotId(20, 1), SnapshotId(20, 2), SnapshotId(30, 2)]
    for snapshot_id in ids:
        store.save(snapshot_id, _contents(snapshot_id.end_offset))
    store.delete_before(SnapshotId(20, 2))
    assert [store.size(s) is not None for s in ids] == [False, False, True, True]
    assert store.latest() == SnapshotId(30, 2)
    store.delete_before(SnapshotId(20, 2))  # nothing left to delete
    with pytest.raises(KeyError):
        store.read(SnapshotId(10, 1), 0, 1)


def test_voters_none_when_the_snapshot_carries_none(store: SnapshotStore) -> None:
    store.save(SnapshotId(4, 1), _contents(voters=None))
    assert store.voters(SnapshotId(4, 1)) is None


# -- the file store on disk ----------------------------------------------------------------------


def test_files_are_named_as_kafka_names_them(tmp_path: Path) -> None:
    store = FileSnapshotStore(tmp_path)
    store.save(SnapshotId(1234, 56), _contents())
    assert _files(tmp_path) == ["00000000000000001234-0000000056.checkpoint"]
    assert snapshot_file_name(SnapshotId(1234, 56)) == _files(tmp_path)[0]
    partial = store.begin_download(SnapshotId(2000, 57))
    partial.append(b"abc")
    assert "00000000000000002000-0000000057.checkpoint.part" in _files(tmp_path)
    partial.abort()
    assert _files(tmp_path) == ["00000000000000001234-0000000056.checkpoint"]
    with pytest.raises(ValueError, match="finished"):
        partial.append(b"more")


def test_reopen_finds_the_snapshots(tmp_path: Path) -> None:
    store = FileSnapshotStore(tmp_path)
    store.save(SnapshotId(9, 2), _contents(9))
    partial = store.begin_download(SnapshotId(12, 3))
    partial.append(_contents(12))
    partial.freeze(_accept)
    reopened = FileSnapshotStore(tmp_path)
    assert reopened.latest() == SnapshotId(12, 3)
    assert reopened.read(SnapshotId(9, 2), 0, 1 << 20) == _contents(9)
    assert reopened.size(SnapshotId(12, 3)) == len(_contents(12))


def test_a_crash_mid_download_leaves_a_part_file_that_open_removes(tmp_path: Path) -> None:
    store = FileSnapshotStore(tmp_path)
    store.save(SnapshotId(5, 1), _contents(5))
    partial = store.begin_download(SnapshotId(40, 2))
    partial.append(_contents(40)[:100])
    # The process dies here: the part file stays, never renamed.
    assert any(name.endswith(".checkpoint.part") for name in _files(tmp_path))
    reopened = FileSnapshotStore(tmp_path)
    assert _files(tmp_path) == [snapshot_file_name(SnapshotId(5, 1))]
    assert reopened.latest() == SnapshotId(5, 1)
    # A complete but unfrozen download is no better: it was never checked nor fsynced.
    (tmp_path / (snapshot_file_name(SnapshotId(50, 2)) + ".part")).write_bytes(_contents(50))
    assert FileSnapshotStore(tmp_path).latest() == SnapshotId(5, 1)
    assert _files(tmp_path) == [snapshot_file_name(SnapshotId(5, 1))]


def test_corrupt_download_leaves_no_file(tmp_path: Path) -> None:
    store = FileSnapshotStore(tmp_path)
    partial = store.begin_download(SnapshotId(20, 2))
    partial.append(_contents()[:-1])
    with pytest.raises(CorruptSnapshotError, match=r"checkpoint\.part"):
        partial.freeze(_accept)
    assert _files(tmp_path) == []
    with pytest.raises(ValueError, match="finished"):
        partial.freeze(_accept)


def test_unknown_names_are_left_alone(tmp_path: Path) -> None:
    strangers = ["00000000000000000000.log", "quorum-state", "notes.checkpoint",
                 "1-2.checkpoint", "00000000000000000001-0000000001.checkpoint.deleted"]
    for name in strangers:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "00000000000000000009-0000000001.checkpoint").mkdir()
    store = FileSnapshotStore(tmp_path)
    assert store.latest() is None
    assert set(strangers) <= set(_files(tmp_path))


def test_voters_reads_only_the_header_batch(tmp_path: Path) -> None:
    store = FileSnapshotStore(tmp_path)
    store.save(SnapshotId(500, 4), _contents(count=2000))
    path = tmp_path / snapshot_file_name(SnapshotId(500, 4))
    with path.open("r+b") as file:  # ruin everything after the first kilobyte
        file.seek(1024)
        file.write(b"\xff" * 1024)
    assert store.voters(SnapshotId(500, 4)) == VOTERS
    with pytest.raises(CorruptSnapshotError):
        read_snapshot(path.read_bytes())
    path.write_bytes(b"\x00" * 5)
    with pytest.raises(CorruptSnapshotError, match="too short"):
        FileSnapshotStore(tmp_path).voters(SnapshotId(500, 4))


def test_io_failures_are_storage_errors_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileSnapshotStore(tmp_path)

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(StorageError, match=r"checkpoint\.part: fsync failed"):
        store.save(SnapshotId(3, 1), _contents())
    monkeypatch.undo()
    assert store.latest() is None
    assert _files(tmp_path) == []
    store.save(SnapshotId(3, 1), _contents())
    (tmp_path / snapshot_file_name(SnapshotId(3, 1))).write_bytes(b"short")
    with pytest.raises(StorageError, match="short read"):
        store.read(SnapshotId(3, 1), 0, 100)


def test_reads_while_another_snapshot_is_saved_in_a_thread(tmp_path: Path) -> None:
    store = FileSnapshotStore(tmp_path)
    first = _contents(0, count=200)
    store.save(SnapshotId(1, 1), first)
    saved = threading.Event()
    errors: list[BaseException] = []

    def saver() -> None:
        try:
            for n in range(2, 40):
                store.save(SnapshotId(n, 1), _contents(n, count=200))
                store.delete_before(SnapshotId(n - 1, 1))
        except BaseException as error:  # reported below
            errors.append(error)
        finally:
            saved.set()

    thread = threading.Thread(target=saver)
    thread.start()
    reads = 0
    while not saved.is_set() or reads < 50:
        latest = store.latest()
        assert latest is not None
        size = store.size(latest)
        try:
            data = store.read(latest, 0, 1 << 20) if size is not None else None
        except KeyError:
            continue  # deleted between the calls: the store no longer holds it
        if data is not None:
            assert len(data) == size
            check_snapshot(data)  # never a file that is still being written
        reads += 1
    thread.join()
    assert not errors
    assert store.latest() == SnapshotId(39, 1)


def test_saved_batch_by_batch_as_they_are_framed(tmp_path: Path) -> None:
    """A large snapshot is written as it is encoded (never whole in memory): the same file as
    the whole contents saved at once, and the framing is consumed as it is written."""
    store = FileSnapshotStore(tmp_path)
    records = [Record(value=b"v%d" % n * 5, key=b"k%d" % n) for n in range(50)]
    framed: list[int] = []

    def batches() -> Iterator[bytes]:
        for batch in encode_snapshot_batches(VOTERS, 1000, records, records_per_batch=8):
            framed.append(len(batch))
            # Everything framed before this batch is already in the part file.
            part = tmp_path / (snapshot_file_name(SnapshotId(50, 1)) + ".part")
            assert part.stat().st_size == sum(framed[:-1])
            yield batch

    store.save_batches(SnapshotId(50, 1), batches())
    whole = encode_snapshot(VOTERS, 1000, records, records_per_batch=8)
    assert len(framed) == 9  # header, 7 data batches (50 records by 8), footer
    assert store.read(SnapshotId(50, 1), 0, len(whole)) == whole
    assert _files(tmp_path) == [snapshot_file_name(SnapshotId(50, 1))]


def test_saved_batches_that_do_not_check_leave_no_file(tmp_path: Path) -> None:
    store = FileSnapshotStore(tmp_path)
    batches = list(encode_snapshot_batches(VOTERS, 1000, [Record(value=b"v", key=b"k")]))
    with pytest.raises(CorruptSnapshotError):
        store.save_batches(SnapshotId(5, 1), batches[:-1])  # no footer
    assert store.latest() is None
    assert _files(tmp_path) == []
