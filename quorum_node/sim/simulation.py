"""One simulation run wired together: event loop, cluster, client, operator, log compaction,
invariant checker, and the small vocabulary scenarios are written in (do this at that time, wait
for that, fail with this).

Everything random draws from the one ``random.Random`` handed in, so a run is a pure function of
its seed (and scenario).
"""

from __future__ import annotations

import random
import traceback
from collections.abc import Callable, Collection
from typing import TypeVar

from quorum_node.raft.config import QuorumConfig
from quorum_node.sim.admin import Operator
from quorum_node.sim.cluster import Cluster
from quorum_node.sim.compaction import Compaction
from quorum_node.sim.events import EventLoop
from quorum_node.sim.forgery import Forger
from quorum_node.sim.invariants import INVARIANTS, InvariantChecker
from quorum_node.sim.node import CoreFactory
from quorum_node.sim.reads import LINEARIZABLE_READ, Readers
from quorum_node.sim.violation import Violation
from quorum_node.sim.workload import Workload

CORE_ERROR = "CoreError"
LIVENESS = "Liveness"
NO_MINORITY_COMMIT = "NoMinorityCommit"
BUSY_POLL = "BusyPoll"
CHECKS = (*INVARIANTS, LINEARIZABLE_READ, CORE_ERROR, BUSY_POLL, LIVENESS, NO_MINORITY_COMMIT)

# Timings no longer than production's, most shorter, as in Kafka's simulation, for more protocol
# per event.
SIM_CONFIG = QuorumConfig(
    election_timeout_ms=1000,
    fetch_timeout_ms=1000,
    election_backoff_max_ms=1000,
    request_timeout_ms=1000,
    retry_backoff_ms=50,
    append_linger_ms=25,
    fetch_max_wait_ms=100,
)
# How often wait_for re-evaluates its condition.
WAIT_STEP_MS = 10
# No run goes past this, whatever the scenario asks for.
MAX_RUN_MS = 120_000

T = TypeVar("T")


class Simulation:
    def __init__(
        self,
        *,
        seed: int,
        scenario: str,
        rng: random.Random,
        voters: int,
        observers: int,
        core_factory: CoreFactory,
        checks: Collection[str] = CHECKS,
        config: QuorumConfig = SIM_CONFIG,
        propose_interval_ms: tuple[int, int] = (5, 50),
        configured_directories: bool = True,
    ) -> None:
        self.seed = seed
        self.scenario = scenario
        self.rng = rng
        self.loop = EventLoop()
        self.violations: list[Violation] = []
        self.events = 0
        self.end_ms = 0
        self._checks = frozenset(checks)
        self.cluster = Cluster(
            loop=self.loop,
            rng=rng,
            voters=voters,
            observers=observers,
            config=config,
            core_factory=core_factory,
            monitor=self,
            configured_directories=configured_directories,
        )
        self.operator = Operator(self.cluster, rng)
        self.compaction = Compaction(self.cluster, rng)
        self.forger = Forger(self.cluster, rng)
        self.workload = Workload(
            self.cluster,
            rng,
            min_interval_ms=propose_interval_ms[0],
            max_interval_ms=propose_interval_ms[1],
        )
        self.checker = InvariantChecker(self.cluster, self.workload.proposed_at, self.fail)
        self.readers = Readers(self.cluster, rng, lambda: self.checker.committed_end, self.fail)
        # Scenario-specific checks that run after every event while they are installed.
        self.watches: list[Callable[[], None]] = []

    @property
    def now_ms(self) -> int:
        return self.loop.now_ms

    def run(self) -> None:
        """Process events until ``end_ms`` (which scenario steps may push later) or the first
        violation, checking the invariants after every event that did something."""
        while not self.violations:
            outcome = self.loop.run_one(min(self.end_ms, MAX_RUN_MS))
            if outcome is None:
                return
            if outcome:
                self.events += 1
                for check in (self.checker.check, *self.watches):
                    if self.violations:
                        break
                    check()

    # -- reporting ----------------------------------------------------------------------------
    def fail(self, check: str, message: str) -> bool:
        """Record a violation of ``check`` unless it is switched off; True if recorded."""
        if check not in self._checks:
            return False
        self.violations.append(Violation(self.seed, self.scenario, check, self.now_ms, message))
        return True

    # -- CoreMonitor --------------------------------------------------------------------------
    def core_failed(self, node_id: int, error: Exception) -> None:
        frame = traceback.extract_tb(error.__traceback__)[-1]
        where = f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} in {frame.name}"
        if not self.fail(CORE_ERROR, f"node {node_id}: {type(error).__name__}: {error} ({where})"):
            # Not reported: the process dies of it, as an uncaught exception would end it.
            self.cluster.kill(node_id)

    def core_spinning(self, node_id: int, polls: int) -> None:
        core = self.cluster.nodes[node_id].core
        assert core is not None
        self.fail(
            BUSY_POLL,
            f"node {node_id} ({core.state}, epoch {core.epoch}): next_deadline_ms() was not in "
            f"the future right after poll() {polls} times in a row (a real driver would spin)",
        )

    # -- scenario vocabulary ------------------------------------------------------------------
    def run_until_at_least(self, time_ms: int) -> None:
        self.end_ms = max(self.end_ms, time_ms)

    def at(self, time_ms: int, action: Callable[[], None]) -> None:
        """Run a scenario step at ``time_ms`` (and keep the run going until then)."""
        self.run_until_at_least(time_ms)

        def step() -> bool:
            action()
            return True

        self.loop.at(time_ms, step)

    def wait_for(
        self,
        what: str,
        condition: Callable[[], T | None],
        then: Callable[[T], None],
        *,
        timeout_ms: int,
    ) -> None:
        """Call ``then`` with the condition's value as soon as it is not None; a Liveness
        violation if that takes longer than ``timeout_ms``."""
        deadline = self.now_ms + timeout_ms
        self.run_until_at_least(deadline)

        def probe() -> bool:
            found = condition()
            if found is not None:
                then(found)
                return True
            if self.now_ms >= deadline:
                self.fail(LIVENESS, f"no {what} within {timeout_ms} ms")
                return True
            self.loop.after(WAIT_STEP_MS, probe)
            return False

        self.loop.after(0, probe)
