"""The client: every few milliseconds it proposes a key-value operation to the current leader
(now and then a few, from several clients at once, in one step), encoded as the node's API
encodes it (``quorum_node.kv.store.encode_op``): puts, deletes, cas and txns over a small set
of keys, so that writes overwrite, delete and compare one another's results, and the replicas'
stores (``quorum_node.kv.machine``) have something to disagree on.

It remembers when each accepted operation carrying a value was proposed (liveness checks ask
whether anything proposed after a fault healed got committed). Every value is unique, so a
record's bytes name its proposal; a delete (or a cas that deletes), which carries none, is not
remembered.
"""

from __future__ import annotations

import random

from quorum_node.kv.ops import Cas, Compare, Delete, KvOp, Put, Txn, encode_op
from quorum_node.raft.records import Record
from quorum_node.sim.cluster import Cluster

KEYS = 32


class Workload:
    def __init__(
        self, cluster: Cluster, rng: random.Random, *, min_interval_ms: int, max_interval_ms: int
    ) -> None:
        self._cluster = cluster
        self._rng = rng
        self._min_interval_ms = min_interval_ms
        self._max_interval_ms = max_interval_ms
        self._sequence = 0
        # The value each key was last proposed with (None: deleted), what a cas expects.
        self._last_proposed: dict[str, str | None] = {}
        # Record value -> simulated time the leader accepted it.
        self.proposed_at: dict[bytes, int] = {}

    def start(self) -> None:
        self._schedule()

    def _schedule(self) -> None:
        self._cluster.loop.after(
            self._rng.randint(self._min_interval_ms, self._max_interval_ms), self._propose
        )

    def _next_op(self) -> KvOp:
        rng = self._rng
        key = f"key-{rng.randrange(KEYS)}"
        value = f"v-{self._sequence}"
        self._sequence += 1
        draw = rng.random()
        if draw < 0.5:
            return Put(key, value)
        if draw < 0.65:
            return Delete(key)
        if draw < 0.9:
            # Mostly what the key was last proposed with: some apply, some find it overwritten.
            return Cas(key, self._last_proposed.get(key), None if rng.random() < 0.2 else value)
        other = f"key-{rng.randrange(KEYS)}"
        return Txn(compares=(Compare(key, "version", ">", rng.randint(0, 3)),),
                   success=(Put(key, value),),
                   failure=(Put(other, value),) if other != key else ())

    def _propose(self) -> bool:
        self._schedule()
        leader = self._cluster.leader()
        if leader is None:
            return False
        # Now and then several clients' writes reach the leader in the same turn of its loop,
        # and it proposes them in one step (``RaftCore.propose_each``).
        callers = 1 if self._rng.random() < 0.75 else self._rng.randint(2, 4)
        ops = [self._next_op() for _ in range(callers)]
        records = [encode_op(op) for op in ops]
        if callers == 1:
            taken = [leader.propose(records) is not None]
        else:
            outcomes = leader.propose_each([[record] for record in records])
            taken = ([False] * callers if outcomes is None
                     else [isinstance(outcome, tuple) for outcome in outcomes])
        for op, record, was_taken in zip(ops, records, taken, strict=True):
            if was_taken:
                self._accepted(op, record)
        return True

    def _accepted(self, op: KvOp, record: Record) -> None:
        if isinstance(op, Put | Cas):
            self._last_proposed[op.key] = op.value
        elif isinstance(op, Delete):
            self._last_proposed[op.key] = None
        if not isinstance(op, Delete) and not (isinstance(op, Cas) and op.value is None):
            self.proposed_at[record.value] = self._cluster.loop.now_ms
