"""``FileSnapshotStore``: snapshots (KIP-630) as files in the metadata partition's directory.

Named as Kafka names them: ``<end offset, 20 digits>-<epoch, 10 digits>.checkpoint``. A snapshot
is written (downloaded from the leader, or saved by the state machine) to
``<name>.checkpoint.part``, checked whole (``quorum_node.raft.snapshot_format``), fsynced, renamed
into place and the directory fsynced: a ``.checkpoint`` file is therefore always complete and
durable, and a crash at any step leaves at most a ``.part`` file, which opening the store removes.

Threading: ``read``, ``size``, ``latest`` and ``voters`` may run (on the event loop) while a
``save`` runs in a worker thread. They share only the table of complete snapshots, under a lock;
a snapshot's file never changes once it is in that table, and a read that races with its
deletion fails with ``KeyError`` like a read of any snapshot the store does not hold.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import threading
from collections.abc import Iterable
from pathlib import Path

from quorum_node.raft.records import MAX_BATCH_SIZE, batch_size_at
from quorum_node.raft.snapshot_format import check_snapshot, read_snapshot_header
from quorum_node.raft.snapshots import (
    CorruptSnapshotError,
    PartialSnapshot,
    SnapshotCheck,
    SnapshotId,
)
from quorum_node.raft.types import ReplicaKey
from quorum_node.storage.errors import StorageError
from quorum_node.storage.fsutil import (
    ensure_directory,
    fsync_directory,
    open_private,
    write_all,
)

logger = logging.getLogger(__name__)

CHECKPOINT_SUFFIX = ".checkpoint"
PART_SUFFIX = CHECKPOINT_SUFFIX + ".part"
_CHECKPOINT_NAME = re.compile(r"([0-9]{20})-([0-9]{10})\.checkpoint")
_PREFIX_SIZE = 12  # base offset and length of a batch: enough to know its size


def snapshot_file_name(snapshot_id: SnapshotId) -> str:
    return f"{snapshot_id.end_offset:020d}-{snapshot_id.epoch:010d}{CHECKPOINT_SUFFIX}"


class FileSnapshotStore:
    """A ``SnapshotStore`` over ``.checkpoint`` files in ``directory`` (created if missing)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._lock = threading.Lock()
        self._sizes: dict[SnapshotId, int] = {}  # complete snapshots only
        try:
            ensure_directory(self.directory)
            self._scan()
        except OSError as exc:
            raise StorageError(f"{self.directory}: cannot open the snapshots: {exc}") from exc

    # -- SnapshotStore -------------------------------------------------------------------------
    def latest(self) -> SnapshotId | None:
        with self._lock:
            return max(self._sizes, default=None)

    def size(self, snapshot_id: SnapshotId) -> int | None:
        with self._lock:
            return self._sizes.get(snapshot_id)

    def read(self, snapshot_id: SnapshotId, position: int, max_bytes: int) -> bytes:
        size = self._size_of(snapshot_id)
        if not 0 <= position < size:
            raise ValueError(f"position {position} outside snapshot {snapshot_id} of {size} bytes")
        return self._pread(snapshot_id, position, max(0, min(max_bytes, size - position)))

    def voters(self, snapshot_id: SnapshotId) -> tuple[ReplicaKey, ...] | None:
        # The voters are in the header batch: read that batch only, however big the snapshot.
        size = self._size_of(snapshot_id)
        prefix = self._pread(snapshot_id, 0, min(_PREFIX_SIZE, size))
        batch_size = batch_size_at(prefix, 0)
        if batch_size is None:
            raise CorruptSnapshotError(f"{self._path(snapshot_id)}: too short for a snapshot")
        # A damaged length must not make us allocate gigabytes: the decoder refuses it anyway.
        length = max(min(batch_size, MAX_BATCH_SIZE, size), len(prefix))
        try:
            return read_snapshot_header(self._pread(snapshot_id, 0, length)).voters
        except CorruptSnapshotError as error:
            raise CorruptSnapshotError(f"{self._path(snapshot_id)}: {error}") from None

    def begin_download(self, snapshot_id: SnapshotId) -> PartialSnapshot:
        return _FilePartial(self, snapshot_id)

    def save(self, snapshot_id: SnapshotId, contents: bytes) -> None:
        self.save_batches(snapshot_id, (contents,))

    def save_batches(self, snapshot_id: SnapshotId, batches: Iterable[bytes]) -> None:
        """Write a snapshot from its encoded batches in order (``encode_snapshot_batches``), as
        they come, into a ``.part`` file that is checked whole before it is made visible: what
        could not be read back is never stored. CorruptSnapshotError if it does not check."""
        part = self._part_path(snapshot_id)
        try:
            fd = open_private(part, os.O_RDWR | os.O_TRUNC)
        except OSError as exc:
            raise StorageError(f"{part}: cannot create: {exc}") from exc
        size = 0
        try:
            for batch in batches:
                write_all(fd, batch, size)
                size += len(batch)
            _check_file(fd, size)
        except OSError as exc:
            _close_and_remove(fd, part)
            raise StorageError(f"{part}: write failed: {exc}") from exc
        except BaseException:
            _close_and_remove(fd, part)
            raise
        self._publish(snapshot_id, fd, size)

    def delete_before(self, snapshot_id: SnapshotId) -> None:
        with self._lock:
            doomed = sorted(old for old in self._sizes if old < snapshot_id)
            for old in doomed:
                del self._sizes[old]
        if not doomed:
            return
        try:
            for old in doomed:
                self._path(old).unlink(missing_ok=True)
            fsync_directory(self.directory)
        except OSError as exc:
            raise StorageError(f"{self.directory}: deleting old snapshots failed: {exc}") from exc

    def check(self, snapshot_id: SnapshotId) -> None:
        """Check a held snapshot whole (at about disk speed); StorageError naming the file if it
        is damaged. Nothing is removed: the log below it may already be gone."""
        path = self._path(snapshot_id)
        try:
            with open(path, "rb") as file:
                _check_file(file.fileno(), os.fstat(file.fileno()).st_size)
        except CorruptSnapshotError as error:
            raise StorageError(f"{path}: corrupt snapshot: {error}; refusing to open the log "
                               "(nothing was modified)") from None
        except OSError as error:
            raise StorageError(f"{path}: unreadable: {error}") from error

    # -- internals -------------------------------------------------------------------------------
    def _path(self, snapshot_id: SnapshotId) -> Path:
        return self.directory / snapshot_file_name(snapshot_id)

    def _part_path(self, snapshot_id: SnapshotId) -> Path:
        return self.directory / (snapshot_file_name(snapshot_id) + ".part")

    def _size_of(self, snapshot_id: SnapshotId) -> int:
        size = self.size(snapshot_id)
        if size is None:
            raise KeyError(f"the store holds no snapshot {snapshot_id}")
        return size

    def _pread(self, snapshot_id: SnapshotId, position: int, length: int) -> bytes:
        path = self._path(snapshot_id)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise KeyError(f"snapshot {snapshot_id} was deleted") from None
        except OSError as exc:
            raise StorageError(f"{path}: cannot open: {exc}") from exc
        try:
            data = os.pread(fd, length, position)
        except OSError as exc:
            raise StorageError(f"{path}: read failed at byte {position}: {exc}") from exc
        finally:
            os.close(fd)
        if len(data) != length:
            raise StorageError(f"{path}: short read at byte {position} ({len(data)} of {length} "
                               "bytes): the file changed underneath the store")
        return data

    def _publish(self, snapshot_id: SnapshotId, fd: int, size: int) -> None:
        """Make the checked ``.part`` file open on ``fd`` durable and the snapshot visible."""
        part, path = self._part_path(snapshot_id), self._path(snapshot_id)
        try:
            os.fsync(fd)
        except OSError as exc:
            _close_and_remove(fd, part)
            raise StorageError(f"{part}: fsync failed: {exc}") from exc
        os.close(fd)
        try:
            os.replace(part, path)
            fsync_directory(self.directory)
        except OSError as exc:
            raise StorageError(f"{path}: cannot move the snapshot into place: {exc}") from exc
        with self._lock:
            self._sizes[snapshot_id] = size

    def _scan(self) -> None:
        removed = False
        for entry in os.scandir(self.directory):
            match = _CHECKPOINT_NAME.fullmatch(entry.name)
            if match and entry.is_file(follow_symlinks=False):
                snapshot_id = SnapshotId(int(match.group(1)), int(match.group(2)))
                self._sizes[snapshot_id] = entry.stat(follow_symlinks=False).st_size
            elif entry.name.endswith(PART_SUFFIX) and entry.is_file(follow_symlinks=False):
                # A download or save cut short by a crash: never complete, never visible.
                logger.info("%s: removing an unfinished snapshot", entry.path)
                os.unlink(entry.path)
                removed = True
            elif CHECKPOINT_SUFFIX in entry.name:
                logger.warning("%s: not a snapshot this store writes; ignored", entry.path)
        if removed:
            fsync_directory(self.directory)


class _FilePartial:
    """A download being written to its ``.part`` file."""

    def __init__(self, store: FileSnapshotStore, snapshot_id: SnapshotId) -> None:
        self._store = store
        self._id = snapshot_id
        self._path = store._part_path(snapshot_id)
        self._written = 0
        try:
            # Truncating: a leftover of an earlier attempt at the same snapshot starts over.
            self._fd: int | None = open_private(self._path, os.O_RDWR | os.O_TRUNC)
        except OSError as exc:
            raise StorageError(f"{self._path}: cannot create: {exc}") from exc

    @property
    def snapshot_id(self) -> SnapshotId:
        return self._id

    @property
    def written(self) -> int:
        return self._written

    def append(self, data: bytes) -> None:
        fd = self._open_fd()
        try:
            write_all(fd, data, self._written)
        except OSError as exc:
            raise StorageError(f"{self._path}: write failed: {exc}") from exc
        self._written += len(data)

    def freeze(self, check: SnapshotCheck) -> None:
        fd = self._open_fd()
        try:
            self._check(fd, check)
        except CorruptSnapshotError as error:
            self.abort()
            raise CorruptSnapshotError(f"{self._path}: {error}") from None
        except OSError as exc:
            self.abort()
            raise StorageError(f"{self._path}: cannot read back: {exc}") from exc
        self._fd = None
        self._store._publish(self._id, fd, self._written)

    def abort(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            _close_and_remove(fd, self._path)
        except OSError as exc:
            raise StorageError(f"{self._path}: cannot remove: {exc}") from exc

    def _check(self, fd: int, check: SnapshotCheck) -> None:
        """Check the snapshot as written to the file, without loading it into memory."""
        if self._written == 0:
            raise CorruptSnapshotError("empty snapshot")
        with (
            mmap.mmap(fd, self._written, access=mmap.ACCESS_READ) as mapped,
            memoryview(mapped) as data,
        ):
            check_snapshot(data)
            check(data)

    def _open_fd(self) -> int:
        if self._fd is None:
            raise ValueError(f"the download of snapshot {self._id} is finished")
        return self._fd


def _close_and_remove(fd: int, path: Path) -> None:
    os.close(fd)
    path.unlink(missing_ok=True)


def _check_file(fd: int, size: int) -> None:
    """``check_snapshot`` over a snapshot file, mapped rather than read into memory."""
    if size == 0:
        raise CorruptSnapshotError("empty file")
    with (mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mapped,
          memoryview(mapped) as data):
        check_snapshot(data)
