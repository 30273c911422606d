"""Snapshots of the key-value state machine (KIP-630): when to write one, how to load one.

The state machine, not the Raft core, decides when to snapshot: every
``snapshot.interval.records`` applied records (and no more often than it has applied a quarter
as many records as the map has keys; a txn counts as many records as it has operations, what
replaying it costs) it writes its map, as of the offset it has applied
(always committed, always at a batch boundary), with the voter set in force there. That policy
is ``quorum_node.raft.snapshot_policy``'s, the simulator's too. The log below the snapshot is then
deleted, keeping ``snapshot.retained.log.records`` records for followers that are only a little
behind. The store starts from the latest snapshot on disk (``load_latest``, before the node's
core and timers exist), and loads the snapshot the core downloaded from the leader when the core
says so (``load_downloaded``: built in a thread, swapped in on the loop, so that the node goes on
serving its peers meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Protocol

from quorum_node.node.kv import KvStore, LoadedSnapshot, SnapshotEntries, snapshot_records
from quorum_node.raft.records import read_batch_header
from quorum_node.raft.snapshot_format import encode_snapshot_batches, iter_snapshot_records
from quorum_node.raft.snapshot_policy import SnapshotPolicy
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


class KvSnapshots:
    def __init__(self, node: SnapshotHost, store: KvStore) -> None:
        self.node = node
        self.store = store
        latest = node.log_dir.snapshots.latest()
        self.policy = SnapshotPolicy(node.config.snapshot_interval_records,
                                     latest.end_offset if latest is not None else 0)
        self._task: asyncio.Task[None] | None = None

    def _latest_ahead(self) -> tuple[SnapshotId, bytes] | None:
        """The latest snapshot and its bytes, if the store has not applied up to it."""
        snapshots = self.node.log_dir.snapshots
        latest = snapshots.latest()
        if latest is None or latest.end_offset <= self.store.next_offset:
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
        self._install(snapshot_id, LoadedSnapshot.build(iter_snapshot_records(data),
                                                        snapshot_id.end_offset),
                      len(data), started)
        return True

    async def load_downloaded(self) -> bool:
        """Load the latest snapshot (the core replaced the log by one from the leader) if the
        store has not applied up to it. The new map is built in a thread, the loop going on
        meanwhile, and swapped in on the loop. True if loaded."""
        ahead = self._latest_ahead()
        if ahead is None:
            return False
        started = time.perf_counter()
        snapshot_id, data = ahead
        loaded = await asyncio.to_thread(LoadedSnapshot.build, iter_snapshot_records(data),
                                         snapshot_id.end_offset)
        if loaded.next_offset <= self.store.next_offset:
            # A guard: the applier, which applies below the log's start only, waited here.
            return False
        self._install(snapshot_id, loaded, len(data), started)
        return True

    def _install(self, snapshot_id: SnapshotId, loaded: LoadedSnapshot, size: int,
                 started: float) -> None:
        self.store.install_snapshot(loaded)
        self.policy.loaded(snapshot_id.end_offset)
        logger.info("node %d: loaded snapshot %s (%d keys, %d bytes) in %.3f s",
                    self.node.config.node_id, snapshot_id, len(self.store), size,
                    time.perf_counter() - started)

    def maybe_start_writing(self) -> None:
        """Start writing a snapshot in the background if enough has been applied since the
        last one (the applier goes on meanwhile: a snapshot is of the map as it is now)."""
        end = self.store.next_offset
        # A txn counts as many records as it has operations: what replaying it costs.
        due = self.policy.due(end, len(self.store), self.store.txn_extra_ops)
        if not due or self._task is not None:
            return
        log = self.node.log_dir.log
        if end - 1 < log.start_offset:
            return
        header = read_batch_header(log.read(end - 1, 1), verify_crc=False)
        if header.next_offset != end:
            return  # not at a batch boundary: try again after the next batch
        voters = self.node.voters_at(end - 1)
        carried = voters if all(key.directory_id is not None for key in voters) else None
        snapshot_id = SnapshotId(end, header.epoch)
        task = asyncio.ensure_future(self._write(snapshot_id, carried, header.timestamp_ms,
                                                 self.store.snapshot_entries(),
                                                 self.store.txn_extra_ops))
        self._task = task
        task.add_done_callback(self._written)

    async def _write(self, snapshot_id: SnapshotId, voters: VoterSet | None,
                     timestamp_ms: int, content: SnapshotEntries,
                     txn_extra_ops: int) -> None:
        started = time.perf_counter()
        snapshots = self.node.log_dir.snapshots
        keys = len(content.entries)
        # Sorted, encoded and written in the thread, a batch at a time: beside the map, only
        # the copy of its entries is held, never the snapshot whole.
        batches = encode_snapshot_batches(voters, timestamp_ms, snapshot_records(content))
        del content
        await asyncio.to_thread(snapshots.save_batches, snapshot_id, batches)
        del batches
        size = snapshots.size(snapshot_id)
        snapshots.delete_before(snapshot_id)
        log = self.node.log_dir.log
        log.delete_before(max(0, snapshot_id.end_offset
                              - self.node.config.snapshot_retained_log_records))
        self.policy.written(snapshot_id.end_offset, txn_extra_ops)
        logger.info("node %d: wrote snapshot %s (%d keys, %d bytes) in %.3f s; the log starts "
                    "at %d", self.node.config.node_id, snapshot_id, keys, size,
                    time.perf_counter() - started, log.start_offset)

    def _written(self, task: asyncio.Task[None]) -> None:
        self._task = None
        if not task.cancelled() and task.exception() is not None:
            # A failed snapshot loses nothing (the log is only deleted after it is saved).
            logger.error("node %d: writing a snapshot failed: %s", self.node.config.node_id,
                         task.exception())

    async def stop(self) -> None:
        task = self._task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
