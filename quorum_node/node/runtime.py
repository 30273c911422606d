"""The node runtime: a replica's client-facing Raft API (``QuorumNode``), what the services
(``KvService``, ``AdminService``, backups, the HTTP and Kafka APIs) build on: its status, epoch,
leader and voter sets, appends and voter changes waited for until they commit, linearizable read
points, committed batches; and its start and graceful shutdown.

The parts it runs are made and wired by ``quorum_node.node.wiring.build_node`` (the composition
root). The core is driven by ``quorum_node.raft.driver.CoreDriver`` (the driver the simulator
runs too), whose host over real files, sockets and the asyncio loop is
``quorum_node.node.driver_host.NodeDriverHost``; the listeners are
``quorum_node.node.listener.NodeListeners``. A caller waiting for a condition of the core (a
commit, a confirmed read, a voter change) is woken once, when a step makes it true (``Waits``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, assert_never

from aiohttp import web

from quorum_node.node.clock import now_ms as _now_ms
from quorum_node.node.config import Listener, NodeConfig
from quorum_node.node.driver_host import NodeDriverHost
from quorum_node.node.listener import NodeListeners, SecondProtocol
from quorum_node.node.proposals import Appended, Proposals
from quorum_node.node.state_machine import KvStateMachine
from quorum_node.node.story import NodeStory
from quorum_node.node.transport import PeerClient
from quorum_node.node.waits import WaitInterrupted, Waits
from quorum_node.raft.core import (
    RaftCore,
    ReadAbandoned,
    ReadBarrier,
    ReadConfirmed,
    ReadTimedOut,
)
from quorum_node.raft.driver import CoreDriver
from quorum_node.raft.log import LogFullError
from quorum_node.raft.quorum_state import RoleChanged
from quorum_node.raft.records import Record, RecordBatch, decode_batches
from quorum_node.raft.state import RaftState
from quorum_node.raft.status import NodeStatus
from quorum_node.raft.types import Errors, NotLeaderError, ReplicaKey, VoterChangeError
from quorum_node.raft.voters import VoterSet
from quorum_node.security.node_security import NodeSecurity
from quorum_node.storage.log_dir import LogDirectory

logger = logging.getLogger(__name__)


class CommitUnknownError(Exception):
    """An append was not seen committed in time; it may still commit (the client may retry)."""


class AppendLostError(Exception):
    """An append was truncated away by a new leader: it will never commit."""


@dataclass(frozen=True)
class NodeParts:
    """The parts of a replica, as ``quorum_node.node.wiring.build_node`` makes and wires them."""

    config: NodeConfig
    security: NodeSecurity
    log_dir: LogDirectory  # open and locked: the node closes it at shutdown
    core: RaftCore
    host: NodeDriverHost  # the core's driver's host; it holds the driver
    state_machine: KvStateMachine
    story: NodeStory
    peers: PeerClient
    listeners: NodeListeners
    endpoints: dict[int, tuple[str, int]]  # where each voter serves peers
    client_endpoints: dict[int, tuple[str, int]]  # where each voter serves clients


class QuorumNode:
    """A running replica. Made by ``quorum_node.node.wiring.build_node(config)``, then
    ``await start()``."""

    def __init__(self, parts: NodeParts) -> None:
        self.config = parts.config
        self.security = parts.security
        self.log_dir = parts.log_dir
        self.core = parts.core
        self.host = parts.host
        self.driver: CoreDriver = parts.host.driver
        self.state_machine = parts.state_machine
        self.story = parts.story
        self.peers = parts.peers
        self.listeners = parts.listeners
        self.endpoints = parts.endpoints
        self.client_endpoints = parts.client_endpoints
        self.waits: Waits = parts.host.waits
        self._proposals = Proposals(self.driver, _now_ms, lambda: self.core.epoch)
        self._tasks: set[asyncio.Task[None]] = set()
        self._shutting_down = False
        # Observers of each append's commit latency in seconds (metrics).
        self.commit_hooks: list[Callable[[float], None]] = []

    @property
    def failure(self) -> BaseException | None:
        """Why the node stopped on its own (the core raised, a flush or a write failed)."""
        return self.host.failure

    @property
    def step_hooks(self) -> list[Callable[[], None]]:
        """Observers called after every step (metrics)."""
        return self.host.step_hooks

    @property
    def role_hooks(self) -> list[Callable[[RoleChanged], None]]:
        """Observers called with each role change (metrics)."""
        return self.host.role_hooks

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self, app: web.Application | None = None,
                    kafka_protocol: Callable[[Listener], SecondProtocol] | None = None) -> None:
        """Serve the peer RPCs on the controller listener(s), ``app`` (the client and admin APIs,
        probes, metrics) on the client listeners, and start the timers. With one listener for
        everything, ``app`` gets the peer routes too. ``kafka_protocol``: the Kafka protocol's
        handlers of each controller listener, served on its port beside HTTP."""
        config = self.config
        await self.listeners.start(app if app is not None else web.Application(), kafka_protocol)
        self.host.start()
        self._spawn(self.host.flush_loop())
        self._spawn(self.security.reload_forever())
        self.state_machine.start()
        logger.info("node %d listening for peers on %s and clients on %s", config.node_id,
                    ", ".join(str(listener) for listener in config.controller_listeners),
                    ", ".join(str(listener) for listener in config.client_listeners))
        self.security.warn_if_open()

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Graceful stop: a leader resigns and waits (up to ``timeout_s``) for a successor, so
        the quorum does not wait out a fetch timeout; then everything is closed and flushed.
        A node that stopped on a failure is closed all the same (its tasks, listeners and log
        directory), without the resignation and the flush. Only the first call does anything."""
        if self._shutting_down:
            return
        self._shutting_down = True
        if self.failure is None:
            self.host.unreachable.clear()  # from here on: who the resignation cannot reach
            self.driver.step(lambda core: core.begin_shutdown(_now_ms()))
            with contextlib.suppress(TimeoutError, NotLeaderError):
                await self._wait_for(self._no_successor_to_wait_for, timeout_s,
                                     interruptible=False)
        # From here on nothing drives the core: every call into it runs its timers, so a peer's
        # request would otherwise keep a stopping node campaigning.
        self.host.stop()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.host.drop_parked()
        await self.listeners.close_peer_servers()
        # Requests still waiting are answered now: the servers wait for them to finish.
        self.interrupt_waits()
        self.state_machine.begin_closing()
        await self.listeners.close()
        await self.state_machine.stop()
        await self.peers.close()
        if self.failure is None:
            self.log_dir.log.flush()
        self.log_dir.close()

    def _no_successor_to_wait_for(self) -> bool:
        """A successor is known, or none can come: every other voter refused a request, could
        not be reached, or closed its stream since the shutdown began (they are stopping too,
        as a whole local quorum does)."""
        if self._successor_known():
            return True
        others = {key.id for key in self.core.voters} - {self.config.node_id}
        return bool(others) and others <= self.host.unreachable

    def _successor_known(self) -> bool:
        leader = self.core.leader_id
        state = self.core.state
        if not self.core.is_voter or len(self.core.voters) == 1:
            return True
        return state not in (RaftState.LEADER, RaftState.RESIGNED) and leader is not None

    async def wait_stopped(self) -> None:
        await self.host.stopped.wait()

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def interrupt_waits(self) -> None:
        """Cut every wait for the core short, now and from now on, with WaitInterrupted: the
        server is shutting down and waits for its requests to end. (The node's own shutdown
        still waits for a successor.)"""
        self.waits.interrupt()

    async def _wait_for(self, condition: Callable[[], bool], timeout_s: float, *,
                        interruptible: bool = True, committed: int | None = None) -> None:
        """``Waits.wait``: raises TimeoutError after ``timeout_s``, NotLeaderError once the node
        has failed, WaitInterrupted once ``interrupt_waits`` was called (if ``interruptible``)."""
        await self.waits.wait(condition, timeout_s, interruptible=interruptible,
                              committed=committed)

    async def _wait_committed(self, offset: int, timeout_s: float, *,
                              interruptible: bool = True) -> None:
        """``_wait_for`` the high watermark to pass ``offset``."""
        await self.waits.wait_committed(offset, timeout_s, interruptible=interruptible)

    # --- what the client and admin APIs build on ---------------------------------------------

    def status(self) -> NodeStatus:
        """This replica's state now, in the one shape every reader of it takes (the admin API's
        ``/v1/node``, the metrics, the story, backups, the Kafka listener)."""
        return _status_now(self.core)

    @property
    def status_reader(self) -> Callable[[], NodeStatus]:
        """``status`` as a callable that holds the core, not the node: for a reader kept apart
        from the node (its metrics), which must not keep a stopped node alive."""
        return functools.partial(_status_now, self.core)

    # The few facts the client paths read on every request, without building a whole status.

    @property
    def state(self) -> RaftState:
        return self.core.state

    @property
    def epoch(self) -> int:
        return self.core.epoch

    @property
    def leader_id(self) -> int | None:
        """The leader this replica knows of in its epoch (a resigning leader names itself)."""
        return self.core.leader_id

    @property
    def voters_unheard(self) -> tuple[int, ...]:
        """On a new quorum's first leader: the voters it must hear from before it takes writes
        (``RaftCore.voters_unheard``)."""
        return self.core.voters_unheard

    @property
    def high_watermark(self) -> int | None:
        """Every offset below it is committed; None until this replica has learned it."""
        return self.core.high_watermark

    def voters_at(self, offset: int) -> VoterSet:
        """The voter set in force at ``offset`` (what a snapshot or backup ending after it
        carries)."""
        return self.core.voter_set_at(offset)

    async def append(self, records: Sequence[Record], timeout_s: float) -> Appended:
        """Append records through the leader and wait until they are committed: their offsets,
        and the epoch they were appended in.

        Raises NotLeaderError (with the leader, if known) on a non-leader, AppendLostError when
        a new leader truncated them, CommitUnknownError when the timeout passed first,
        LogFullError (nothing appended) while the log's disk has no room."""
        if self.failure is not None:
            raise NotLeaderError(None, self.core.epoch)
        if self.log_dir.log.full and self.core.state is RaftState.LEADER:
            # The core retries what it holds; new records would only pile up behind them.
            raise LogFullError(f"{self.log_dir.log.directory}: the disk is full: appends are "
                               "refused until space comes back")
        started = time.perf_counter()
        if not self.core.accepts_writes and self.core.state is RaftState.LEADER:
            # A new leader takes writes once it has written the bootstrap voters (KIP-856).
            with contextlib.suppress(TimeoutError):
                await self._wait_for(
                    lambda: self.core.accepts_writes or self.core.state is not RaftState.LEADER,
                    timeout_s)
        appended = await self._proposals.propose(records)
        first, last, epoch = appended
        self.host.appends_waiting += 1
        try:
            await self._wait_committed(last, timeout_s)
        except TimeoutError:
            raise CommitUnknownError(
                f"offsets {first}-{last} not committed within {timeout_s:g} s") from None
        except NotLeaderError:
            # The node stopped on a failure after proposing: the records may be on other
            # replicas and commit there, so the outcome is unknown, not "not the leader" (a
            # client told that would retry, and could apply the write twice).
            raise CommitUnknownError(
                f"offsets {first}-{last} proposed, then the node stopped; they may still "
                f"commit") from None
        finally:
            self.host.appends_waiting -= 1
        if not self._committed_in_epoch(last, epoch):
            raise AppendLostError(f"offsets {first}-{last} of epoch {epoch} were truncated")
        for hook in self.commit_hooks:
            hook(time.perf_counter() - started)
        return appended

    async def add_voter(self, key: ReplicaKey, timeout_s: float) -> None:
        """AddVoter (KIP-856) through the leader; returns once the new voter set is committed.

        Raises NotLeaderError on a non-leader, VoterChangeError when the change is refused or
        not done within ``timeout_s`` (REQUEST_TIMED_OUT: it may still complete)."""
        await self._change_voters(self.core.add_voter, key, timeout_s)

    async def remove_voter(self, key: ReplicaKey, timeout_s: float, *,
                           decommission: bool = False) -> None:
        """RemoveVoter (KIP-856), as ``add_voter``; ``decommission`` may remove a node id's last
        directory (``RaftCore.remove_voter``)."""
        await self._change_voters(
            functools.partial(self.core.remove_voter, decommission=decommission), key, timeout_s)

    async def _change_voters(self, start: Callable[[int, ReplicaKey, int], int],
                             key: ReplicaKey, timeout_s: float) -> None:
        if self.failure is not None:
            raise NotLeaderError(None, self.core.epoch)
        core_timeout_ms = _core_timeout_ms(int(timeout_s * 1000))
        ticket = self.driver.request(lambda _: start(_now_ms(), key, core_timeout_ms))
        done = self.host.voter_changes_done
        try:
            await self._wait_for(lambda: ticket in done, timeout_s)
        except TimeoutError:
            raise VoterChangeError(Errors.REQUEST_TIMED_OUT,
                                   f"not done within {timeout_s:g} s; it may still complete"
                                   ) from None
        except WaitInterrupted:
            raise VoterChangeError(Errors.REQUEST_TIMED_OUT,
                                   "the node is shutting down; the change may still complete"
                                   ) from None
        finally:
            outcome = done.pop(ticket, None)
        assert outcome is not None
        if outcome.error is not Errors.NONE:
            raise VoterChangeError(outcome.error, outcome.message)

    def _committed_in_epoch(self, offset: int, epoch: int) -> bool:
        # Epochs hold contiguous offset ranges: the offset is still ours iff our epoch ends after
        # it (a later leader's truncation would have ended it at or before the offset).
        end = self.log_dir.log.end_offset_for_epoch(epoch)
        return end.epoch == epoch and end.offset > offset

    async def read_barrier(self, timeout_s: float) -> int:
        """A linearizable read point (ReadIndex): an offset covering every write acknowledged
        before this call, confirmed by a majority to be read on the current leader.
        Raises NotLeaderError on a non-leader, TimeoutError if it cannot be confirmed in time."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        settled = self.host.reads_settled
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            barrier = self.driver.request(functools.partial(
                _begin_read, timeout_ms=_core_timeout_ms(int(remaining * 1000))))
            if barrier is not None:
                try:
                    await self._wait_for(functools.partial(settled.__contains__, barrier.id),
                                         remaining)
                finally:
                    outcome = settled.pop(barrier.id, None)
                assert outcome is not None  # else the wait raised
                match outcome:
                    case ReadConfirmed():
                        return outcome.read_index
                    case ReadAbandoned():
                        raise NotLeaderError(outcome.leader_id, outcome.epoch)
                    case ReadTimedOut():
                        raise TimeoutError
                    case _:
                        assert_never(outcome)
            # A new leader has no high watermark until its LeaderChange commits: wait for it.
            await self._wait_for(lambda: self.core.leader_has_committed, remaining)

    async def wait_for_high_watermark(self, offset: int, timeout_s: float) -> bool:
        """Wait until this replica knows ``offset`` is committed; False on timeout."""
        try:
            # Not interruptible: the KV applier waits here, bounded, until it is stopped.
            await self._wait_committed(offset, timeout_s, interruptible=False)
        except TimeoutError:
            return False
        return True

    def read_committed(self, offset: int, max_bytes: int) -> list[RecordBatch]:
        """Committed batches from the one holding ``offset`` (whole batches, below the high
        watermark only)."""
        high_watermark = self.core.high_watermark or 0
        if offset >= high_watermark:
            return []
        batches = decode_batches(self.log_dir.log.read(offset, max_bytes))
        return [batch for batch in batches if batch.base_offset < high_watermark]


def _status_now(core: RaftCore) -> NodeStatus:
    return core.status(_now_ms())


def _begin_read(core: RaftCore, timeout_ms: int) -> ReadBarrier | None:
    return core.begin_read(_now_ms(), timeout_ms)


def _core_timeout_ms(timeout_ms: int) -> int:
    """The time the core gets for what a caller waits ``timeout_ms`` for: a little less, so that
    its own timeout says what was waited for, and its outcome reaches the waiter."""
    return max(1, timeout_ms - min(500, timeout_ms // 10))
