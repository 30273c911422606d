"""Fault scenarios, after Kafka's RaftEventSimulationTest, plus disk replacement (KIP-856),
catching up from a snapshot (KIP-630), and a mixed random one with all of them.

A scenario fixes the range of cluster shapes it runs on and a script that schedules faults and the
progress expected once they heal. All nodes start within the first few milliseconds and the client
proposes throughout; the safety invariants are checked after every event whatever the scenario.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from quorum_node.sim.cluster import GRACEFUL_SHUTDOWN_TIMEOUT_MS
from quorum_node.sim.durability import majority
from quorum_node.sim.liveness import (
    expect_commit_since,
    expect_recovery,
    expect_remediated,
    watch_no_commit_since,
)
from quorum_node.sim.node import SimNode
from quorum_node.sim.simulation import Simulation

# Time for elections and catch-up once a fault heals; a few election and fetch timeouts.
RECOVERY_WINDOW_MS = 10_000
# How long a scenario waits for the leader it wants to hurt.
LEADER_WAIT_MS = 15_000
# Longer partitions where the network also loses messages: the majority side must commit before
# the heal, and each lost Fetch costs a request timeout on the way (two in a row end a follower's
# fetch timeout, and the leader's check-quorum may follow), so progress can take a few more
# election rounds than on a clean network.
LOSSY_PARTITION_EXTRA_MS = 6_000
# Time for a replaced disk's replica to catch up and for the operator's two voter changes.
REMEDIATION_WINDOW_MS = 25_000


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    voters: tuple[int, int]  # inclusive range
    observers: tuple[int, int]
    script: Callable[[Simulation], None]


def _partition_ms(sim: Simulation, low_ms: int, high_ms: int) -> int:
    """How long a partition lasts: drawn from [low_ms, high_ms], longer on a lossy network."""
    extra = LOSSY_PARTITION_EXTRA_MS if sim.cluster.network.drop_probability > 0 else 0
    return sim.rng.randint(low_ms, high_ms) + extra


def _then_at_leader(sim: Simulation, at_ms: int, action: Callable[[SimNode], None]) -> None:
    """At ``at_ms``, wait for a leader that takes writes, its bootstrap voters committed, and
    hand it to ``action``. (A leader of voters configured by id takes no writes until it has
    learned every voter's directory id and written them down, KIP-856: cut a voter off before
    that is committed and the quorum must wait for it.)"""

    def writable_leader() -> SimNode | None:
        leader = sim.cluster.leader()
        ready = leader is not None and leader.core is not None and leader.core.accepts_writes
        return leader if ready and sim.checker.committed_voters else None

    sim.at(
        at_ms,
        lambda: sim.wait_for("leader", writable_leader, action, timeout_ms=LEADER_WAIT_MS),
    )


def initial_election(sim: Simulation) -> None:
    expect_recovery(sim, 0, RECOVERY_WINDOW_MS)


def _leader_failure(graceful: bool) -> Callable[[Simulation], None]:
    def script(sim: Simulation) -> None:
        def fail(leader: SimNode) -> None:
            now = sim.now_ms
            if graceful:
                sim.cluster.shutdown(leader.node_id)
            else:
                sim.cluster.kill(leader.node_id)
            # The rest still form a majority: progress resumes, and the old leader catches up
            # once it is back.
            sim.at(now + sim.rng.randint(1000, 5000), lambda: sim.cluster.start(leader.node_id))
            expect_recovery(sim, now, RECOVERY_WINDOW_MS)

        _then_at_leader(sim, sim.rng.randint(1500, 4000), fail)

    return script


def all_killed(sim: Simulation) -> None:
    def kill_all() -> None:
        sim.cluster.kill_all()
        restarts = {
            node_id: sim.now_ms + sim.rng.randint(100, 2000) for node_id in sim.cluster.nodes
        }
        for node_id, at_ms in restarts.items():
            sim.at(at_ms, partial(sim.cluster.start, node_id))
        expect_recovery(sim, max(restarts.values()), RECOVERY_WINDOW_MS)

    sim.at(sim.rng.randint(1500, 5000), kill_all)


def leader_partition(sim: Simulation) -> None:
    def isolate(leader: SimNode) -> None:
        now = sim.now_ms
        sim.cluster.isolate(leader.node_id)
        heal_at = now + _partition_ms(sim, 5000, 8000)
        expect_commit_since(sim, now, heal_at)
        sim.at(heal_at, sim.cluster.heal)
        expect_recovery(sim, heal_at, RECOVERY_WINDOW_MS)

    _then_at_leader(sim, sim.rng.randint(1500, 4000), isolate)


def leader_pause(sim: Simulation) -> None:
    """Pause the leader past the fetch timeout: the others elect a successor and commit; the old
    leader, resumed, handles at once the reads that queued up meanwhile and the Fetches its
    followers sent before they moved on, and must confirm none of those reads."""

    def pause(leader: SimNode) -> None:
        now = sim.now_ms
        sim.cluster.pause(leader.node_id)
        resume_at = now + _partition_ms(sim, 3000, 5000)
        expect_commit_since(sim, now, resume_at)
        # Once its successor has committed: a read the old leader must not confirm.
        sim.at(resume_at - 1, partial(sim.readers.read_at, leader))
        sim.at(resume_at, partial(sim.cluster.resume, leader.node_id))
        expect_recovery(sim, resume_at, RECOVERY_WINDOW_MS)

    _then_at_leader(sim, sim.rng.randint(1500, 4000), pause)


def majority_split(sim: Simulation) -> None:
    cluster = sim.cluster

    def split(leader: SimNode) -> None:
        now = sim.now_ms
        voters = list(cluster.voter_ids)
        sim.rng.shuffle(voters)
        if sim.rng.random() < 0.5:  # the old leader on the minority side, or not
            voters.remove(leader.node_id)
            voters.insert(0, leader.node_id)
        minority = voters[: (len(voters) - 1) // 2]
        majority = voters[len(minority) :]
        for observer in cluster.observer_ids:
            (minority if sim.rng.random() < 0.5 else majority).append(observer)
        cluster.split([minority, majority])
        heal_at = now + _partition_ms(sim, 6000, 9000)
        expect_commit_since(sim, now, heal_at)
        unwatch = watch_no_commit_since(sim, minority, now)

        def heal() -> None:
            unwatch()
            cluster.heal()

        sim.at(heal_at, heal)
        expect_recovery(sim, heal_at, RECOVERY_WINDOW_MS)

    _then_at_leader(sim, sim.rng.randint(1500, 4000), split)


def back_to_back_failures(sim: Simulation) -> None:
    cluster = sim.cluster

    def isolate_first(first: SimNode) -> None:
        assert first.core is not None
        first_epoch = first.core.epoch
        cluster.isolate(first.node_id)

        def successor() -> SimNode | None:
            leader = cluster.leader()
            if leader is None or leader.core is None or leader.core.epoch <= first_epoch:
                return None
            return leader

        def isolate_second(second: SimNode) -> None:
            # As soon as there is a successor, cut it off too and bring the first one back.
            now = sim.now_ms
            cluster.heal()
            cluster.isolate(second.node_id)
            heal_at = now + _partition_ms(sim, 6000, 9000)
            expect_commit_since(sim, now, heal_at)
            sim.at(heal_at, cluster.heal)
            expect_recovery(sim, heal_at, RECOVERY_WINDOW_MS)

        sim.wait_for("successor leader", successor, isolate_second, timeout_ms=LEADER_WAIT_MS)

    _then_at_leader(sim, sim.rng.randint(1500, 4000), isolate_first)


def _replace_disk(
    sim: Simulation,
    node_id: int,
    then: Callable[[], None],
    after_wipe: Callable[[], None] = lambda: None,
) -> None:
    """Kill ``node_id``, lose its disk once that is safe, ``after_wipe``, restart it under its new
    directory; ``then`` once the operator has made it a voter again in place of the lost
    directory and the quorum has recovered."""
    cluster = sim.cluster
    cluster.kill(node_id)

    def safe() -> bool | None:
        return True if sim.checker.can_lose_disk(node_id) else None

    def wipe(_: bool) -> None:
        cluster.wipe_disk(node_id)
        after_wipe()
        restart_at = sim.now_ms + sim.rng.randint(200, 3000)
        sim.at(restart_at, lambda: cluster.start(node_id))

        def recovered() -> None:
            expect_recovery(sim, sim.now_ms, RECOVERY_WINDOW_MS)
            sim.at(sim.now_ms + RECOVERY_WINDOW_MS, then)

        expect_remediated(sim, restart_at, REMEDIATION_WINDOW_MS, recovered)

    sim.wait_for(f"a moment node {node_id}'s disk can be lost", safe, wipe,
                 timeout_ms=LEADER_WAIT_MS)


def _disk_loss_behind_a_partition(sim: Simulation, leader: SimNode) -> None:
    """The voters that a majority can do without are cut off and fall behind; then a voter that
    holds what they lack loses its disk and comes back on their side. Its vote went with its
    disk: they must not elect one of them (it would lack committed data), and the quorum resumes
    once the partition heals."""
    cluster = sim.cluster
    others = [v for v in cluster.voter_ids if v != leader.node_id]
    sim.rng.shuffle(others)
    laggards = others[: len(cluster.voter_ids) - majority(cluster.voter_ids)]
    victim = others[len(laggards)]
    rest = [node_id for node_id in cluster.nodes if node_id not in laggards]
    cluster.split([laggards, rest])

    def move_victim() -> None:
        cluster.heal()
        cluster.split([[*laggards, victim], [n for n in rest if n != victim]])
        sim.at(sim.now_ms + sim.rng.randint(3000, 6000), cluster.heal)

    sim.at(sim.now_ms + sim.rng.randint(1500, 3000),
           lambda: _replace_disk(sim, victim, lambda: None, after_wipe=move_victim))


def disk_replacement(sim: Simulation) -> None:
    """A voter's disk dies (sometimes the leader's): the node comes back empty under a new
    directory id, an observer, and the operator replaces the lost voter with it (AddVoter, then
    RemoveVoter). Sometimes a second disk goes once the first is replaced; sometimes the disk
    dies while the voters a majority can do without are partitioned away and behind."""
    rng = sim.rng
    cluster = sim.cluster
    voter_ids = cluster.voter_ids
    if rng.random() < 0.3:

        def everyone_bootstrapped() -> bool | None:
            # A replica that still goes by the static voters (known by id only) would take the
            # replaced node's vote: no disk may be lost before they all know the directory ids.
            nodes = [cluster.nodes[v] for v in voter_ids]
            return True if all(n.core is not None and n.core.bootstrapped for n in nodes) \
                else None

        _then_at_leader(sim, rng.randint(1500, 4000), lambda leader: sim.wait_for(
            "every voter to know the bootstrap voters", everyone_bootstrapped,
            lambda _: _disk_loss_behind_a_partition(sim, cluster.leader() or leader),
            timeout_ms=LEADER_WAIT_MS))
        return

    def replace(leader: SimNode, more: int) -> None:
        victim = leader.node_id if rng.random() < 0.4 else rng.choice(voter_ids)

        def next_one() -> None:
            if more:
                _then_at_leader(sim, sim.now_ms + rng.randint(0, 2000),
                                lambda next_leader: replace(next_leader, more - 1))

        _replace_disk(sim, victim, next_one)

    _then_at_leader(sim, rng.randint(1500, 4000), lambda leader: replace(leader, rng.randint(0, 1)))


def _hand_leadership(sim: Simulation, heir: SimNode, then: Callable[[], None]) -> None:
    """Make ``heir`` the leader, heal, then ``then``. Only the links that touch ``heir`` stay up
    (a star around it), so the leader's new records reach it alone; once its log is ahead of
    every other voter's, the leader is cut off too. Each other voter then reaches no one but
    ``heir``, which turns its shorter log down, while ``heir`` can win every vote."""
    cluster = sim.cluster

    def heir_leads() -> bool | None:
        leads = cluster.leader() is heir and heir.core is not None and heir.core.accepts_writes
        return True if leads else None

    def elected(_: bool) -> None:
        cluster.heal()
        then()

    def cut_off(leader: SimNode) -> None:
        cluster.isolate(leader.node_id)
        sim.wait_for(f"node {heir.node_id} to lead", heir_leads, elected,
                     timeout_ms=LEADER_WAIT_MS)

    def cut_to_a_star(leader: SimNode) -> None:
        if leader is heir:
            then()
            return
        cluster.star(heir.node_id)
        others = [cluster.nodes[v] for v in cluster.voter_ids
                  if v not in (heir.node_id, leader.node_id)]

        def heir_ahead() -> bool | None:
            return True if all(heir.log_position > n.log_position for n in others) else None

        sim.wait_for(f"node {heir.node_id}'s log to be ahead of the other voters'", heir_ahead,
                     lambda _: cut_off(leader), timeout_ms=LEADER_WAIT_MS)

    _then_at_leader(sim, sim.now_ms, cut_to_a_star)


def snapshot_catch_up(sim: Simulation) -> None:
    """A replica is down while the others snapshot and delete their logs past its end: back, it
    must catch up by downloading a snapshot (FetchSnapshot); a voter then leads."""
    cluster = sim.cluster
    sim.compaction.start()

    def take_down(leader: SimNode) -> None:
        victim = cluster.nodes[sim.rng.choice([i for i in cluster.nodes if i != leader.node_id])]
        cluster.kill(victim.node_id)

        def compacted_past_victim() -> bool | None:
            # Compact every running node down to its snapshot, so whoever leads next has no log
            # left for the victim.
            behind = [n for n in cluster.alive() if n.log.start_offset <= victim.log.end_offset]
            for node in behind:
                sim.compaction.compact(node, keep=0)
            return None if behind else True

        def restart(_: bool) -> None:
            loaded = victim.snapshots_loaded
            cluster.start(victim.node_id)

            def recover() -> None:
                expect_recovery(sim, sim.now_ms, RECOVERY_WINDOW_MS)

            def loaded_one(_: bool) -> None:
                # A voter then leads: its snapshot and its log together must hold all that is
                # committed.
                if victim.node_id in cluster.voter_ids:
                    _hand_leadership(sim, victim, recover)
                else:
                    recover()

            sim.wait_for(
                f"node {victim.node_id} to load a snapshot",
                lambda: True if victim.snapshots_loaded > loaded else None,
                loaded_one,
                timeout_ms=RECOVERY_WINDOW_MS,
            )

        sim.at(
            sim.now_ms + sim.rng.randint(2000, 5000),
            lambda: sim.wait_for("the logs to be compacted past the stopped node",
                                 compacted_past_victim, restart, timeout_ms=LEADER_WAIT_MS),
        )

    _then_at_leader(sim, sim.rng.randint(1500, 4000), take_down)


def forged_messages(sim: Simulation) -> None:
    """Forged Votes, BeginQuorumEpochs, EndQuorumEpochs, Fetches and FetchSnapshots from ids
    outside the cluster, with random epochs up to the bound, throughout; the leader is killed
    on the way. Nothing forged may move a node: the quorum elects, commits and recovers as if
    there were no forger."""
    sim.forger.start()
    _leader_failure(graceful=sim.rng.random() < 0.5)(sim)


class _RandomFaults:
    """The faults that ``random_faults`` draws from, each a step of its own. A kill or a graceful
    shutdown keeps a majority of voters up but for a small chance (a quorum that loses its
    majority must come back once it heals); a lost disk is only ever a dead node's, and only
    when the checker can still tell what the quorum had committed."""

    def __init__(self, sim: Simulation) -> None:
        self._sim = sim
        self._cluster = sim.cluster
        self._rng = sim.rng
        self._tolerated = (len(sim.cluster.voter_ids) - 1) // 2

    def weighted(self) -> list[tuple[Callable[[], None], float]]:
        """Every fault with its weight in the draw."""
        cluster, sim = self._cluster, self._sim
        return [
            (self.kill, 3.0),
            (self.shutdown_leader, 1.0),
            (self.restart, 4.0),
            (self.pause, 1.5),
            (self.isolate, 2.0),
            (self.split, 1.5),
            (cluster.heal, 3.0),
            (self.noise, 2.0),
            (cluster.kill_all, 0.2),
            (self.lose_disk, 1.0),
            (sim.operator.random_request, 2.0),
            (sim.forger.start, 0.3),
        ]

    def _may_lose_a_voter(self) -> bool:
        dead_voters = sum(not self._cluster.nodes[v].alive for v in self._cluster.voter_ids)
        return dead_voters < self._tolerated or self._rng.random() < 0.1

    def _dead(self) -> list[int]:
        return [node_id for node_id, node in self._cluster.nodes.items() if not node.alive]

    def kill(self) -> None:
        alive = [node.node_id for node in self._cluster.alive()]
        if alive and self._may_lose_a_voter():
            self._cluster.kill(self._rng.choice(alive))

    def shutdown_leader(self) -> None:
        leader = self._cluster.leader()
        if leader is not None and self._may_lose_a_voter():
            self._cluster.shutdown(leader.node_id)

    def restart(self) -> None:
        dead = self._dead()
        if dead:
            self._cluster.start(self._rng.choice(dead))

    def pause(self) -> None:
        """Pause a node (the leader half the time) for up to a few fetch timeouts."""
        leader = self._cluster.leader()
        node_id = leader.node_id if leader is not None and self._rng.random() < 0.5 \
            else self._rng.choice(list(self._cluster.nodes))
        self._cluster.pause(node_id)
        self._sim.at(self._sim.now_ms + self._rng.randint(100, 4000),
                     partial(self._cluster.resume, node_id))

    def isolate(self) -> None:
        self._cluster.isolate(self._rng.choice(list(self._cluster.nodes)))

    def split(self) -> None:
        ids = list(self._cluster.nodes)
        self._rng.shuffle(ids)
        cut = self._rng.randint(1, len(ids) - 1)
        self._cluster.split([ids[:cut], ids[cut:]])

    def noise(self) -> None:
        network = self._cluster.network
        quiet = self._rng.random() < 0.3
        network.drop_probability = 0.0 if quiet else self._rng.uniform(0.0, 0.2)
        network.duplicate_probability = 0.0 if quiet else self._rng.uniform(0.0, 0.1)

    def lose_disk(self) -> None:
        dead = self._dead()
        if dead:
            node_id = self._rng.choice(dead)
            if self._sim.checker.can_lose_disk(node_id):
                self._cluster.wipe_disk(node_id)

    def heal_everything(self) -> None:
        self._cluster.heal()
        self._cluster.resume_all()
        network = self._cluster.network
        network.drop_probability = network.duplicate_probability = 0.0
        self._cluster.start_all()


def _schedule_drawn(sim: Simulation, weighted: list[tuple[Callable[[], None], float]],
                    end_ms: int) -> None:
    """Schedule actions drawn by weight, one every 100 to 1500 ms, from a start drawn in
    [500, 2000] ms until ``end_ms``."""
    actions = [action for action, _ in weighted]
    weights = [weight for _, weight in weighted]
    at_ms = sim.rng.randint(500, 2000)
    while at_ms < end_ms:
        sim.at(at_ms, sim.rng.choices(actions, weights=weights)[0])
        at_ms += sim.rng.randint(100, 1500)


def random_faults(sim: Simulation) -> None:
    """Kills, graceful shutdowns, restarts, pauses, partitions, message loss and duplication, lost
    disks and voter changes (valid or not) at random for a while, mostly keeping a majority of
    voters up; then everything heals and the operator completes the replacement of lost disks."""
    faults = _RandomFaults(sim)
    faults_end = sim.rng.randint(10_000, 20_000)
    _schedule_drawn(sim, faults.weighted(), faults_end)
    sim.at(faults_end, faults.heal_everything)
    # A graceful shutdown under way at the end exits later: bring that node back too.
    sim.at(faults_end + 2 * GRACEFUL_SHUTDOWN_TIMEOUT_MS, sim.cluster.start_all)
    expect_recovery(sim, faults_end, RECOVERY_WINDOW_MS + 5000)
    expect_remediated(sim, faults_end, REMEDIATION_WINDOW_MS)


SCENARIOS: dict[str, Scenario] = {
    scenario.name: scenario
    for scenario in (
        Scenario(
            "initial_election",
            "elect a first leader and commit",
            voters=(1, 5),
            observers=(0, 3),
            script=initial_election,
        ),
        Scenario(
            "leader_crash",
            "hard-kill the leader; a new one takes over",
            voters=(3, 5),
            observers=(0, 1),
            script=_leader_failure(graceful=False),
        ),
        Scenario(
            "leader_shutdown",
            "gracefully shut the leader down; a successor takes over",
            voters=(3, 5),
            observers=(0, 1),
            script=_leader_failure(graceful=True),
        ),
        Scenario(
            "all_killed",
            "hard-kill every node, restart them all",
            voters=(1, 5),
            observers=(0, 1),
            script=all_killed,
        ),
        Scenario(
            "leader_partition",
            "cut the leader off, heal later",
            voters=(3, 5),
            observers=(0, 1),
            script=leader_partition,
        ),
        Scenario(
            "leader_pause",
            "pause the leader past the fetch timeout, resume it later",
            voters=(3, 5),
            observers=(0, 1),
            script=leader_pause,
        ),
        Scenario(
            "majority_split",
            "split into minority|majority; only the majority commits",
            voters=(3, 5),
            observers=(0, 1),
            script=majority_split,
        ),
        Scenario(
            "back_to_back_failures",
            "cut off the leader, then its successor",
            voters=(3, 5),
            observers=(0, 1),
            script=back_to_back_failures,
        ),
        Scenario(
            "disk_replacement",
            "lose a voter's disk (or the leader's); the operator replaces the lost voter",
            voters=(3, 5),
            observers=(0, 1),
            script=disk_replacement,
        ),
        Scenario(
            "snapshot_catch_up",
            "a replica down while the logs are compacted past it catches up from a snapshot, "
            "then leads if a voter",
            voters=(3, 5),
            observers=(0, 1),
            script=snapshot_catch_up,
        ),
        Scenario(
            "forged_messages",
            "messages forged by non-members (any epoch up to the bound) while the leader fails",
            voters=(3, 5),
            observers=(0, 1),
            script=forged_messages,
        ),
        Scenario(
            "random_faults",
            "random kills, restarts, partitions, loss and duplication",
            voters=(3, 5),
            observers=(0, 2),
            script=random_faults,
        ),
    )
}
