"""The simulated cluster: nodes, message routing between them over the network, and the fault
verbs scenarios use (kill, restart, graceful shutdown, pause, partitions, disk loss).

What a sender learns of a peer's death is what TCP tells it: a request to a process that is
gone is refused (``RequestFailure.REFUSED``: nothing listens at its address), and the requests
the process held when it was killed fail on the connections it dropped (``CLOSED``). Across a
cut link a sender learns nothing: a partition is silence."""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterator

from quorum_node.raft.config import QuorumConfig
from quorum_node.raft.core import OutboundRequest, OutboundResponse, VoterChangeDone
from quorum_node.raft.requests import RequestFailure
from quorum_node.raft.state import RaftState
from quorum_node.raft.types import ReplicaKey
from quorum_node.sim.events import EventLoop
from quorum_node.sim.network import Network
from quorum_node.sim.node import CoreFactory, CoreMonitor, SimNode, random_uuid

CLUSTER_ID = "sim-cluster"
GRACEFUL_SHUTDOWN_TIMEOUT_MS = 500


class Cluster:
    def __init__(
        self,
        *,
        loop: EventLoop,
        rng: random.Random,
        voters: int,
        observers: int,
        config: QuorumConfig,
        core_factory: CoreFactory,
        monitor: CoreMonitor,
        configured_directories: bool = True,
    ) -> None:
        """``configured_directories``: the static voters come with their directory ids (as
        Kafka's ``format --initial-controllers`` gives them), else by id only
        (``controller.quorum.voters``), to be learned from their fetches."""
        self.loop = loop
        self._rng = rng
        self.network = Network(loop, rng)
        # The requests each node's process holds unanswered: (source, its incarnation,
        # correlation id), failed on their connections when the process is killed.
        self._held: dict[int, set[tuple[int, int, int]]] = {}
        # Told of every voter change a node's core finished (the administrators who asked).
        self.voter_change_listeners: list[Callable[[SimNode, VoterChangeDone], None]] = []
        self.voter_ids = list(range(voters))
        self.observer_ids = list(range(voters, voters + observers))
        directories = {node_id: random_uuid(rng) for node_id in self.voter_ids + self.observer_ids}
        self._used_directories = set(directories.values())
        self.static_voters = tuple(
            ReplicaKey(node_id, directories[node_id] if configured_directories else None)
            for node_id in self.voter_ids
        )
        self.nodes: dict[int, SimNode] = {
            node_id: SimNode(
                node_id=node_id,
                directory_id=directory_id,
                cluster_id=CLUSTER_ID,
                voters=self.static_voters,
                # Replicas outside the voters (Kafka's brokers): allowed to fetch.
                observer_ids=self.observer_ids,
                config=config,
                core_factory=core_factory,
                host=self,
                monitor=monitor,
                rng=rng,
            )
            for node_id, directory_id in directories.items()
        }

    # -- queries ------------------------------------------------------------------------------
    def alive(self) -> Iterator[SimNode]:
        return (node for node in self.nodes.values() if node.alive)

    def leader(self) -> SimNode | None:
        """The running node that is leader of the highest epoch, if any."""
        best: SimNode | None = None
        best_epoch = -1
        for node in self.nodes.values():
            core = node.core
            if core is not None and core.state is RaftState.LEADER and core.epoch > best_epoch:
                best, best_epoch = node, core.epoch
        return best

    # -- NodeHost -----------------------------------------------------------------------------
    def send(self, source: SimNode, message: OutboundRequest | OutboundResponse) -> None:
        destination = self.nodes.get(message.destination)
        # A message reaches the process it was sent to: one addressed to a process that has
        # since died or restarted is lost with the connection it travelled on.
        target_incarnation = destination.incarnation if destination is not None else -1
        source_incarnation = source.incarnation

        def reachable() -> bool:
            return (
                destination is not None
                and destination.alive
                and destination.incarnation == target_incarnation
            )

        if isinstance(message, OutboundRequest):
            request = message.message

            def deliver_request() -> bool:
                if not reachable():
                    self._refuse(source, source_incarnation, message)
                    return False
                assert destination is not None
                held = (source.node_id, source_incarnation, message.correlation_id)
                self._held.setdefault(destination.node_id, set()).add(held)
                destination.handle_request(source.node_id, message.correlation_id, request)
                return True

            self.network.send(source.node_id, message.destination, deliver_request)
        else:
            response = message.message
            if destination is not None:
                self._held.get(source.node_id, set()).discard(
                    (destination.node_id, target_incarnation, message.correlation_id))

            def deliver_response() -> bool:
                if not reachable():
                    return False
                assert destination is not None
                destination.handle_response(source.node_id, message.correlation_id, response)
                return True

            self.network.send(source.node_id, message.destination, deliver_response)

    def voter_change_done(self, source: SimNode, done: VoterChangeDone) -> None:
        for listener in self.voter_change_listeners:
            listener(source, done)

    def _refuse(self, source: SimNode, incarnation: int, request: OutboundRequest) -> None:
        """Tell the sender its connection was refused: nothing listens where the process was."""
        self._fail_request(source, incarnation, request.destination, request.correlation_id,
                           RequestFailure.REFUSED)

    def _fail_request(self, source: SimNode, incarnation: int, destination: int,
                      correlation_id: int, failure: RequestFailure) -> None:
        def fail() -> bool:
            if source.incarnation != incarnation or not source.alive:
                return False
            source.handle_request_failure(destination, correlation_id, failure)
            return True

        self.loop.after(self.network.latency_ms(), fail)

    # -- faults -------------------------------------------------------------------------------
    def start(self, node_id: int) -> None:
        if not self.nodes[node_id].alive:
            self.nodes[node_id].start()

    def start_all(self) -> None:
        for node_id in self.nodes:
            self.start(node_id)

    def kill(self, node_id: int) -> None:
        self.nodes[node_id].kill()
        # The connections the process held end: their senders' calls fail, unless a partition
        # keeps the news from them.
        for source_id, incarnation, correlation_id in sorted(self._held.pop(node_id, set())):
            if not self.network.is_blocked(node_id, source_id):
                self._fail_request(self.nodes[source_id], incarnation, node_id, correlation_id,
                                   RequestFailure.CLOSED)

    def kill_all(self) -> None:
        for node_id in self.nodes:
            self.kill(node_id)

    def wipe_disk(self, node_id: int) -> None:
        """Lose a stopped node's disk: it comes back formatted afresh, under a directory id no
        replica ever had."""
        directory_id = random_uuid(self._rng)
        while directory_id in self._used_directories:
            directory_id = random_uuid(self._rng)
        self._used_directories.add(directory_id)
        self.nodes[node_id].wipe_disk(directory_id)

    def shutdown(self, node_id: int) -> None:
        self.nodes[node_id].shutdown(GRACEFUL_SHUTDOWN_TIMEOUT_MS)

    def pause(self, node_id: int) -> None:
        """Stop the process (SIGSTOP): its connections stay open, what reaches it waits."""
        self.nodes[node_id].pause()

    def resume(self, node_id: int) -> None:
        self.nodes[node_id].resume()

    def resume_all(self) -> None:
        for node in self.nodes.values():
            node.resume()

    def isolate(self, node_id: int) -> None:
        self.network.isolate(node_id, self.nodes)

    def split(self, groups: Collection[Collection[int]]) -> None:
        self.network.split(groups)

    def star(self, center: int) -> None:
        self.network.star(center, self.nodes)

    def heal(self) -> None:
        self.network.heal()
