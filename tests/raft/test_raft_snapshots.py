"""KIP-630 in the core: a Fetch below the log start is answered with the snapshot id, FetchSnapshot
serves byte ranges, and a follower downloads, checks and loads a snapshot, then fetches on from its
end (reference catalogue items 37-39)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from quorum_node.raft.memory_snapshots import MemorySnapshotStore
from quorum_node.raft.messages import (
    EpochEndOffset,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    SnapshotIdField,
)
from quorum_node.raft.records import Record
from quorum_node.raft.snapshot_format import encode_snapshot
from quorum_node.raft.snapshots import CorruptSnapshotError, SnapshotId
from quorum_node.raft.state import RaftState
from quorum_node.raft.types import MAX_OFFSET, Errors, ReplicaKey

U = {n: uuid.UUID(int=n) for n in range(1, 4)}
VOTERS = (ReplicaKey(1, U[1]), ReplicaKey(2, U[2]), ReplicaKey(3, U[3]))


def snapshot_bytes(count: int = 200) -> bytes:
    return encode_snapshot(VOTERS, 0, [Record(b"v%d" % i, b"k%d" % i) for i in range(count)])


@pytest.fixture
def leader(make_ctx: Callable[..., Any]) -> Any:
    """Node 1 leading 3 voters (known with directory ids) whose log below 20 is compacted into
    snapshot (20, epoch)."""
    ctx = make_ctx(1, (1, 2, 3), directory_ids=U)
    epoch = ctx.become_leader()
    for i in range(4):
        ctx.core.propose(ctx.now_ms, [Record(b"%d" % i)] * 5)
        ctx.advance(ctx.config.append_linger_ms + 1)
    ctx.flush()
    end = ctx.log.end_offset
    for node in (2, 3):
        ctx.deliver_one(node, ctx.fetch_request(node, epoch, end, epoch, max_wait_ms=0,
                                                directory_id=U[node]))
    assert ctx.core.high_watermark == end
    ctx.snapshot_id = SnapshotId(end, epoch)
    ctx.core.snapshots.save(ctx.snapshot_id, snapshot_bytes())
    ctx.log.delete_before(end)
    assert ctx.log.start_offset == end
    return ctx


def snapshot_request(ctx: Any, position: int, *, max_bytes: int = 100,
                     snapshot_id: SnapshotId | None = None) -> FetchSnapshotRequest:
    wanted = snapshot_id or ctx.snapshot_id
    return FetchSnapshotRequest(
        cluster_id="test-cluster", replica_id=2, replica_directory_id=U[2], max_bytes=max_bytes,
        current_leader_epoch=ctx.core.epoch,
        snapshot_id=SnapshotIdField(end_offset=wanted.end_offset, epoch=wanted.epoch),
        position=position)


def test_fetch_below_the_log_start_is_answered_with_the_snapshot_id(leader: Any) -> None:
    response = leader.deliver_one(2, leader.fetch_request(2, leader.core.epoch, 0, 0,
                                                          directory_id=U[2]))
    assert isinstance(response, FetchResponse)
    assert response.snapshot_id == SnapshotIdField(end_offset=leader.snapshot_id.end_offset,
                                                   epoch=leader.snapshot_id.epoch)
    assert response.records == b""


def test_fetch_at_the_snapshot_end_with_its_epoch_is_valid(leader: Any) -> None:
    sid = leader.snapshot_id
    response = leader.deliver_one(2, leader.fetch_request(2, leader.core.epoch, sid.end_offset,
                                                          sid.epoch, max_wait_ms=0,
                                                          directory_id=U[2]))
    assert response.snapshot_id is None and response.diverging_epoch is None


def test_fetch_snapshot_serves_byte_ranges(leader: Any) -> None:
    whole = snapshot_bytes()
    received = b""
    while len(received) < len(whole):
        response = leader.deliver_one(2, snapshot_request(leader, len(received)))
        assert isinstance(response, FetchSnapshotResponse)
        assert response.error_code is Errors.NONE and response.size == len(whole)
        assert response.position == len(received) and 0 < len(response.records) <= 100
        received += response.records
    assert received == whole


@pytest.mark.parametrize(
    ("position", "snapshot_id", "error"),
    [
        (10**9, None, Errors.POSITION_OUT_OF_RANGE),
        (-1, None, Errors.INVALID_REQUEST),
        (0, SnapshotId(7, 1), Errors.SNAPSHOT_NOT_FOUND),
    ],
)
def test_fetch_snapshot_errors(leader: Any, position: int, snapshot_id: SnapshotId | None,
                               error: Errors) -> None:
    response = leader.deliver_one(2, snapshot_request(leader, position, snapshot_id=snapshot_id))
    assert response.error_code is error


@pytest.fixture
def follower(make_ctx: Callable[..., Any]) -> Any:
    """Node 2, empty, following node 1 in epoch 3 after its first fetch was answered with a
    snapshot id."""
    ctx = make_ctx(2, (1, 2, 3), local_directory_id=U[2])
    ctx.deliver_one(1, ctx.begin_quorum_request(1, 3))
    ctx.snapshot_id = SnapshotId(50, 2)
    fetch = ctx.take_requests(FetchRequest, 1)[-1]
    ctx.deliver_response(fetch, FetchResponse(
        leader_id=1, leader_epoch=3, high_watermark=60, log_start_offset=50,
        snapshot_id=SnapshotIdField(end_offset=50, epoch=2)))
    return ctx


def serve_chunk(ctx: Any, data: bytes, *, size: int | None = None) -> FetchSnapshotRequest:
    request = ctx.take_request(FetchSnapshotRequest, 1)
    message = request.message
    assert isinstance(message, FetchSnapshotRequest)
    chunk = data[message.position: message.position + 64]
    ctx.deliver_response(request, FetchSnapshotResponse(
        leader_id=1, leader_epoch=3, snapshot_id=message.snapshot_id,
        size=len(data) if size is None else size, position=message.position, records=chunk))
    return message


def test_follower_downloads_and_loads_the_snapshot_then_fetches_on(follower: Any) -> None:
    ctx = follower
    data = snapshot_bytes()
    positions = []
    while ctx.pending_requests(FetchSnapshotRequest):
        positions.append(serve_chunk(ctx, data).position)
        ctx.poll()
    assert positions == list(range(0, len(data), 64))
    assert ctx.log.start_offset == ctx.log.end_offset == 50
    assert ctx.core.high_watermark == 50
    assert ctx.core.voters == VOTERS
    assert any(e.snapshot_loaded == ctx.snapshot_id for e in ctx.history)
    assert ctx.core.snapshots.latest() == ctx.snapshot_id
    fetch = ctx.take_requests(FetchRequest, 1)[-1].message
    assert (fetch.fetch_offset, fetch.last_fetch_epoch) == (50, 2)


def test_follower_restarts_the_download_when_the_snapshot_is_gone(follower: Any) -> None:
    ctx = follower
    serve_chunk(ctx, snapshot_bytes())
    request = ctx.take_request(FetchSnapshotRequest, 1)
    ctx.deliver_response(request, FetchSnapshotResponse(
        error_code=Errors.SNAPSHOT_NOT_FOUND, leader_id=1, leader_epoch=3))
    ctx.advance(ctx.config.retry_backoff_ms)  # an error answer backs off first
    assert ctx.take_requests(FetchRequest, 1)  # back to fetching: the answer names the new one
    assert ctx.core.snapshots.latest() is None
    assert ctx.state() is RaftState.FOLLOWER


def test_corrupt_snapshot_is_not_loaded(follower: Any) -> None:
    ctx = follower
    data = bytearray(snapshot_bytes())
    data[len(data) // 2] ^= 0xFF
    while ctx.pending_requests(FetchSnapshotRequest):
        serve_chunk(ctx, bytes(data))
        ctx.poll()
    assert ctx.core.snapshots.latest() is None
    # A snapshot answer validates nothing of the local log: no high watermark from it.
    assert ctx.log.end_offset == 0 and ctx.core.high_watermark is None
    assert ctx.core.refused_snapshots == 1
    assert not ctx.take_requests(FetchRequest, 1)  # backed off from, as from an error
    ctx.advance(ctx.config.retry_backoff_ms)
    assert ctx.take_requests(FetchRequest, 1)  # it fetches again, and will be sent a snapshot


def _refuse_bad_values(records: Iterator[Record]) -> None:
    """A state machine's check: it cannot load a record whose value is b"bad"."""
    for index, record in enumerate(records):
        if record.value == b"bad":
            raise CorruptSnapshotError(f"data record {index} is bad")


@pytest.mark.parametrize(("voters", "values"), [
    ((ReplicaKey(1, U[1]), ReplicaKey(2, U[2]), ReplicaKey(7, uuid.UUID(int=7))), [b"v"]),
    (VOTERS, [b"v", b"bad", b"v"]),
])
def test_a_snapshot_that_cannot_be_used_is_refused_and_the_log_kept(
    make_ctx: Callable[..., Any], voters: tuple[ReplicaKey, ...], values: list[bytes],
) -> None:
    """A leader's snapshot whose voter set names an id outside controller.quorum.voters (7),
    or holding a record the state machine cannot load, is refused whole before it is kept:
    the follower's log, voters and high watermark stay as they were, nothing is loaded, the
    refusal is counted, and it does not stop the node (it once replaced the log, then
    stopped the node, at every start too)."""
    ctx = make_ctx(2, (1, 2, 3), directory_ids=U, log_epochs=[(1, 5), (1, 5)],
                   check_snapshot_records=_refuse_bad_values)
    ctx.deliver_one(1, ctx.begin_quorum_request(1, 3))
    fetch = ctx.take_requests(FetchRequest, 1)[-1]
    ctx.deliver_response(fetch, FetchResponse(leader_id=1, leader_epoch=3, high_watermark=6))
    assert ctx.core.high_watermark == 6
    layout = ctx.log_layout()
    fetch = ctx.take_requests(FetchRequest, 1)[-1]
    ctx.deliver_response(fetch, FetchResponse(
        leader_id=1, leader_epoch=3, high_watermark=60, log_start_offset=50,
        snapshot_id=SnapshotIdField(end_offset=50, epoch=2)))
    data = encode_snapshot(voters, 0, [Record(value, b"k") for value in values])
    while ctx.pending_requests(FetchSnapshotRequest):
        serve_chunk(ctx, data)
        ctx.poll()
    assert ctx.core.refused_snapshots == 1
    assert ctx.core.snapshots.latest() is None
    assert not any(e.snapshot_loaded for e in ctx.history)
    assert ctx.log_layout() == layout and ctx.log.start_offset == 0
    assert ctx.core.high_watermark == 6
    assert ctx.core.voters == VOTERS
    assert ctx.state() is RaftState.FOLLOWER


def test_a_refused_snapshot_does_not_reset_the_fetch_timer(follower: Any) -> None:
    """A leader that only ever sends snapshots that cannot be used is, like one that answers
    nonsense, replaced by an election: the last chunk counts as hearing from it only once the
    snapshot is kept (earlier chunks count: a large download is progress)."""
    ctx = follower
    data = bytearray(snapshot_bytes())
    data[-20] ^= 0xFF
    started = ctx.now_ms
    while len(ctx.pending_requests(FetchSnapshotRequest)) and \
            ctx.pending_requests(FetchSnapshotRequest)[0].message.position + 64 < len(data):
        serve_chunk(ctx, bytes(data))
        ctx.poll()
    ctx.advance(ctx.config.fetch_timeout_ms // 2)
    serve_chunk(ctx, bytes(data))
    assert ctx.core.refused_snapshots == 1
    ctx.advance_to(started + ctx.config.fetch_timeout_ms * 11 // 10 + 1)
    assert ctx.state() is RaftState.PROSPECTIVE


def test_after_a_restart_the_latest_snapshot_bounds_truncation(
    make_ctx: Callable[..., Any],
) -> None:
    """The high watermark is not persisted: a restarted follower learns it from its leader's
    first answer. Before, a leader's word could truncate its log to anything; the end of its
    latest snapshot (only ever of committed records) now bounds that: a diverging epoch below
    it, or a snapshot ending before it, is dropped, the log kept."""
    snapshots = MemorySnapshotStore()
    snapshots.save(SnapshotId(20, 1), snapshot_bytes())
    ctx = make_ctx(2, (1, 2, 3), directory_ids=U, log_epochs=[(1, 20), (2, 10)],
                   snapshots=snapshots)
    ctx.deliver_one(1, ctx.begin_quorum_request(1, 3))
    assert ctx.core.high_watermark is None
    layout = ctx.log_layout()
    fetch = ctx.take_requests(FetchRequest, 1)[-1]
    ctx.deliver_response(fetch, FetchResponse(
        leader_id=1, leader_epoch=3, diverging_epoch=EpochEndOffset(epoch=1, end_offset=10)))
    ctx.advance(ctx.config.retry_backoff_ms)
    fetch = ctx.take_requests(FetchRequest, 1)[-1]
    ctx.deliver_response(fetch, FetchResponse(
        leader_id=1, leader_epoch=3, snapshot_id=SnapshotIdField(end_offset=15, epoch=1)))
    ctx.advance(ctx.config.retry_backoff_ms)
    assert not ctx.pending_requests(FetchSnapshotRequest)
    assert ctx.log_layout() == layout
    # At the snapshot's end it is the truncation Raft asks for: the tail of epoch 2 goes.
    fetch = ctx.take_requests(FetchRequest, 1)[-1]
    ctx.deliver_response(fetch, FetchResponse(
        leader_id=1, leader_epoch=3, diverging_epoch=EpochEndOffset(epoch=1, end_offset=20)))
    assert ctx.log.end_offset == 20


def test_a_snapshot_id_past_the_offset_bound_is_dropped(make_ctx: Callable[..., Any]) -> None:
    """A snapshot moves the log's end to its own: one ending at 2^63 - 1 once left the
    replica that installed it unable to append (its first batch as leader overflowed the
    int64 offset, and the node stopped, at every start). Past MAX_OFFSET it is not fetched."""
    ctx = make_ctx(2, (1, 2, 3), directory_ids=U)
    ctx.deliver_one(1, ctx.begin_quorum_request(1, 3))
    for end_offset in (2**63 - 1, MAX_OFFSET + 1):
        fetch = ctx.take_requests(FetchRequest, 1)[-1]
        ctx.deliver_response(fetch, FetchResponse(
            leader_id=1, leader_epoch=3, snapshot_id=SnapshotIdField(end_offset=end_offset,
                                                                    epoch=3)))
        assert not ctx.pending_requests(FetchSnapshotRequest)
        ctx.advance(ctx.config.retry_backoff_ms)
    fetch = ctx.take_requests(FetchRequest, 1)[-1]
    ctx.deliver_response(fetch, FetchResponse(
        leader_id=1, leader_epoch=3, snapshot_id=SnapshotIdField(end_offset=MAX_OFFSET, epoch=3)))
    assert ctx.pending_requests(FetchSnapshotRequest)
