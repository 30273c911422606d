"""The readers: every few milliseconds a client sends a linearizable read (ReadIndex, as the node's
API serves ``GET /v1/kv/<key>``) to a replica that believes it leads: the leader of the newest
epoch, or one that does not know yet that it was replaced (cut off, or paused and not yet
resumed: the read then waits in its queue with everything else).

LinearizableRead: a confirmed read covers every write committed before the client sent it: its
read index is at least the end of what was committed then. A stale leader must never confirm one.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial

from quorum_node.raft.core import ReadConfirmed, ReadOutcome
from quorum_node.raft.state import RaftState
from quorum_node.sim.cluster import Cluster
from quorum_node.sim.node import SimNode

LINEARIZABLE_READ = "LinearizableRead"
# The barrier's deadline: long enough to outlast a pause the read waited through.
READ_TIMEOUT_MS = 2000


class Readers:
    def __init__(self, cluster: Cluster, rng: random.Random, committed_end: Callable[[], int],
                 report: Callable[[str, str], bool], *,
                 interval_ms: tuple[int, int] = (100, 500)) -> None:
        """``committed_end``: the end of the globally committed prefix now; ``report`` records a
        violation."""
        self._cluster = cluster
        self._rng = rng
        self._committed_end = committed_end
        self._report = report
        self._interval_ms = interval_ms
        self.sent = 0
        self.confirmed = 0

    def start(self) -> None:
        self._schedule()

    def _schedule(self) -> None:
        self._cluster.loop.after(self._rng.randint(*self._interval_ms), self._read)

    def _read(self) -> bool:
        self._schedule()
        leaders = [node for node in self._cluster.nodes.values()
                   if node.core is not None and node.core.state is RaftState.LEADER]
        if not leaders:
            return False
        self.read_at(self._rng.choice(leaders))
        return True

    def read_at(self, node: SimNode) -> None:
        """Send a read to ``node`` now (a scenario aims one at a leader it paused)."""
        self.sent += 1
        node.read(READ_TIMEOUT_MS, partial(self._settled, node.node_id,
                                           self._cluster.loop.now_ms, self._committed_end()))

    def _settled(self, node_id: int, sent_ms: int, committed_end: int,
                 outcome: ReadOutcome) -> None:
        if not isinstance(outcome, ReadConfirmed):
            return
        self.confirmed += 1
        if outcome.read_index < committed_end:
            self._report(LINEARIZABLE_READ,
                         f"node {node_id} confirmed a read sent at {sent_ms} ms at offset "
                         f"{outcome.read_index}, below {committed_end}: committed when it was "
                         f"sent")
