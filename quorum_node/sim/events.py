"""Simulated time: a priority queue of actions ordered by (time, insertion order).

The insertion sequence number breaks ties, so two runs that schedule the same actions in the same
order execute them in the same order: together with one seeded ``random.Random`` that makes a run a
pure function of its seed.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

# An action returns True if it did something; False marks a stale event (a superseded poll, a
# message to a node that died) that is neither counted nor followed by an invariant check.
Action = Callable[[], bool]


class EventLoop:
    def __init__(self) -> None:
        self.now_ms = 0
        self._queue: list[tuple[int, int, Action]] = []
        self._sequence = itertools.count()

    def at(self, time_ms: int, action: Action) -> None:
        """Run ``action`` at ``time_ms`` (never in the past)."""
        heapq.heappush(self._queue, (max(time_ms, self.now_ms), next(self._sequence), action))

    def after(self, delay_ms: int, action: Action) -> None:
        self.at(self.now_ms + delay_ms, action)

    def run_one(self, until_ms: int) -> bool | None:
        """Run the next action due at or before ``until_ms``: its result, or None when none is."""
        if not self._queue or self._queue[0][0] > until_ms:
            self.now_ms = max(self.now_ms, until_ms)
            return None
        time_ms, _, action = heapq.heappop(self._queue)
        self.now_ms = time_ms
        return action()
