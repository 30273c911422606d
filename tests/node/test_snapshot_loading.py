"""Where and when the node loads its store's snapshot: at start-up before the core (and its
clock) exists, so that a long load is not taken for the leader's silence; and, once the core has
replaced the log by a snapshot from the leader, in a thread, the loop going on meanwhile."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from test_admin_api import shutdown
from test_state_machine import _single_node, _wait

from quorum_node.kv.machine import SnapshotPlan
from quorum_node.kv.ops import Put, encode_op
from quorum_node.kv.snapshot_data import Entry, SnapshotEntries, snapshot_records
from quorum_node.node.wiring import build_node
from quorum_node.raft.snapshot_format import encode_snapshot_batches
from quorum_node.raft.snapshots import SnapshotId
from quorum_node.raft.state import RaftState
from quorum_node.storage.snapshot_store import CHECKPOINT_SUFFIX, PART_SUFFIX

KEYS = 150_000


async def test_a_restarted_node_holds_its_snapshot_before_its_core_runs(tmp_path: Path) -> None:
    node = _single_node(tmp_path, snapshot_interval_records=10)
    await node.start()
    try:
        await _wait(lambda: node.core.state is RaftState.LEADER
                    and node.core.high_watermark is not None, "a leader")
        for index in range(20):
            await node.append([encode_op(Put(f"key-{index}", "value"))], timeout_s=5)
        await _wait(lambda: node.log_dir.snapshots.latest() is not None, "a snapshot")
    finally:
        await shutdown(node, timeout_s=2)
    restarted = build_node(node.config)  # not started: no timer, no applier yet
    try:
        snapshot = restarted.log_dir.snapshots.latest()
        assert snapshot is not None
        store = restarted.state_machine.store
        assert store.next_offset == snapshot.end_offset
        assert store.get("key-0") == "value"
    finally:
        restarted.log_dir.close()


async def test_a_downloaded_snapshot_is_loaded_while_the_loop_goes_on(tmp_path: Path) -> None:
    """The store's map is built in a thread: the loop's longest stall while a snapshot of many
    keys loads is a small part of the load (loaded on the loop, it was all of it)."""
    node = _single_node(tmp_path)  # not started: its store and snapshots only
    try:
        end_offset = 10
        entries: dict[str, Entry] = {f"key-{index:07d}": ("value", 5, 1)
                                     for index in range(KEYS)}
        node.log_dir.snapshots.save_batches(
            SnapshotId(end_offset, 1),
            encode_snapshot_batches(None, 0, snapshot_records(SnapshotEntries.of(entries, 0))))
        stalls: list[float] = []
        last_tick = [time.perf_counter()]

        async def tick() -> None:
            while True:
                await asyncio.sleep(0.001)
                now = time.perf_counter()
                stalls.append(now - last_tick[0])
                last_tick[0] = now

        ticker = asyncio.ensure_future(tick())
        started = time.perf_counter()
        try:
            assert await node.state_machine.snapshots.load_downloaded()
        finally:
            took = time.perf_counter() - started
            stalls.append(time.perf_counter() - last_tick[0])
            ticker.cancel()
        store = node.state_machine.store
        assert store.next_offset == end_offset and len(store) == KEYS
        assert store.get(f"key-{KEYS - 1:07d}") == "value"
        assert max(stalls) < took / 3, (max(stalls), took)
    finally:
        node.log_dir.close()


async def test_a_stopped_node_leaves_no_snapshot_writing_behind(tmp_path: Path) -> None:
    """Stopping gives up a snapshot being written and waits for the thread writing it: once
    the node has stopped, nothing of it is left in the directory, and nothing writes there (its
    lock is let go next, and a restarted node scans the directory)."""
    node = _single_node(tmp_path)  # not started: its store and snapshots only
    directory = node.log_dir.snapshots.directory

    def snapshot_files() -> list[str]:
        return sorted(path.name for path in directory.iterdir() if CHECKPOINT_SUFFIX in path.name)

    try:
        entries: dict[str, Entry] = {f"key-{index:07d}": ("value", 5, 1)
                                     for index in range(KEYS)}
        snapshots = node.state_machine.snapshots
        snapshots.write(SnapshotPlan(SnapshotId(10, 1), None, 0,
                                     SnapshotEntries.of(entries, 0), 0))
        await _wait(lambda: any(name.endswith(PART_SUFFIX) for name in snapshot_files()),
                    "a snapshot being written")
        await node.state_machine.stop()
        assert snapshot_files() == []
        await asyncio.sleep(0.3)
        assert snapshot_files() == []
        assert node.log_dir.snapshots.latest() is None
    finally:
        node.log_dir.close()
