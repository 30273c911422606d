"""The node's key-value state machine: the synchronous machine over its store
(``quorum_node.kv.machine``, which the simulator runs too), the snapshots of it on disk
(``quorum_node.node.snapshotting``) and the asyncio applier that feeds it the committed log.

The runtime owns it: it is started with the node and stopped with it, on every node, leader or
not, whatever APIs are served, so that the store follows the high watermark, and snapshots and log
compaction happen, on a node that serves no HTTP at all. Transports read the store and wait for it
through ``KvService`` (``quorum_node.node.kv_service``).

Errors are ordinary exceptions: ``StateMachineClosing`` once the node is shutting down,
``StateMachineFailed`` once the applier stopped on a failure, ``TimeoutError`` when a wait ran out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from quorum_node.kv.machine import KvMachine
from quorum_node.kv.store import KvStore
from quorum_node.node.snapshotting import KvSnapshots, SnapshotHost
from quorum_node.raft.state import RaftState
from quorum_node.raft.types import NotLeaderError

logger = logging.getLogger(__name__)

# How much of the log to read at a time (whole batches; at least one). Small, as the node
# decodes all it reads, uncommitted batches past the high watermark included.
READ_CHUNK_BYTES = 64 * 1024
# Most committed records a step applies itself; more is a backlog for the applier task.
STEP_APPLY_RECORDS = 1000


class StateMachineHost(SnapshotHost, Protocol):
    """What the state machine needs of the node that runs it (``QuorumNode``)."""

    @property
    def failure(self) -> BaseException | None: ...

    @property
    def state(self) -> RaftState: ...

    @property
    def high_watermark(self) -> int | None: ...

    async def wait_for_high_watermark(self, offset: int, timeout_s: float) -> bool: ...


class StateMachineClosing(Exception):
    """The node is shutting down: waits on the store end."""


class StateMachineFailed(Exception):
    """The applier stopped on a failure: the store no longer follows the log."""


class KvStateMachine:
    """The store, its snapshots and the applier that feeds it; ``start`` and ``stop`` are the
    runtime's, ``after_step`` is called by the runtime after every step of the core."""

    def __init__(self, node: StateMachineHost) -> None:
        self.node = node
        self.store = KvStore(event_bytes_limit=node.config.kv_history_retention_bytes)
        latest = node.log_dir.snapshots.latest()
        self.machine = KvMachine(self.store, node.config.snapshot_interval_records,
                                 latest.end_offset if latest is not None else 0)
        self.snapshots = KvSnapshots(node, self.machine)
        # Set when the core replaced the log by a snapshot from the leader: the applier loads it.
        self._snapshot_wanted = asyncio.Event()
        self.failure: BaseException | None = None
        self._applier: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        # Replaced after every step of the applier: waiters hold the one current when they
        # checked, so no step is missed between the check and the wait.
        self._progress = asyncio.Event()
        # The store starts from the latest snapshot on disk, loaded before the node's core and
        # timers exist: however long it takes, no timeout runs meanwhile. One it cannot load
        # fails the store, not the replica.
        try:
            self.snapshots.load_latest()
        except Exception as error:
            self.applier_failed(error)

    @property
    def closing(self) -> bool:
        return self._closing.is_set()

    @property
    def running(self) -> bool:
        """Neither closing nor failed: the store follows the log."""
        return not self._closing.is_set() and self.failure is None

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        """Start the applier: it follows the high watermark on every node, leader or not."""
        if self._applier is None:
            self._applier = asyncio.ensure_future(self._apply_committed())
        return self._applier

    def begin_closing(self) -> None:
        """Answer every wait on the store now (the server is about to wait for its requests)."""
        self._closing.set()
        self.store.watchers.end_all(lost=False)
        self._notify()

    async def stop(self) -> None:
        self.begin_closing()
        if self._applier is not None:
            self._applier.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._applier
        await self.snapshots.stop()

    # --- the applier -------------------------------------------------------------------------

    def snapshot_loaded(self) -> None:
        """The core replaced the log by a snapshot from the leader: the applier loads it before
        applying anything more (the log below it is gone)."""
        self._snapshot_wanted.set()

    def _notify(self) -> None:
        progress, self._progress = self._progress, asyncio.Event()
        progress.set()

    async def _apply_committed(self) -> None:
        node, store = self.node, self.store
        if self.failure is not None:
            return  # the snapshot on disk could not be loaded: the log below it is gone
        try:
            # Checked as well as cancelled: a cancellation can be lost in the node's waits.
            while not self._closing.is_set():
                if self._snapshot_wanted.is_set():
                    self._snapshot_wanted.clear()
                    if await self.snapshots.load_downloaded():
                        self._notify()
                    continue
                high_watermark = node.high_watermark
                if high_watermark is None or store.next_offset >= high_watermark:
                    # A bounded wait so that a stopped node is noticed (it raises then). A
                    # snapshot from the leader ends it too: the core counts everything below the
                    # snapshot committed, the store is behind it.
                    await node.wait_for_high_watermark(store.next_offset, 1.0)
                    continue
                self._apply_chunk(high_watermark)
                await asyncio.sleep(0)  # a long replay must not starve the handlers
        except NotLeaderError:
            # What the runtime raises to waiters once the node has stopped after a failure.
            self.failure = node.failure or RuntimeError("the node stopped")
            self.store.watchers.end_all(lost=False)
        except Exception as error:
            self.applier_failed(error)
        self._notify()

    def _apply_chunk(self, high_watermark: int) -> None:
        # The log's bytes rather than read_committed's decoded batches: the store skips batches
        # without KV operations undecoded.
        self.machine.apply(self.node.log_dir.log.read(self.store.next_offset, READ_CHUNK_BYTES),
                           high_watermark)
        self._notify()
        self.snapshots.maybe_start_writing()

    def after_step(self) -> None:
        """On the leader, apply what a step of the core committed right away, so that a write
        is answered in the loop's next turn instead of after the applier's. A follower leaves it
        to the applier, after the fsync its leader waits for; a backlog, or a snapshot to load
        first, is the applier's anywhere."""
        if (self._applier is None or self.failure is not None or self._closing.is_set()
                or self._snapshot_wanted.is_set() or self.node.state is not RaftState.LEADER):
            return
        high_watermark = self.node.high_watermark
        next_offset = self.store.next_offset
        if (high_watermark is None or next_offset >= high_watermark
                or high_watermark - next_offset > STEP_APPLY_RECORDS
                or next_offset < self.node.log_dir.log.start_offset):
            return
        try:
            self._apply_chunk(high_watermark)
        except Exception as error:
            self.applier_failed(error)
            self._notify()

    def applier_failed(self, error: Exception) -> None:
        """Stop following the log (the store is left as it is): reads and writes fail, and the
        probes report it."""
        logger.exception("node %d: the KV applier stopped", self.node.config.node_id)
        self.failure = error
        self.store.watchers.end_all(lost=False)

    # --- waits -------------------------------------------------------------------------------

    def check_running(self) -> None:
        """Raise StateMachineClosing or StateMachineFailed unless the store follows the log."""
        if self._closing.is_set():
            raise StateMachineClosing("the node is shutting down")
        if self.failure is not None:
            raise StateMachineFailed(f"the node's state machine stopped: {self.failure}")

    async def wait_applied(self, next_offset: int, deadline: float) -> None:
        """Wait until the store has applied every offset below ``next_offset`` (``deadline`` on
        the loop's clock). Raises TimeoutError, StateMachineClosing or StateMachineFailed."""
        loop = asyncio.get_running_loop()
        while self.store.next_offset < next_offset:
            self.check_running()
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(
                    f"offset {next_offset - 1} is committed but was not applied on this node "
                    f"in time (applied up to {self.store.applied_offset})")
            await self.wait_progress(remaining)

    async def wait_progress(self, timeout_s: float) -> None:
        """Wait for the applier's next step (or closing), at most ``timeout_s``."""
        progress = self._progress
        # asyncio.timeout rather than wait_for: on 3.11, wait_for can swallow a cancellation.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await progress.wait()
