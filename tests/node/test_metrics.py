"""``/metrics``: Kafka's raft metrics in Prometheus text format, one registry per node."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from statuses import status
from test_admin_api import LocalCluster, running_cluster

from quorum_node.node.metrics import (
    KAFKA_STATES,
    StateWatcher,
    kafka_state_name,
    metrics_for,
    voter_lag_seconds,
)
from quorum_node.node.runtime import QuorumNode
from quorum_node.raft.leader import QuorumDescription, ReplicaDescription
from quorum_node.raft.quorum_state import RoleChanged, TransitionCause
from quorum_node.raft.records import Record
from quorum_node.raft.state import RaftState
from quorum_node.raft.status import NodeStatus
from quorum_node.raft.types import ReplicaKey
from quorum_node.storage.kafka_uuid import to_kafka_string

# --- the watcher, on a stand-in node ----------------------------------------------------------


@dataclass
class FakeLog:
    end_offset: int = 0


@dataclass
class FakeCore:
    """What the watcher is told of a node: its role (as a status) and its log."""

    state: RaftState = RaftState.UNATTACHED
    epoch: int = 0
    log: FakeLog = field(default_factory=FakeLog)
    wall_ms: int = 0

    def status(self) -> NodeStatus:
        return status(as_of_ms=self.wall_ms, state=self.state, epoch=self.epoch)

    def change(self, watcher: StateWatcher, state: RaftState, epoch: int | None = None) -> None:
        """Move to ``state`` (and ``epoch``) and tell the watcher, as the core's effect does."""
        before, previous_epoch = self.state, self.epoch
        self.state = state
        self.epoch = self.epoch if epoch is None else epoch
        watcher.on_role_changed(RoleChanged(before, state, self.epoch, None,
                                            TransitionCause.ELECTION_TIMEOUT, previous_epoch,
                                            None))


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


def watch(core: FakeCore) -> tuple[StateWatcher, list[float], Clock]:
    observed: list[float] = []
    clock = Clock()
    return StateWatcher(core.status(), core.log, observed.append, clock), observed, clock


def step(watcher: StateWatcher, core: FakeCore, clock: Clock, at: float, state: RaftState, *,
         epoch: int | None = None, end_offset: int | None = None) -> None:
    """One step of the node, told as the runtime tells it."""
    clock.now = at
    if (state, core.epoch if epoch is None else epoch) != (core.state, core.epoch):
        core.change(watcher, state, epoch)
    core.log.end_offset = core.log.end_offset if end_offset is None else end_offset
    watcher.on_step()


def test_election_latency_runs_from_leaving_follower_to_leader() -> None:
    core = FakeCore(RaftState.FOLLOWER, 1)
    watcher, observed, clock = watch(core)
    step(watcher, core, clock, 101.0, RaftState.PROSPECTIVE)
    step(watcher, core, clock, 101.2, RaftState.CANDIDATE, epoch=2)
    step(watcher, core, clock, 101.2, RaftState.CANDIDATE, epoch=2)  # no change: nothing counts
    step(watcher, core, clock, 101.5, RaftState.LEADER)
    assert observed == [pytest.approx(0.5)]
    assert watcher.transitions[RaftState.PROSPECTIVE] == 1
    assert watcher.transitions[RaftState.CANDIDATE] == 1
    assert watcher.transitions[RaftState.LEADER] == 1


def test_election_latency_of_a_leader_resigning_until_it_follows_its_successor() -> None:
    core = FakeCore(RaftState.LEADER, 3)
    watcher, observed, clock = watch(core)
    step(watcher, core, clock, 100.3, RaftState.RESIGNED)
    step(watcher, core, clock, 100.5, RaftState.UNATTACHED, epoch=4)
    step(watcher, core, clock, 101.0, RaftState.FOLLOWER)
    assert observed == [pytest.approx(0.7)]
    # A follower learning a newer leader directly was never without one: no election here.
    step(watcher, core, clock, 102.0, RaftState.FOLLOWER, epoch=5)
    assert observed == [pytest.approx(0.7)]
    assert watcher.transitions[RaftState.FOLLOWER] == 2


def test_start_up_counts_as_an_election_only_once_campaigning() -> None:
    core = FakeCore()
    watcher, observed, clock = watch(core)
    step(watcher, core, clock, 100.4, RaftState.FOLLOWER, epoch=1)  # learned of a leader
    assert observed == []

    core = FakeCore()
    watcher, observed, clock = watch(core)
    step(watcher, core, clock, 100.4, RaftState.PROSPECTIVE)
    step(watcher, core, clock, 100.6, RaftState.CANDIDATE, epoch=1)
    step(watcher, core, clock, 100.9, RaftState.LEADER)
    assert observed == [pytest.approx(0.5)]


def test_the_watcher_knows_since_when_the_replica_leads() -> None:
    core = FakeCore(RaftState.FOLLOWER, 1)
    wall = iter([5_000, 9_000])
    elections: list[float] = []
    watcher = StateWatcher(core.status(), core.log, elections.append, Clock(), lambda: next(wall))
    assert watcher.elected_ms is None
    core.change(watcher, RaftState.LEADER, 2)
    assert watcher.elected_ms == 5_000
    watcher.on_step()  # a step without a role change: still the same election
    assert watcher.elected_ms == 5_000
    core.change(watcher, RaftState.UNATTACHED, 3)
    assert watcher.elected_ms is None


def test_voter_lag_is_from_the_last_catch_up_else_from_the_election() -> None:
    def row(node_id: int, caught_up_ms: int | None) -> ReplicaDescription:
        return ReplicaDescription(ReplicaKey(node_id, None), None, caught_up_ms, caught_up_ms)

    described = QuorumDescription(1, 4, 10, (row(1, 20_000), row(2, 17_500), row(3, None)), ())
    assert voter_lag_seconds(described, 20_000, elected_ms=12_000) == [(2, 2.5), (3, 8.0)]
    # A clock step backwards reads as caught up, never as a negative lag.
    assert voter_lag_seconds(described, 17_000, elected_ms=12_000) == [(2, 0.0), (3, 5.0)]


def test_log_growth_counts_as_appended_by_a_leader_and_fetched_by_a_follower() -> None:
    core = FakeCore(RaftState.FOLLOWER, 1)
    watcher, _, clock = watch(core)
    step(watcher, core, clock, 101, RaftState.FOLLOWER, end_offset=5)
    step(watcher, core, clock, 102, RaftState.FOLLOWER, end_offset=3)  # truncated: not negative
    step(watcher, core, clock, 103, RaftState.FOLLOWER, end_offset=4)
    step(watcher, core, clock, 104, RaftState.CANDIDATE, epoch=2)
    step(watcher, core, clock, 105, RaftState.LEADER, end_offset=5)  # its LeaderChange record
    step(watcher, core, clock, 106, RaftState.LEADER, end_offset=9)
    assert (watcher.fetched_records, watcher.appended_records) == (6, 5)


@pytest.mark.parametrize(("state", "voted", "voter", "expected"), [
    (RaftState.LEADER, True, True, "leader"),
    (RaftState.CANDIDATE, True, True, "candidate"),
    (RaftState.PROSPECTIVE, False, True, "prospective"),
    (RaftState.PROSPECTIVE, True, True, "prospective-voted"),
    (RaftState.UNATTACHED, False, True, "unattached"),
    (RaftState.UNATTACHED, True, True, "unattached-voted"),
    (RaftState.FOLLOWER, True, True, "follower"),
    (RaftState.FOLLOWER, False, False, "observer"),
    (RaftState.RESIGNED, True, True, "unattached"),  # as Kafka reports Resigned
])
def test_kafka_state_names(state: RaftState, voted: bool, voter: bool, expected: str) -> None:
    assert kafka_state_name(state, voted, voter) == expected
    assert expected in KAFKA_STATES


# --- /metrics on real nodes -------------------------------------------------------------------


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(cluster: LocalCluster, node_id: int) -> Samples:
    async with aiohttp.ClientSession() as session, \
            session.get(cluster.url(node_id) + "/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        text = await response.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text) for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def state_of(samples: Samples) -> str:
    current = [s for s in KAFKA_STATES if value(samples, "quorum_current_state", state=s) == 1]
    assert len(current) == 1
    return current[0]


async def test_metrics_of_the_leader_and_the_followers(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as cluster:
        leader = await cluster.wait_for_leader()
        for value_ in (b"a", b"b", b"c"):
            await leader.append([Record(value_)], timeout_s=5)
        await cluster.wait_for_leader()  # the followers have everything
        leader_id = leader.config.node_id
        end = leader.core.log.end_offset

        samples = await scrape(cluster, leader_id)
        assert state_of(samples) == "leader"
        assert value(samples, "quorum_current_leader") == leader_id
        assert value(samples, "quorum_current_vote") == leader_id
        assert value(samples, "quorum_current_epoch") == leader.core.epoch
        assert value(samples, "quorum_high_watermark") == end
        assert value(samples, "quorum_log_end_offset") == end
        assert value(samples, "quorum_log_end_epoch") == leader.core.epoch
        assert value(samples, "quorum_number_of_voters") == 3
        assert value(samples, "quorum_number_of_observers") == 0
        assert value(samples, "quorum_number_of_possible_voters") == 0
        assert value(samples, "quorum_pending_add_voter") == 0
        assert value(samples, "quorum_pending_remove_voter") == 0
        assert value(samples, "quorum_is_observer") == 0
        # The LeaderChange record and ours, all appended while leader.
        assert value(samples, "quorum_append_records_total") == end
        assert value(samples, "quorum_fetch_records_total") == 0
        assert value(samples, "quorum_commit_latency_seconds_count") == 3
        assert 0 < value(samples, "quorum_commit_latency_seconds_sum") < 15
        # Start-up: Unattached, then campaigning, then elected.
        assert value(samples, "quorum_election_latency_seconds_count") >= 1
        assert 0 < value(samples, "quorum_election_latency_seconds_sum") < 10
        assert value(samples, "quorum_state_transitions_total", to="leader") == 1
        directory_id = to_kafka_string(leader.log_dir.meta.directory_id)
        assert value(samples, "quorum_node_info", node_id=str(leader_id),
                     cluster_id=cluster.cluster_id, directory_id=directory_id) == 1

        for node_id in (i for i in cluster.nodes if i != leader_id):
            samples = await scrape(cluster, node_id)
            assert state_of(samples) == "follower"
            assert value(samples, "quorum_current_leader") == leader_id
            assert value(samples, "quorum_current_epoch") == leader.core.epoch
            assert value(samples, "quorum_high_watermark") == end
            assert value(samples, "quorum_fetch_records_total") == end
            assert value(samples, "quorum_append_records_total") == 0
            assert value(samples, "quorum_commit_latency_seconds_count") == 0
            # Every node's registry is its own, even in one process.
            assert ("quorum_node_info", (("cluster_id", cluster.cluster_id),
                                         ("directory_id", directory_id),
                                         ("node_id", str(leader_id)))) not in samples


async def test_the_leader_reports_how_far_behind_each_voter_is(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as cluster:
        leader = await cluster.wait_for_leader()
        await leader.append([Record(b"a")], timeout_s=5)
        leader_id = leader.config.node_id
        stopped, running = sorted(i for i in cluster.nodes if i != leader_id)
        samples = await scrape(cluster, leader_id)
        assert sorted(labels for name, labels in samples if name == "quorum_voter_lag_seconds") \
            == [(("voter_id", str(stopped)),), (("voter_id", str(running)),)]
        await cluster.stop(stopped)
        await leader.append([Record(b"b")], timeout_s=5)  # the leader and one voter commit it
        await asyncio.sleep(2)
        samples = await scrape(cluster, leader_id)
        behind = value(samples, "quorum_voter_lag_seconds", voter_id=str(stopped))
        assert behind >= 2
        # The running voter keeps fetching: caught up well after the other one stopped.
        assert value(samples, "quorum_voter_lag_seconds", voter_id=str(running)) < behind - 1
        follower = await scrape(cluster, running)
        assert not [name for name, _ in follower if name == "quorum_voter_lag_seconds"]


async def test_a_failover_is_measured_as_an_election(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as cluster:
        old = await cluster.wait_for_leader()
        # A follower may have campaigned at start-up too, before it heard of the leader.
        before = {i: election_count(n) for i, n in cluster.nodes.items()}
        old_epoch = old.core.epoch
        await cluster.stop(old.config.node_id)
        new = await cluster.wait_for_leader()

        samples = await scrape(cluster, new.config.node_id)
        assert state_of(samples) == "leader"
        assert value(samples, "quorum_current_epoch") > old_epoch
        assert value(samples, "quorum_state_transitions_total", to="leader") == 1
        assert value(samples, "quorum_election_latency_seconds_count") == election_count(new)
        assert election_count(new) == before[new.config.node_id] + 1
        # From the moment it stopped hearing from the old leader; bounded by the fetch timeout
        # plus an election or two.
        assert 0 < value(samples, "quorum_election_latency_seconds_sum") < 5


def election_count(node: QuorumNode) -> float:
    count = metrics_for(node).registry.get_sample_value("quorum_election_latency_seconds_count")
    assert count is not None
    return count
