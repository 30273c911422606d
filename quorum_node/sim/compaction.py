"""Log compaction, as a node's state machine does it (KIP-630): now and then each running node
looks whether its state machine (the node's, ``quorum_node.kv.machine``) calls for a snapshot of
what it has applied; if so it snapshots and deletes the log below the snapshot, keeping a random
tail (the node's ``snapshot.retained.log.records``) for followers that are only a little behind.
Followers further behind must then catch up through FetchSnapshot."""

from __future__ import annotations

import random

from quorum_node.sim.cluster import Cluster
from quorum_node.sim.node import SimNode


class Compaction:
    def __init__(
        self,
        cluster: Cluster,
        rng: random.Random,
        *,
        interval_ms: tuple[int, int] = (500, 3000),
        max_kept: int = 50,
    ) -> None:
        self._cluster = cluster
        self._rng = rng
        self._interval_ms = interval_ms
        self._max_kept = max_kept
        self.snapshots_taken = 0
        self.running = False

    def start(self) -> None:
        if self.running:
            return
        self.running = True
        for node in self._cluster.nodes.values():
            self._schedule(node)

    def _schedule(self, node: SimNode) -> None:
        def compact() -> bool:
            self._schedule(node)
            return node.state_machine.snapshot_due and self.compact(node)

        self._cluster.loop.after(self._rng.randint(*self._interval_ms), compact)

    def compact(self, node: SimNode, *, keep: int | None = None) -> bool:
        """Snapshot ``node`` and delete its log below, but for ``keep`` records (random if not
        given), due or not. False if there was nothing new to snapshot."""
        if keep is None:
            keep = self._rng.choice((0, self._rng.randint(0, self._max_kept)))
        if node.take_snapshot(retained_log_records=keep) is None:
            return False
        self.snapshots_taken += 1
        return True
