"""Deterministic discrete-event simulation of the Raft quorum: real RaftCores on a simulated
network and disk, faults injected per scenario, safety invariants checked after every event.

A seed reproduces a run exactly: ``python -m quorum_node.sim --seed S --seeds 1``.
"""

from quorum_node.sim.runner import SeedResult, run_seed, run_seeds
from quorum_node.sim.scenarios import SCENARIOS
from quorum_node.sim.simulation import CHECKS
from quorum_node.sim.violation import Violation

__all__ = ["CHECKS", "SCENARIOS", "SeedResult", "Violation", "run_seed", "run_seeds"]
