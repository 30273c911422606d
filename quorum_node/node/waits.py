"""Callers waiting for a condition of the core, woken by the step that makes it true.

A commit on a fast disk is a handful of event-loop turns, so a wait costs no turn it does not
need: an append waits by offset in a heap that the high watermark drains (a step looks at those
it settles only); any other condition (a confirmed read, a voter change, a successor) is checked
after each step. Either kind is a future, resolved once, never polled.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable, Iterator

# Waiters by offset kept before the timed-out ones among them are let go.
_COMMIT_WAITERS_PRUNED_AT = 1024


class WaitInterrupted(Exception):
    """The wait was cut short: the node's server is shutting down (``Waits.interrupt``)."""


class Waits:
    """The node's waiters. ``wait`` registers one; ``after_step`` (the runtime's, after every
    step of the core) wakes those whose condition holds; ``interrupt`` and ``fail`` end them."""

    def __init__(self, high_watermark: Callable[[], int | None],
                 stopped: Callable[[], BaseException | None]) -> None:
        """``high_watermark``: the core's; ``stopped``: what a wait raises once the node has
        stopped (None while it runs)."""
        self._high_watermark = high_watermark
        self._stopped = stopped
        # Conditions checked after every step, and whether shutting the server down cuts the
        # wait short.
        self._waiters: dict[asyncio.Future[None], tuple[Callable[[], bool], bool]] = {}
        # Waiters for the high watermark to pass an offset (every append): (offset, sequence,
        # future, interruptible); a timed-out waiter's entry goes when the high watermark
        # passes it.
        self._commit_waiters: list[tuple[int, int, asyncio.Future[None], bool]] = []
        self._commit_waiter_sequence = 0
        self.interrupted = False

    def is_settled(self, offset: int) -> bool:
        high_watermark = self._high_watermark()
        return high_watermark is not None and high_watermark > offset

    async def wait(self, condition: Callable[[], bool], timeout_s: float, *,
                   interruptible: bool = True, committed: int | None = None) -> None:
        """Wait until ``condition()`` holds (checked now and after every step). Raises
        TimeoutError after ``timeout_s``, WaitInterrupted once ``interrupt`` was called (if
        ``interruptible``), what ``stopped`` gives once the node has stopped. ``committed``: the
        condition is that the high watermark passed this offset (then woken by offset, not
        checked every step)."""
        if condition():
            return
        stopped = self._stopped()
        if stopped is not None:
            raise stopped
        if interruptible and self.interrupted:
            raise WaitInterrupted
        if timeout_s <= 0:
            raise TimeoutError
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        if committed is None:
            self._waiters[future] = (condition, interruptible)
        else:
            self._commit_waiter_sequence += 1
            heapq.heappush(self._commit_waiters, (committed, self._commit_waiter_sequence,
                                                  future, interruptible))
        # A timer that fails the future, rather than asyncio.timeout (a Timeout object per wait,
        # which cancels the waiting task when it expires) or wait_for (a task per wait, and on
        # Python 3.11 it can swallow a cancellation): the wait needs no task of its own, and
        # cancelling the waiting task still ends it.
        timer = loop.call_at(loop.time() + timeout_s, _time_out, future)
        try:
            await future
        finally:
            timer.cancel()
            if committed is None:
                del self._waiters[future]
            elif len(self._commit_waiters) > _COMMIT_WAITERS_PRUNED_AT:
                # Timed-out waits pile up while the high watermark stands still (an idle
                # quorum, no leader): let them go.
                self._commit_waiters = [w for w in self._commit_waiters if not w[2].done()]
                heapq.heapify(self._commit_waiters)

    async def wait_committed(self, offset: int, timeout_s: float, *,
                             interruptible: bool = True) -> None:
        """``wait`` for the high watermark to pass ``offset``."""
        await self.wait(lambda: self.is_settled(offset), timeout_s,
                        interruptible=interruptible, committed=offset)

    def after_step(self) -> None:
        if self._commit_waiters:
            self._wake_committed()
        if self._waiters:
            self.check_conditions()

    def _wake_committed(self) -> None:
        high_watermark = self._high_watermark()
        if high_watermark is None:
            return
        waiters = self._commit_waiters
        while waiters and waiters[0][0] < high_watermark:
            future = heapq.heappop(waiters)[2]
            if not future.done():
                future.set_result(None)

    def check_conditions(self) -> None:
        """Wake the waiters whose condition holds now (after a step, or any other change)."""
        for future, (condition, _) in list(self._waiters.items()):
            if future.done():
                continue
            try:
                if condition():
                    future.set_result(None)
            except Exception as error:  # the waiter's own error, raised to it
                future.set_exception(error)

    def interrupt(self) -> None:
        """Cut every interruptible wait short with WaitInterrupted, now and from now on."""
        self.interrupted = True
        for future, interruptible in self._all():
            if interruptible and not future.done():
                future.set_exception(WaitInterrupted())

    def fail(self) -> None:
        """End every wait with what ``stopped`` gives (the node stopped)."""
        for future, _ in self._all():
            if not future.done():
                error = self._stopped()
                assert error is not None, "fail() before the node stopped"
                future.set_exception(error)

    def _all(self) -> Iterator[tuple[asyncio.Future[None], bool]]:
        """Every waiting future, with whether it is interruptible."""
        for future, (_, interruptible) in self._waiters.items():
            yield future, interruptible
        for _, _, future, interruptible in self._commit_waiters:
            yield future, interruptible


def _time_out(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())
