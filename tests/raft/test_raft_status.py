"""``RaftCore.status``: one frozen shape of a replica's state, the same facts its properties
and ``describe_quorum`` give, taken at one instant."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from quorum_node.raft.state import RaftState
from quorum_node.raft.types import ReplicaKey

if TYPE_CHECKING:
    from context import RaftTestContext

    MakeCtx = Callable[..., RaftTestContext]

DIRECTORY = uuid.UUID(int=1)


def test_a_leader_status_holds_its_record_of_every_replica(make_ctx: MakeCtx) -> None:
    ctx = make_ctx(local_directory_id=DIRECTORY, log_epochs=[(0, 1)])
    epoch = ctx.become_leader()
    core = ctx.core
    status = core.status(ctx.now_ms)
    assert (status.state, status.epoch, status.leader_id) == (RaftState.LEADER, epoch, 1)
    assert status.role == (RaftState.LEADER, epoch, 1)
    assert (status.node_id, status.directory_id, status.cluster_id) == (1, DIRECTORY,
                                                                       core.cluster_id)
    assert status.voted_for == ReplicaKey(1, DIRECTORY) == core.election_state.voted_key
    assert status.is_voter and status.voters == core.voters
    assert (status.log_start_offset, status.log_end_offset, status.log_end_epoch) == (
        0, ctx.log.end_offset, epoch)
    assert status.flushed_offset == core.flushed_offset == ctx.log.end_offset
    assert status.high_watermark is None and not status.leader_has_committed
    assert status.quorum == core.describe_quorum(ctx.now_ms)
    assert status.as_of_ms == ctx.now_ms
    assert status.pending_voter_change is None and status.snapshot_id is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        status.epoch = 0  # type: ignore[misc]


def test_a_follower_status_has_no_record_of_the_replicas(make_ctx: MakeCtx) -> None:
    ctx = make_ctx(log_epochs=[(0, 1), (1, 1)])
    ctx.deliver_request(2, ctx.begin_quorum_request(2, 2))
    status = ctx.core.status(ctx.now_ms)
    assert status.role == (RaftState.FOLLOWER, 2, 2)
    assert status.quorum is None
    assert status.directory_id is None  # a static quorum's replica
    assert (status.log_end_offset, status.log_end_epoch) == (2, 1)
