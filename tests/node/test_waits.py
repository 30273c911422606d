"""The node's waiters (``quorum_node.node.waits``), without a node: woken by the step that makes
their condition true, cut short by an interruption or a failure, timed out, let go."""

from __future__ import annotations

import asyncio

import pytest

from quorum_node.node.waits import WaitInterrupted, Waits


class Host:
    def __init__(self) -> None:
        self.high_watermark: int | None = None
        self.failure: BaseException | None = None
        self.waits = Waits(lambda: self.high_watermark, lambda: self.failure)


async def test_a_commit_waiter_is_woken_once_the_high_watermark_passes_its_offset() -> None:
    host = Host()
    waits = [asyncio.ensure_future(host.waits.wait_committed(offset, 5)) for offset in (4, 2)]
    await asyncio.sleep(0)
    host.high_watermark = 3  # offset 2 is committed, 4 is not
    host.waits.after_step()
    await asyncio.sleep(0)
    assert [w.done() for w in waits] == [False, True]
    host.high_watermark = 5
    host.waits.after_step()
    await asyncio.gather(*waits)
    await host.waits.wait_committed(4, 0)  # already settled: no wait, even with no time left


async def test_a_condition_is_checked_after_each_step() -> None:
    host = Host()
    ready = False
    waiting = asyncio.ensure_future(host.waits.wait(lambda: ready, 5))
    await asyncio.sleep(0)
    host.waits.after_step()
    await asyncio.sleep(0)
    assert not waiting.done()
    ready = True
    host.waits.after_step()
    await waiting


async def test_timeout_interrupt_and_failure() -> None:
    host = Host()
    with pytest.raises(TimeoutError):
        await host.waits.wait_committed(0, 0.01)
    steady = asyncio.ensure_future(host.waits.wait_committed(0, 5, interruptible=False))
    cut = asyncio.ensure_future(host.waits.wait_committed(0, 5))
    await asyncio.sleep(0)
    host.waits.interrupt()
    with pytest.raises(WaitInterrupted):
        await cut
    with pytest.raises(WaitInterrupted):  # and from now on
        await host.waits.wait(lambda: False, 5)
    assert not steady.done()
    host.failure = RuntimeError("the disk failed")
    host.waits.fail()
    with pytest.raises(RuntimeError, match="the disk failed"):
        await steady
    with pytest.raises(RuntimeError, match="the disk failed"):
        await host.waits.wait(lambda: False, 5, interruptible=False)


async def test_timed_out_commit_waiters_are_let_go() -> None:
    host = Host()
    for offset in range(1100):
        with pytest.raises(TimeoutError):
            await host.waits.wait_committed(offset, 0.0001)
    assert len(list(host.waits._all())) <= 1024


async def test_a_wait_times_out_without_cancelling_its_task() -> None:
    """A timed-out wait raises TimeoutError into the code that awaits it and leaves its task
    alone: no cancellation is left pending on the task (which a transport's reader may be, or
    share), and a wait run by a plain coroutine step, outside any task, times out as well."""
    host = Host()
    with pytest.raises(TimeoutError):
        await host.waits.wait(lambda: False, 0.01)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    # Driven by hand, as an eager start does: asyncio.timeout would refuse to run here.
    outcome: list[BaseException] = []
    coroutine = host.waits.wait_committed(0, 0.01)
    awaited = coroutine.send(None)

    def resume(_: object) -> None:
        try:
            coroutine.throw(awaited.exception() or RuntimeError("resolved"))
        except BaseException as error:  # what the wait ended with
            outcome.append(error)

    awaited.add_done_callback(resume)
    await asyncio.sleep(0.1)
    assert len(outcome) == 1 and isinstance(outcome[0], TimeoutError)
