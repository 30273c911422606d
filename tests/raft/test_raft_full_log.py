"""A leader whose log's disk is full: it never stops the node for its own control records. A
new leader that cannot write its epoch's LeaderChange hands the epoch on at once; a voter change
waits for space (within its deadline) rather than failing the core."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from quorum_node.raft.log import LogFullError, MemoryLog
from quorum_node.raft.messages import EndQuorumEpochRequest
from quorum_node.raft.records import Record, RecordBatch
from quorum_node.raft.state import RaftState
from quorum_node.raft.types import ReplicaKey
from quorum_node.raft.voters import voters_record

if TYPE_CHECKING:
    from context import RaftTestContext

    MakeCtx = Callable[..., RaftTestContext]


class FullLog(MemoryLog):
    """A memory log whose appends fail, as a full disk's do, while ``full`` is set."""

    full = False

    def append_as_leader(self, records: Sequence[Record], epoch: int, timestamp_ms: int,
                         is_control: bool = False) -> RecordBatch:
        if self.full:
            raise LogFullError("no space left for an append (No space left on device)")
        return super().append_as_leader(records, epoch, timestamp_ms, is_control)


def _full(ctx: RaftTestContext) -> FullLog:
    ctx.log.__class__ = FullLog  # the same log, its appends now able to fail
    log = ctx.log
    assert isinstance(log, FullLog)
    return log


def test_a_leader_elected_on_a_full_disk_resigns_instead_of_stopping(make_ctx: MakeCtx) -> None:
    ctx = make_ctx(1, [1, 2, 3])
    log = _full(ctx)
    log.full = True
    ctx.expire_election_timer()
    ctx.grant_pre_votes(2)
    ctx.grant_votes(2)  # wins epoch 1, cannot write its LeaderChange
    assert ctx.state() is RaftState.RESIGNED
    assert ctx.core.epoch == 1 and log.end_offset == 0
    ctx.poll()
    assert {r.destination for r in ctx.take_requests(EndQuorumEpochRequest)} == {2, 3}


def test_a_voter_change_waits_for_space_and_is_appended_when_it_comes(
        make_ctx: MakeCtx) -> None:
    dirs = {1: uuid.uuid4(), 2: uuid.uuid4(), 3: uuid.uuid4()}
    ctx = make_ctx(1, [1, 2, 3], directory_ids=dirs)
    epoch = ctx.become_leader()
    log = _full(ctx)
    end = log.end_offset
    for voter in (2, 3):  # both followers caught up: the change may be appended
        ctx.deliver_one(voter, ctx.fetch_request(voter, epoch, end, epoch, max_wait_ms=0))
    removed = ReplicaKey(3, dirs[3])
    log.full = True
    ctx.core.remove_voter(ctx.now_ms, removed, 60_000, decommission=True)
    ctx.collect()
    ctx.advance(10)
    assert ctx.state() is RaftState.LEADER and log.end_offset == end
    log.full = False
    ctx.advance(10)
    assert log.end_offset == end + 1
    assert log.batches[-1].records[0].value == \
        voters_record((ReplicaKey(1, dirs[1]), ReplicaKey(2, dirs[2]))).value
