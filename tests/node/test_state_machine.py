"""The KV state machine is the runtime's: a node that serves no HTTP API at all applies the
committed log to its store, snapshots it and compacts its log, and KvService works on it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from test_admin_api import FAST, free_port, shutdown

from quorum_node.kv.ops import Compare, Put, Txn, encode_op
from quorum_node.node.config import NodeConfig
from quorum_node.node.errors import ErrorCode, ServiceError
from quorum_node.node.kv_service import KvService
from quorum_node.node.runtime import QuorumNode
from quorum_node.node.wiring import build_node
from quorum_node.raft.config import VoterEndpoint
from quorum_node.raft.records import Record
from quorum_node.raft.state import RaftState
from quorum_node.storage.meta_properties import format_log_dir, random_cluster_id


async def _wait(condition: object, what: str, timeout_s: float = 10) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def _single_node(tmp_path: Path, **settings: int) -> QuorumNode:
    cluster_id = random_cluster_id()
    log_dir = tmp_path / "node-1"
    format_log_dir(log_dir, cluster_id, 1)
    port = free_port()
    return build_node(NodeConfig(
        node_id=1, cluster_id=cluster_id, log_dir=log_dir, listeners=f"127.0.0.1:{port}",
        voters=(VoterEndpoint(id=1, host="127.0.0.1", port=port),), quorum=FAST, **settings))


async def test_a_node_without_an_api_applies_snapshots_and_compacts(tmp_path: Path) -> None:
    node = _single_node(tmp_path, snapshot_interval_records=10, segment_bytes=512)
    await node.start()  # no application: peers' routes only
    try:
        await _wait(lambda: node.core.state is RaftState.LEADER
                    and node.core.high_watermark is not None, "a leader")
        for index in range(30):
            await node.append([encode_op(Put(f"key-{index}", "value"))], timeout_s=5)
        store = node.state_machine.store
        await _wait(lambda: store.get("key-29") == "value", "the store to apply every put")
        await _wait(lambda: node.log_dir.snapshots.latest() is not None, "a snapshot")
        await _wait(lambda: node.log_dir.log.start_offset > 0, "the log compacted")
    finally:
        await shutdown(node, timeout_s=2)


async def test_kv_service_raises_plain_errors(tmp_path: Path) -> None:
    node = _single_node(tmp_path)
    await node.start()
    try:
        await _wait(lambda: node.core.state is RaftState.LEADER
                    and node.core.high_watermark is not None, "a leader")
        service = KvService(node)
        written = await service.put("colour", "blue", timeout_s=5)
        assert written.applied and written.key == "colour"
        found = await service.get("colour", stale=False, timeout_s=5)
        assert found.value == "blue" and found.applied_offset >= written.offset
        assert (await service.get("absent", stale=True, timeout_s=5)).value is None
        cas = await service.cas("colour", "red", "green", timeout_s=5)
        assert not cas.applied
        with pytest.raises(ServiceError) as bad:
            await service.put("", "x", timeout_s=5)
        assert bad.value.code is ErrorCode.BAD_REQUEST
        with pytest.raises(ServiceError) as compacted:
            node.state_machine.store.events_start = 10**6
            await service.watch(0, key="colour")
        assert compacted.value.code is ErrorCode.COMPACTED
    finally:
        await shutdown(node, timeout_s=2)


async def test_txns_count_their_operations_towards_a_snapshot_which_keeps_versions(
        tmp_path: Path) -> None:
    """Two txns of 20 puts are 40 operations: a snapshot is due at 30; a restart over it knows
    each key's version and modification offset."""
    node = _single_node(tmp_path, snapshot_interval_records=30)
    await node.start()
    try:
        await _wait(lambda: node.core.state is RaftState.LEADER
                    and node.core.high_watermark is not None, "a leader")
        service = KvService(node)
        puts = tuple(Put(f"t-{index}", "1") for index in range(20))
        first = await service.txn(Txn((), puts, ()), timeout_s=5)
        second = await service.txn(Txn((Compare("t-0", "version", "=", 1),), puts, ()),
                                   timeout_s=5)
        assert second.succeeded
        await _wait(lambda: node.log_dir.snapshots.latest() is not None, "a snapshot")
    finally:
        await shutdown(node, timeout_s=2)
    restarted = build_node(node.config)
    await restarted.start()
    try:
        store = restarted.state_machine.store
        await _wait(lambda: store.get("t-19") == "1", "the store loaded")
        assert store.meta("t-3") == (second.offset, 2)
        assert first.offset < second.offset
    finally:
        await shutdown(restarted, timeout_s=2)


async def test_a_leader_applies_a_write_in_the_step_that_commits_it(tmp_path: Path) -> None:
    """No wake-up of the applier between a write's commit and its answer: when the append's
    waiter resumes, the store holds the write already, so KvService answers without a wait."""
    node = _single_node(tmp_path)
    await node.start()
    try:
        await _wait(lambda: node.core.state is RaftState.LEADER
                    and node.core.high_watermark is not None, "a leader")
        store = node.state_machine.store
        for index in range(20):
            first, _, _ = await node.append([encode_op(Put(f"key-{index}", "value"))], timeout_s=5)
            assert store.next_offset > first and store.get(f"key-{index}") == "value"
    finally:
        await shutdown(node, timeout_s=2)


async def test_appends_of_one_turn_are_proposed_together(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The appends that reach the leader in one turn of its loop: the first goes to the core at
    once, those after it in one step between them; each commits at its own offsets, and a
    refused one (too large for a batch) fails alone."""
    node = _single_node(tmp_path)
    await node.start()
    try:
        await _wait(lambda: node.core.state is RaftState.LEADER
                    and node.core.high_watermark is not None, "a leader")
        gathered: list[int] = []
        propose_each = node.core.propose_each

        def counted(now_ms: int, proposals: Sequence[Sequence[Record]]
                    ) -> list[tuple[int, int] | Exception]:
            gathered.append(len(proposals))
            return propose_each(now_ms, proposals)

        monkeypatch.setattr(node.core, "propose_each", counted)
        too_large = [Record(b"x" * (node.core.config.max_batch_bytes + 1))]
        puts = [[encode_op(Put(f"key-{index}", "value"))] for index in range(8)]
        outcomes = await asyncio.gather(
            *(node.append(records, timeout_s=5) for records in puts[:4]),
            node.append(too_large, timeout_s=5),
            *(node.append(records, timeout_s=5) for records in puts[4:]),
            return_exceptions=True)
        assert gathered == [8]  # the first went alone; the other seven and the refused one
        refused = outcomes.pop(4)
        assert isinstance(refused, ValueError)
        offsets = [outcome.first_offset for outcome in outcomes
                   if not isinstance(outcome, BaseException)]
        assert len(offsets) == 8 and offsets == list(range(offsets[0], offsets[0] + 8))
        store = node.state_machine.store
        await _wait(lambda: store.get("key-7") == "value", "the store to apply every put")
        assert all(store.get(f"key-{index}") == "value" for index in range(8))
    finally:
        await shutdown(node, timeout_s=2)
