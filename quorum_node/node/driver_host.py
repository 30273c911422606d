"""The node's ``DriverHost`` (``quorum_node.raft.driver``): what the one driver of the core calls
to carry out a step's effects over real files, sockets and an asyncio loop.

It writes the election state durably (before anything of the step is sent), sends requests
and answers inbound ones (a parked Fetch is answered whenever the core releases it), hands
flush requests to one flusher task, so that any number of appends waiting together share one
fsync (group commit), and keeps one loop timer at the time the driver asks for. The core is only
ever called from the event loop's thread; a slow fsync, or one while other appends wait, runs in
a worker thread (the segment log allows that).

A commit on a fast disk is a handful of event-loop turns, so the host spends none it does not
need: the core's timer is one rescheduled loop timer, and a caller waiting for a condition of the
core (a commit, a confirmed read, a voter change) is woken once, when a step makes it true,
rather than after every step to check (``Waits``).

Steps taken before ``start`` (at start-up) keep their requests and timer until the loop runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from aiohttp import web

from quorum_node.node.clock import now_ms as _now_ms
from quorum_node.node.config import NodeConfig
from quorum_node.node.state_machine import KvStateMachine
from quorum_node.node.story import NodeStory
from quorum_node.node.transport import PeerClient, PeerUnavailable, Reply, claimed_node_id
from quorum_node.node.waits import Waits
from quorum_node.raft.core import (
    OutboundRequest,
    OutboundResponse,
    RaftCore,
    ReadOutcome,
    VoterChangeDone,
)
from quorum_node.raft.driver import CoreDriver
from quorum_node.raft.messages import RaftRequest, RaftResponse
from quorum_node.raft.quorum_state import RoleChanged
from quorum_node.raft.snapshots import SnapshotId
from quorum_node.raft.state import ElectionState
from quorum_node.raft.types import NotLeaderError
from quorum_node.storage.errors import StorageError
from quorum_node.storage.log_dir import LogDirectory
from quorum_node.storage.segment_log import SegmentLog

logger = logging.getLogger(__name__)

# Flushes that take less than this (on average) run on the event loop's thread; slower ones in a
# worker thread, so that a slow disk never stalls the loop. A hop to a thread and back costs a
# wake-up and a contended GIL, a large share of what a fast disk's fsync takes.
INLINE_FSYNC_S = 0.002


class NodeDriverHost:
    """The ``DriverHost`` of a node: it makes the core's ``CoreDriver`` and carries out its
    effects. ``failure`` is set, and ``stopped`` too, once the node must not go on (the core
    raised, a flush or a write of the election state failed)."""

    def __init__(self, config: NodeConfig, *, log_dir: LogDirectory, core: RaftCore,
                 story: NodeStory, state_machine: KvStateMachine, peers: PeerClient) -> None:
        self.config = config
        self.log_dir = log_dir
        self.core = core
        self.story = story
        self.state_machine = state_machine
        self.peers = peers
        self.driver = CoreDriver(core, self)
        # Requests the core has not answered yet (parked fetches): their reply callbacks, and the
        # safety-net timer of each.
        self._inbound: dict[int, Reply] = {}
        self._inbound_timers: dict[int, asyncio.TimerHandle] = {}
        self._next_inbound_id = 0
        self._loop: asyncio.AbstractEventLoop | None = None  # set by start()
        self._unsent: list[OutboundRequest] = []  # requests of steps taken before start()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_wanted_ms: int | None = None  # a time the driver asked for before start()
        self._flush_wanted = asyncio.Event()
        self._fsync_s = 0.0  # moving average of the recent flushes' fsync time
        self._flush_in_step = False  # flush inline once the step's effects are carried out
        self._flushing_in_thread = False
        # Callers waiting for a condition of the core (a commit, a confirmed read, a voter
        # change), woken by the step that makes it true.
        self.waits = Waits(lambda: core.high_watermark, self._stopped_error)
        # The core's outcomes, by ticket and read barrier id, until their waiter takes them.
        self.voter_changes_done: dict[int, VoterChangeDone] = {}
        self.reads_settled: dict[int, ReadOutcome] = {}
        self.appends_waiting = 0  # appends waiting for their commit (the node counts them)
        # Peers whose last request failed, or whose stream ended, since the shutdown began.
        self.unreachable: set[int] = set()
        self.stopped = asyncio.Event()
        self.failure: BaseException | None = None
        # Observers of the node (metrics): called after every step, and with each role change.
        self.step_hooks: list[Callable[[], None]] = []
        self.role_hooks: list[Callable[[RoleChanged], None]] = []

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Run on the current loop: send what steps before it asked to, set their timer."""
        self._loop = asyncio.get_running_loop()
        for outbound in self._unsent:
            self.send(outbound)
        self._unsent.clear()
        if self._timer_wanted_ms is not None:
            self.set_timer(self._timer_wanted_ms)

    def stop(self) -> None:
        """Stop driving the core (every input is dropped from here on) and its timer."""
        self.driver.stop()
        self.stopped.set()
        if self._timer is not None:
            self._timer.cancel()

    def drop_parked(self) -> None:
        """Answer every parked request with nothing (its peer is told the node is stopping)."""
        for correlation_id in list(self._inbound):
            self._answer_inbound(correlation_id, None)

    # --- what the driver calls ---------------------------------------------------------------

    def now_ms(self) -> int:
        return _now_ms()

    def persist(self, state: ElectionState) -> None:
        self.log_dir.quorum_state.write(state)

    def answer(self, response: OutboundResponse) -> None:
        if self._inbound:
            self._answer_inbound(response.correlation_id, response.message)

    def flush(self) -> None:
        if self._loop is not None and self._inline_flush_pays(waiting=0) \
                and not self._flushing_in_thread:
            # A lone append (a follower's, or a leader's with no other waiting) on a fast disk:
            # flushed at the end of this step, not by the flusher task a loop turn later. The
            # step's messages (a leader's Fetch answers) have left by then.
            self._flush_in_step = True
        else:
            self._flush_wanted.set()

    def snapshot_loaded(self, snapshot_id: SnapshotId) -> None:
        logger.info("node %d: the log was replaced by snapshot %s from the leader",
                    self.config.node_id, snapshot_id)
        self.state_machine.snapshot_loaded()

    def voter_change_done(self, done: VoterChangeDone) -> None:
        self.voter_changes_done[done.ticket] = done  # its waiter wakes after the step

    def read_settled(self, outcome: ReadOutcome) -> None:
        self.reads_settled[outcome.barrier_id] = outcome

    def role_changed(self, change: RoleChanged) -> None:
        self.story.role_changed(change)
        for hook in self.role_hooks:
            hook(change)

    def stepped(self) -> None:
        self.story.after_step(self.core.leader_has_committed)
        self.waits.after_step()
        self.state_machine.after_step()
        for hook in self.step_hooks:
            hook()
        if self._flush_in_step:
            # Last, so that the step is carried out whole before the next one starts here.
            self._flush_in_step = False
            self._flush_now()

    def set_timer(self, at_ms: int) -> None:
        loop = self._loop
        if loop is None:  # before start(): set then
            self._timer_wanted_ms = at_ms
            return
        if self._timer is not None:
            self._timer.cancel()
        delay_ms = at_ms - _now_ms()
        # The loop counts whole milliseconds of a clock of its own, read once a turn: a timer
        # for the next millisecond of ours can fire before it comes, and the driver then polls
        # for nothing and sets it again. A millisecond more never fires early.
        self._timer = loop.call_later((delay_ms + 1) / 1000 if delay_ms > 0 else 0,
                                      self._on_timer)

    def core_failed(self, error: Exception) -> None:
        logger.error("node %d: the core failed", self.config.node_id, exc_info=error)
        self._fail(error)

    def core_spinning(self, polls: int) -> None:
        logger.error("node %d: the core asked to be polled again at once %d times in a row",
                     self.config.node_id, polls)

    def send(self, outbound: OutboundRequest) -> None:
        if self._loop is None:  # a step before start(): sent once the node runs
            self._unsent.append(outbound)
            return
        destination, correlation_id = outbound.destination, outbound.correlation_id

        def answered(answer: RaftResponse | PeerUnavailable) -> None:
            if isinstance(answer, PeerUnavailable):
                logger.debug("%s", answer)
                self.story.peer_failed(destination, str(answer))
                self.peer_lost(destination)
                self.driver.handle_request_failure(destination, correlation_id, answer.failure)
            else:
                self.story.peer_answered(destination)
                self.unreachable.discard(destination)
                self.driver.handle_response(destination, correlation_id, answer)

        self.peers.start_call(destination, outbound.message, answered)

    # --- what the peers' transport calls -----------------------------------------------------

    def peer_lost(self, node_id: int) -> None:
        self.unreachable.add(node_id)
        self.waits.check_conditions()  # a stopping leader may be waiting for this peer

    def handle_peer_request(self, request: RaftRequest, reply: Reply) -> RaftResponse | None:
        """The core's answer to a peer's request: at once when it has one (most do), else None
        and the answer through ``reply`` (a parked Fetch). Raises HTTPServiceUnavailable on a
        stopping node."""
        if not self.driver.driving:
            raise web.HTTPServiceUnavailable(text="node stopping\n")
        self._next_inbound_id += 1
        correlation_id = self._next_inbound_id
        answered: list[RaftResponse | None] = []
        self._inbound[correlation_id] = answered.append
        self.driver.handle_request(claimed_node_id(request), correlation_id, request)
        if not answered and self.failure is None:  # parked
            self._inbound[correlation_id] = reply
            # A parked Fetch is answered within fetch_max_wait_ms; the bound is a safety net.
            self._inbound_timers[correlation_id] = asyncio.get_running_loop().call_later(
                self.config.quorum.request_timeout_ms / 1000,
                self._answer_inbound, correlation_id, None)
            return None
        self._inbound.pop(correlation_id, None)
        if answered and answered[0] is not None:  # answered in the step
            return answered[0]
        raise web.HTTPServiceUnavailable(text="node stopping\n")  # it failed in the step

    # --- the flusher -------------------------------------------------------------------------

    async def flush_loop(self) -> None:
        """The flusher task: one flush for every request to flush made since the last one."""
        log = self.log_dir.log
        while self.driver.driving:
            await self._flush_wanted.wait()
            self._flush_wanted.clear()
            if self._inline_flush_pays(waiting=1):
                # A fast disk and one append waiting: handing the fsync to a thread and back
                # costs more than the fsync itself, and every commit waits for two of them
                # (leader, follower). With more appends waiting, the loop takes in the next
                # ones while the disk works (a quarter more puts/s with 64 clients).
                self._flush_now()
                continue
            self._flushing_in_thread = True
            try:
                flushed, took_s = await asyncio.to_thread(_timed_flush, log)
            except (OSError, StorageError) as error:
                # After a failed fsync the page cache cannot be trusted: stop (Kafka does too).
                # The log says StorageError (it refuses every later call); a bare OSError comes
                # from a failure before it reached the fsync.
                self._fail(error)
                return
            finally:
                self._flushing_in_thread = False
            # The fsync's own time, not the hop to a thread and back: that would keep a fast
            # disk that once had a slow flush in the thread for good.
            self._fsync_s = 0.8 * self._fsync_s + 0.2 * took_s
            self.driver.handle_flushed(flushed)

    def _inline_flush_pays(self, waiting: int) -> bool:
        """Whether a flush runs on the event loop's thread: the disk is fast and at most
        ``waiting`` appends wait for it (more would rather be taken in while the disk works)."""
        return self._fsync_s < INLINE_FSYNC_S and self.appends_waiting <= waiting

    def _flush_now(self) -> None:
        """Flush on the loop's thread and report it to the core."""
        try:
            flushed, took_s = _timed_flush(self.log_dir.log)
        except (OSError, StorageError) as error:
            self._fail(error)
            return
        self._fsync_s = 0.8 * self._fsync_s + 0.2 * took_s
        self.driver.handle_flushed(flushed)

    # --- internals ---------------------------------------------------------------------------

    def _on_timer(self) -> None:
        self._timer = None
        self.driver.poll()

    def _answer_inbound(self, correlation_id: int, answer: RaftResponse | None) -> None:
        reply = self._inbound.pop(correlation_id, None)
        if reply is None:
            return  # answered already, or given up on
        timer = self._inbound_timers.pop(correlation_id, None)
        if timer is not None:
            timer.cancel()
        reply(answer)

    def _fail(self, error: BaseException) -> None:
        logger.critical("node %d stopping: %s", self.config.node_id, error)
        self.failure = error
        self.driver.stop()  # nothing drives the core past a failure (a failed fsync too)
        self.stopped.set()
        self.waits.fail()

    def _stopped_error(self) -> BaseException | None:
        """What a wait raises once the node has stopped after a failure."""
        return None if self.failure is None else NotLeaderError(None, self.core.epoch)


def _timed_flush(log: SegmentLog) -> tuple[int, float]:
    """Flush ``log``: the offset it is durable to, and how long the flush took in seconds."""
    started = time.perf_counter()
    flushed = log.flush()
    return flushed, time.perf_counter() - started
