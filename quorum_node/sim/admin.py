"""The people around the quorum: an operator who replaces lost disks' voters, a careless admin who
sends voter changes at random, and the state machine's housekeeping (snapshots, log deletion).

The operator follows KIP-856's disk failure recovery: DescribeQuorum at the leader shows an
observer (id, new directory) whose id is a voter under another directory; once it has caught up
it is added, and the voter its lost directory was is removed. One change at a time, polled with
``voter_change_result``. Random requests go to any running node and may be invalid; the core must
refuse them (NotLeaderError, VoterChangeError), never fail. Both stop being issued when told, so
that the quorum can settle.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from quorum_node.raft.core import QuorumDescription
from quorum_node.raft.types import Errors, NotLeaderError, ReplicaKey, VoterChangeError
from quorum_node.raft.voters import VoterSet
from quorum_node.sim.cluster import Cluster
from quorum_node.sim.node import SimNode, random_uuid

OPERATOR_INTERVAL_MS = 100
OPERATOR_TIMEOUT_MS = 5000
# An observer counts as caught up if it reached the leader's log end this recently.
CAUGHT_UP_MS = 1000


@dataclass(slots=True)
class _Pending:
    node: SimNode
    incarnation: int
    ticket: int
    label: str


class Operator:
    def __init__(self, cluster: Cluster, rng: random.Random) -> None:
        self._cluster = cluster
        self._loop = cluster.loop
        self._rng = rng
        self._pending: list[_Pending] = []
        self._ours: _Pending | None = None  # the remediation step in progress
        self.outcomes: list[tuple[str, Errors]] = []  # what the core answered, in order
        self.refusals: list[tuple[str, Errors | None]] = []  # refused at once (None: not leader)

    # -- remediation --------------------------------------------------------------------------
    def start(self) -> None:
        self._loop.after(OPERATOR_INTERVAL_MS, self._tick)

    def _tick(self) -> bool:
        self._loop.after(OPERATOR_INTERVAL_MS, self._tick)
        self._collect()
        return self._remediate()

    def remediated_voters(self) -> VoterSet:
        """The voter set a finished recovery leaves: each configured id under its disk now."""
        nodes = self._cluster.nodes
        return tuple(sorted(ReplicaKey(i, nodes[i].directory_id) for i in self._cluster.voter_ids))

    def _remediate(self) -> bool:
        if self._ours is not None:
            return False
        leader = self._cluster.leader()
        if leader is None or leader.core is None or leader.core.pending_voter_change is not None:
            return False
        description = leader.describe_quorum()
        if description is None:
            return False
        step = self._next_step(description)
        if step is None:
            return False
        kind, key = step
        self._ours = self._send(leader, kind, key, OPERATOR_TIMEOUT_MS)
        return True

    def _next_step(self, description: QuorumDescription) -> tuple[str, ReplicaKey] | None:
        nodes = self._cluster.nodes
        voters = [row.key for row in description.voters]
        for key in voters:
            current = ReplicaKey(key.id, nodes[key.id].directory_id)
            if key.directory_id not in (None, current.directory_id) and current in voters:
                return "remove", key  # the lost directory, now replaced
        configured = set(self._cluster.voter_ids)
        for row in description.observers:
            key = row.key
            caught_up = row.last_caught_up_ms is not None and (
                self._loop.now_ms - row.last_caught_up_ms <= CAUGHT_UP_MS)
            if (key.id in configured and key.directory_id == nodes[key.id].directory_id
                    and key not in voters and caught_up):
                return "add", key
        return None

    def _collect(self) -> None:
        """Take the outcomes of finished changes; forget those whose process is gone."""
        still: list[_Pending] = []
        for pending in self._pending:
            node = pending.node
            if node.incarnation != pending.incarnation or node.core is None:
                outcome = None
                done = True
            else:
                result = node.voter_change_result(pending.ticket)
                outcome = result.error if result is not None else None
                done = result is not None
            if outcome is not None:
                self.outcomes.append((pending.label, outcome))
            if done:
                if pending is self._ours:
                    self._ours = None
            else:
                still.append(pending)
        self._pending = still

    def _send(self, node: SimNode, kind: str, key: ReplicaKey, timeout_ms: int) -> _Pending | None:
        label = f"{kind} {key} at node {node.node_id}"
        request: Callable[[ReplicaKey, int], int | None] = (
            node.add_voter if kind == "add" else node.remove_voter)
        try:
            ticket = request(key, timeout_ms)
        except NotLeaderError:
            self.refusals.append((label, None))
            return None
        except VoterChangeError as refusal:
            self.refusals.append((label, refusal.error))
            return None
        if ticket is None:
            return None
        pending = _Pending(node, node.incarnation, ticket, label)
        self._pending.append(pending)
        return pending

    # -- the careless admin -------------------------------------------------------------------
    def random_request(self) -> None:
        """A voter change, valid or not, to any running node."""
        cluster = self._cluster
        alive = [node for node in cluster.nodes.values() if node.alive]
        if not alive:
            return
        rng = self._rng
        target = rng.choice(alive)
        node_id = rng.choice([*cluster.nodes, len(cluster.nodes)])  # the last: no such node
        directories = [None, random_uuid(rng)]
        if node_id in cluster.nodes:
            directories.append(cluster.nodes[node_id].directory_id)
        if target.core is not None:
            directories += [key.directory_id for key in target.core.voters if key.id == node_id]
        key = ReplicaKey(node_id, rng.choice(directories))
        self._send(target, rng.choice(("add", "remove")), key, rng.randint(50, 5000))
