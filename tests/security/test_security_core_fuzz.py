"""Hostile peer requests against the Raft core: any Vote, BeginQuorumEpoch, EndQuorumEpoch,
Fetch or FetchSnapshot, with any ids, epochs, offsets (negative, huge), cluster ids and
directory ids, must be answered (an error code at worst) and never raise out of the core, which
would stop the node. The core starts as a leader with a log, and as a follower."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from fuzz_support import FUZZ_EXAMPLES, TALLY
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quorum_node.raft.config import QuorumConfig
from quorum_node.raft.core import OutboundResponse, RaftCore
from quorum_node.raft.log import MemoryLog
from quorum_node.raft.memory_snapshots import MemorySnapshotStore
from quorum_node.raft.messages import (
    BeginQuorumEpochRequest,
    EndQuorumEpochRequest,
    FetchRequest,
    FetchSnapshotRequest,
    Message,
    RaftRequest,
    ReplicaInfo,
    SnapshotIdField,
    VoteRequest,
)
from quorum_node.raft.records import Record
from quorum_node.raft.state import ElectionState, RaftState
from quorum_node.raft.types import ReplicaKey

M = TypeVar("M", bound=Message)
CLUSTER = "fuzz-cluster"
DIRS = {i: uuid.UUID(int=i) for i in (1, 2, 3)}
CONFIG = QuorumConfig(election_timeout_ms=100, fetch_timeout_ms=200, request_timeout_ms=500,
                      fetch_max_wait_ms=0, append_linger_ms=0)

# Mostly near the core's own numbers (where the logic branches), sometimes anything at all.
# (Anything beyond Kafka's int32/int64 wire types is refused when a frame is decoded; epochs up
# to the int32 maximum reach the core, which must refuse those it cannot adopt.)
small = st.integers(-2, 12)
offsets = small | small | st.integers(-(2**63), 2**63 - 1)
epochs = small | small | st.integers(-(2**31), 2**31 - 1)
int32s = st.integers(-(2**31), 2**31 - 1)
node_ids = st.integers(-1, 5) | int32s
uuids = st.none() | st.sampled_from(list(DIRS.values())) | st.uuids()
cluster_ids = st.sampled_from([CLUSTER, CLUSTER, None, "other", ""])

def by_name(cls: type[M]) -> Callable[..., M]:
    # Hypothesis builds pydantic models from their aliases; these are field names.
    def build(**fields: Any) -> M:
        return cls(**fields)

    return build


requests: st.SearchStrategy[RaftRequest] = st.one_of(
    st.builds(by_name(VoteRequest), cluster_id=cluster_ids, voter_id=node_ids,
              voter_directory_id=uuids, replica_epoch=epochs, replica_id=node_ids,
              replica_directory_id=uuids, last_offset_epoch=epochs, last_offset=offsets,
              pre_vote=st.booleans()),
    st.builds(by_name(BeginQuorumEpochRequest), cluster_id=cluster_ids, leader_id=node_ids,
              leader_epoch=epochs, voter_id=node_ids, voter_directory_id=uuids),
    st.builds(by_name(EndQuorumEpochRequest), cluster_id=cluster_ids, leader_id=node_ids,
              leader_epoch=epochs, voter_id=node_ids, voter_directory_id=uuids,
              preferred_successors=st.lists(st.builds(
                  by_name(ReplicaInfo), replica_id=node_ids, replica_directory_id=uuids),
                  max_size=3).map(tuple)),
    st.builds(by_name(FetchRequest), cluster_id=cluster_ids, replica_id=node_ids,
              replica_directory_id=uuids, max_wait_ms=st.integers(-5, 50) | int32s,
              current_leader_epoch=epochs, fetch_offset=offsets, last_fetch_epoch=epochs,
              high_watermark=st.none() | offsets, max_bytes=st.integers(-5, 1 << 20) | int32s),
    st.builds(by_name(FetchSnapshotRequest), cluster_id=cluster_ids, replica_id=node_ids,
              replica_directory_id=uuids, max_bytes=st.integers(-5, 1 << 20) | int32s,
              current_leader_epoch=epochs,
              snapshot_id=st.builds(by_name(SnapshotIdField), end_offset=offsets,
                                    epoch=epochs),
              position=offsets),
)


def leader_core() -> tuple[RaftCore, int]:
    """A single voter (node 1) that elected itself and committed a few records; nodes 2 and 3
    fetch as observers."""
    core = RaftCore(node_id=1, directory_id=DIRS[1], cluster_id=CLUSTER,
                    voters=[ReplicaKey(1)], log=MemoryLog(), election_state=None,
                    config=CONFIG, random=random.Random(7), now_ms=0,
                    snapshots=MemorySnapshotStore())
    now = 0
    for _ in range(100):
        now = min(max(now + 1, core.next_deadline_ms()), now + 1000)
        core.poll(now)
        settle(core, now)
        if core.state is RaftState.LEADER and core.accepts_writes:
            break
    assert core.state is RaftState.LEADER, core.state
    core.propose(now, [Record(value=b"v%d" % i) for i in range(3)])
    settle(core, now)
    return core, now


def follower_core() -> tuple[RaftCore, int]:
    core = RaftCore(node_id=1, directory_id=DIRS[1], cluster_id=CLUSTER,
                    voters=[ReplicaKey(i) for i in (1, 2, 3)], log=MemoryLog(),
                    election_state=ElectionState(3, 2, None), config=CONFIG,
                    random=random.Random(7), now_ms=0, snapshots=MemorySnapshotStore())
    settle(core, 0)
    return core, 0


def settle(core: RaftCore, now: int) -> list[Any]:
    """Take the effects, flushing when asked (as the node's flusher does); the responses."""
    log = core.log
    assert isinstance(log, MemoryLog)  # as leader_core and follower_core build it
    responses: list[Any] = []
    for _ in range(10):
        effects = core.take_effects()
        responses += [m for m in effects.messages if isinstance(m, OutboundResponse)]
        if not effects.flush:
            break
        core.handle_flushed(now, log.flush())
    return responses


FUZZ = settings(max_examples=FUZZ_EXAMPLES * 4, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(start=st.sampled_from(["leader", "follower"]),
       batch=st.lists(st.tuples(requests, st.integers(0, 300)), min_size=1, max_size=8))
def test_hostile_requests_never_break_the_core(start: str,
                                               batch: list[tuple[RaftRequest, int]]) -> None:
    core, now = leader_core() if start == "leader" else follower_core()
    for correlation, (request, advance) in enumerate(batch, start=1):
        now += advance
        TALLY["peer requests"] += 1
        core.handle_request(now, 2, correlation, request)
        answered = settle(core, now)
        core.poll(now)  # a parked fetch is answered on a later poll, or at once
        answered += settle(core, now)
        if not (isinstance(request, FetchRequest) and core.state is RaftState.LEADER):
            assert any(r.correlation_id == correlation for r in answered), request
