"""The simulator's moving parts on their own: event order, the network, a node's disk and
process lifecycle, and the command line."""

from __future__ import annotations

import random

import pytest

from quorum_node.kv.machine import state_digest
from quorum_node.kv.ops import Put, encode_op
from quorum_node.raft.core import RaftCore
from quorum_node.raft.quorum_state import TransitionCause
from quorum_node.raft.records import Record
from quorum_node.raft.state import RaftState
from quorum_node.raft.types import Errors
from quorum_node.sim import __main__ as cli
from quorum_node.sim import runner
from quorum_node.sim.events import EventLoop
from quorum_node.sim.network import Network
from quorum_node.sim.runner import SeedResult
from quorum_node.sim.scenarios import SCENARIOS
from quorum_node.sim.simulation import SIM_CONFIG, Simulation
from quorum_node.sim.violation import Violation


def test_event_loop_runs_by_time_then_insertion_order() -> None:
    loop = EventLoop()
    seen: list[str] = []

    def note(label: str) -> bool:
        seen.append(f"{label}@{loop.now_ms}")
        return True

    loop.at(5, lambda: note("b"))
    loop.at(1, lambda: note("a"))
    loop.at(5, lambda: note("c"))
    while loop.run_one(until_ms=10) is not None:
        pass
    assert seen == ["a@1", "b@5", "c@5"]
    assert loop.now_ms == 10


def _deliveries(network: Network, loop: EventLoop, source: int, destination: int) -> list[int]:
    arrivals: list[int] = []

    def deliver() -> bool:
        arrivals.append(loop.now_ms)
        return True

    network.send(source, destination, deliver)
    return arrivals


def _drain(loop: EventLoop) -> None:
    while loop.run_one(until_ms=1000) is not None:
        pass


def test_partition_drops_messages_sent_and_in_flight() -> None:
    loop = EventLoop()
    network = Network(loop, random.Random(1), min_latency_ms=5, max_latency_ms=5)
    in_flight = _deliveries(network, loop, 0, 1)
    network.split([[0], [1, 2]])
    blocked = _deliveries(network, loop, 0, 1)
    inside = _deliveries(network, loop, 1, 2)
    _drain(loop)
    assert (in_flight, blocked, inside) == ([], [], [5])
    network.heal()
    network.isolate(2, [0, 1, 2])
    assert network.is_blocked(2, 0) and network.is_blocked(1, 2)
    assert not network.is_blocked(0, 1)


def test_a_star_leaves_only_the_links_of_its_center() -> None:
    network = Network(EventLoop(), random.Random(1))
    network.star(1, [0, 1, 2, 3])
    links = [(a, b) for a in range(4) for b in range(4) if a != b]
    assert [link for link in links if not network.is_blocked(*link)] == [
        (0, 1), (1, 0), (1, 2), (1, 3), (2, 1), (3, 1)]


def test_network_duplicates_and_drops() -> None:
    loop = EventLoop()
    network = Network(loop, random.Random(1))
    network.duplicate_probability = 1.0
    twice = _deliveries(network, loop, 0, 1)
    _drain(loop)
    network.drop_probability = 1.0
    never = _deliveries(network, loop, 0, 1)
    _drain(loop)
    assert (len(twice), never) == (2, [])


def _single_voter_with_data() -> Simulation:
    sim = Simulation(
        seed=0,
        scenario="test",
        rng=random.Random(0),
        voters=1,
        observers=0,
        core_factory=RaftCore,
    )
    sim.cluster.start(0)
    node = sim.cluster.nodes[0]
    while node.core is not None and node.core.state is not RaftState.LEADER:
        sim.loop.run_one(until_ms=5000)
    node.propose([encode_op(Put("key", "x"))])
    sim.end_ms = sim.now_ms + 100
    sim.run()
    node.propose([Record(value=b"y")])
    return sim


def test_hard_kill_loses_unflushed_writes_and_keeps_the_election_state() -> None:
    sim = _single_voter_with_data()
    node = sim.cluster.nodes[0]
    assert node.core is not None
    epoch = node.core.epoch
    while node.log.end_offset == node.log.durable_end_offset:  # appended, not yet flushed
        sim.loop.run_one(until_ms=sim.now_ms + 100)
    durable = node.log.durable_end_offset
    node.kill()
    assert node.log.end_offset == durable
    assert node.persisted is not None and node.persisted.epoch == epoch
    node.start()
    assert node.core is not None and node.core.epoch >= epoch


def test_graceful_shutdown_flushes_the_log() -> None:
    sim = _single_voter_with_data()
    node = sim.cluster.nodes[0]
    node.shutdown(timeout_ms=50)
    sim.end_ms = sim.now_ms + 100
    sim.run()
    assert not node.alive
    assert node.log.durable_end_offset == node.log.end_offset


def test_wiped_disk_comes_back_empty_under_a_new_directory_id() -> None:
    sim = _single_voter_with_data()
    node = sim.cluster.nodes[0]
    directory_id = node.directory_id
    assert node.take_snapshot() is not None
    node.kill()
    sim.cluster.wipe_disk(0)
    assert (node.log.end_offset, node.persisted, node.snapshots.latest()) == (0, None, None)
    assert node.directory_id != directory_id
    node.start()
    assert node.core is not None and not node.core.is_voter
    assert node.state_machine.next_offset == 0 and len(node.state_machine.store) == 0


def test_snapshot_survives_a_crash_and_restores_the_state_machine() -> None:
    sim = _single_voter_with_data()
    node = sim.cluster.nodes[0]
    sim.end_ms = sim.now_ms + 100
    sim.run()
    machine = node.state_machine
    applied, digest = machine.next_offset, state_digest(machine.store.snapshot_entries())
    snapshot = node.take_snapshot()
    assert snapshot is not None and snapshot.end_offset == applied
    node.delete_log_before(applied)
    assert node.log.start_offset == applied
    node.kill()
    node.start()
    restored = node.state_machine
    assert restored is not machine and restored.store.get("key") == "x"
    assert (restored.next_offset, state_digest(restored.store.snapshot_entries())) == (
        applied, digest)
    assert node.snapshots.latest() == snapshot and not sim.violations


def test_operator_replaces_a_lost_voter() -> None:
    """KIP-856's recovery, driven by the operator: the new directory is added once caught up,
    then the lost one removed; the invariants hold throughout."""
    sim = Simulation(
        seed=3, scenario="test", rng=random.Random(3), voters=3, observers=0,
        core_factory=RaftCore,
    )
    sim.cluster.start_all()
    sim.workload.start()
    sim.operator.start()
    sim.end_ms = 3000
    sim.run()
    sim.cluster.kill(2)
    assert sim.checker.can_lose_disk(2)
    sim.cluster.wipe_disk(2)
    sim.cluster.kill(0)
    assert not sim.checker.can_lose_disk(0)  # a second lost voter of three: no majority left
    sim.cluster.start(0)
    sim.cluster.start(2)
    sim.end_ms = 15_000
    sim.run()
    assert not sim.violations, sim.violations
    expected = sim.operator.remediated_voters()
    assert tuple(sorted(sim.checker.committed_voter_set())) == expected
    assert [(label.split()[0], error) for label, error in sim.operator.outcomes] == [
        ("add", Errors.NONE), ("remove", Errors.NONE)]


def test_cli_lists_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--list-scenarios"]) == 0
    listed = [line.split(":")[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == list(SCENARIOS)


def test_cli_reports_violations_and_exits_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    violation = Violation(5, "leader_partition", "SingleLeader", 1234, "two leaders")

    def fake_run_seeds(seeds: range, scenario: str | None, jobs: int) -> list[SeedResult]:
        return [
            SeedResult(seed, "leader_partition", 3, 0, 10, 100, 1, [violation] if seed else [], ())
            for seed in seeds
        ]

    monkeypatch.setattr(cli, "run_seeds", fake_run_seeds)
    assert cli.main(["--seed", "0", "--seeds", "2"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "violation: seed=5 scenario=leader_partition invariant=SingleLeader t=1234ms: two leaders"
    )
    assert lines[1] == "seeds: 2, events: 20, violations: 1"
    assert lines[2].startswith("events/s: ")


def test_cli_runs_real_seeds(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--seed", "9", "--seeds", "2", "--jobs", "2"]) == 0
    summary = capsys.readouterr().out.splitlines()[-2]
    assert summary.startswith("seeds: 2, events: ") and summary.endswith(", violations: 0")


def test_scenario_for_is_round_robin_unless_named() -> None:
    names = list(SCENARIOS)
    assert [runner.scenario_for(seed) for seed in range(len(names))] == names
    assert runner.scenario_for(3, "majority_split") == "majority_split"
    with pytest.raises(ValueError, match="unknown scenario"):
        runner.scenario_for(0, "nope")


def _three_voters_led(seed: int) -> Simulation:
    """Three voters, run until a leader has served its followers' fetches for a while."""
    sim = Simulation(seed=seed, scenario="test", rng=random.Random(seed), voters=3, observers=0,
                     core_factory=RaftCore)
    sim.cluster.start_all()
    while (leader := sim.cluster.leader()) is None or leader.core is None \
            or not leader.core.accepts_writes:
        sim.loop.run_one(until_ms=10_000)
    until = sim.now_ms + 1000
    while sim.loop.run_one(until_ms=until) is not None:
        pass
    return sim


@pytest.mark.parametrize("fault", ["kill", "partition"])
def test_a_killed_leader_is_refused_and_replaced_at_once_a_cut_off_one_is_not(
        fault: str) -> None:
    """A crashed leader's followers get refusals, not silence, and elect a successor well
    within the fetch timeout; a leader cut off by a partition gives silence, and the survivors
    wait out the fetch timeout."""
    sim = _three_voters_led(seed=4)
    old = sim.cluster.leader()
    assert old is not None and old.core is not None
    old_epoch, failed_at = old.core.epoch, sim.now_ms
    for node in sim.cluster.nodes.values():
        node.role_changes.clear()
    if fault == "kill":
        sim.cluster.kill(old.node_id)
    else:
        sim.cluster.network.isolate(old.node_id, sim.cluster.nodes)
    while (leader := sim.cluster.leader()) is None or leader.core is None \
            or leader.core.epoch == old_epoch:
        assert sim.loop.run_one(until_ms=failed_at + 10_000) is not None
    took = sim.now_ms - failed_at
    causes = {change.cause for node in sim.cluster.nodes.values()
              for change in node.role_changes}
    fetch_timeout = SIM_CONFIG.fetch_timeout_ms
    if fault == "kill":
        assert TransitionCause.LEADER_GONE in causes
        assert took < fetch_timeout // 4
    else:
        assert TransitionCause.LEADER_GONE not in causes
        # Counted from each follower's last answer, which may precede the cut by a long poll.
        assert took >= fetch_timeout - SIM_CONFIG.long_poll_ms
