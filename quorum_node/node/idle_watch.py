"""The idle timeout of a long-lived stream (a client's binary stream, a peer's stream of RPCs):
closed once its reader has waited a while for the next message with nothing else going on.

One timer per stream, looked at once per timeout at most, rather than a timeout around every
receive: entering a timeout and arming its timer costs more than a small message itself, and
the peers' and clients' streams carry one for every commit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


class IdleWatch:
    """Calls ``close`` once the stream's reader has waited ``idle_s`` for a message (the reader
    brackets each wait with ``receiving`` and ``received``) while ``busy()`` says nothing else
    is going on (a request being served, a peer's request parked). With ``idle_s`` None (or 0)
    a stream is never idle."""

    def __init__(self, idle_s: float | None, *, busy: Callable[[], bool],
                 close: Callable[[], Coroutine[Any, Any, object]]) -> None:
        self._idle_s = idle_s or 0.0
        self._busy = busy
        self._close = close
        self._loop = asyncio.get_running_loop()
        # When the reader began waiting for the next message (None while it is not waiting).
        self._receiving_since: float | None = None
        self._closing: asyncio.Task[object] | None = None
        self._timer: asyncio.TimerHandle | None = None
        if idle_s:
            self._timer = self._loop.call_at(self._loop.time() + idle_s, self._check)

    def receiving(self) -> None:
        """The reader waits for the next message from now on."""
        self._receiving_since = self._loop.time()

    def received(self) -> None:
        """The reader has its message (or the stream ended)."""
        self._receiving_since = None

    def _check(self) -> None:
        since = self._receiving_since
        now = self._loop.time()
        if since is None or now - since < self._idle_s:  # reading, or waiting for less long
            self._timer = self._loop.call_at((since or now) + self._idle_s, self._check)
            return
        if self._busy():  # not idle: the stream waits for the node, not for its other end
            self._receiving_since = now
            self._timer = self._loop.call_at(now + self._idle_s, self._check)
            return
        self._timer = None
        self._closing = self._loop.create_task(self._close())

    async def stop(self) -> None:
        """Stop watching (the stream is over); finish closing it if it was idle."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._closing is not None:
            await self._closing
