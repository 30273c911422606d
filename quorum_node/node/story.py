"""The log lines that tell a node's story to an operator: role and epoch changes with what
caused them, peers that become unreachable and come back, an observer that could be a voter
(with the exact ``quorum-admin add-voter`` line), and the shutdown. The runtime tells it what
happened: each role change comes from the core with its cause (``RoleChanged``), and is said
once, as it happened.

Directory ids are printed in Kafka's 22-character form, as everywhere else."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from quorum_node.node.voter_candidates import could_be_voter
from quorum_node.raft.config import QuorumConfig
from quorum_node.raft.quorum_state import RoleChanged, TransitionCause
from quorum_node.raft.state import RaftState
from quorum_node.raft.status import NodeStatus
from quorum_node.raft.types import ReplicaKey
from quorum_node.storage.kafka_uuid import to_kafka_string

logger = logging.getLogger("quorum_node.node")

# A peer still unreachable is mentioned again this often (the first failure is said at once).
UNREACHABLE_REMINDER_S = 60.0
# How often a leader looks for observers that could be voters.
OBSERVER_CHECK_S = 1.0
# A peer never heard from is not called unreachable before this long: at start-up the nodes of a
# quorum come up one after another.
STARTUP_GRACE_S = 5.0

# What each cause of a role change is said as; ``{previous_leader}``: the leader before it.
_REASONS: dict[TransitionCause, str] = {
    TransitionCause.ELECTED: "won the election",
    TransitionCause.PRE_VOTE_GRANTED: "a majority granted the pre-vote; asking for votes",
    TransitionCause.PRE_VOTE_UNSUPPORTED: "a voter cannot take a pre-vote; asking for votes",
    TransitionCause.PRE_VOTE_LOST: "the pre-vote failed (refused, or no majority in time)",
    TransitionCause.ELECTION_TIMEOUT: "no leader known within the election timeout; starting "
                                      "an election",
    TransitionCause.FETCH_TIMEOUT: "no word from leader {previous_leader} within the fetch "
                                   "timeout; starting an election",
    TransitionCause.LEADER_RESIGNED: "leader {previous_leader} resigned; starting an election",
    TransitionCause.LEADER_GONE: "leader {previous_leader} refused a connection (its process is "
                                 "gone); starting an election",
    TransitionCause.LONE_VOTER: "the only voter; electing itself",
    TransitionCause.CHECK_QUORUM: "resigning: no fetch from a majority of the voters within the "
                                  "check-quorum timeout (cut off?)",
    TransitionCause.SHUTDOWN: "shutting down: resigning so that another voter leads",
    TransitionCause.REMOVED: "resigning: removed from the voters",
    TransitionCause.LOG_FULL: "resigning at once: no room in the log for the epoch's first "
                              "record",
}


class NodeStory:
    def __init__(self, status: Callable[[], NodeStatus], node_id: int, voter_ids: Sequence[int],
                 bootstrap: str, *,
                 fetch_timeout_ms: int = QuorumConfig().fetch_timeout_ms,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``status``: the node's status now (its leader's rows say who fetches)."""
        self._status = status
        self._node_id = node_id
        self._voter_ids = frozenset(voter_ids)
        self._bootstrap = bootstrap  # the voters' client endpoints, for the add-voter line
        self._clock = clock
        role = status()
        self._state, self._epoch = role.state, role.epoch  # as of the latest change of role
        self._started = clock()
        self._heard: set[int] = set()  # peers that have answered once
        self._down_since: dict[int, float] = {}
        self._last_said: dict[int, float] = {}
        self._observers_said: set[ReplicaKey] = set()
        self._fetch_timeout_ms = fetch_timeout_ms
        self._silent: dict[ReplicaKey, int] = {}  # voters not fetching -> epoch it was said in
        self._leading_since = clock()
        self._serving_epoch: int | None = None  # the epoch whose LeaderChange was said committed
        self._unheard_said: tuple[int, tuple[int, ...]] | None = None  # epoch, voters waited for
        self._next_observer_check = 0.0

    def role_changed(self, change: RoleChanged) -> None:
        """The core changed role (state, epoch or leader): say so, with its cause."""
        self._state, self._epoch = change.after, change.epoch
        if change.after is RaftState.LEADER:
            self._leading_since = self._clock()
        logger.info("node %d: %s -> %s in epoch %d%s: %s", self._node_id, change.before,
                    change.after, change.epoch,
                    f" (was {change.previous_epoch})" if change.epoch != change.previous_epoch
                    else "", _reason(change))

    def after_step(self, leader_has_committed: bool) -> None:
        """The core took a step (after ``role_changed``, if it changed role): a leader says when
        it first serves (``leader_has_committed``: a record of its epoch is committed) and looks
        at its replicas now and then. A new quorum's first leader serves only once it has written
        the voter set, for which it must have heard from every voter: until then it says which
        it waits for, for a voter that never comes leaves the quorum without writes though a
        majority runs."""
        if self._state is RaftState.LEADER:
            if self._serving_epoch != self._epoch and leader_has_committed:
                voters_unheard = self._status().voters_unheard
                if not voters_unheard:
                    # The end of a failover: from here on the new leader commits writes.
                    self._serving_epoch = self._epoch
                    logger.info("node %d: the LeaderChange of epoch %d is committed; serving",
                                self._node_id, self._epoch)
                elif self._unheard_said != (self._epoch, voters_unheard):
                    self._unheard_said = (self._epoch, voters_unheard)
                    logger.warning("node %d: %s", self._node_id,
                                   no_writes_yet(self._node_id, self._epoch, voters_unheard))
            self._check_replicas()

    def peer_failed(self, node_id: int, problem: str) -> None:
        now = self._clock()
        since = self._down_since.setdefault(node_id, now)
        problem = problem.removeprefix(f"node {node_id} unreachable: ")
        if node_id not in self._last_said:
            # A peer that answered before has gone away; one never heard from may be starting.
            if node_id in self._heard or now - self._started >= STARTUP_GRACE_S:
                logger.warning("node %d: peer %d unreachable: %s", self._node_id, node_id,
                               problem)
                self._last_said[node_id] = now
        elif now - self._last_said[node_id] >= UNREACHABLE_REMINDER_S:
            logger.warning("node %d: peer %d still unreachable after %.0f s: %s", self._node_id,
                           node_id, now - since, problem)
            self._last_said[node_id] = now

    def peer_answered(self, node_id: int) -> None:
        self._heard.add(node_id)
        since = self._down_since.pop(node_id, None)
        if since is not None and self._last_said.pop(node_id, None) is not None:
            logger.info("node %d: peer %d reachable again after %.1f s", self._node_id, node_id,
                        self._clock() - since)

    def _check_replicas(self) -> None:
        """On the leader: voters that stopped fetching (followers pull, so a dead one makes no
        request fail here) and observers that could be voters."""
        now = self._clock()
        if now < self._next_observer_check:
            return
        self._next_observer_check = now + OBSERVER_CHECK_S
        status = self._status()
        description, now_ms = status.quorum, status.as_of_ms
        if description is None:
            return
        # A new leader gives its followers a fetch timeout to find it before calling them silent.
        settled = now - self._leading_since >= self._fetch_timeout_ms / 1000
        for voter in description.voters:
            key = voter.key
            if key.id == self._node_id or not settled:
                continue
            last = voter.last_fetch_ms
            silent = last is None or now_ms - last > self._fetch_timeout_ms
            if silent and self._silent.get(key) != description.epoch:
                self._silent[key] = description.epoch
                since = "has not fetched in this epoch" if last is None else \
                    f"has not fetched for {(now_ms - last) / 1000:.1f} s"
                logger.warning("node %d: voter %s %s (down, or cut off?); the quorum needs a "
                               "majority of the %d voters", self._node_id, voter.key, since,
                               len(description.voters))
            elif not silent and key in self._silent:
                del self._silent[key]
                logger.info("node %d: voter %s fetching again, at offset %s", self._node_id,
                            voter.key, voter.log_end_offset)
        for observer in description.observers:
            key = observer.key
            if key.directory_id is None or key in self._observers_said \
                    or not could_be_voter(observer, self._voter_ids, description.voters):
                continue
            self._observers_said.add(key)
            directory_id = to_kafka_string(key.directory_id)
            logger.info("node %d: observer %d (directory %s) fetches and could be a voter: "
                        "quorum-admin -b %s add-voter --id %d --uuid %s", self._node_id, key.id,
                        directory_id, self._bootstrap, key.id, directory_id)

    def stopping(self, why: str) -> None:
        logger.info("node %d: shutting down (%s)%s", self._node_id, why,
                    "; resigning the leadership first" if self._state is RaftState.LEADER
                    else "")

    def stopped(self, failure: BaseException | None) -> None:
        # A failure was said once already, by the runtime's one CRITICAL line that stopped it.
        logger.info("node %d: stopped%s", self._node_id,
                    "" if failure is None else " (after the failure above)")


def no_writes_yet(leader_id: int, epoch: int, voters_unheard: Sequence[int]) -> str:
    """Why a new quorum's first leader refuses writes: what it waits for (KIP-856)."""
    many = len(voters_unheard) > 1
    return (f"leads epoch {epoch} but takes no writes until voter{'s' if many else ''} "
            f"{', '.join(map(str, voters_unheard))} {'have' if many else 'has'} fetched from it: "
            f"a new quorum's first leader writes the voter set, with every voter's directory "
            f"id, before any record (start {'them' if many else 'it'}, or check that "
            f"{'they reach' if many else 'it reaches'} node {leader_id})")


def _reason(change: RoleChanged) -> str:
    """Why the role changed, in words (the peer whose message moved it, when one did)."""
    cause, after = change.cause, change.after
    if after is RaftState.FOLLOWER and cause in (TransitionCause.HIGHER_EPOCH,
                                                 TransitionCause.LEADER_LEARNED):
        return f"following node {change.leader_id} (learned from node {change.peer})"
    if cause is TransitionCause.HIGHER_EPOCH:
        return f"node {change.peer} is in a higher epoch"
    if cause is TransitionCause.LEADER_LEARNED:  # the leader's id, known again
        return f"node {change.peer} names leader {change.leader_id}"
    if cause is TransitionCause.PRE_VOTE_LOST and after is RaftState.FOLLOWER:
        return f"the pre-vote failed; following node {change.leader_id} again"
    if cause is TransitionCause.ELECTION_TIMEOUT and change.before is RaftState.CANDIDATE:
        return "no majority within the election timeout; starting over with a pre-vote"
    if cause is TransitionCause.ELECTION_TIMEOUT and change.before is RaftState.RESIGNED:
        return "leaving the epoch it led once its election timeout passed"
    if after is RaftState.UNATTACHED and cause in (TransitionCause.FETCH_TIMEOUT,
                                                    TransitionCause.LEADER_RESIGNED):
        return f"lost leader {change.previous_leader_id}; an observer looks for the next one"
    return _REASONS[cause].format(previous_leader=change.previous_leader_id)
