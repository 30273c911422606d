"""The simulator catches Raft protocol bugs, not only broken outputs: each mutation below removes
one rule of the core's logic (in a subclass, never in the product) and one invariant finds it.

These reach into the core's private methods on purpose: the point is the very rule they break.
"""

from __future__ import annotations

from typing import Any

import pytest

from quorum_node.raft.core import RaftCore
from quorum_node.raft.messages import EpochEndOffset
from quorum_node.raft.quorum_rpcs import QuorumRpcs
from quorum_node.raft.replication import LeaderReplication
from quorum_node.raft.types import ReplicaKey
from quorum_node.sim.invariants import (
    CONSISTENT_COMMITTED_DATA,
    NO_COMMITTED_LOSS,
)
from quorum_node.sim.node import CoreFactory
from quorum_node.sim.runner import first_violation
from quorum_node.sim.simulation import CORE_ERROR, LIVENESS


class _NoDivergenceCheck(LeaderReplication):
    def validate_fetch_position(self, offset: int, last_epoch: int) -> EpochEndOffset | None:
        return None


class NeverReportsDivergence(RaftCore):
    """The leader skips the (fetch offset, last fetched epoch) check: a follower keeps its
    divergent suffix and appends the leader's records after it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._replication.__class__ = _NoDivergenceCheck


class _GrantsRegardlessOfLogs(QuorumRpcs):
    def _can_grant_vote(self, candidate: ReplicaKey, up_to_date: bool, pre_vote: bool) -> bool:
        return super()._can_grant_vote(candidate, True, pre_vote)


class IgnoresLogComparison(RaftCore):
    """Grants votes whether or not the candidate's log is at least as up to date as its own, so
    a replica missing committed records can be elected."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._rpcs.__class__ = _GrantsRegardlessOfLogs


class _TrustsAnyone(QuorumRpcs):
    def _may_be_voter(self, key: ReplicaKey, last_epoch: int, last_offset: int) -> bool:
        return True

    def _is_voter_id(self, node_id: int) -> bool:
        return True


class TrustsNonMembers(RaftCore):
    """Takes any replica for a possible voter or leader (Kafka's leniency, which once let one
    forged Vote move a quorum to an epoch no election could follow): forged messages from
    outside the cluster then move epochs and leaders."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._rpcs.__class__ = _TrustsAnyone


def _caught(factory: CoreFactory, checks: set[str], scenario: str, seeds: range) -> str:
    violation = first_violation(seeds, scenario, factory, checks)
    if violation is None:
        pytest.fail(f"none of {sorted(checks)} caught the mutation in seeds {seeds} of {scenario}")
    return str(violation)


@pytest.mark.parametrize(
    ("factory", "checks", "scenario"),
    [
        (NeverReportsDivergence, {CONSISTENT_COMMITTED_DATA, NO_COMMITTED_LOSS}, "random_faults"),
        (IgnoresLogComparison, {NO_COMMITTED_LOSS, CONSISTENT_COMMITTED_DATA}, "random_faults"),
        (TrustsNonMembers, {LIVENESS, CORE_ERROR}, "forged_messages"),
    ],
)
def test_protocol_mutation_is_caught(
    factory: CoreFactory, checks: set[str], scenario: str
) -> None:
    print(_caught(factory, checks, scenario, range(40)))
