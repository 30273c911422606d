"""The one driver of a RaftCore: it calls the core and carries out the effects of each step, in
the order the core's contract requires, through a ``DriverHost``.

The node's driver host (``quorum_node.node.driver_host``) hosts it over real files, sockets and
an asyncio loop; the simulator (``quorum_node.sim.node``) over a simulated disk, network and
clock. Both run this class, so the simulator's fault schedules test the driving that
production runs: when the election state is written (durably, before any message of its step
leaves, and before the role changes it implies are told), how requests and answers leave, when a
flush is asked for, how the core's timer is kept, what a failing core does to its node, and how
a snapshot downloaded from the leader reaches the state machine.

The driver does no I/O of its own and reads no clock but the host's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from quorum_node.raft.core import (
    OutboundRequest,
    OutboundResponse,
    RaftCore,
    ReadOutcome,
    VoterChangeDone,
)
from quorum_node.raft.log import LogFullError
from quorum_node.raft.messages import RaftRequest, RaftResponse
from quorum_node.raft.quorum_state import RoleChanged
from quorum_node.raft.requests import RequestFailure
from quorum_node.raft.snapshots import SnapshotId
from quorum_node.raft.state import ElectionState
from quorum_node.raft.types import NotLeaderError, VoterChangeError

T = TypeVar("T")

# Consecutive polls after which a core whose next deadline is never in the future is reported
# (it asks to be polled again at once, over and over: a bug, and a busy loop in a node).
SPINNING_POLLS = 100

# What the core raises to a caller that asked for something it refuses (not a failure): a full
# log refuses a client's records, having taken none of them.
REFUSALS = (NotLeaderError, VoterChangeError, ValueError, LogFullError)


class DriverHost(Protocol):
    """What the driver needs from the process around the core."""

    def now_ms(self) -> int:
        """The clock the core runs on (milliseconds)."""
        ...

    def persist(self, state: ElectionState) -> None:
        """Write the election state durably; returns once it is."""
        ...

    def send(self, request: OutboundRequest) -> None:
        """Send a request to a peer; its answer or failure comes back through the driver's
        ``handle_response`` or ``handle_request_failure`` (with why: a refused connection, and
        one the peer ended, are told apart from silence)."""
        ...

    def answer(self, response: OutboundResponse) -> None:
        """Answer a peer's request (by its correlation id)."""
        ...

    def flush(self) -> None:
        """Make the log durable (now or soon; one flush may cover many asks), then call the
        driver's ``handle_flushed`` with the offset it is durable to."""
        ...

    def role_changed(self, change: RoleChanged) -> None:
        """The replica changed role (state, epoch or leader), for the reason ``change.cause``
        says; the election state it implies is durable by now."""
        ...

    def snapshot_loaded(self, snapshot_id: SnapshotId) -> None:
        """The core replaced the log by this snapshot, downloaded from the leader: the state
        machine starts over from it."""
        ...

    def voter_change_done(self, done: VoterChangeDone) -> None:
        """A voter change the core took a ticket for has ended (committed or failed)."""
        ...

    def read_settled(self, outcome: ReadOutcome) -> None:
        """A read barrier the core handed out is confirmed, abandoned or timed out."""
        ...

    def stepped(self) -> None:
        """A step is carried out: what waits on the core's state may look again."""
        ...

    def set_timer(self, at_ms: int) -> None:
        """Call the driver's ``poll`` at ``at_ms`` (host clock), instead of any earlier-set time."""
        ...

    def core_failed(self, error: Exception) -> None:
        """The core raised: the node must not go on with it."""
        ...

    def core_spinning(self, polls: int) -> None:
        """The core asked to be polled again at once after ``polls`` polls in a row."""
        ...


class CoreDriver:
    """Calls a RaftCore and carries out its effects through ``host``."""

    def __init__(self, core: RaftCore, host: DriverHost) -> None:
        self.core = core
        self._host = host
        self.failed = False  # the core raised: nothing drives it any more
        self.stopped = False  # the host stopped driving it (the process is going away)
        self._timer_at: int | None = None
        self._spinning_polls = 0

    @property
    def driving(self) -> bool:
        return not self.failed and not self.stopped

    # --- inputs ------------------------------------------------------------------------------

    def step(self, step: Callable[[RaftCore], object], *, polled: bool = False) -> None:
        """Call into the core and carry out its effects; a core that raises fails the node."""
        if not self.driving:
            return
        try:
            step(self.core)
        except Exception as error:  # an invariant failure, or a bug: never carry on past it
            self._fail(error)
            return
        self.after_step(polled=polled)

    def request(self, call: Callable[[RaftCore], T]) -> T:
        """Call the core for a client or an administrator and carry out the step's effects: its
        answer, or the refusal it raises (``REFUSALS``) to the caller. Anything else the core
        raises fails the node, and the caller is told the node is no leader."""
        if not self.driving:
            raise NotLeaderError(None, self.core.epoch)
        try:
            answer = call(self.core)
        except REFUSALS:
            self.after_step()
            raise
        except Exception as error:
            self._fail(error)
            raise NotLeaderError(None, self.core.epoch) from error
        self.after_step()
        return answer

    def poll(self) -> None:
        """The timer the host set has fired."""
        self._timer_at = None
        if not self.driving:
            return
        now_ms = self._host.now_ms()
        if self.core.next_deadline_ms() > now_ms:
            self._schedule(polled=False)  # early: the host's clock stepped back
            return
        self.step(lambda core: core.poll(now_ms), polled=True)

    def handle_request(self, source: int, correlation_id: int, request: RaftRequest) -> None:
        self.step(lambda core: core.handle_request(self._host.now_ms(), source, correlation_id,
                                                   request))

    def handle_response(self, source: int, correlation_id: int, response: RaftResponse) -> None:
        self.step(lambda core: core.handle_response(self._host.now_ms(), source, correlation_id,
                                                    response))

    def handle_request_failure(self, destination: int, correlation_id: int,
                               failure: RequestFailure = RequestFailure.UNANSWERED) -> None:
        self.step(lambda core: core.handle_request_failure(self._host.now_ms(), destination,
                                                           correlation_id, failure))

    def handle_flushed(self, offset: int) -> None:
        self.step(lambda core: core.handle_flushed(self._host.now_ms(), offset))

    # --- effects -----------------------------------------------------------------------------

    def after_step(self, *, polled: bool = False) -> None:
        """Carry out what the core asked for in its last step(s), in the contract's order."""
        host = self._host
        try:
            effects = self.core.take_effects()
            if effects.snapshot_loaded is not None:
                host.snapshot_loaded(effects.snapshot_loaded)
        except Exception as error:
            self._fail(error)
            return
        if effects.persist is not None:
            # Synchronous on purpose: nothing of this step may leave before it is durable. A
            # write that failed leaves the core ahead of its disk (a vote it holds but may forget
            # in a power loss, and would grant again after): the node stops.
            try:
                host.persist(effects.persist)
            except Exception as error:
                self._fail(error)
                return
        for change in effects.role_changes:
            host.role_changed(change)
        for message in effects.messages:
            if isinstance(message, OutboundRequest):
                host.send(message)
            else:
                host.answer(message)
        if effects.flush:
            host.flush()
        for done in effects.voter_changes:
            host.voter_change_done(done)
        for outcome in effects.reads:
            host.read_settled(outcome)
        self._schedule(polled=polled)
        host.stepped()

    def _schedule(self, *, polled: bool) -> None:
        """Keep the host's one timer at the core's next deadline. Right after a poll every timer
        up to now has run, so a deadline not in the future asks to spin: time must pass first,
        and a core that keeps asking is reported."""
        if self.stopped:
            return
        now_ms = self._host.now_ms()
        deadline_ms = self.core.next_deadline_ms()
        if polled:
            if deadline_ms <= now_ms:
                self._spinning_polls += 1
                if self._spinning_polls == SPINNING_POLLS:
                    self._host.core_spinning(self._spinning_polls)
            else:
                self._spinning_polls = 0
        at_ms = max(deadline_ms, now_ms + 1 if polled else now_ms)
        if self._timer_at is not None and self._timer_at <= at_ms:
            return  # an earlier poll is due: it looks at the deadline again
        self._timer_at = at_ms
        self._host.set_timer(at_ms)

    def stop(self) -> None:
        """Stop driving the core: from here on every input is dropped (the process stops; a
        peer's request would otherwise keep a stopping node campaigning)."""
        self.stopped = True

    def _fail(self, error: Exception) -> None:
        self.failed = True
        self._host.core_failed(error)
