"""Client records proposed to the core together: the writes that reach the leader in one turn of
the event loop cost it one step of the core between them, not one each.

Under load, a stream read brings many requests at once and their tasks all propose in the same
turn; every step of the core carries its timers, its effects and the waits it may wake, so one
step for many proposals is most of what a write costs the leader beyond its own bytes. The
first proposal of a turn goes to the core at once, so that a lone write waits for nothing; those
that follow it in the same turn are gathered and proposed in one step at the start of the next
(``RaftCore.propose_each``), each with its own offsets or its own refusal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import NamedTuple

from quorum_node.raft.driver import CoreDriver
from quorum_node.raft.records import Record


class Appended(NamedTuple):
    """Where a caller's records go in the log: their first and last offsets, and the epoch of
    the leader that took them (they are committed once the high watermark passes
    ``last_offset`` in it)."""

    first_offset: int
    last_offset: int
    epoch: int


class Proposals:
    """Proposes client records through ``driver``, gathering those of one turn of the loop."""

    def __init__(self, driver: CoreDriver, now_ms: Callable[[], int],
                 epoch: Callable[[], int]) -> None:
        """``epoch``: the core's current epoch (read right after each proposal)."""
        self._driver = driver
        self._now_ms = now_ms
        self._epoch = epoch
        # Records waiting for the gathered step, with their callers' futures; None while no
        # proposal was made in this turn (the next one goes to the core at once).
        self._gathered: list[tuple[Sequence[Record], asyncio.Future[Appended]]] | None = None

    async def propose(self, records: Sequence[Record]) -> Appended:
        """Hand ``records`` to the core: raises what the core refuses them with
        (``REFUSALS`` of the driver), or NotLeaderError once the node has failed."""
        if self._gathered is None:
            first, last = self._driver.request(
                lambda core: core.propose(self._now_ms(), records))
            appended = Appended(first, last, self._epoch())
            self._gathered = []
            asyncio.get_running_loop().call_soon(self._propose_gathered)
            return appended
        future: asyncio.Future[Appended] = asyncio.get_running_loop().create_future()
        self._gathered.append((records, future))
        return await future

    def _propose_gathered(self) -> None:
        gathered, self._gathered = self._gathered or [], None
        # A caller cancelled meanwhile (its client went away) proposes nothing.
        waiting = [(records, future) for records, future in gathered if not future.done()]
        if not waiting:
            return
        proposals = [records for records, _ in waiting]
        try:
            outcomes = self._driver.request(
                lambda core: core.propose_each(self._now_ms(), proposals))
        except Exception as error:  # the node failed: every caller is told it is no leader
            for _, future in waiting:
                future.set_exception(error)
            return
        epoch = self._epoch()
        for (_, future), outcome in zip(waiting, outcomes, strict=True):
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(Appended(*outcome, epoch))
