"""The people around the quorum: an operator who replaces lost disks' voters, a careless admin who
sends voter changes at random, and the state machine's housekeeping (snapshots, log deletion).

The operator follows KIP-856's disk failure recovery: DescribeQuorum at the leader shows an
observer (id, new directory) whose id is a voter under another directory; once it has caught up
it is added, and the voter its lost directory was is removed. One change at a time, each ended
by the core's ``VoterChangeDone``. Random requests go to any running node and may be invalid;
the core must refuse them (NotLeaderError, VoterChangeError), never fail. Both stop being issued
when told, so that the quorum can settle.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from quorum_node.raft.core import QuorumDescription, VoterChangeDone
from quorum_node.raft.types import (
    Errors,
    NotLeaderError,
    ReplicaKey,
    VoterChangeError,
    VoterChangeKind,
)
from quorum_node.raft.voters import VoterSet
from quorum_node.sim.cluster import Cluster
from quorum_node.sim.node import SimNode, random_uuid

OPERATOR_INTERVAL_MS = 100
OPERATOR_TIMEOUT_MS = 5000
# An observer counts as caught up if it reached the leader's log end this recently.
CAUGHT_UP_MS = 1000


@dataclass(frozen=True, slots=True)
class _Ticket:
    """A voter change's ticket at one process of one node."""

    node_id: int
    incarnation: int
    ticket: int


@dataclass(slots=True)
class _Pending:
    node: SimNode
    ticket: _Ticket
    label: str


class Operator:
    def __init__(self, cluster: Cluster, rng: random.Random) -> None:
        self._cluster = cluster
        self._loop = cluster.loop
        self._rng = rng
        self._pending: dict[_Ticket, _Pending] = {}
        # Changes that ended in the very step that started them, until ``_send`` claims them.
        self._ended_at_once: dict[_Ticket, VoterChangeDone] = {}
        self._ours: _Pending | None = None  # the remediation step in progress
        cluster.voter_change_listeners.append(self._voter_change_done)
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

    def _next_step(
        self, description: QuorumDescription
    ) -> tuple[VoterChangeKind, ReplicaKey] | None:
        nodes = self._cluster.nodes
        voters = [row.key for row in description.voters]
        for key in voters:
            current = ReplicaKey(key.id, nodes[key.id].directory_id)
            if key.directory_id not in (None, current.directory_id) and current in voters:
                return VoterChangeKind.REMOVE, key  # the lost directory, now replaced
        configured = set(self._cluster.voter_ids)
        for row in description.observers:
            key = row.key
            caught_up = row.last_caught_up_ms is not None and (
                self._loop.now_ms - row.last_caught_up_ms <= CAUGHT_UP_MS)
            if (key.id in configured and key.directory_id == nodes[key.id].directory_id
                    and key not in voters and caught_up):
                return VoterChangeKind.ADD, key
        return None

    def _collect(self) -> None:
        """Forget the changes whose process is gone: they end without an outcome."""
        for ticket, pending in list(self._pending.items()):
            node = pending.node
            if node.incarnation != ticket.incarnation or node.core is None:
                self._forget(ticket)

    def _voter_change_done(self, node: SimNode, done: VoterChangeDone) -> None:
        ticket = _Ticket(node.node_id, node.incarnation, done.ticket)
        pending = self._pending.get(ticket)
        if pending is None:
            self._ended_at_once[ticket] = done
            return
        self.outcomes.append((pending.label, done.error))
        self._forget(ticket)

    def _forget(self, ticket: _Ticket) -> None:
        pending = self._pending.pop(ticket)
        if pending is self._ours:
            self._ours = None

    def _send(self, node: SimNode, kind: VoterChangeKind, key: ReplicaKey,
              timeout_ms: int) -> _Pending | None:
        label = f"{kind} {key} at node {node.node_id}"
        request: Callable[[ReplicaKey, int], int | None] = (
            node.add_voter if kind is VoterChangeKind.ADD else node.remove_voter)
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
        taken = _Ticket(node.node_id, node.incarnation, ticket)
        ended = self._ended_at_once.pop(taken, None)
        if ended is not None:
            self.outcomes.append((label, ended.error))
            return None
        pending = self._pending[taken] = _Pending(node, taken, label)
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
        self._send(target, rng.choice(list(VoterChangeKind)), key, rng.randint(50, 5000))
