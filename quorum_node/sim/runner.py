"""Running seeds: a seed picks the scenario (round-robin unless one is named), the cluster shape
and every random choice of the run; ``run_seed`` gives the same result for the same arguments."""

from __future__ import annotations

import multiprocessing
import random
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from functools import partial

from quorum_node.raft.config import QuorumConfig
from quorum_node.raft.core import RaftCore
from quorum_node.sim.node import CoreFactory
from quorum_node.sim.scenarios import SCENARIOS
from quorum_node.sim.simulation import CHECKS, SIM_CONFIG, Simulation
from quorum_node.sim.violation import Violation

# Share of seeds whose network also loses and duplicates a few messages throughout.
NOISY_SHARE = 0.25
MAX_NOISE = 0.05
# Nodes start within this many ms of each other.
START_SPREAD_MS = 50
# Share of seeds whose static voters are configured by id only (controller.quorum.voters); the
# others know their directory ids from the start (format --initial-controllers).
ID_ONLY_SHARE = 0.5
# Share of seeds whose nodes snapshot and delete their logs now and then (some scenarios always do).
COMPACTING_SHARE = 0.5
# The leader's flush delay, in turn for each round of the scenarios: Kafka's (a leader flushes
# at once); the node's default, shorter than a commit takes over this network (the leader
# mostly flushes once it has waited); and one longer than that (the followers commit what the
# leader has not flushed).
LEADER_FLUSH_DELAYS_MS = (0, QuorumConfig().leader_flush_delay_ms, 40)


@dataclass(frozen=True, slots=True)
class NodeSummary:
    node_id: int
    alive: bool
    incarnation: int
    state: str | None
    epoch: int | None
    high_watermark: int | None
    log_start: int
    log_end: int
    durable_end: int
    snapshots_loaded: int


@dataclass(frozen=True, slots=True)
class SeedResult:
    seed: int
    scenario: str
    voters: int
    observers: int
    events: int
    sim_time_ms: int
    committed: int
    violations: list[Violation]
    nodes: tuple[NodeSummary, ...]


def scenario_for(seed: int, scenario: str | None = None) -> str:
    if scenario is None:
        return list(SCENARIOS)[seed % len(SCENARIOS)]
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    return scenario


def config_for(seed: int) -> QuorumConfig:
    delay = LEADER_FLUSH_DELAYS_MS[seed // len(SCENARIOS) % len(LEADER_FLUSH_DELAYS_MS)]
    return SIM_CONFIG.model_copy(update={"leader_flush_delay_ms": delay})


def run_seed(
    seed: int,
    scenario: str | None = None,
    core_factory: CoreFactory = RaftCore,
    checks: Collection[str] = CHECKS,
) -> SeedResult:
    """Simulate one seed. ``checks`` switches invariants off (mutation tests isolate one)."""
    chosen = SCENARIOS[scenario_for(seed, scenario)]
    rng = random.Random(seed)
    voters = rng.randint(*chosen.voters)
    observers = rng.randint(*chosen.observers)
    sim = Simulation(
        seed=seed,
        scenario=chosen.name,
        rng=rng,
        voters=voters,
        observers=observers,
        core_factory=core_factory,
        checks=checks,
        configured_directories=rng.random() >= ID_ONLY_SHARE,
        config=config_for(seed),
    )
    if rng.random() < NOISY_SHARE:
        sim.cluster.network.drop_probability = rng.uniform(0.0, MAX_NOISE)
        sim.cluster.network.duplicate_probability = rng.uniform(0.0, MAX_NOISE)
    for node_id in sim.cluster.nodes:
        sim.at(rng.randint(0, START_SPREAD_MS), partial(sim.cluster.start, node_id))
    sim.workload.start()
    sim.readers.start()
    sim.operator.start()
    if rng.random() < COMPACTING_SHARE:
        sim.compaction.start()
    chosen.script(sim)
    sim.run()
    return SeedResult(
        seed=seed,
        scenario=chosen.name,
        voters=voters,
        observers=observers,
        events=sim.events,
        sim_time_ms=sim.now_ms,
        committed=sim.checker.committed_end,
        violations=sim.violations,
        nodes=tuple(
            NodeSummary(
                node_id=node.node_id,
                alive=node.alive,
                incarnation=node.incarnation,
                state=str(node.core.state) if node.core is not None else None,
                epoch=node.core.epoch if node.core is not None else None,
                high_watermark=node.core.high_watermark if node.core is not None else None,
                log_start=node.log.start_offset,
                log_end=node.log.end_offset,
                durable_end=node.log.durable_end_offset,
                snapshots_loaded=node.snapshots_loaded,
            )
            for node in sim.cluster.nodes.values()
        ),
    )


def first_violation(
    seeds: Iterable[int],
    scenario: str,
    core_factory: CoreFactory,
    checks: Collection[str],
) -> Violation | None:
    """The first violation of ``checks`` over ``seeds``: what a mutation test looks for."""
    for seed in seeds:
        result = run_seed(seed, scenario, core_factory, checks)
        if result.violations:
            return result.violations[0]
    return None


def run_seeds(
    seeds: Iterable[int], scenario: str | None = None, jobs: int = 1
) -> Iterator[SeedResult]:
    """Results in seed order; ``jobs`` > 1 spreads the seeds over that many processes."""
    run = partial(run_seed, scenario=scenario)
    if jobs <= 1:
        yield from map(run, seeds)
        return
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        yield from pool.imap(run, seeds)
