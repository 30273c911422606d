"""The replica's place in the quorum, as Kafka's ``QuorumState`` keeps it: the current state (one
of the role objects of ``leader.py``, ``follower.py`` and ``candidate.py``), the epoch, the leader
and the vote it holds, the election state it has made durable, and every transition between the
states.

A transition goes through ``_enter``, which keeps two rules in one place: the epoch never goes
back, and whenever the election state changes it is handed out to be persisted (``take_outputs``)
before anything of the same step is sent. Every change of role (state, epoch or leader) is
reported as a ``RoleChanged`` with its cause, so that whoever tells or counts them (the node's
story and metrics, the simulator's checker) reads what happened instead of guessing it from two
snapshots of the core.

Nothing here reads a clock or does I/O: the core hands in ``now_ms`` and the seeded random source
the election timers are drawn from. What leaving a state involves beyond the state itself
(answering a leader's parked fetches, failing its voter change, forgetting in-flight requests)
is the core's, which ``on_leave`` calls.
"""

from __future__ import annotations

import enum
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

from quorum_node.raft.candidate import (
    CandidateState,
    ProspectiveState,
    ResignedState,
    UnattachedState,
)
from quorum_node.raft.config import QuorumConfig
from quorum_node.raft.election import EpochElection
from quorum_node.raft.follower import FollowerState, gone_leader_delay_ms
from quorum_node.raft.leader import LeaderState, ReplicaProgress
from quorum_node.raft.state import ElectionState, RaftState
from quorum_node.raft.types import MAX_EPOCH, NEVER, RaftInvariantError, ReplicaKey, epoch_in_bounds
from quorum_node.raft.voters import VoterSet

logger = logging.getLogger(__name__)

# The replica states, each in the module of its role (leader, follower, candidate).
ReplicaState = (UnattachedState | ProspectiveState | CandidateState | FollowerState | LeaderState
                | ResignedState)

STATE_NAMES: dict[type, RaftState] = {
    UnattachedState: RaftState.UNATTACHED,
    ProspectiveState: RaftState.PROSPECTIVE,
    CandidateState: RaftState.CANDIDATE,
    FollowerState: RaftState.FOLLOWER,
    LeaderState: RaftState.LEADER,
    ResignedState: RaftState.RESIGNED,
}


class TransitionCause(enum.StrEnum):
    """Why a replica changed role: the core's own reasons, one per path into a state."""

    ELECTED = "elected"  # a majority granted the vote
    PRE_VOTE_GRANTED = "pre-vote-granted"  # a majority granted the pre-vote
    PRE_VOTE_UNSUPPORTED = "pre-vote-unsupported"  # a voter cannot take one (KIP-996)
    PRE_VOTE_LOST = "pre-vote-lost"  # rejected by a majority, or timed out
    ELECTION_TIMEOUT = "election-timeout"  # no leader (or no win) within the election timer
    FETCH_TIMEOUT = "fetch-timeout"  # the leader was not heard from within the fetch timeout
    LEADER_RESIGNED = "leader-resigned"  # the leader's EndQuorumEpoch, after the back-off
    LEADER_GONE = "leader-gone"  # the leader refused a connection: nothing listens at its address
    LONE_VOTER = "lone-voter"  # the only voter elects itself without waiting
    HIGHER_EPOCH = "higher-epoch"  # a peer's message carried a newer epoch
    LEADER_LEARNED = "leader-learned"  # a peer named the leader of this epoch
    CHECK_QUORUM = "check-quorum"  # a leader no majority fetched from within the timeout
    SHUTDOWN = "shutdown"  # a leader resigns to shut down
    REMOVED = "removed"  # a leader whose removal from the voters committed
    LOG_FULL = "log-full"  # a new leader without room for its LeaderChange


@dataclass(frozen=True, slots=True)
class RoleChanged:
    """The replica went from ``before`` to ``after`` (a change of state, epoch or leader; a vote
    recorded in the same state is not one). ``epoch`` and ``leader_id`` are the new ones,
    ``previous_epoch`` and ``previous_leader_id`` the old; ``peer`` is the node whose message
    caused it, if one did. The change is durable when the host sees it (the driver hands it on
    after the election state it implies is persisted)."""

    before: RaftState
    after: RaftState
    epoch: int
    leader_id: int | None
    cause: TransitionCause
    previous_epoch: int
    previous_leader_id: int | None
    peer: int | None = None


class QuorumState:
    """One replica's state and its transitions. ``voters`` gives the voter set in force (the core
    keeps it, from the log); ``on_leave`` is called with a state once another has replaced it."""

    def __init__(self, *, local_key: ReplicaKey, config: QuorumConfig, random: random.Random,
                 voters: Callable[[], VoterSet], on_leave: Callable[[ReplicaState], None],
                 stored: ElectionState, log_epoch: int, log_end_offset: int,
                 now_ms: int) -> None:
        """Start from ``stored`` (the quorum-state file) and the log's last epoch and end
        offset; a start state whose election state differs from ``stored`` is to be persisted
        at once (``take_outputs``)."""
        self.local_key = local_key
        self._config = config
        self._random = random
        self._voters = voters
        self._on_leave = on_leave
        self._persisted = stored
        self._unpersisted: ElectionState | None = None
        self._role_changes: list[RoleChanged] = []
        # (epoch, leader id, rounds): the pre-votes asked for because that leader was gone.
        self._gone_rounds = (0, -1, 0)
        self.state: ReplicaState = self._initial_state(stored, log_epoch, log_end_offset, now_ms)
        if self.election_state != stored:
            self._persisted = self._unpersisted = self.election_state

    # --- inspection --------------------------------------------------------------------------

    @property
    def name(self) -> RaftState:
        return STATE_NAMES[type(self.state)]

    @property
    def epoch(self) -> int:
        return self.state.epoch

    @property
    def leader_id(self) -> int | None:
        return self._leader_of(self.state)

    @property
    def election_state(self) -> ElectionState:
        return self._election_state_of(self.state)

    @property
    def is_voter(self) -> bool:
        return any(key.matches(self.local_key) for key in self._voters())

    def take_outputs(self) -> tuple[ElectionState | None, list[RoleChanged]]:
        """The election state to persist (if it changed) and the role changes since the last
        call, in order."""
        outputs = self._unpersisted, self._role_changes
        self._unpersisted, self._role_changes = None, []
        return outputs

    def _leader_of(self, state: ReplicaState) -> int | None:
        if isinstance(state, LeaderState | ResignedState):
            return self.local_key.id
        if isinstance(state, CandidateState):
            return None
        return state.leader_id

    def _election_state_of(self, state: ReplicaState) -> ElectionState:
        if isinstance(state, LeaderState | ResignedState):
            return ElectionState(state.epoch, self.local_key.id, state.voted_key)
        if isinstance(state, CandidateState):
            return ElectionState(state.epoch, None, self.local_key)
        return ElectionState(state.epoch, state.leader_id, state.voted_key)

    # --- timers ------------------------------------------------------------------------------

    def election_deadline(self, now_ms: int) -> int:
        timeout = self._config.election_timeout_ms
        return now_ms + timeout + self._random.randrange(timeout)

    def unattached_deadline(self, now_ms: int) -> int:
        return self.election_deadline(now_ms) if self.is_voter else NEVER

    # --- a leader gone (follower.py) ---------------------------------------------------------

    def peer_refused(self, now_ms: int, peer: int) -> None:
        """``peer`` refused a connection: if it is the leader this voter follows, the leader is
        gone and a pre-vote is due (staggered by rank, backed off per round: ``follower.py``).
        An observer cannot campaign and keeps its fetch timer."""
        state = self.state
        if not isinstance(state, FollowerState) or peer != state.leader_id or not self.is_voter:
            return
        others = sorted({key.id for key in self._voters()} - {peer})
        rank = others.index(self.local_key.id) if self.local_key.id in others else len(others)
        epoch, leader_id, rounds = self._gone_rounds
        if (epoch, leader_id) != (state.epoch, peer):
            rounds = 0
        state.saw_leader_gone(now_ms, gone_leader_delay_ms(
            rounds, rank, self._config.election_timeout_ms, self._random.randrange))

    def peer_closed(self, peer: int) -> None:
        """``peer`` ended the connection our request was on: if it is the leader this voter
        follows, the voter grants pre-votes until it hears from the leader again, which the
        retry at once tells within a round trip (``follower.py``)."""
        state = self.state
        if isinstance(state, FollowerState) and peer == state.leader_id and self.is_voter:
            state.lost_leader_connection = True

    def granted_pre_vote(self, now_ms: int, candidate_id: int) -> None:
        """A pre-vote was granted to ``candidate_id``: a follower puts its own round on a gone
        leader off by an election timer, and a prospective with a higher id than the
        candidate's stands down in this round (the candidate it granted goes first)."""
        state = self.state
        if isinstance(state, FollowerState):
            state.granted_pre_vote(self.election_deadline(now_ms))
        elif isinstance(state, ProspectiveState) and candidate_id < self.local_key.id:
            state.yielded = True

    def _count_gone_round(self, state: FollowerState) -> None:
        epoch, leader_id, rounds = self._gone_rounds
        same = (epoch, leader_id) == (state.epoch, state.leader_id)
        self._gone_rounds = (state.epoch, state.leader_id, rounds + 1 if same else 1)

    # --- start-up ----------------------------------------------------------------------------

    def _initial_state(self, stored: ElectionState, log_epoch: int, log_end_offset: int,
                       now_ms: int) -> ReplicaState:
        node_id = self.local_key.id
        if not epoch_in_bounds(log_epoch):
            # Only a leader that broke the rule can have put it there (this node refuses such
            # batches): no election could follow, and nothing sensible can be made of it here.
            raise RaftInvariantError(
                f"node {node_id}: the log's last epoch {log_epoch} is not below "
                f"{MAX_EPOCH}: it holds batches no correct leader wrote; replace the log "
                f"directory as a lost disk")
        if stored.leader_id == node_id and log_epoch < stored.epoch:
            # A leader appends its LeaderChange at once; only a crash before its flush, or a
            # log that lost its tail, leaves the epoch it led without a record of it. In the
            # second case records this node acknowledged may be gone (see docs/design.md).
            logger.warning(
                "node %d: quorum-state says this node led epoch %d, but the log (ending at %d, "
                "epoch %d) holds nothing of it: if the log lost its last segment, records it "
                "acknowledged are missing", node_id, stored.epoch, log_end_offset, log_epoch)
        if stored.epoch < log_epoch:
            logger.warning(
                "quorum-state epoch %d is behind the log's last epoch %d; starting unattached",
                stored.epoch,
                log_epoch,
            )
            return UnattachedState(log_epoch, None, None, self.unattached_deadline(now_ms))
        voter = self.is_voter
        if stored.leader_id == node_id and voter:
            # Never lead or vote again in an epoch we led: un-flushed data of that epoch may be
            # lost, and reusing an (offset, epoch) pair would break log matching.
            remote = {key.id for key in self._voters() if key.id != node_id}
            return ResignedState(stored.epoch, stored.voted_key, self.election_deadline(now_ms),
                                 (), remote)
        # A known leader wins over our own vote: Kafka restarts such a replica as a Candidate,
        # which forgets the leader and campaigns in an epoch that already has one.
        if stored.leader_id is not None and stored.leader_id != node_id:
            return self._new_follower(stored.epoch, stored.leader_id, stored.voted_key, now_ms)
        if stored.voted_key is not None and stored.voted_key.matches(self.local_key) and voter:
            return self._new_candidate(stored.epoch, now_ms)
        return UnattachedState(stored.epoch, None, stored.voted_key,
                               self.unattached_deadline(now_ms))

    # --- transitions -------------------------------------------------------------------------

    def to_unattached(self, now_ms: int, epoch: int, cause: TransitionCause,
                      peer: int | None = None) -> None:
        """No leader known in ``epoch`` (Kafka's transitionToUnattached): the vote is kept in
        the same epoch, dropped in a newer one."""
        voted = self.election_state.voted_key if epoch == self.epoch else None
        self._enter(UnattachedState(epoch, None, voted, self.unattached_deadline(now_ms)),
                    cause, peer)

    def to_unattached_in_epoch(self, deadline_ms: int, cause: TransitionCause) -> None:
        """Stop campaigning (or, an observer, following) in this epoch, keeping the leader known
        and the vote cast; the election timer runs to ``deadline_ms``."""
        held = self.election_state
        self._enter(UnattachedState(held.epoch, held.leader_id, held.voted_key, deadline_ms),
                    cause, None)

    def record_vote(self, now_ms: int, candidate: ReplicaKey) -> None:
        """An Unattached or Prospective replica grants its standard vote to ``candidate``: the
        same state, now holding the vote (durable before the answer leaves)."""
        state = self.state
        deadline = self.election_deadline(now_ms)
        if isinstance(state, ProspectiveState):
            self._enter(ProspectiveState(state.epoch, state.leader_id, candidate,
                                         state.election, deadline), None, None)
        elif isinstance(state, UnattachedState):
            self._enter(UnattachedState(state.epoch, state.leader_id, candidate, deadline),
                        None, None)
        else:
            raise RaftInvariantError(f"{type(state).__name__} cannot record a vote")

    def to_follower(self, now_ms: int, epoch: int, leader_id: int, cause: TransitionCause,
                    peer: int | None = None) -> None:
        """Follow ``leader_id`` in ``epoch``; the vote is kept in the same epoch."""
        voted = self.election_state.voted_key if epoch == self.epoch else None
        self._enter(self._new_follower(epoch, leader_id, voted, now_ms), cause, peer)

    def to_prospective(self, now_ms: int, cause: TransitionCause) -> None:
        """Ask for pre-votes (KIP-996) in this epoch, keeping the leader known and the vote
        held: a pre-vote changes nothing durable."""
        held = self.election_state
        if cause is TransitionCause.LEADER_GONE and isinstance(self.state, FollowerState):
            self._count_gone_round(self.state)
        self._enter(ProspectiveState(held.epoch, held.leader_id, held.voted_key,
                                     EpochElection(self.local_key, self._voters()),
                                     self.election_deadline(now_ms)),
                    cause, None)

    def to_candidate(self, now_ms: int, cause: TransitionCause) -> None:
        """Campaign in the next epoch, voting for itself."""
        self._enter(self._new_candidate(self.epoch + 1, now_ms), cause, None)

    def to_leader(self, now_ms: int, epoch_start_offset: int) -> LeaderState:
        """A Candidate that won: leader of its epoch from ``epoch_start_offset`` on."""
        candidate = self.state
        if not isinstance(candidate, CandidateState):
            raise RaftInvariantError(f"{type(candidate).__name__} cannot become leader")
        voters = self._voters()
        local = next(key for key in voters if key.matches(self.local_key))
        progress = {local: ReplicaProgress(),
                    **{key: ReplicaProgress() for key in voters if not key.matches(self.local_key)}}
        leader = LeaderState(candidate.epoch, self.local_key, epoch_start_offset,
                             now_ms + self._config.check_quorum_timeout_ms, progress)
        self._enter(leader, TransitionCause.ELECTED, None)
        return leader

    def to_resigned(self, now_ms: int, cause: TransitionCause) -> None:
        """A leader hands its epoch on: it asks its voters, most caught-up first, to elect a
        successor, and never leads or votes in this epoch again."""
        leader = self.state
        if not isinstance(leader, LeaderState):
            raise RaftInvariantError(f"{type(leader).__name__} cannot resign")
        successors = leader.successors(self.local_key.id)
        self._enter(ResignedState(leader.epoch, leader.voted_key,
                                  self.election_deadline(now_ms), tuple(successors),
                                  {key.id for key in successors}),
                    cause, None)

    def voters_changed(self, now_ms: int) -> None:
        """A new voter set is in force: a leader regroups its replicas; an unattached replica's
        timer starts over (it may have become, or stopped being, a voter)."""
        state = self.state
        if isinstance(state, LeaderState):
            state.regroup(self._voters(), self.local_key)
        elif isinstance(state, UnattachedState):
            state.election_deadline_ms = self.unattached_deadline(now_ms)

    def _new_follower(self, epoch: int, leader_id: int, voted_key: ReplicaKey | None,
                      now_ms: int) -> FollowerState:
        timeout = self._config.fetch_timeout_ms
        timeout += self._random.randrange(timeout // 10 + 1)
        return FollowerState(epoch, leader_id, voted_key, now_ms + timeout, timeout)

    def _new_candidate(self, epoch: int, now_ms: int) -> CandidateState:
        return CandidateState(epoch, EpochElection(self.local_key, self._voters()),
                              self.election_deadline(now_ms))

    def _enter(self, new: ReplicaState, cause: TransitionCause | None,
               peer: int | None) -> None:
        """Enter ``new``. The election state is handed out to persist (before any message of
        this step goes out) whenever it changes; Prospective and Resigned never change it, by
        construction. ``cause`` is None only for a step that keeps the role (a vote recorded)."""
        old = self.state
        if new.epoch < old.epoch:
            raise RaftInvariantError(f"epoch going backwards: {old.epoch} -> {new.epoch}")
        new_election = self._election_state_of(new)
        if new_election != self._persisted:
            # Entering Prospective or Resigned never changes the quorum-state; the one durable
            # change a Prospective makes is recording a standard vote it grants.
            entering = isinstance(new, ResignedState) or (
                isinstance(new, ProspectiveState) and not isinstance(old, ProspectiveState))
            if entering:
                raise RaftInvariantError(f"{type(new).__name__} must not change the quorum-state")
            self._persisted = self._unpersisted = new_election
        self.state = new
        before, after = STATE_NAMES[type(old)], STATE_NAMES[type(new)]
        leader_before, leader_after = self._leader_of(old), self._leader_of(new)
        if (before, old.epoch, leader_before) != (after, new.epoch, leader_after):
            if cause is None:
                raise RaftInvariantError(f"{before} -> {after} without a cause")
            self._role_changes.append(RoleChanged(before, after, new.epoch, leader_after, cause,
                                                  old.epoch, leader_before, peer))
        self._on_leave(old)
