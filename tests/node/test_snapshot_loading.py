"""Where and when the node loads its store's snapshot: at start-up before the core (and its
clock) exists, so that a long load is not taken for the leader's silence; and, once the core has
replaced the log by a snapshot from the leader, in a thread, the loop going on meanwhile."""

from __future__ import annotations

import asyncio
import gc
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_admin_api import shutdown
from test_state_machine import _single_node, _wait

from quorum_node.kv.machine import SnapshotPlan
from quorum_node.kv.ops import Put, encode_op
from quorum_node.kv.snapshot_data import Entry, SnapshotEntries, snapshot_records
from quorum_node.kv.store import KvStore
from quorum_node.node.main import tune_garbage_collector
from quorum_node.node.wiring import build_node
from quorum_node.raft.records import RecordBatch
from quorum_node.raft.snapshot_format import encode_snapshot_batches, iter_snapshot_records
from quorum_node.raft.snapshots import SnapshotId
from quorum_node.raft.state import RaftState
from quorum_node.storage.snapshot_store import CHECKPOINT_SUFFIX, PART_SUFFIX

KEYS = 150_000


class LoopStalls:
    """The longest the event loop went without running a task of 1 ms sleeps, while the
    ``async with`` body ran, and how long it ran."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.took = 0.0
        self._ticker: asyncio.Future[None] | None = None

    async def __aenter__(self) -> LoopStalls:
        self._started = self._last_tick = time.perf_counter()
        self._ticker = asyncio.ensure_future(self._tick())
        return self

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0.001)
            self._note()

    def _note(self) -> None:
        now = time.perf_counter()
        self.longest = max(self.longest, now - self._last_tick)
        self._last_tick = now

    async def __aexit__(self, *_: object) -> None:
        self._note()
        self.took = time.perf_counter() - self._started
        assert self._ticker is not None
        self._ticker.cancel()


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
        async with LoopStalls() as stalls:
            assert await node.state_machine.snapshots.load_downloaded()
        store = node.state_machine.store
        assert store.next_offset == end_offset and len(store) == KEYS
        assert store.get(f"key-{KEYS - 1:07d}") == "value"
        assert stalls.longest < stalls.took / 3, (stalls.longest, stalls.took)
    finally:
        node.log_dir.close()


@pytest.fixture
def collector_as_in_a_node() -> Iterator[None]:
    """The cyclic collector as a node's main sets it once the node runs: what was built before
    frozen (here the test process's own objects, which a full collection would walk in the
    middle of a measured write), and young collections further apart."""
    thresholds = gc.get_threshold()
    tune_garbage_collector()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("collector_as_in_a_node")
async def test_a_snapshot_is_written_while_the_loop_goes_on(tmp_path: Path) -> None:
    """The loop copies the map and its key list; laying the entries out, encoding and writing
    them is the thread's, and no call of it holds the interpreter long (the loop waits for it
    meanwhile). The map here took its keys in another order than theirs, as most do: sorting
    its entries in one call held the loop for most of the write."""
    node = _single_node(tmp_path)  # not started: its store and snapshots only
    try:
        keys = [f"key-{index:07d}" for index in range(KEYS)]
        random.Random(7).shuffle(keys)
        store = node.state_machine.store
        store.apply_batch(RecordBatch(base_offset=0, epoch=1, records=tuple(
            encode_op(Put(key, "value")) for key in keys)))
        snapshots = node.state_machine.snapshots
        async with LoopStalls() as stalls:
            snapshots.write(SnapshotPlan(SnapshotId(KEYS, 1), None, 0,
                                         store.snapshot_entries(), 0))
            await _wait(lambda: node.log_dir.snapshots.latest() is not None, "the snapshot")
        assert stalls.longest < stalls.took / 3, (stalls.longest, stalls.took)
        saved = node.log_dir.snapshots
        snapshot_id = SnapshotId(KEYS, 1)
        size = saved.size(snapshot_id)
        assert size is not None
        loaded = KvStore()
        loaded.load_snapshot(iter_snapshot_records(saved.read(snapshot_id, 0, size)), KEYS)
        assert loaded.items() == store.items()
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
