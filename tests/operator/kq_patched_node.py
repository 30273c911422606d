"""``quorum-node`` with the one node change the operator's scale-down needs (reported in
docs/operator.md): RemoveVoter may remove the last directory of a node id, as KIP-853's
RemoveRaftVoter does, so long as a voter remains. The node as it is refuses that with
INVALID_REQUEST (KIP-856 only replaces a node's directory).

Test-only: the kubelet runs it as ``python kq_patched_node.py run ...`` where a test asks for
it. The proposed change to ``RaftCore.remove_voter`` is exactly this method.
"""

from __future__ import annotations

import sys

from quorum_node.cli import node
from quorum_node.raft.core import RaftCore
from quorum_node.raft.types import Errors, ReplicaKey, VoterChangeError


def remove_voter(self: RaftCore, now_ms: int, key: ReplicaKey, timeout_ms: int) -> int:
    self._check_voter_change(now_ms, key)
    if not any(voter == key for voter in self.voters):
        raise VoterChangeError(Errors.VOTER_NOT_FOUND, f"{key} is not a voter")
    if len(self.voters) == 1:
        raise VoterChangeError(Errors.INVALID_REQUEST, f"{key} is the last voter")
    return self._start_voter_change(now_ms, "remove", key, timeout_ms)


RaftCore.remove_voter = remove_voter  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(node.main(sys.argv[1:]))
