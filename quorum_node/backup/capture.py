"""Taking a backup inside a running node: ``GET /v1/backup`` (``quorum_node.node.api.backup``)
streams a consistent, committed-only copy of the node's log directory as a tar archive,
``backup.json`` last.

Why inside the node, not by reading its directory from outside (as ``export --live`` does): only
the running node knows its high watermark, and a directory read from outside may hold an
uncommitted tail (which a new leader may truncate) and a torn last batch. The node pins the cut
in one event-loop turn, where nothing else runs: the high watermark, the latest snapshot, and the
segment files from the one holding the snapshot's end onwards, opened there and then. The open
files are what is copied: a segment the node deletes afterwards (a newer snapshot covers it) or
truncates (only ever above the high watermark) still reads the same below the cut. That turn is
the only time a backup takes from the event loop (measured in docs/backup.md); reading,
checking and hashing the files runs in a worker thread, one chunk at a time.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import os
import struct
import tarfile
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ParamSpec, TypeVar

from quorum_node.backup.manifest import (
    MANIFEST_NAME,
    BackupError,
    BackupManifest,
    FileEntry,
    SnapshotRef,
    VoterEntry,
    rfc3339,
)
from quorum_node.raft.records import HEADER_SIZE, CorruptRecordError, read_batch_header
from quorum_node.raft.snapshots import SnapshotId
from quorum_node.raft.status import NodeStatus
from quorum_node.raft.voters import VoterSet
from quorum_node.storage.kafka_uuid import to_kafka_string
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR, LogDirectory
from quorum_node.storage.meta_properties import META_PROPERTIES
from quorum_node.storage.snapshot_store import snapshot_file_name

_P = ParamSpec("_P")
_T = TypeVar("_T")

CHUNK_BYTES = 1 << 20
_BLOCK = tarfile.BLOCKSIZE
_LENGTH = struct.Struct(">qi")  # a batch's base offset and length: enough to know its size


@dataclass
class _File:
    path: str  # in the backup
    fd: int
    size: int = 0  # bytes to copy (a segment's cut)


@dataclass
class PinnedBackup:
    """What one event-loop turn pinned; ``prepare`` (in a thread) cuts the segments."""

    node_id: int
    cluster_id: str
    directory_id: str
    created_at: datetime.datetime
    high_watermark: int
    snapshot: SnapshotId | None
    voters: list[VoterEntry]
    meta_properties: bytes
    snapshot_file: _File | None
    segments: list[tuple[int, _File]]  # (base offset, file), oldest first
    end_offset: int = 0
    last_epoch: int = 0
    log_start_offset: int = 0
    files: list[_File] = field(default_factory=list)  # what the archive holds, in order

    def close(self) -> None:
        for file in [*(f for _, f in self.segments), self.snapshot_file]:
            if file is not None and file.fd >= 0:
                os.close(file.fd)
                file.fd = -1


def pin(status: NodeStatus, log_dir: LogDirectory, voters_at: Callable[[int], VoterSet],
        controller_urls: Mapping[int, str]) -> PinnedBackup:
    """Pin a backup's contents: the node's ``status`` now, its ``log_dir``, its voter sets by
    offset and where each voter's controller listener is. Event loop only: it must not
    interleave with a step."""
    high_watermark = status.high_watermark
    if high_watermark is None:
        raise BackupError("no committed offset known yet (an election, or catching up): retry")
    partition = log_dir.path / METADATA_PARTITION_DIR
    snapshot = log_dir.snapshots.latest()
    end = max(high_watermark, snapshot.end_offset if snapshot is not None else 0)
    voters = voters_at(end - 1) if end > 0 else status.voters
    pinned = PinnedBackup(
        node_id=status.node_id, cluster_id=status.cluster_id,
        directory_id=to_kafka_string(log_dir.meta.directory_id),
        created_at=datetime.datetime.now(datetime.UTC), high_watermark=high_watermark,
        snapshot=snapshot,
        voters=[VoterEntry(id=key.id, directory_id=None if key.directory_id is None
                           else to_kafka_string(key.directory_id),
                           endpoints=[controller_urls[key.id]]
                           if key.id in controller_urls else [])
                for key in voters],
        meta_properties=(log_dir.path / META_PROPERTIES).read_bytes(),  # a few dozen bytes
        snapshot_file=None, segments=[])
    try:
        if snapshot is not None:
            name = f"{METADATA_PARTITION_DIR}/{snapshot_file_name(snapshot)}"
            pinned.snapshot_file = _File(name, _open(partition / snapshot_file_name(snapshot)))
        start = snapshot.end_offset if snapshot is not None else 0
        paths = log_dir.log.segment_paths
        bases = [int(path.name[:20]) for path in paths]
        for index, (base, path) in enumerate(zip(bases, paths, strict=True)):
            following = bases[index + 1] if index + 1 < len(bases) else None
            if base >= high_watermark or (following is not None and following <= start):
                continue  # nothing committed in it, or all of it below the snapshot
            pinned.segments.append(
                (base, _File(f"{METADATA_PARTITION_DIR}/{path.name}", _open(path))))
    except BaseException:
        pinned.close()
        raise
    return pinned


async def in_thread_to_its_end(function: Callable[_P, _T], *args: _P.args,
                                **kwargs: _P.kwargs) -> _T:
    """``function`` in a worker thread, waited for to its end even when the caller is
    cancelled, and only then the cancellation raised. A cancelled ``asyncio.to_thread`` leaves
    its thread running: the caller would close the pinned files the thread still reads (and
    ``prepare`` closes some itself), so a descriptor could be closed twice, the second time
    after another file took its number."""
    task = asyncio.ensure_future(asyncio.to_thread(function, *args, **kwargs))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():
            try:
                await asyncio.wait([task])
            except asyncio.CancelledError:
                continue  # cancelled again: the thread still has to end first
        if not task.cancelled():
            task.exception()  # retrieved: the caller is cancelled, its outcome goes nowhere
        raise


def _open(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as error:
        raise BackupError(f"{path}: {error.strerror}") from None


def prepare(pinned: PinnedBackup) -> None:
    """Cut every pinned segment at the last whole batch at or below the high watermark, each
    batch's CRC checked (a worker thread: this reads the segments)."""
    snapshot = pinned.snapshot
    snapshot_end = snapshot.end_offset if snapshot is not None else 0
    last_epoch = snapshot.epoch if snapshot is not None else 0
    segment_end: int | None = None
    kept: list[tuple[int, _File]] = []
    for base, file in pinned.segments:
        if segment_end is not None and base != segment_end:
            raise BackupError(f"{file.path}: starts at {base}, not where the segment before "
                              f"ends ({segment_end}): the log changed underneath; retry")
        file.size, segment_end, epoch = _cut(file, pinned.high_watermark)
        if file.size:
            kept.append((base, file))
            last_epoch = epoch
    if segment_end is not None and segment_end < snapshot_end:
        # The log ends before the snapshot (a follower replacing its log by a downloaded
        # snapshot): the snapshot holds all of it.
        kept, last_epoch = [], snapshot.epoch if snapshot is not None else 0
    for _, file in pinned.segments:
        if all(file is not other for _, other in kept):
            os.close(file.fd)
            file.fd = -1
    pinned.segments = kept
    pinned.end_offset = max(segment_end or 0, snapshot_end)
    pinned.last_epoch = last_epoch
    pinned.log_start_offset = kept[0][0] if kept else snapshot_end
    if pinned.snapshot_file is not None:
        pinned.snapshot_file.size = os.fstat(pinned.snapshot_file.fd).st_size
    pinned.files = [*([pinned.snapshot_file] if pinned.snapshot_file else []),
                    *(file for _, file in kept)]


def _cut(file: _File, high_watermark: int) -> tuple[int, int, int]:
    """(byte position, next offset, epoch of the last batch) of the last whole batch at or below
    ``high_watermark`` in a segment."""
    position = 0
    next_offset = -1
    epoch = 0
    while True:
        prefix = os.pread(file.fd, _LENGTH.size, position)
        if len(prefix) < _LENGTH.size:
            break
        base_offset, length = _LENGTH.unpack(prefix)
        if base_offset >= high_watermark:
            break
        data = os.pread(file.fd, _LENGTH.size + length, position) \
            if length >= HEADER_SIZE - _LENGTH.size else b""
        try:
            header = read_batch_header(data)
        except CorruptRecordError as error:
            raise BackupError(f"{file.path}: a damaged batch at byte {position} below the high "
                              f"watermark: {error}") from None
        if header.next_offset > high_watermark:
            break
        position, next_offset, epoch = position + len(data), header.next_offset, header.epoch
    if next_offset < 0:
        base = int(Path(file.path).name[:20])
        return 0, base, epoch
    return position, next_offset, epoch


async def stream(pinned: PinnedBackup) -> AsyncGenerator[bytes, None]:
    """The archive: meta.properties, the snapshot, the segments, then ``backup.json`` (with the
    sha256 of each file as it was sent). Closes the pinned files."""
    entries: list[FileEntry] = []
    try:
        meta = pinned.meta_properties
        yield _header(META_PROPERTIES, len(meta), pinned.created_at) + _padded(meta)
        entries.append(FileEntry(path=META_PROPERTIES, size=len(meta),
                                 sha256=hashlib.sha256(meta).hexdigest()))
        for file in pinned.files:
            yield _header(file.path, file.size, pinned.created_at)
            digest = hashlib.sha256()
            position = 0
            while position < file.size:
                chunk = await in_thread_to_its_end(_read_chunk, file, position, digest)
                position += len(chunk)
                yield chunk
            yield bytes(-file.size % _BLOCK)
            entries.append(FileEntry(path=file.path, size=file.size, sha256=digest.hexdigest()))
        manifest = BackupManifest(
            cluster_id=pinned.cluster_id, node_id=pinned.node_id,
            directory_id=pinned.directory_id, created_at=rfc3339(pinned.created_at),
            snapshot=None if pinned.snapshot is None else SnapshotRef(
                end_offset=pinned.snapshot.end_offset, epoch=pinned.snapshot.epoch),
            log_start_offset=pinned.log_start_offset, end_offset=pinned.end_offset,
            last_epoch=pinned.last_epoch, voters=pinned.voters, files=entries).to_json()
        yield _header(MANIFEST_NAME, len(manifest), pinned.created_at) + _padded(manifest)
        yield bytes(2 * _BLOCK)  # the end of the archive
    finally:
        pinned.close()


def _read_chunk(file: _File, position: int, digest: hashlib._Hash) -> bytes:
    want = min(CHUNK_BYTES, file.size - position)
    chunk = os.pread(file.fd, want, position)
    if len(chunk) != want:
        raise BackupError(f"{file.path}: shrank below byte {position + want} while copied")
    digest.update(chunk)
    return chunk


def _header(name: str, size: int, moment: datetime.datetime) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, int(moment.timestamp()), 0o644
    return info.tobuf(format=tarfile.PAX_FORMAT)


def _padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % _BLOCK)
