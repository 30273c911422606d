"""The node runtime: one asyncio process driving a RaftCore over real storage and HTTP.

The core is driven by ``quorum_node.raft.driver.CoreDriver`` (the driver the simulator runs too),
which keeps the core's contract; this node is its host: it writes the election state durably
(before anything of the step is sent), sends requests and answers inbound ones (a parked Fetch
is answered whenever the core releases it), hands flush requests to one flusher task, so that
any number of appends waiting together share one fsync (group commit), and keeps one loop timer
at the time the driver asks for.

The core is only ever called from the event loop's thread; a slow fsync, or one while other
appends wait, runs in a worker thread (the segment log allows that).

A commit on a fast disk is a handful of event-loop turns, so the runtime spends none it does not
need: the core's timer is one rescheduled loop timer, and a caller waiting for a condition of the
core (a commit, a confirmed read, a voter change) is woken once, when a step makes it true,
rather than after every step to check.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, assert_never

from aiohttp import web

from quorum_node.addresses import address_url, host_port
from quorum_node.kv.machine import check_snapshot_records
from quorum_node.node.clock import now_ms as _now_ms
from quorum_node.node.config import ConfigError, Listener, NodeConfig
from quorum_node.node.limits import READ_TIMEOUT_KEY
from quorum_node.node.listener import (
    BoundedSite,
    ConnectionLimits,
    SecondProtocol,
    principals_middleware,
    probes_reserve_middleware,
    start_site,
)
from quorum_node.node.state_machine import KvStateMachine
from quorum_node.node.story import NodeStory
from quorum_node.node.transport import (
    PeerClient,
    PeerServer,
    PeerUnavailable,
    Reply,
    claimed_node_id,
    max_response_bytes,
    refusals_close_connections,
    wrong_listener_middleware,
)
from quorum_node.node.waits import WaitInterrupted, Waits
from quorum_node.raft.core import (
    OutboundRequest,
    OutboundResponse,
    RaftCore,
    ReadAbandoned,
    ReadBarrier,
    ReadConfirmed,
    ReadOutcome,
    ReadTimedOut,
    VoterChangeDone,
)
from quorum_node.raft.driver import CoreDriver
from quorum_node.raft.log import LogFullError
from quorum_node.raft.messages import (
    RaftRequest,
    RaftResponse,
)
from quorum_node.raft.quorum_state import RoleChanged
from quorum_node.raft.records import Record, RecordBatch, decode_batches
from quorum_node.raft.snapshots import SnapshotId
from quorum_node.raft.state import ElectionState, RaftState
from quorum_node.raft.status import NodeStatus
from quorum_node.raft.types import Errors, NotLeaderError, ReplicaKey, VoterChangeError
from quorum_node.raft.voters import VoterSet
from quorum_node.security.node_security import NodeSecurity, SecuritySetupError
from quorum_node.storage.dir_lock import LOCK_FILE, DirectoryLock, lock_directory
from quorum_node.storage.errors import NotFormattedError, StorageError
from quorum_node.storage.kafka_uuid import to_kafka_string
from quorum_node.storage.log_dir import LogDirectory
from quorum_node.storage.meta_properties import format_log_dir
from quorum_node.storage.segment_log import SegmentLog

logger = logging.getLogger(__name__)


class CommitUnknownError(Exception):
    """An append was not seen committed in time; it may still commit (the client may retry)."""


class AppendLostError(Exception):
    """An append was truncated away by a new leader: it will never commit."""


# Flushes that take less than this (on average) run on the event loop's thread; slower ones in a
# worker thread, so that a slow disk never stalls the loop. A hop to a thread and back costs a
# wake-up and a contended GIL, a large share of what a fast disk's fsync takes.
INLINE_FSYNC_S = 0.002


def open_log_directory(config: NodeConfig) -> LogDirectory:
    """Open the node's log directory, holding its lock until it is closed; with
    ``format.if.empty``, format an empty one first (a new directory id, so that a replaced disk
    comes back as a new replica, never the old one)."""
    def open_with(lock: DirectoryLock | None) -> LogDirectory:
        return LogDirectory.open(config.log_dir, cluster_id=config.cluster_id,
                                 node_id=config.node_id, segment_bytes=config.segment_bytes,
                                 lock=lock)

    try:
        return open_with(None)
    except NotFormattedError:
        if not config.format_if_empty or _has_entries(config.log_dir):
            raise
    # Locked (created if missing) before it is formatted, and held until it is closed: no other
    # process can format or open the directory in between.
    lock = lock_directory(config.log_dir, create=True)
    try:
        try:
            return open_with(lock)  # formatted by another process since the check above
        except NotFormattedError:
            if _has_entries(config.log_dir):
                raise
        meta = format_log_dir(config.log_dir, config.cluster_id, config.node_id)
        logger.warning("formatted empty log directory %s with new directory id %s",
                       config.log_dir, to_kafka_string(meta.directory_id))
        return open_with(lock)
    except BaseException:
        lock.release()
        raise


def _has_entries(path: os.PathLike[str]) -> bool:
    """Whether the directory holds anything but its lock file."""
    try:
        with os.scandir(path) as entries:
            return any(entry.name != LOCK_FILE for entry in entries)
    except FileNotFoundError:
        return False


class QuorumNode:
    """A running replica. Create with ``QuorumNode(config)``, then ``await start()``."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        try:
            self.security = NodeSecurity(config)
        except SecuritySetupError as error:
            raise ConfigError(str(error)) from None
        self.log_dir = open_log_directory(config)
        try:
            # The key-value store the committed log is applied to, with its snapshots: run with
            # the node, whatever it serves. Made first: it loads the latest snapshot before the
            # core's clock starts, so that a long load is not a leader's silence.
            self.state_machine = KvStateMachine(self)
            self.endpoints = {voter.id: (voter.host, voter.port) for voter in config.voters}
            self.core = RaftCore(
                node_id=config.node_id,
                directory_id=self.log_dir.meta.directory_id,
                cluster_id=config.cluster_id,
                voters=[ReplicaKey(voter.id) for voter in config.voters],
                log=self.log_dir.log,
                election_state=self.log_dir.quorum_state.read(),
                config=config.quorum,
                random=random.Random(int.from_bytes(os.urandom(8), "big")),
                now_ms=_now_ms(),
                snapshots=self.log_dir.snapshots,
                check_snapshot_records=check_snapshot_records,
            )
        except BaseException:
            self.log_dir.close()  # and its lock, for whoever opens it next
            raise
        self.driver = CoreDriver(self.core, self)
        # Where each voter serves clients: a non-leader redirects clients to the leader's.
        self.client_endpoints = {
            endpoint.id: (endpoint.host, endpoint.port)
            for endpoint in config.voter_client_endpoints}
        self.story = NodeStory(self.status, config.node_id, [voter.id for voter in config.voters],
                               ",".join(host_port(host, port)
                                        for host, port in self.client_endpoints.values()),
                               fetch_timeout_ms=config.quorum.fetch_timeout_ms)
        idle_timeout_s = config.http_read_timeout_ms / 1000
        self._peers = PeerClient(self.endpoints, config.quorum.request_timeout_ms,
                                 tls=self.security.peer_tls,
                                 peer_secret=self.security.current_peer_secret,
                                 on_peer_lost=self._peer_lost,
                                 max_response_bytes=max_response_bytes(config.quorum),
                                 idle_timeout_s=idle_timeout_s)
        # One per controller listener: each checks peers by its own protocol (certificates on
        # an SSL one, the secret on a PLAINTEXT one).
        self._peer_servers = [
            PeerServer(self.handle_peer_request,
                       authorizer=self.security.peer_authorizer(listener),
                       idle_timeout_s=idle_timeout_s,
                       max_unsent_bytes=max_response_bytes(config.quorum))
            for listener in config.controller_listeners]
        self._sites: list[BoundedSite] = []
        self._secret_sites: list[BoundedSite] = []  # the PLAINTEXT ones serving peers
        # Requests the core has not answered yet (parked fetches): their reply callbacks, and the
        # safety-net timer of each.
        self._inbound: dict[int, Reply] = {}
        self._inbound_timers: dict[int, asyncio.TimerHandle] = {}
        self._next_inbound_id = 0
        self._tasks: set[asyncio.Task[None]] = set()
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
        self.waits = Waits(lambda: self.core.high_watermark, self._stopped_error)
        # The core's outcomes, by ticket and read barrier id, until their waiter takes them.
        self._voter_changes_done: dict[int, VoterChangeDone] = {}
        self._reads_settled: dict[int, ReadOutcome] = {}
        self._appends_waiting = 0  # appends waiting for their commit
        # Peers whose last request failed, or whose stream ended, since the shutdown began.
        self._unreachable: set[int] = set()
        self._runners: list[web.AppRunner] = []  # one per kind of listener, as start() made
        self._kafka_protocol: Callable[[Listener], SecondProtocol] | None = None
        self._stopped = asyncio.Event()
        self.failure: BaseException | None = None
        # Observers of the node (metrics): called after every step, with each role change, and
        # with each append's commit latency in seconds.
        self.step_hooks: list[Callable[[], None]] = []
        self.role_hooks: list[Callable[[RoleChanged], None]] = []
        self.commit_hooks: list[Callable[[float], None]] = []
        # The core may have changed state (and asked to persist) at start-up.
        self.driver.after_step()

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self, app: web.Application | None = None,
                    kafka_protocol: Callable[[Listener], SecondProtocol] | None = None) -> None:
        """Serve the peer RPCs on the controller listener(s), ``app`` (the client and admin APIs,
        probes, metrics) on the client listeners, and start the timers. With one listener for
        everything, ``app`` gets the peer routes too. ``kafka_protocol``: the Kafka protocol's
        handlers of each controller listener, served on its port beside HTTP."""
        config = self.config
        self._kafka_protocol = kafka_protocol
        app = app if app is not None else web.Application()
        controllers = config.controller_listeners
        if config.combined_listener:
            app.add_routes(self._peer_servers[0].routes())
            await self._serve(app, controllers, serves_peers=True, serves_clients=True)
        else:
            for controller, peer_server in zip(controllers, self._peer_servers, strict=True):
                peer_app = web.Application()
                peer_app.add_routes(peer_server.routes())
                await self._serve(peer_app, (controller,), serves_peers=True,
                                  serves_clients=False)
            await self._serve(app, config.client_listeners, serves_peers=False,
                              serves_clients=True)
        if self.security.tls is not None:
            self.security.tls.on_reload.append(self._close_connections)
        self.security.on_peer_secret_change.append(self._close_secret_connections)
        self._loop = asyncio.get_running_loop()
        for outbound in self._unsent:
            self.send(outbound)
        self._unsent.clear()
        if self._timer_wanted_ms is not None:
            self.set_timer(self._timer_wanted_ms)
        self._spawn(self._flush_loop())
        self._spawn(self.security.reload_forever())
        self.state_machine.start()
        logger.info("node %d listening for peers on %s and clients on %s", config.node_id,
                    ", ".join(str(listener) for listener in controllers),
                    ", ".join(str(listener) for listener in config.client_listeners))
        self.security.warn_if_open()

    async def _serve(self, app: web.Application, listeners: Sequence[Listener], *,
                     serves_peers: bool, serves_clients: bool) -> None:
        """Serve ``app`` on ``listeners`` (all of one protocol), with its own runner."""
        config, security, listener = self.config, self.security, listeners[0]
        kafka_protocol = self._kafka_protocol if serves_peers else None
        # Outermost: the probes' reserve answers probes only; on a listener of the peers alone,
        # a refused request closes its connection, and a client's is told where to go.
        app.middlewares.insert(0, probes_reserve_middleware() if serves_clients
                               else refusals_close_connections)
        if not serves_clients:
            app.middlewares.insert(1, wrong_listener_middleware(self._where_clients_go()))
        # Refusals happen before any handler runs: a refused request changes nothing.
        app.middlewares.extend(security.middlewares(listener, serves_peers=serves_peers))
        if security.authenticates(listener):
            app.middlewares.append(principals_middleware(security.principal_of))
        app[READ_TIMEOUT_KEY] = config.http_read_timeout_ms / 1000
        # In-flight requests get a second to finish at shutdown (a long poll ends within
        # fetch_max_wait_ms anyway), not aiohttp's default minute. The keep-alive timeout also
        # runs from the start of a connection: one that never completes a request head (a
        # slow-loris client) is closed after it.
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0,
                               keepalive_timeout=self.config.http_read_timeout_ms / 1000)
        await runner.setup()
        self._runners.append(runner)
        tls = security.tls
        limits = ConnectionLimits(config.max_connections, config.max_connections_per_ip,
                                  config.max_connections_per_principal)
        # A listener of the peers alone over SSL holds no connection without a node's
        # certificate: none of its requests could be served.
        admits = security.admits_peer if listener.tls and not serves_clients else None
        for each in listeners:
            site = await start_site(
                runner, each.host, each.port, tls.listening if tls and each.tls else None,
                handshake_timeout_s=config.http_read_timeout_ms / 1000, limits=limits,
                serves_probes=serves_clients, admits=admits,
                second_protocol=kafka_protocol(each) if kafka_protocol is not None else None,
                # Kafka's admin tools may come without a node's certificate.
                admits_either=security.admits_peer_or_admin if admits is not None else None)
            self._sites.append(site)
            if serves_peers and not each.tls:
                self._secret_sites.append(site)

    def _where_clients_go(self) -> str:
        """Where this node serves clients and the admin API, for a client that came to the
        controller listener."""
        config = self.config
        own = self.client_endpoints.get(config.node_id)
        listeners = ", ".join(str(listener) for listener in config.client_listeners)
        url = f" ({address_url(config.url_scheme, *own)})" if own is not None else ""
        return f"clients and the admin API are served on {listeners}{url}"

    def _close_connections(self) -> None:
        """The TLS files changed: close every connection made under the old ones, both ways,
        so that each is made again and verified against the current CA."""
        closed = sum(site.close_connections() for site in self._sites)
        self._peers.close_streams()
        logger.info("node %d: TLS files reloaded; closed %d connection(s) made under the "
                    "previous ones, and the streams to peers", self.config.node_id, closed)

    def _close_secret_connections(self) -> None:
        """The peer secret changed: close the connections of the PLAINTEXT listeners serving
        peers (each was let in with the old secret, or with none) and the streams this node
        opened with it, so that a secret taken away takes its streams with it."""
        closed = sum(site.close_connections() for site in self._secret_sites)
        if self.security.current_peer_secret() is not None:
            self._peers.close_streams()
        logger.info("node %d: peer secret changed; closed %d connection(s) of the PLAINTEXT "
                    "listeners serving peers, and the streams to peers opened with the old "
                    "secret", self.config.node_id, closed)

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Graceful stop: a leader resigns and waits (up to ``timeout_s``) for a successor, so
        the quorum does not wait out a fetch timeout; then everything is closed and flushed."""
        if self._stopped.is_set():
            return
        if self.failure is None:
            self._unreachable.clear()  # from here on: who the resignation cannot reach
            self.driver.step(lambda core: core.begin_shutdown(_now_ms()))
            with contextlib.suppress(TimeoutError, NotLeaderError):
                await self._wait_for(self._no_successor_to_wait_for, timeout_s,
                                     interruptible=False)
        # From here on nothing drives the core: every call into it runs its timers, so a peer's
        # request would otherwise keep a stopping node campaigning.
        self.driver.stop()
        self._stopped.set()
        if self._timer is not None:
            self._timer.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for correlation_id in list(self._inbound):
            self._answer_inbound(correlation_id, None)
        for peer_server in self._peer_servers:
            await peer_server.close()
        # Requests still waiting are answered now: the servers wait for them to finish.
        self.interrupt_waits()
        self.state_machine.begin_closing()
        for runner in self._runners:
            await runner.cleanup()
        await self.state_machine.stop()
        await self._peers.close()
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
        return bool(others) and others <= self._unreachable

    def _successor_known(self) -> bool:
        leader = self.core.leader_id
        state = self.core.state
        if not self.core.is_voter or len(self.core.voters) == 1:
            return True
        return state not in (RaftState.LEADER, RaftState.RESIGNED) and leader is not None

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # --- the driver's host (quorum_node.raft.driver.DriverHost) ---------------------------

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

    def _inline_flush_pays(self, waiting: int) -> bool:
        """Whether a flush runs on the event loop's thread: the disk is fast and at most
        ``waiting`` appends wait for it (more would rather be taken in while the disk works)."""
        return self._fsync_s < INLINE_FSYNC_S and self._appends_waiting <= waiting

    def _flush_now(self) -> None:
        """Flush on the loop's thread and report it to the core."""
        try:
            flushed, took_s = _timed_flush(self.log_dir.log)
        except (OSError, StorageError) as error:
            self._fail(error)
            return
        self._fsync_s = 0.8 * self._fsync_s + 0.2 * took_s
        self.driver.handle_flushed(flushed)

    def snapshot_loaded(self, snapshot_id: SnapshotId) -> None:
        logger.info("node %d: the log was replaced by snapshot %s from the leader",
                    self.config.node_id, snapshot_id)
        self.state_machine.snapshot_loaded()

    def voter_change_done(self, done: VoterChangeDone) -> None:
        self._voter_changes_done[done.ticket] = done  # its waiter wakes after the step

    def read_settled(self, outcome: ReadOutcome) -> None:
        self._reads_settled[outcome.barrier_id] = outcome

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
        self._timer = loop.call_later(max(0, at_ms - _now_ms()) / 1000, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.driver.poll()

    def core_failed(self, error: Exception) -> None:
        logger.error("node %d: the core failed", self.config.node_id, exc_info=error)
        self._fail(error)

    def core_spinning(self, polls: int) -> None:
        logger.error("node %d: the core asked to be polled again at once %d times in a row",
                     self.config.node_id, polls)

    def _fail(self, error: BaseException) -> None:
        logger.critical("node %d stopping: %s", self.config.node_id, error)
        self.failure = error
        self.driver.stop()  # nothing drives the core past a failure (a failed fsync too)
        self._stopped.set()
        self.waits.fail()

    def _stopped_error(self) -> BaseException | None:
        """What a wait raises once the node has stopped after a failure."""
        return None if self.failure is None else NotLeaderError(None, self.core.epoch)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def send(self, outbound: OutboundRequest) -> None:
        if self._loop is None:  # a step before start(): sent once the node runs
            self._unsent.append(outbound)
            return
        destination, correlation_id = outbound.destination, outbound.correlation_id

        def answered(answer: RaftResponse | PeerUnavailable) -> None:
            if isinstance(answer, PeerUnavailable):
                logger.debug("%s", answer)
                self.story.peer_failed(destination, str(answer))
                self._peer_lost(destination)
                self.driver.handle_request_failure(destination, correlation_id)
            else:
                self.story.peer_answered(destination)
                self._unreachable.discard(destination)
                self.driver.handle_response(destination, correlation_id, answer)

        self._peers.start_call(destination, outbound.message, answered)

    def _peer_lost(self, node_id: int) -> None:
        self._unreachable.add(node_id)
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

    def _answer_inbound(self, correlation_id: int, answer: RaftResponse | None) -> None:
        reply = self._inbound.pop(correlation_id, None)
        if reply is None:
            return  # answered already, or given up on
        timer = self._inbound_timers.pop(correlation_id, None)
        if timer is not None:
            timer.cancel()
        reply(answer)

    async def _flush_loop(self) -> None:
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
    def high_watermark(self) -> int | None:
        """Every offset below it is committed; None until this replica has learned it."""
        return self.core.high_watermark

    def voters_at(self, offset: int) -> VoterSet:
        """The voter set in force at ``offset`` (what a snapshot or backup ending after it
        carries)."""
        return self.core.voter_set_at(offset)

    async def append(self, records: Sequence[Record], timeout_s: float) -> tuple[int, int]:
        """Append records through the leader and wait until they are committed.

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
        first, last = self.driver.request(lambda core: core.propose(_now_ms(), records))
        epoch = self.core.epoch
        self._appends_waiting += 1
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
            self._appends_waiting -= 1
        if not self._committed_in_epoch(last, epoch):
            raise AppendLostError(f"offsets {first}-{last} of epoch {epoch} were truncated")
        for hook in self.commit_hooks:
            hook(time.perf_counter() - started)
        return first, last

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
        done = self._voter_changes_done
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
        settled = self._reads_settled
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


def _timed_flush(log: SegmentLog) -> tuple[int, float]:
    """Flush ``log``: the offset it is durable to, and how long the flush took in seconds."""
    started = time.perf_counter()
    flushed = log.flush()
    return flushed, time.perf_counter() - started
