"""The client: every few milliseconds it proposes one record with a unique value to the current
leader, and remembers when each accepted value was proposed (liveness checks ask whether anything
proposed after a fault healed got committed)."""

from __future__ import annotations

import random

from quorum_node.raft.records import Record
from quorum_node.sim.cluster import Cluster


class Workload:
    def __init__(
        self, cluster: Cluster, rng: random.Random, *, min_interval_ms: int, max_interval_ms: int
    ) -> None:
        self._cluster = cluster
        self._rng = rng
        self._min_interval_ms = min_interval_ms
        self._max_interval_ms = max_interval_ms
        self._sequence = 0
        # Value -> simulated time the leader accepted it.
        self.proposed_at: dict[bytes, int] = {}

    def start(self) -> None:
        self._schedule()

    def _schedule(self) -> None:
        self._cluster.loop.after(
            self._rng.randint(self._min_interval_ms, self._max_interval_ms), self._propose
        )

    def _propose(self) -> bool:
        self._schedule()
        leader = self._cluster.leader()
        if leader is None:
            return False
        value = b"v-%d" % self._sequence
        self._sequence += 1
        if leader.propose([Record(value=value)]) is not None:
            self.proposed_at[value] = self._cluster.loop.now_ms
        return True
