"""The quorum's admin operations (KIP-595's DescribeQuorum, KIP-856's AddVoter and RemoveVoter),
one code path for every transport that offers them: the HTTP admin API
(``quorum_node.node.api.admin``) and the Kafka protocol of the controller listener
(``quorum_node.node.kafka``). Each transport only translates requests and answers.

Only the leader describes the quorum and changes its voters: elsewhere these raise
``NotLeaderError`` (each transport says so in its own way). A node stopped after a failure
raises ``ServiceError(NODE_FAILED)``; a refused or unfinished change ``VoterChangeError`` with
Kafka's error."""

from __future__ import annotations

from quorum_node.node.errors import ErrorCode, ServiceError
from quorum_node.node.runtime import QuorumNode
from quorum_node.raft.core import QuorumDescription
from quorum_node.raft.status import NodeStatus
from quorum_node.raft.types import NotLeaderError, ReplicaKey


class QuorumAdmin:
    def __init__(self, node: QuorumNode) -> None:
        self.node = node

    def _check_running(self) -> None:
        if self.node.failure is not None:
            raise ServiceError(ErrorCode.NODE_FAILED,
                               f"the node stopped after a failure: {self.node.failure}")

    def status(self) -> NodeStatus:
        """This node's own view, which any node gives."""
        return self.node.status()

    def describe(self) -> QuorumDescription:
        """The leader's view of the quorum."""
        self._check_running()
        status = self.node.status()
        if status.quorum is None:
            raise NotLeaderError(status.leader_id, status.epoch)
        return status.quorum

    async def add_voter(self, key: ReplicaKey, timeout_ms: int) -> tuple[ReplicaKey, ...]:
        """Make observer ``key`` a voter; the voters once the change is committed."""
        self._check_running()
        await self.node.add_voter(key, timeout_ms / 1000)
        return self.voters()

    async def remove_voter(self, key: ReplicaKey, timeout_ms: int, *,
                           decommission: bool = False) -> tuple[ReplicaKey, ...]:
        """Remove voter ``key``; the voters once the change is committed."""
        self._check_running()
        await self.node.remove_voter(key, timeout_ms / 1000, decommission=decommission)
        return self.voters()

    def voters(self) -> tuple[ReplicaKey, ...]:
        return self.node.status().voters

    def controller_endpoint(self, node_id: int) -> tuple[str, int] | None:
        """Where voter ``node_id`` serves its controller listener (controller.quorum.voters)."""
        return self.node.endpoints.get(node_id)
