"""One simulated replica: a RaftCore, its disk (a MemoryLog, a snapshot store and the persisted
election state), the state machine it applies committed records to, and the driver duties the core
leaves to its host. The core is driven by ``quorum_node.raft.driver.CoreDriver``, the driver the
node's driver host runs; this node is its host over the simulated disk, network and clock. The state
machine is the node's too (``quorum_node.kv.machine.KvMachine`` over a ``KvStore``): it applies
the log's bytes, decides when to snapshot, writes, loads and compacts as the node does, with the
simulated disk for the node's files.

The disk outlives the process. A hard kill throws away whatever was not flushed (and snapshot
downloads in progress); a restart builds a fresh core and state machine from what is on the disk,
as a real restart would. A wiped disk comes back empty under a new directory id.

A paused process (SIGSTOP, a long garbage collection, a starved VM) takes no input: what reaches
it (messages, answers, its own timers, flushes done, clients' reads) waits, and on resume it
finds every socket and timer ready at once. Each source (a peer's connection, a client's, the
disk, the timer) gives its inputs in the order they came, and the sources take turns in random
order, one input each, as an event loop serves its ready sockets. Nothing it held is lost: its
peers' requests were sent long ago, in whatever epoch they were in then.
"""

from __future__ import annotations

import functools
import random
import uuid
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Protocol, TypeVar

from quorum_node.kv.machine import KvMachine, check_snapshot_records
from quorum_node.kv.store import KvStore
from quorum_node.raft.config import QuorumConfig
from quorum_node.raft.core import (
    OutboundRequest,
    OutboundResponse,
    QuorumDescription,
    RaftCore,
    ReadBarrier,
    ReadOutcome,
    VoterChangeDone,
)
from quorum_node.raft.driver import CoreDriver
from quorum_node.raft.log import MemoryLog, RaftLog
from quorum_node.raft.memory_snapshots import MemorySnapshotStore
from quorum_node.raft.messages import RaftRequest, RaftResponse
from quorum_node.raft.quorum_state import RoleChanged
from quorum_node.raft.records import Record, read_batch_header
from quorum_node.raft.requests import RequestFailure
from quorum_node.raft.snapshots import SnapshotId, SnapshotRecordsCheck, SnapshotStore
from quorum_node.raft.state import ElectionState, RaftState
from quorum_node.raft.types import NotLeaderError, ReplicaKey
from quorum_node.sim.events import EventLoop

MIN_FLUSH_MS = 1
MAX_FLUSH_MS = 5
# How often a node in graceful shutdown checks whether a successor has taken over.
SHUTDOWN_CHECK_MS = 5
# The simulated snapshot.interval.records: a workload proposes tens of records a second.
SNAPSHOT_INTERVAL_RECORDS = 16
# How much of the log the state machine reads at a time: small, so that an apply takes several.
READ_CHUNK_BYTES = 4096

T = TypeVar("T")


def random_uuid(rng: random.Random) -> uuid.UUID:
    return uuid.UUID(int=rng.getrandbits(128), version=4)


def read_snapshot_bytes(store: SnapshotStore, snapshot_id: SnapshotId) -> bytes:
    size = store.size(snapshot_id)
    assert size is not None, f"no snapshot {snapshot_id}"
    return store.read(snapshot_id, 0, size)


def new_state_machine(snapshots: SnapshotStore) -> KvMachine:
    """A process's state machine: an empty store, then the latest snapshot on the disk, as the
    node starts (``KvSnapshots.load_latest``). Raises for a snapshot the store cannot load."""
    latest = snapshots.latest()
    machine = KvMachine(KvStore(), SNAPSHOT_INTERVAL_RECORDS,
                        latest.end_offset if latest is not None else 0)
    if latest is not None:
        machine.load(latest, read_snapshot_bytes(snapshots, latest))
    return machine


class CoreFactory(Protocol):
    """RaftCore's constructor; tests pass deliberately broken subclasses."""

    def __call__(
        self,
        *,
        node_id: int,
        directory_id: uuid.UUID | None,
        cluster_id: str,
        voters: Iterable[ReplicaKey],
        log: RaftLog,
        election_state: ElectionState | None,
        config: QuorumConfig,
        random: random.Random,
        now_ms: int,
        snapshots: SnapshotStore,
        observer_ids: Iterable[int] = (),
        check_snapshot_records: SnapshotRecordsCheck | None = None,
    ) -> RaftCore: ...


class NodeHost(Protocol):
    """What a node needs from the cluster around it."""

    loop: EventLoop

    def send(self, source: SimNode, message: OutboundRequest | OutboundResponse) -> None: ...

    def voter_change_done(self, source: SimNode, done: VoterChangeDone) -> None: ...


class CoreMonitor(Protocol):
    """Where a node reports a misbehaving core."""

    def core_failed(self, node_id: int, error: Exception) -> None: ...

    def core_spinning(self, node_id: int, polls: int) -> None: ...


class SimNode:
    def __init__(
        self,
        *,
        node_id: int,
        directory_id: uuid.UUID,
        cluster_id: str,
        voters: Sequence[ReplicaKey],
        observer_ids: Sequence[int],
        config: QuorumConfig,
        core_factory: CoreFactory,
        host: NodeHost,
        monitor: CoreMonitor,
        rng: random.Random,
    ) -> None:
        self.node_id = node_id
        self._observer_ids = observer_ids
        self.directory_id = directory_id
        self._cluster_id = cluster_id
        self._voters = voters
        self._config = config
        self._core_factory = core_factory
        self._host = host
        self._monitor = monitor
        self._loop = host.loop
        self._rng = rng
        # The disk: survives kills and restarts.
        self.log = MemoryLog()
        self.snapshots = MemorySnapshotStore()
        self.persisted: ElectionState | None = None
        # Lost disks by directory id, as they were when lost: what their replicas had
        # acknowledged still counts where a leader counted it (the invariant checker needs it).
        self.lost_disks: dict[uuid.UUID, tuple[MemoryLog, MemorySnapshotStore]] = {}
        # The process: None while the node is down.
        self.core: RaftCore | None = None
        self._driver: CoreDriver | None = None
        self.state_machine = KvMachine(KvStore(), SNAPSHOT_INTERVAL_RECORDS)
        self.snapshots_loaded = 0  # downloaded from a leader, over the node's life
        # Bumped on every start and stop, so events addressed to an earlier process are dropped.
        self.incarnation = 0
        self._flushing = False
        self._poll_token = 0
        self._shutdown_deadline_ms: int | None = None
        # Set by anything that may change the node; the invariant checker clears it.
        self.touched = True
        # The role changes its cores reported, until the invariant checker takes them.
        self.role_changes: list[RoleChanged] = []
        # While the process is paused: what reached it meanwhile, by source, handled on resume.
        self._held_inputs: dict[Hashable, list[Callable[[], None]]] | None = None
        # The readers waiting for a read barrier of this process's core, by barrier id, and the
        # outcomes that came before their reader was known (a lone voter confirms at once).
        self._readers: dict[int, Callable[[ReadOutcome], None]] = {}
        self._early_reads: dict[int, ReadOutcome] = {}

    @property
    def alive(self) -> bool:
        return self.core is not None

    @property
    def driver(self) -> CoreDriver | None:
        """What drives the running process's core (None while the node is down)."""
        return self._driver

    @property
    def paused(self) -> bool:
        return self._held_inputs is not None

    @property
    def shutting_down(self) -> bool:
        return self._shutdown_deadline_ms is not None

    @property
    def log_position(self) -> tuple[int, int]:
        """What a vote compares: the last epoch in the log, then its end (flushed or not)."""
        return self.log.last_fetched_epoch(), self.log.end_offset

    # -- process lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        assert self.core is None, f"node {self.node_id} is already running"
        self._new_process()
        try:
            self.state_machine = new_state_machine(self.snapshots)
            self.core = self._core_factory(
                node_id=self.node_id,
                directory_id=self.directory_id,
                cluster_id=self._cluster_id,
                voters=self._voters,
                log=self.log,
                election_state=self.persisted,
                config=self._config,
                # A Random per process, derived from the run's one, keeps the seed in charge.
                random=random.Random(self._rng.getrandbits(64)),
                now_ms=self._loop.now_ms,
                snapshots=self.snapshots,
                observer_ids=self._observer_ids,
                check_snapshot_records=check_snapshot_records,
            )
        except Exception as error:  # any failure to start is a finding, not a crash
            self._monitor.core_failed(self.node_id, error)
            return
        self._driver = CoreDriver(self.core, self)
        self._driver.after_step()

    def kill(self) -> None:
        """Hard kill: the process vanishes and the un-flushed part of the log with it."""
        if self.core is None:
            return
        self._new_process()
        self.core = None
        self.log.crash()
        self.snapshots.crash()

    def wipe_disk(self, directory_id: uuid.UUID) -> None:
        """Total loss of the disk (the node must be down): empty log and snapshot store, no
        election state, and ``directory_id``, new, as a re-formatted log directory gets
        (KIP-856): the node comes back as an observer."""
        assert self.core is None, "wipe the disk of a stopped node only"
        assert directory_id != self.directory_id, "a wiped disk gets a new directory id"
        self.touched = True
        self.lost_disks[self.directory_id] = (self.log, self.snapshots)
        self.log = MemoryLog()
        self.snapshots = MemorySnapshotStore()
        self.persisted = None
        self.directory_id = directory_id

    def shutdown(self, timeout_ms: int) -> None:
        """Graceful shutdown: a leader resigns and hands over; the process exits once a newer
        epoch is known, or after ``timeout_ms``. A clean exit loses nothing (the log is closed)."""
        core = self.core
        if core is None or self.shutting_down:
            return
        epoch = core.epoch
        self._shutdown_deadline_ms = self._loop.now_ms + timeout_ms
        assert self._driver is not None
        self.touched = True
        self._driver.step(lambda c: c.begin_shutdown(self._loop.now_ms))
        incarnation = self.incarnation

        def check() -> bool:
            current = self.core
            if current is None or self.incarnation != incarnation:
                return False
            handed_over = current.epoch > epoch or current.state not in (
                RaftState.LEADER,
                RaftState.RESIGNED,
            )
            assert self._shutdown_deadline_ms is not None
            if handed_over or self._loop.now_ms >= self._shutdown_deadline_ms:
                self._new_process()
                self.core = None
                self.log.flush()
                return True
            self._loop.after(SHUTDOWN_CHECK_MS, check)
            return False

        self._loop.after(0, check)

    def pause(self) -> None:
        """Stop the process where it is (SIGSTOP): it takes no input until ``resume``."""
        if self.core is not None and self._held_inputs is None:
            self._held_inputs = {}

    def resume(self) -> None:
        """Go on (SIGCONT): what reached the process meanwhile is handled, each input its own
        event: in turns, each source's next input in a random order of the sources."""
        held, self._held_inputs = self._held_inputs, None
        queues = list((held or {}).items())
        incarnation = self.incarnation
        while queues:
            self._rng.shuffle(queues)
            for source, queue in queues:
                self._loop.after(0, functools.partial(self._run_held, incarnation, source,
                                                      queue.pop(0)))
            queues = [(source, queue) for source, queue in queues if queue]

    def _run_held(self, incarnation: int, source: Hashable,
                  action: Callable[[], None]) -> bool:
        if self.incarnation != incarnation:
            return False
        self._input(source, action)  # paused again meanwhile: held again
        return True

    def _input(self, source: Hashable, action: Callable[[], None]) -> None:
        """Hand ``action``, from ``source``, to the process now, or on resume while it is
        paused."""
        if self._held_inputs is not None:
            self._held_inputs.setdefault(source, []).append(action)
        else:
            action()

    def _new_process(self) -> None:
        self.touched = True
        self._held_inputs = None  # a process killed while paused never handles what it held
        self._readers.clear()
        self._early_reads.clear()
        self.incarnation += 1
        self._flushing = False
        self._poll_token += 1
        self._shutdown_deadline_ms = None
        if self._driver is not None:
            self._driver.stop()
            self._driver = None

    # -- inputs -------------------------------------------------------------------------------
    def handle_request(self, source: int, correlation_id: int, request: RaftRequest) -> None:
        self._input(("peer", source), lambda: self._drive(
            lambda driver: driver.handle_request(source, correlation_id, request)))

    def handle_response(self, source: int, correlation_id: int, response: RaftResponse) -> None:
        self._input(("peer", source), lambda: self._drive(
            lambda driver: driver.handle_response(source, correlation_id, response)))

    def handle_request_failure(self, destination: int, correlation_id: int,
                               failure: RequestFailure) -> None:
        self._input(("peer", destination), lambda: self._drive(
            lambda driver: driver.handle_request_failure(destination, correlation_id, failure)))

    def _drive(self, call: Callable[[CoreDriver], None]) -> None:
        if self._driver is not None:
            self.touched = True
            call(self._driver)

    def read(self, timeout_ms: int, reader: Callable[[ReadOutcome], None]) -> None:
        """A client's linearizable read (ReadIndex) sent to this process: ``reader`` gets the
        barrier's outcome once the core settles it; nothing if the process is no leader, or
        dies first (the client's connection fails)."""
        self._input(("client", reader), lambda: self._begin_read(timeout_ms, reader))

    def _begin_read(self, timeout_ms: int, reader: Callable[[ReadOutcome], None]) -> None:
        try:
            barrier: ReadBarrier | None = self._request(
                lambda c: c.begin_read(self._loop.now_ms, timeout_ms))
        except NotLeaderError:
            return
        if barrier is None:
            return
        early = self._early_reads.pop(barrier.id, None)
        if early is not None:
            reader(early)
        else:
            self._readers[barrier.id] = reader

    def propose(self, records: Sequence[Record]) -> tuple[int, int] | None:
        """Offer records to the core; None if it is not the leader (or failed)."""
        try:
            return self._request(lambda c: c.propose(self._loop.now_ms, records))
        except NotLeaderError:
            return None

    def propose_each(self, proposals: Sequence[Sequence[Record]]
                     ) -> list[tuple[int, int] | Exception] | None:
        """Offer several clients' records in one step, as the node gathers the writes of one
        turn of its loop: each one's offsets or refusal; None if the node is down."""
        try:
            return self._request(lambda c: c.propose_each(self._loop.now_ms, proposals))
        except NotLeaderError:
            return None

    def add_voter(self, key: ReplicaKey, timeout_ms: int) -> int | None:
        """AddVoter to this node: a ticket, None if the node is down (or its core failed);
        raises what the core refuses with (NotLeaderError, VoterChangeError)."""
        return self._request(lambda c: c.add_voter(self._loop.now_ms, key, timeout_ms))

    def remove_voter(self, key: ReplicaKey, timeout_ms: int) -> int | None:
        """RemoveVoter to this node, as ``add_voter``."""
        return self._request(lambda c: c.remove_voter(self._loop.now_ms, key, timeout_ms))

    def describe_quorum(self) -> QuorumDescription | None:
        """DescribeQuorum, if this node is a running leader."""
        try:
            return self._request(lambda c: c.describe_quorum(self._loop.now_ms))
        except NotLeaderError:
            return None

    def _request(self, request: Callable[[RaftCore], T]) -> T | None:
        """Call the core for a client or an administrator: what it answers, None if the node is
        down or the core failed (or paused: the caller gives up). The refusals a caller must
        expect are raised to it."""
        driver = self._driver
        if driver is None or not driver.driving or self.paused:
            return None
        self.touched = True
        try:
            return driver.request(request)
        except NotLeaderError:
            if driver.failed:
                return None
            raise

    # -- the state machine's duties -----------------------------------------------------------
    def take_snapshot(self, retained_log_records: int | None = None) -> SnapshotId | None:
        """Snapshot the state machine as of what it has applied, if that is a batch boundary
        the log still holds and is past the latest snapshot (KIP-630: the state machine, not
        the core, decides), as the node writes one; then, given ``retained_log_records``,
        delete the log below it but for that many records, as the node compacts."""
        core = self.core
        machine = self.state_machine
        end = machine.next_offset
        latest = self.snapshots.latest()
        if (core is None or self.paused or end == 0
                or (latest is not None and latest.end_offset >= end)
                or end - 1 < self.log.start_offset):
            return None
        plan = machine.plan_snapshot(read_batch_header(self.log.read(end - 1, 1)),
                                     core.voter_set_at(end - 1))
        if plan is None:
            return None
        self.touched = True
        self.snapshots.save(plan.snapshot_id, b"".join(plan.batches()))
        self.snapshots.delete_before(plan.snapshot_id)
        log_start = machine.snapshot_written(plan, retained_log_records or 0)
        if retained_log_records is not None:
            self.delete_log_before(log_start)
        return plan.snapshot_id

    def delete_log_before(self, offset: int) -> None:
        """Delete the log below ``offset``, which a snapshot must cover."""
        latest = self.snapshots.latest()
        assert latest is not None and offset <= latest.end_offset, "no snapshot covers that"
        self.touched = True
        self.log.delete_before(offset)

    # -- the driver's host (quorum_node.raft.driver.DriverHost) --------------------------------
    def now_ms(self) -> int:
        return self._loop.now_ms

    def persist(self, state: ElectionState) -> None:
        self.persisted = state

    def send(self, request: OutboundRequest) -> None:
        self._host.send(self, request)

    def answer(self, response: OutboundResponse) -> None:
        self._host.send(self, response)

    def flush(self) -> None:
        # Group commit: appends made while this flush runs are covered by it, because the flush
        # makes durable everything appended by the time it completes.
        if self._flushing:
            return
        self._flushing = True
        incarnation = self.incarnation

        def complete() -> None:
            driver = self._driver
            if self.incarnation != incarnation or driver is None:
                return
            self._flushing = False
            self.touched = True
            driver.handle_flushed(self.log.flush())

        def done() -> bool:
            if self.incarnation != incarnation:
                return False
            self._input("disk", complete)
            return True

        self._loop.after(self._rng.randint(MIN_FLUSH_MS, MAX_FLUSH_MS), done)

    def role_changed(self, change: RoleChanged) -> None:
        self.role_changes.append(change)

    def snapshot_loaded(self, snapshot_id: SnapshotId) -> None:
        # The core replaced the log by a snapshot from the leader: the state machine starts
        # over from it (a snapshot the store cannot give back fails the node: a finding).
        self.snapshots_loaded += 1
        self.state_machine.load(snapshot_id, read_snapshot_bytes(self.snapshots, snapshot_id))

    def voter_change_done(self, done: VoterChangeDone) -> None:
        self._host.voter_change_done(self, done)

    def read_settled(self, outcome: ReadOutcome) -> None:
        reader = self._readers.pop(outcome.barrier_id, None)
        if reader is not None:
            reader(outcome)
        else:
            self._early_reads[outcome.barrier_id] = outcome

    def stepped(self) -> None:
        core = self.core
        assert core is not None
        # Every step applies what is committed (the node's leader does so after each step, its
        # followers in their applier): a gap in the log stops it, the checker reports that.
        high_watermark = core.high_watermark
        machine = self.state_machine
        while high_watermark is not None and machine.next_offset < high_watermark:
            encoded = self.log.read(machine.next_offset, READ_CHUNK_BYTES)
            if not encoded:
                return
            try:
                machine.apply(encoded, high_watermark)
            except Exception as error:  # the node's applier would stop: a finding
                self._monitor.core_failed(self.node_id, error)
                return

    def set_timer(self, at_ms: int) -> None:
        self._poll_token += 1
        token = self._poll_token

        def poll() -> None:
            driver = self._driver
            if token == self._poll_token and driver is not None:
                self.touched = True
                driver.poll()

        def due() -> bool:
            if token != self._poll_token or self._driver is None:
                return False
            self._input("timer", poll)
            return True

        self._loop.at(at_ms, due)

    def core_failed(self, error: Exception) -> None:
        self._monitor.core_failed(self.node_id, error)

    def core_spinning(self, polls: int) -> None:
        self._monitor.core_spinning(self.node_id, polls)
