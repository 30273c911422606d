"""Prometheus metrics of a node: Kafka's ``raft-metrics`` (``KafkaRaftMetrics``), named the
Prometheus way, served by ``GET /metrics`` in the text exposition format.

Each node has its own ``CollectorRegistry`` (several nodes may share one test process), reached
through ``metrics_for(node)``: the runtime, the client API and the route all get the same
``NodeMetrics`` that way, without the node having to carry an attribute for it.

Gauges are read from the node's status (``quorum_node.raft.status``) at scrape time. What
cannot be read from one status is derived by a ``StateWatcher``: election latency, transitions
and since when the replica leads from the core's ``RoleChanged`` effects, as they happen; records
appended and fetched from the log's end after each step (each scrape samples the log too, so the
counters are current even between steps, and looking more than once per step is harmless).

``metrics_for(node)`` creates them on first use and hooks them to the node (its role, step and
commit hooks); ``metrics_routes(node)`` (``quorum_node.node.api.metrics``) serves them.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Final, Protocol

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)

from quorum_node.node.clock import now_ms
from quorum_node.node.voter_candidates import could_be_voter
from quorum_node.raft.leader import QuorumDescription
from quorum_node.raft.quorum_state import RoleChanged
from quorum_node.raft.state import RaftState
from quorum_node.raft.status import NodeStatus
from quorum_node.raft.types import VoterChangeKind
from quorum_node.storage.kafka_uuid import to_kafka_string
from quorum_node.storage.segment_log import SegmentLog

if TYPE_CHECKING:
    from quorum_node.node.runtime import QuorumNode

# Kafka's current-state values (KafkaRaftMetrics, 4.x). Every one is exported, 1 for the current
# state and 0 for the others, so that dashboards can select on a fixed label set.
KAFKA_STATES: Final = (
    "leader", "prospective", "prospective-voted", "candidate", "unattached-voted", "follower",
    "observer", "unattached",
)

COMMIT_LATENCY_BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)
# Elections take at least one election timeout (default 1-2 s), and a failover adds the fetch
# timeout before that.
ELECTION_LATENCY_BUCKETS: Final = (
    0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0,
)

_STABLE: Final = frozenset({RaftState.LEADER, RaftState.FOLLOWER})
_ELECTING: Final = frozenset({RaftState.PROSPECTIVE, RaftState.CANDIDATE})


def kafka_state_name(state: RaftState, has_voted: bool, is_voter: bool) -> str:
    """The current-state value Kafka reports. Resigned reports as unattached, as in Kafka."""
    if state is RaftState.LEADER:
        return "leader"
    if state is RaftState.CANDIDATE:
        return "candidate"
    if state is RaftState.PROSPECTIVE:
        return "prospective-voted" if has_voted else "prospective"
    if state is RaftState.FOLLOWER:
        return "follower" if is_voter else "observer"
    if state is RaftState.UNATTACHED and has_voted:
        return "unattached-voted"
    return "unattached"


class WatchedLog(Protocol):
    @property
    def end_offset(self) -> int: ...


class StateWatcher:
    """Derives event metrics from the core's role changes and the growth of its log.

    Election latency runs from the moment the replica leaves Leader or Follower (or, from any
    state, starts campaigning as Prospective or Candidate) until it is Leader or Follower again.
    Growth of the log end offset counts as records appended while Leader and as records fetched
    while Follower (the role after the step that grew it); a truncation only moves the baseline
    down. ``elected_ms`` is when this replica became leader of its current epoch (wall clock, as
    DescribeQuorum's timestamps: the change's, or the status's at start), None while it is not
    leader."""

    def __init__(self, status: NodeStatus, log: WatchedLog,
                 observe_election: Callable[[float], None],
                 clock: Callable[[], float] = time.monotonic,
                 wall_ms: Callable[[], int] = now_ms) -> None:
        self._log = log
        self._observe_election = observe_election
        self._clock = clock
        self._wall_ms = wall_ms
        self._state = status.state
        self._end_offset = log.end_offset
        self._election_started: float | None = clock() if self._state in _ELECTING else None
        self.appended_records = 0
        self.fetched_records = 0
        self.transitions: dict[RaftState, int] = dict.fromkeys(RaftState, 0)
        self.elected_ms: int | None = status.as_of_ms if self._state is RaftState.LEADER \
            else None

    def on_role_changed(self, change: RoleChanged) -> None:
        """A change of role the core reported (before its step's ``on_step``)."""
        state = change.after
        self._state = state
        if state is change.before and change.epoch == change.previous_epoch:
            return  # a new leader in the same epoch is no transition
        self.transitions[state] += 1
        self.elected_ms = self._wall_ms() if state is RaftState.LEADER else None
        if state in _STABLE:
            if self._election_started is not None:
                self._observe_election(max(0.0, self._clock() - self._election_started))
                self._election_started = None
        elif self._election_started is None and (change.before in _STABLE
                                                 or state in _ELECTING):
            self._election_started = self._clock()

    def on_step(self) -> None:
        """After every step: the log's growth since the last look."""
        end_offset = self._log.end_offset
        if end_offset > self._end_offset:
            if self._state is RaftState.LEADER:
                self.appended_records += end_offset - self._end_offset
            elif self._state is RaftState.FOLLOWER:
                self.fetched_records += end_offset - self._end_offset
        self._end_offset = end_offset


class _StatusCollector:
    """Reads the node's status at scrape time."""

    def __init__(self, status: Callable[[], NodeStatus], watcher: StateWatcher,
                 voter_ids: frozenset[int], log: SegmentLog) -> None:
        self._status = status
        self._watcher = watcher
        self._voter_ids = voter_ids
        self._log = log

    def collect(self) -> Iterable[Metric]:
        status = self._status()
        self._watcher.on_step()  # counters include whatever happened since the last step

        def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, documentation, value=value)

        info = InfoMetricFamily("quorum_node", "This replica's identity.")
        directory_id = status.directory_id
        info.add_metric([], {
            "node_id": str(status.node_id),
            "cluster_id": status.cluster_id,
            "directory_id": to_kafka_string(directory_id) if directory_id is not None else "",
        })
        yield info

        voted = status.voted_for
        current = kafka_state_name(status.state, voted is not None, status.is_voter)
        states = GaugeMetricFamily("quorum_current_state",
                                   "1 for the replica's current state (Kafka's names), else 0.",
                                   labels=["state"])
        for name in KAFKA_STATES:
            states.add_metric([name], 1.0 if name == current else 0.0)
        yield states

        leader = status.leader_id
        yield gauge("quorum_current_leader", "The current leader's id, -1 if unknown.",
                    -1 if leader is None else leader)
        yield gauge("quorum_current_vote", "The id voted for in the current epoch, -1 if none.",
                    -1 if voted is None else voted.id)
        yield gauge("quorum_current_epoch", "The current epoch.", status.epoch)
        high_watermark = status.high_watermark
        yield gauge("quorum_high_watermark", "The high watermark known here, -1 if unknown.",
                    -1 if high_watermark is None else high_watermark)
        yield gauge("quorum_log_end_offset", "The end offset of the local log.",
                    status.log_end_offset)
        yield gauge("quorum_log_end_epoch", "The epoch of the last batch in the local log.",
                    status.log_end_epoch)
        yield gauge("quorum_flushed_offset", "The end offset of the local log known durable.",
                    status.flushed_offset)
        yield gauge("quorum_number_of_voters", "The number of voters in the voter set.",
                    len(status.voters))
        described = status.quorum  # the leader's only
        observers = described.observers if described is not None else ()
        voters = described.voters if described is not None else ()
        yield gauge("quorum_number_of_observers",
                    "Observers fetching from this replica (leader only, else 0).",
                    len(observers))
        yield gauge("quorum_number_of_possible_voters",
                    "Observers that AddVoter could make voters (leader only, else 0).",
                    sum(1 for row in observers
                        if could_be_voter(row, self._voter_ids, voters)))
        pending = status.pending_voter_change
        pending_kind = None if pending is None else pending[0]
        yield gauge("quorum_pending_add_voter", "1 while an AddVoter is in progress, else 0.",
                    1 if pending_kind is VoterChangeKind.ADD else 0)
        yield gauge("quorum_pending_remove_voter",
                    "1 while a RemoveVoter is in progress, else 0.",
                    1 if pending_kind is VoterChangeKind.REMOVE else 0)
        yield gauge("quorum_is_observer", "1 if this replica is not a voter.",
                    0 if status.is_voter else 1)

        yield gauge("quorum_log_disk_full",
                    "1 while the log's disk has no room for appends (the last one was refused; "
                    "clients get DISK_FULL), else 0.", 1 if self._log.full else 0)
        yield CounterMetricFamily("quorum_log_appends_refused_disk_full",
                                  "Appends the log's disk had no room for (each refused whole).",
                                  value=self._log.refused_for_space)
        watcher = self._watcher
        yield CounterMetricFamily("quorum_append_records",
                                  "Records (offsets) appended to the log as leader.",
                                  value=watcher.appended_records)
        yield CounterMetricFamily("quorum_fetch_records",
                                  "Records (offsets) fetched from the leader as follower.",
                                  value=watcher.fetched_records)
        yield CounterMetricFamily("quorum_snapshots_refused",
                                  "Snapshots downloaded from a leader and refused, the log kept "
                                  "(framing, checksums, voter set or records).",
                                  value=status.refused_snapshots)
        transitions = CounterMetricFamily("quorum_state_transitions",
                                          "Changes of state or epoch, by the state entered.",
                                          labels=["to"])
        for state, count in watcher.transitions.items():
            transitions.add_metric([state.value], count)
        yield transitions

        lag = GaugeMetricFamily(
            "quorum_voter_lag_seconds",
            "Leader only: seconds since each other voter last held the leader's log end offset "
            "(as of its fetch); since this leader's election if it has not yet.",
            labels=["voter_id"])
        if described is not None:
            for voter_id, seconds in voter_lag_seconds(described, status.as_of_ms,
                                                       watcher.elected_ms):
                lag.add_metric([str(voter_id)], seconds)
        yield lag


def voter_lag_seconds(described: QuorumDescription, now: int,
                      elected_ms: int | None) -> list[tuple[int, float]]:
    """Each other voter's time behind the leader: since it was last caught up (Kafka's
    lastCaughtUpTimestamp), or since the election (``elected_ms``; now if unknown) for one that
    has not been in this epoch, such as a voter that is down."""
    since_election = now if elected_ms is None else elected_ms
    return [(row.key.id, max(0.0, (now - (row.last_caught_up_ms if row.last_caught_up_ms
                                           is not None else since_election)) / 1000))
            for row in described.voters if row.key.id != described.leader_id]


class NodeMetrics:
    """One node's registry and the metrics fed by events. Get it with ``metrics_for(node)``."""

    def __init__(self, status: Callable[[], NodeStatus], voter_ids: frozenset[int],
                 log: SegmentLog) -> None:
        """``status``: the node's status now; ``voter_ids``: the configured voters' ids, which
        possible voters must have; ``log``: the node's log."""
        self.registry = CollectorRegistry()
        self.commit_latency = Histogram(
            "quorum_commit_latency_seconds",
            "Time from proposing an append to seeing it committed, per append.",
            buckets=COMMIT_LATENCY_BUCKETS, registry=self.registry,
        )
        self.election_latency = Histogram(
            "quorum_election_latency_seconds",
            "Time from leaving Leader/Follower (or starting to campaign) to Leader/Follower again.",
            buckets=ELECTION_LATENCY_BUCKETS, registry=self.registry,
        )
        self.watcher = StateWatcher(status(), log, self.election_latency.observe)
        self.registry.register(_StatusCollector(status, self.watcher, voter_ids, log))
        # One process per node in production: its RSS and CPU belong to the node.
        ProcessCollector(registry=self.registry)

    def on_step(self) -> None:
        """Call after every call into the core, after ``on_role_changed`` (cheap: one read)."""
        self.watcher.on_step()

    def on_role_changed(self, change: RoleChanged) -> None:
        """Call with every role change the core reports."""
        self.watcher.on_role_changed(change)

    def observe_commit_latency(self, seconds: float) -> None:
        self.commit_latency.observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


# Keyed weakly by node; a NodeMetrics refers to the core (through ``status_reader``) and the log
# only, never back to the node, so a stopped node and its metrics can be collected.
_BY_NODE: weakref.WeakKeyDictionary[QuorumNode, NodeMetrics] = weakref.WeakKeyDictionary()


def metrics_for(node: QuorumNode) -> NodeMetrics:
    """The node's metrics, created on first use and fed by the node from then on (create them
    early to see the first election)."""
    metrics = _BY_NODE.get(node)
    if metrics is None:
        metrics = _BY_NODE[node] = NodeMetrics(node.status_reader, frozenset(node.endpoints),
                                                node.log_dir.log)
        node.role_hooks.append(metrics.on_role_changed)
        node.step_hooks.append(metrics.on_step)
        node.commit_hooks.append(metrics.observe_commit_latency)
    return metrics
