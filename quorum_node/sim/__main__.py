"""Command line: ``python -m quorum_node.sim --seeds N [--seed S] [--scenario NAME] [--jobs J]``.

Prints one line per violation with the seed that reproduces it, then a summary; exits 1 if any
invariant was violated."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence

from quorum_node.sim.runner import run_seeds
from quorum_node.sim.scenarios import SCENARIOS


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m quorum_node.sim",
        description="Deterministic simulation of the Raft quorum under faults.",
    )
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    parser.add_argument("--seed", type=int, default=0, help="first seed (runs S..S+N-1)")
    parser.add_argument(
        "--scenario",
        choices=list(SCENARIOS),
        help="run every seed in this scenario (default: round-robin by seed)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument(
        "--verbose", action="store_true", help="show the cores' log (elections, resignations)"
    )
    parser.add_argument("--list-scenarios", action="store_true", help="list the scenarios and exit")
    args = parser.parse_args(argv)
    if args.list_scenarios:
        for scenario in SCENARIOS.values():
            print(f"{scenario.name}: {scenario.description}")
        return 0
    if args.seeds < 1 or args.jobs < 1:
        parser.error("--seeds and --jobs must be at least 1")
    # The cores log every election and resignation: routine under fault injection.
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR)

    started = time.perf_counter()
    events = violations = 0
    seeds = range(args.seed, args.seed + args.seeds)
    for result in run_seeds(seeds, args.scenario, args.jobs):
        events += result.events
        violations += len(result.violations)
        for violation in result.violations:
            print(violation, flush=True)
    elapsed = time.perf_counter() - started
    print(f"seeds: {args.seeds}, events: {events}, violations: {violations}")
    print(f"events/s: {events / elapsed:.0f} ({elapsed:.1f} s wall, {args.jobs} job(s))")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
