from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from quorum_node.storage.errors import StorageError
from quorum_node.storage.group_commit import GroupCommitter
from quorum_node.storage.segment_log import SegmentLog

from .helpers import make_records


def test_concurrent_appends_share_fsyncs(tmp_path: Path) -> None:
    appenders = 200

    async def scenario(log: SegmentLog) -> list[tuple[int, int]]:
        committer = GroupCommitter(log.flush)
        rng = random.Random(7)

        async def append_and_wait(n: int) -> tuple[int, int]:
            for _ in range(rng.randrange(30)):  # arrive spread out, not all at once
                await asyncio.sleep(0)
            batch = log.append_as_leader(make_records(1, 50, n), 1, n)
            return batch.next_offset, await committer.wait_durable(batch.next_offset)

        results = await asyncio.gather(*(append_and_wait(n) for n in range(appenders)))
        print(f"\n{appenders} appends -> {committer.flush_count} group flushes, "
              f"{log.fsync_count} fsyncs in all")
        assert committer.flush_count < 50
        assert committer.durable_offset == log.end_offset == appenders
        return results

    with SegmentLog.open(tmp_path) as log:
        results = asyncio.run(scenario(log))
    assert all(durable >= own for own, durable in results)
    with SegmentLog.open(tmp_path) as reopened:
        assert reopened.end_offset == appenders


class GatedFlush:
    """A flush that reports the end offset seen when it starts and waits for the gate to end."""

    def __init__(self) -> None:
        self.end_offset = 0
        self.calls = 0
        self.gate = threading.Event()
        self.error: Exception | None = None

    def __call__(self) -> int:
        captured = self.end_offset
        self.calls += 1
        assert self.gate.wait(10)
        if self.error is not None:
            raise self.error
        return captured


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(5000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never held")


def test_caller_during_a_flush_waits_for_the_next_one() -> None:
    async def scenario() -> None:
        flush = GatedFlush()
        committer = GroupCommitter(flush)
        flush.end_offset = 1
        first = asyncio.create_task(committer.wait_durable(1))
        await _until(lambda: flush.calls == 1)
        # Appended while the first fsync runs: that fsync may not cover it.
        flush.end_offset = 3
        later = [asyncio.create_task(committer.wait_durable(3)) for _ in range(10)]
        await asyncio.sleep(0.01)
        assert flush.calls == 1
        flush.gate.set()
        assert await first == 1
        assert await asyncio.gather(*later) == [3] * 10
        assert committer.flush_count == flush.calls == 2

    asyncio.run(scenario())


def test_cancelled_waiter_does_not_cancel_the_shared_flush() -> None:
    async def scenario() -> None:
        flush = GatedFlush()
        flush.end_offset = 5
        committer = GroupCommitter(flush)
        doomed = asyncio.create_task(committer.wait_durable(5))
        survivor = asyncio.create_task(committer.wait_durable(5))
        await _until(lambda: flush.calls == 1)
        doomed.cancel()
        await asyncio.sleep(0)
        flush.gate.set()
        assert await survivor == 5
        assert doomed.cancelled()

    asyncio.run(scenario())


def test_failed_flush_fails_every_waiter_and_all_later_ones() -> None:
    async def scenario() -> None:
        flush = GatedFlush()
        flush.error = OSError(5, "I/O error")
        committer = GroupCommitter(flush)
        running = asyncio.create_task(committer.wait_durable(1))
        await _until(lambda: flush.calls == 1)
        queued = asyncio.create_task(committer.wait_durable(2))
        await asyncio.sleep(0)
        flush.gate.set()
        for task in (running, queued):
            with pytest.raises(StorageError, match="flush failed"):
                await task
        with pytest.raises(StorageError, match="earlier flush failed"):
            await committer.wait_durable(3)
        assert flush.calls == 1

    asyncio.run(scenario())
