"""Snapshots of the key-value state machine (KIP-630) on the node's disk: writing one, loading one.

When to snapshot, what a snapshot holds and how far the log is then compacted are the
synchronous machine's (``quorum_node.kv.machine.KvMachine``, the simulator's too); this is its
I/O. Every ``snapshot.interval.records`` applied records (as the policy counts them) the map is
written, as of the offset it has applied (always committed, always at a batch boundary), with
the voter set in force there, in a thread. The log below the snapshot is then deleted, keeping
``snapshot.retained.log.records`` records for followers that are only a little behind. The store
starts from the latest snapshot on disk (``load_latest``, before the node's core and timers
exist), and loads the snapshot the core downloaded from the leader when the core says so
(``load_downloaded``: built in a thread, swapped in on the loop, so that the node goes on serving
its peers meanwhile).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from quorum_node.kv.machine import KvMachine, SnapshotPlan
from quorum_node.kv.snapshot_data import LoadedSnapshot
from quorum_node.raft.records import read_batch_header
from quorum_node.raft.snapshots import SnapshotId
from quorum_node.raft.voters import VoterSet

if TYPE_CHECKING:
    from quorum_node.node.config import NodeConfig
    from quorum_node.storage.log_dir import LogDirectory

logger = logging.getLogger(__name__)


class SnapshotHost(Protocol):
    """What snapshots need of the node (``QuorumNode``): its settings, log directory and voter
    sets."""

    @property
    def config(self) -> NodeConfig: ...

    @property
    def log_dir(self) -> LogDirectory: ...

    def voters_at(self, offset: int) -> VoterSet: ...


class SnapshotWriteStopped(Exception):
    """The node stopped while a snapshot was being written: the write was given up."""


class KvSnapshots:
    def __init__(self, node: SnapshotHost, machine: KvMachine) -> None:
        self.node = node
        self.machine = machine
        self._task: asyncio.Task[None] | None = None
        # Set by stop(): the thread writing a snapshot gives up at its next batch.
        self._stopping = threading.Event()

    def _latest_ahead(self) -> tuple[SnapshotId, bytes] | None:
        """The latest snapshot and its bytes, if the store has not applied up to it."""
        snapshots = self.node.log_dir.snapshots
        latest = snapshots.latest()
        if latest is None or latest.end_offset <= self.machine.next_offset:
            return None
        size = snapshots.size(latest)
        assert size is not None
        return latest, snapshots.read(latest, 0, size)

    def load_latest(self) -> bool:
        """Load the latest snapshot if the store has not applied up to it, here and now (at
        start-up, before anything else runs on the node). True if loaded."""
        ahead = self._latest_ahead()
        if ahead is None:
            return False
        started = time.perf_counter()
        snapshot_id, data = ahead
        # Batches are decoded as the store reads them; it replaces its map only once the
        # footer is reached, every batch checked.
        return self._install(snapshot_id, KvMachine.build_snapshot(snapshot_id, data),
                             len(data), started)

    async def load_downloaded(self) -> bool:
        """Load the latest snapshot (the core replaced the log by one from the leader) if the
        store has not applied up to it. The new map is built in a thread, the loop going on
        meanwhile, and swapped in on the loop. True if loaded."""
        ahead = self._latest_ahead()
        if ahead is None:
            return False
        started = time.perf_counter()
        snapshot_id, data = ahead
        loaded = await asyncio.to_thread(KvMachine.build_snapshot, snapshot_id, data)
        # The machine's guard: the applier, which applies below the log's start only, waited.
        return self._install(snapshot_id, loaded, len(data), started)

    def _install(self, snapshot_id: SnapshotId, loaded: LoadedSnapshot, size: int,
                 started: float) -> bool:
        if not self.machine.install(snapshot_id, loaded):
            return False
        logger.info("node %d: loaded snapshot %s (%d keys, %d bytes) in %.3f s",
                    self.node.config.node_id, snapshot_id, len(self.machine.store), size,
                    time.perf_counter() - started)
        return True

    def maybe_start_writing(self) -> None:
        """Start writing a snapshot in the background if enough has been applied since the
        last one (the applier goes on meanwhile: a snapshot is of the map as it is now)."""
        machine = self.machine
        if self._task is not None or not machine.snapshot_due:
            return
        end = machine.next_offset
        log = self.node.log_dir.log
        if end - 1 < log.start_offset:
            return
        plan = machine.plan_snapshot(read_batch_header(log.read(end - 1, 1), verify_crc=False),
                                     self.node.voters_at(end - 1))
        if plan is None:
            return  # not at a batch boundary: try again after the next batch
        self.write(plan)

    def write(self, plan: SnapshotPlan) -> None:
        """Write ``plan`` in the background, then compact the log below it."""
        task = asyncio.ensure_future(self._write(plan))
        self._task = task
        task.add_done_callback(self._written)

    async def _write(self, plan: SnapshotPlan) -> None:
        started = time.perf_counter()
        snapshots = self.node.log_dir.snapshots
        snapshot_id = plan.snapshot_id
        # Sorted, encoded and written in the thread, a batch at a time.
        await asyncio.to_thread(snapshots.save_batches, snapshot_id,
                                self._until_stopped(plan.batches()))
        size = snapshots.size(snapshot_id)
        snapshots.delete_before(snapshot_id)
        log = self.node.log_dir.log
        log.delete_before(self.machine.snapshot_written(
            plan, self.node.config.snapshot_retained_log_records))
        logger.info("node %d: wrote snapshot %s (%d keys, %d bytes) in %.3f s; the log starts "
                    "at %d", self.node.config.node_id, snapshot_id, len(plan.content.entries),
                    size, time.perf_counter() - started, log.start_offset)

    def _until_stopped(self, batches: Iterable[bytes]) -> Iterator[bytes]:
        """``batches`` until the node stops: the store then removes the ``.part`` file it was
        writing (a cancelled wait would leave its thread writing on, into a directory the node
        has let go of)."""
        for batch in batches:
            if self._stopping.is_set():
                raise SnapshotWriteStopped("the node is stopping")
            yield batch

    def _written(self, task: asyncio.Task[None]) -> None:
        self._task = None
        error = None if task.cancelled() else task.exception()
        if error is not None and not isinstance(error, SnapshotWriteStopped):
            # A failed snapshot loses nothing (the log is only deleted after it is saved).
            logger.error("node %d: writing a snapshot failed: %s", self.node.config.node_id,
                         error)

    async def stop(self) -> None:
        """Give up a snapshot being written and wait for its thread: once this returns, nothing
        of it writes into the log directory."""
        self._stopping.set()
        task = self._task
        if task is not None:
            await asyncio.wait([task])
