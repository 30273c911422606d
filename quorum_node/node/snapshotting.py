"""Snapshots of the key-value state machine (KIP-630): when to write one, how to load one.

The state machine, not the Raft core, decides when to snapshot: every
``snapshot.interval.records`` applied records (and no more often than it has applied a quarter
as many records as the map has keys; a txn counts as many records as it has operations, what
replaying it costs) it writes its map, as of the offset it has applied
(always committed, always at a batch boundary), with the voter set in force there. The log below
the snapshot is then deleted, keeping ``snapshot.retained.log.records`` records for followers that
are only a little behind. A replica whose store is behind its latest snapshot (at start-up, or
after the core replaced its log by a snapshot downloaded from the leader) loads the snapshot
instead of replaying.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Protocol

from quorum_node.node.kv import KvStore, SnapshotEntries, snapshot_records
from quorum_node.raft.records import read_batch_header
from quorum_node.raft.snapshot_format import encode_snapshot_batches, iter_snapshot_records
from quorum_node.raft.snapshots import SnapshotId
from quorum_node.raft.voters import VoterSet

if TYPE_CHECKING:
    from quorum_node.node.config import NodeConfig
    from quorum_node.storage.log_dir import LogDirectory

logger = logging.getLogger(__name__)


# A restart loads the latest snapshot and replays the log after it, and replaying a record costs
# a few times what loading a key does: a snapshot is due once the log after the last one holds a
# quarter as many records as the map has keys (or ``interval``, whichever is more), so that a
# restart's replay stays a fraction of its snapshot's load, while a large map written to slowly
# is rewritten at most once per quarter of its size in new records.
REPLAY_SHARE_OF_KEYS = 4


def snapshot_due(records_since: int, interval: int, keys: int) -> bool:
    """Whether to snapshot after ``records_since`` records applied since the last snapshot:
    every ``interval`` records (0: never), and no more often than every quarter of the map's
    size in records (``REPLAY_SHARE_OF_KEYS``)."""
    return interval > 0 and records_since >= max(interval, keys // REPLAY_SHARE_OF_KEYS)


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
        self._last_end = latest.end_offset if latest is not None else 0
        self._last_txn_extra_ops = 0  # the store's txn_extra_ops at the last snapshot
        self._task: asyncio.Task[None] | None = None

    def load_if_behind(self) -> bool:
        """Load the latest snapshot if the store has not applied up to it. True if loaded."""
        snapshots = self.node.log_dir.snapshots
        latest = snapshots.latest()
        if latest is None or latest.end_offset <= self.store.next_offset:
            return False
        size = snapshots.size(latest)
        assert size is not None
        started = time.perf_counter()
        # Batches are decoded as the store reads them; it replaces its map only once the
        # footer is reached, every batch checked.
        self.store.load_snapshot(iter_snapshot_records(snapshots.read(latest, 0, size)),
                                 latest.end_offset)
        self._last_end = max(self._last_end, latest.end_offset)
        self._last_txn_extra_ops = 0
        logger.info("node %d: loaded snapshot %s (%d keys, %d bytes) in %.3f s",
                    self.node.config.node_id, latest, len(self.store), size,
                    time.perf_counter() - started)
        return True

    def maybe_start_writing(self) -> None:
        """Start writing a snapshot in the background if enough has been applied since the
        last one (the applier goes on meanwhile: a snapshot is of the map as it is now)."""
        end = self.store.next_offset
        # A txn counts as many records as it has operations: what replaying it costs.
        since = end - self._last_end + self.store.txn_extra_ops - self._last_txn_extra_ops
        due = snapshot_due(since, self.node.config.snapshot_interval_records,
                           len(self.store))
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
        self._last_end = snapshot_id.end_offset
        self._last_txn_extra_ops = txn_extra_ops
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
