"""The simulated network: per-message latency (so messages reorder), random loss and duplication,
and partitions as a set of blocked directed links.

The network knows nothing about nodes being alive; it only decides whether, when and how often a
delivery happens. A blocked link drops a message both when it is sent and when it would arrive, so
cutting a link also loses what was in flight on it, as a real partition does.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable

from quorum_node.sim.events import EventLoop


class Network:
    def __init__(
        self,
        loop: EventLoop,
        rng: random.Random,
        *,
        min_latency_ms: int = 1,
        max_latency_ms: int = 10,
    ) -> None:
        self._loop = loop
        self._rng = rng
        self.min_latency_ms = min_latency_ms
        self.max_latency_ms = max_latency_ms
        self.drop_probability = 0.0
        self.duplicate_probability = 0.0
        self._blocked: set[tuple[int, int]] = set()

    def latency_ms(self) -> int:
        return self._rng.randint(self.min_latency_ms, self.max_latency_ms)

    def is_blocked(self, source: int, destination: int) -> bool:
        return (source, destination) in self._blocked

    def send(self, source: int, destination: int, deliver: Callable[[], bool]) -> None:
        """Schedule ``deliver`` zero, one or two times, each after its own latency."""
        if self.is_blocked(source, destination) or self._rng.random() < self.drop_probability:
            return
        copies = 2 if self._rng.random() < self.duplicate_probability else 1
        for _ in range(copies):
            self._loop.after(self.latency_ms(), self._arrival(source, destination, deliver))

    def _arrival(
        self, source: int, destination: int, deliver: Callable[[], bool]
    ) -> Callable[[], bool]:
        def arrive() -> bool:
            return not self.is_blocked(source, destination) and deliver()

        return arrive

    # -- partitions ---------------------------------------------------------------------------
    def isolate(self, node: int, everyone: Iterable[int]) -> None:
        """Cut every link to and from ``node``."""
        for other in everyone:
            if other != node:
                self._blocked.add((node, other))
                self._blocked.add((other, node))

    def split(self, groups: Collection[Collection[int]]) -> None:
        """Cut every link between nodes of different groups (links inside a group stay as they
        were)."""
        for group in groups:
            for other_group in groups:
                if other_group is group:
                    continue
                self._blocked.update((a, b) for a in group for b in other_group)

    def star(self, center: int, everyone: Iterable[int]) -> None:
        """Cut every link that does not touch ``center``: the others reach ``center`` alone."""
        nodes = [node for node in everyone if node != center]
        self._blocked.update((a, b) for a in nodes for b in nodes if a != b)

    def heal(self) -> None:
        self._blocked.clear()
