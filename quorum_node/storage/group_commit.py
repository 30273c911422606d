"""Group commit: many appends awaiting durability share one fsync.

An fsync costs about the same for one batch as for a hundred, so waiters are grouped by the flush
that will cover them: a caller's data was appended before it called, so any flush that *starts*
after the call covers it. While one flush runs in a worker thread, every new caller joins the next
one, which starts as soon as the running one ends. The event loop is never blocked by the disk.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from quorum_node.storage.errors import StorageError


class GroupCommitter:
    def __init__(self, flush: Callable[[], int]) -> None:
        self._flush = flush
        self._next: asyncio.Future[int] | None = None  # waiters of the flush not yet started
        self._runner: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self.flush_count = 0  # flush() calls made: each is one group fsync
        self.durable_offset = 0  # what the latest flush reported

    async def wait_durable(self, offset: int) -> int:
        """Wait until a flush that started after this call has completed; return the end offset
        it reported. That is >= ``offset`` (the caller's appended end offset) unless the log was
        truncated below ``offset`` meanwhile: then that data is gone, not durable.

        There is deliberately no shortcut for an ``offset`` at or below the last reported one: a
        truncation since then may have replaced those offsets with data not yet flushed."""
        if self._failure is not None:
            raise StorageError(f"an earlier flush failed: {self._failure}") from self._failure
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        waiters = self._next
        if self._runner is None:
            self._runner = asyncio.create_task(self._run())
        # shield: one cancelled waiter must not cancel the flush the others share.
        return await asyncio.shield(waiters)

    async def _run(self) -> None:
        try:
            while self._next is not None:
                waiters, self._next = self._next, None
                try:
                    durable = await asyncio.to_thread(self._flush)
                except Exception as exc:
                    # A failed fsync may have lost data a retry would not notice (see
                    # SegmentLog.flush): fail every waiter, now and later.
                    self._failure = exc
                    error = StorageError(f"flush failed: {exc}")
                    error.__cause__ = exc
                    for pending in (waiters, self._next):
                        if pending is not None and not pending.done():
                            pending.set_exception(error)
                            pending.exception()  # retrieved even if every waiter was cancelled
                    self._next = None
                    return
                except asyncio.CancelledError:
                    for pending in (waiters, self._next):
                        if pending is not None:
                            pending.cancel()
                    self._next = None
                    raise
                self.flush_count += 1
                self.durable_offset = durable
                waiters.set_result(durable)
        finally:
            self._runner = None
