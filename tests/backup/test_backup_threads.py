"""A backup's worker threads read the files it pinned: a cancelled backup (its handler cancelled,
the node stopping) lets go of those files only once the thread using them has ended."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import os
import threading
from pathlib import Path

import pytest

from quorum_node.backup import capture
from quorum_node.backup.capture import PinnedBackup, _File, in_thread_to_its_end, stream

RELEASE_WAIT_S = 5.0


async def test_a_cancelled_caller_waits_for_the_thread_to_end() -> None:
    release = threading.Event()
    ended = threading.Event()

    def work() -> int:
        release.wait(RELEASE_WAIT_S)
        ended.set()
        return 1

    caller = asyncio.ensure_future(in_thread_to_its_end(work))
    await asyncio.sleep(0.05)
    caller.cancel()
    await asyncio.sleep(0.05)
    caller.cancel()  # a second cancellation while it waits for the thread
    await asyncio.sleep(0.05)
    assert not caller.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert ended.is_set()


async def test_a_failure_of_the_thread_reaches_its_caller() -> None:
    def work() -> None:
        raise OSError("read failed")

    with pytest.raises(OSError, match="read failed"):
        await in_thread_to_its_end(work)


async def test_a_backup_stream_cancelled_mid_read_closes_its_file_after_the_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(bytes(4096))
    file = _File("segment", os.open(segment, os.O_RDONLY), size=4096)
    pinned = PinnedBackup(
        node_id=1, cluster_id="c", directory_id="d",
        created_at=datetime.datetime.now(datetime.UTC), high_watermark=1, snapshot=None,
        voters=[], meta_properties=b"", snapshot_file=None, segments=[(0, file)],
        files=[file])
    reading = threading.Event()
    release = threading.Event()
    read_errors: list[OSError] = []
    read_chunk = capture._read_chunk

    def slow_read_chunk(file: _File, position: int, digest: hashlib._Hash) -> bytes:
        reading.set()
        release.wait(RELEASE_WAIT_S)
        try:
            return read_chunk(file, position, digest)
        except OSError as error:  # its descriptor closed under it
            read_errors.append(error)
            raise

    monkeypatch.setattr(capture, "_read_chunk", slow_read_chunk)

    async def consume() -> None:
        async for _ in stream(pinned):
            pass

    consumer = asyncio.ensure_future(consume())
    while not reading.is_set():
        await asyncio.sleep(0.01)
    consumer.cancel()
    await asyncio.sleep(0.05)
    assert file.fd >= 0, "the file was closed while the thread reading it ran"
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await consumer
    assert read_errors == []
    assert file.fd == -1  # closed once the read had ended
