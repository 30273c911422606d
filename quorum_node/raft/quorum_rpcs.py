"""The quorum's own RPCs (KIP-595, KIP-996): Vote, BeginQuorumEpoch and EndQuorumEpoch, and the
epoch and leader discovery that every response carries (Kafka's ``maybeHandleCommonResponse``
and ``maybeTransition``).

Each request is checked whole before anything changes: a refusal (an older epoch, a stranger to
the voter set, a second leader named for a known epoch, a request meant for another directory of
this node's id) moves no epoch and grants nothing, and one bad or forged message cannot stop the
replica. What is granted or learned becomes a transition of the ``QuorumState``; a granted vote
is persisted (``Effects.persist``) before the answer leaves.

``QuorumRpcs`` is given what it reads and writes (the log, the quorum state, the voter history,
the requests in flight and the outbox); ``RaftCore`` hands it each of these requests and
responses, and asks it for the votes a Prospective or Candidate still needs.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

from quorum_node.raft.candidate import (
    CandidateState,
    ProspectiveState,
    ResignedState,
    UnattachedState,
)
from quorum_node.raft.config import QuorumConfig
from quorum_node.raft.election import EpochElection
from quorum_node.raft.follower import FollowerState
from quorum_node.raft.leader import LeaderState
from quorum_node.raft.log import RaftLog
from quorum_node.raft.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    RaftResponse,
    ReplicaInfo,
    VoteRequest,
    VoteResponse,
)
from quorum_node.raft.outbox import Outbox, WarningLimiter
from quorum_node.raft.quorum_state import QuorumState, TransitionCause
from quorum_node.raft.requests import RequestManager
from quorum_node.raft.types import MAX_EPOCH, Errors, ReplicaKey, epoch_in_bounds
from quorum_node.raft.voter_history import VoterHistory

logger = logging.getLogger(__name__)


class QuorumRpcs:
    """This replica's side of the election RPCs, as voter, candidate, leader or follower."""

    def __init__(self, *, local_key: ReplicaKey, cluster_id: str, config: QuorumConfig,
                 log: RaftLog, quorum: QuorumState, voters: VoterHistory,
                 requests: RequestManager, outbox: Outbox, warnings: WarningLimiter) -> None:
        self._local_key = local_key
        self._cluster_id = cluster_id
        self._config = config
        self._log = log
        self._quorum = quorum
        self._voters = voters
        self._static_ids = voters.static_ids
        self._requests = requests
        self._outbox = outbox
        self._warnings = warnings

    # --- epoch and leader discovery ----------------------------------------------------------

    def handle_common_response(self, now_ms: int, source: int, response: RaftResponse) -> bool:
        """Epoch and leader discovery shared by every response. True if the response is fully
        handled (dropped as stale, or turned into a transition)."""
        error, leader_id, epoch = response.error_code, response.leader_id, response.leader_epoch
        if epoch < self._quorum.epoch or error == Errors.UNKNOWN_LEADER_EPOCH:
            return True
        if not epoch_in_bounds(epoch):
            self._outbox.drop_response(now_ms, source, f"epoch {epoch} is not below {MAX_EPOCH}")
            return True
        if leader_id is not None and leader_id >= 0 and not self._is_voter_id(leader_id):
            # A leader we could never follow (a stale voter set, or a broken peer): as if the
            # response named none. The epoch still counts: it fences ours.
            self._warnings.warn(now_ms, "leader-non-voter",
                                "node %d: node %d names %d, not a voter, leader of epoch %d",
                                self._local_key.id, source, leader_id, epoch)
            leader_id = None
        if epoch > self._quorum.epoch or error in (Errors.FENCED_LEADER_EPOCH,
                                                   Errors.NOT_LEADER_OR_FOLLOWER):
            if epoch > self._quorum.epoch:
                self._log_moved_by(source, "a response", epoch, leader_id)
            self._maybe_transition(now_ms, source, leader_id, epoch)
            return True
        if error == Errors.INVALID_REQUEST:
            # Kafka treats this as our bug and stops; but the peer may be the broken one, and
            # stopping would let one bad peer stop every node that talks to it. Back off.
            self._outbox.drop_response(now_ms, source, "it found our request invalid")
            return True
        if leader_id is not None and self._quorum.leader_id is None:
            self._maybe_transition(now_ms, source, leader_id, epoch)
            return error != Errors.NONE
        if (isinstance(self._quorum.state, UnattachedState) and leader_id is not None
                and leader_id != self._local_key.id):
            # An unattached replica that kept the last leader's id rediscovered it.
            self._quorum.to_follower(now_ms, epoch, leader_id, TransitionCause.LEADER_LEARNED,
                                     source)
            return error != Errors.NONE
        return False

    def _maybe_transition(self, now_ms: int, source: int, leader_id: int | None,
                          epoch: int) -> None:
        """React to an epoch and leader learned from the peer ``source`` (Kafka's
        maybeTransition)."""
        if leader_id is not None and leader_id < 0:
            leader_id = None
        if epoch > self._quorum.epoch:
            if leader_id is not None and leader_id != self._local_key.id:
                self._quorum.to_follower(now_ms, epoch, leader_id, TransitionCause.HIGHER_EPOCH,
                                         source)
            else:
                self._quorum.to_unattached(now_ms, epoch, TransitionCause.HIGHER_EPOCH, source)
            return
        if epoch < self._quorum.epoch or leader_id is None:
            return
        known = self._quorum.leader_id
        if known is not None and known != leader_id:
            # No correct peer names another leader for an epoch whose leader we know: a broken
            # or forged message. Dropped; if our leader is the one that is gone, the fetch
            # timeout ends the epoch.
            self._warnings.warn(now_ms, "other-leader",
                                "node %d: ignored a peer naming %d leader of epoch %d, whose "
                                "leader is %d", self._local_key.id, leader_id, epoch, known)
            return
        if leader_id == self._local_key.id:
            return
        # Follow a leader newly learned for this epoch. A Prospective that already knew it keeps
        # campaigning (its fetches failed); an Unattached that kept its id has rediscovered it.
        if isinstance(self._quorum.state, UnattachedState) or (
            known is None and isinstance(self._quorum.state, ProspectiveState | CandidateState)
        ):
            self._quorum.to_follower(now_ms, epoch, leader_id, TransitionCause.LEADER_LEARNED,
                                     source)

    def _log_moved_by(self, source: int, rpc: str, epoch: int, leader_id: int | None) -> None:
        """A peer's message is about to change this node's epoch or leader: say who and how."""
        if epoch == self._quorum.epoch and leader_id == self._quorum.leader_id:
            return
        logger.info("node %d: %s from %d: epoch %d -> %d, leader %s -> %s", self._local_key.id, rpc,
                    source, self._quorum.epoch, epoch, self._quorum.leader_id, leader_id)

    def _claims_other_leader(self, now_ms: int, leader_id: int, epoch: int) -> bool:
        """A request naming another leader for an epoch whose leader we know: no correct peer
        sends it. Refused (INVALID_REQUEST, nothing changed) rather than raised as the invariant
        failure it would be in a response, so that one bad or forged message cannot stop us."""
        known = self._quorum.leader_id
        if epoch != self._quorum.epoch or known is None or known == leader_id:
            return False
        self._warnings.warn(now_ms, "other-leader",
                            "node %d: refused a request naming %d leader of epoch %d, whose "
                            "leader is %d", self._local_key.id, leader_id, epoch, known)
        return True

    def _is_voter_id(self, node_id: int) -> bool:
        """A leader named by id (BeginQuorumEpoch, EndQuorumEpoch and responses carry no
        directory id): an id of the current voter set."""
        return node_id in self._voters.voter_ids

    def _cluster_ok(self, cluster_id: str | None) -> bool:
        return cluster_id is None or cluster_id == self._cluster_id

    def _addressed_to_me(self, voter_id: int, voter_directory_id: uuid.UUID | None) -> bool:
        return ReplicaKey(voter_id, voter_directory_id).matches(self._local_key)

    def epoch_exhausted(self, now_ms: int, epoch: int) -> bool:
        """Whether ``epoch`` has no successor within MAX_EPOCH: this replica cannot start
        another epoch (only a peer that jumped the quorum to the bound leads here)."""
        if epoch_in_bounds(epoch + 1):
            return False
        self._warnings.warn(now_ms, "epoch-exhausted",
                            "node %d: epoch %d is the last below %d: no election can follow it",
                            self._local_key.id, epoch, MAX_EPOCH)
        return True

    # --- sending -----------------------------------------------------------------------------

    def send_begin_quorum_epochs(self, now_ms: int, state: LeaderState,
                                 peer_voters: Sequence[ReplicaKey]) -> None:
        """The leader's heartbeat: a BeginQuorumEpoch to each voter it is due to, and to each
        voter whose answer the waiting read barriers need (``LeaderState.awaits_answer_from``):
        answered in this epoch, it proves the voter followed this leader after the barriers
        taken before it was sent, as etcd's heartbeats confirm a ReadIndex."""
        interval = self._config.begin_quorum_interval_ms
        for key in peer_voters:
            progress = state.voters[key]
            due = now_ms >= progress.begin_quorum_due_ms(interval)
            if not (due or state.awaits_answer_from(progress)) \
                    or not self._requests.is_ready(key.id, now_ms):
                continue
            if due:
                progress.next_begin_quorum_ms = now_ms + interval
            progress.read_barrier_asked = state.newest_read_barrier
            state.begin_quorum_asked[key.id] = progress
            self._outbox.send(now_ms, key.id, BeginQuorumEpochRequest(
                cluster_id=self._cluster_id, leader_id=self._local_key.id,
                leader_epoch=state.epoch, voter_id=key.id, voter_directory_id=key.directory_id,
            ))

    def send_end_quorum_epochs(self, now_ms: int, state: ResignedState) -> None:
        """A resigned leader asks each voter that has not acknowledged it to elect a successor,
        the most caught-up first."""
        successors = tuple(ReplicaInfo.of(k) for k in state.preferred_successors)
        for key in self._voters.voters:
            if key.id not in state.unacknowledged or not self._requests.is_ready(key.id, now_ms):
                continue
            self._outbox.send(now_ms, key.id, EndQuorumEpochRequest(
                cluster_id=self._cluster_id, leader_id=self._local_key.id,
                leader_epoch=state.epoch, voter_id=key.id, voter_directory_id=key.directory_id,
                preferred_successors=successors,
            ))

    # --- Vote --------------------------------------------------------------------------------

    def request_votes(
        self, now_ms: int, election: EpochElection, epoch: int, *, pre_vote: bool
    ) -> None:
        for key in election.unrecorded():
            if not self._requests.is_ready(key.id, now_ms):
                continue
            self._outbox.send(now_ms, key.id, VoteRequest(
                cluster_id=self._cluster_id, voter_id=key.id, voter_directory_id=key.directory_id,
                replica_epoch=epoch, replica_id=self._local_key.id,
                replica_directory_id=self._local_key.directory_id,
                last_offset_epoch=self._log.last_fetched_epoch(), last_offset=self._log.end_offset,
                pre_vote=pre_vote,
            ))

    def handle_vote(self, now_ms: int, request: VoteRequest) -> tuple[Errors, bool]:
        """The answer to a Vote (pre-vote or standard): its error, and whether it is granted."""
        if not self._cluster_ok(request.cluster_id):
            return Errors.INCONSISTENT_CLUSTER_ID, False
        last_epoch_ok = (
            request.last_offset_epoch <= request.replica_epoch
            if request.pre_vote
            else request.last_offset_epoch < request.replica_epoch
        )
        if (request.last_offset < 0 or request.last_offset_epoch < 0 or request.replica_id < 0
                or not last_epoch_ok or not epoch_in_bounds(request.replica_epoch)):
            return Errors.INVALID_REQUEST, False
        if request.replica_epoch < self._quorum.epoch:
            return Errors.FENCED_LEADER_EPOCH, False
        candidate = ReplicaKey(request.replica_id, request.replica_directory_id)
        if not self._may_be_voter(candidate, request.last_offset_epoch, request.last_offset):
            # Checked before the epoch is adopted: a non-member's vote must not move it.
            self._warnings.warn(now_ms, "vote-non-voter",
                                "node %d: refused a %s from %s, not a voter (epoch %d)",
                                self._local_key.id, "pre-vote" if request.pre_vote else "vote",
                                candidate, request.replica_epoch)
            return Errors.INCONSISTENT_VOTER_SET, False
        if request.replica_epoch > self._quorum.epoch:
            self._log_moved_by(request.replica_id, "Vote", request.replica_epoch, None)
            self._quorum.to_unattached(now_ms, request.replica_epoch,
                                       TransitionCause.HIGHER_EPOCH, request.replica_id)
        if not self._addressed_to_me(request.voter_id, request.voter_directory_id):
            return Errors.INVALID_VOTER_KEY, False
        up_to_date = (request.last_offset_epoch, request.last_offset) >= (
            self._log.last_fetched_epoch(), self._log.end_offset)
        granted = self._can_grant_vote(candidate, up_to_date, request.pre_vote)
        if granted and request.pre_vote:
            self._quorum.granted_pre_vote(now_ms, candidate.id)
        state = self._quorum.state
        if granted and not request.pre_vote \
                and isinstance(state, UnattachedState | ProspectiveState) \
                and state.voted_key is None:
            # The vote is durable before the response leaves (Effects.persist goes first).
            self._quorum.record_vote(now_ms, candidate)
        return Errors.NONE, granted

    def _may_be_voter(self, key: ReplicaKey, last_epoch: int, last_offset: int) -> bool:
        """Whether a candidate may be a voter: a member of our voter set, or a configured id
        whose log is strictly newer than ours and may hold a VotersRecord we have not
        replicated yet (refusing it could leave the quorum with no electable replica: it may
        be the only one up to date). A log no newer than ours, by log matching, holds no voter
        set we lack."""
        if any(voter.matches(key) for voter in self._voters.voters):
            return True
        newer = (last_epoch, last_offset) > (self._log.last_fetched_epoch(), self._log.end_offset)
        return key.id in self._static_ids and newer

    def _can_grant_vote(self, candidate: ReplicaKey, up_to_date: bool, pre_vote: bool) -> bool:
        """Kafka's grant matrix (KIP-595 + KIP-996 as shipped): each state answers for itself."""
        return self._quorum.state.can_grant_vote(candidate, up_to_date, pre_vote)

    def handle_vote_response(self, now_ms: int, source: int, response: VoteResponse) -> None:
        state = self._quorum.state
        if (response.error_code == Errors.UNSUPPORTED_VERSION
                and isinstance(state, ProspectiveState)
                and not self.epoch_exhausted(now_ms, state.epoch)):
            # The peer cannot take a pre-vote: fall back to a standard election (KIP-996).
            self._quorum.to_candidate(now_ms, TransitionCause.PRE_VOTE_UNSUPPORTED)
            return
        if self.handle_common_response(now_ms, source, response):
            return
        state = self._quorum.state
        if response.leader_epoch != state.epoch \
                or not isinstance(state, ProspectiveState | CandidateState):
            return
        if response.error_code == Errors.NONE:
            state.election.record(ReplicaKey(source, response.voter_directory_id),
                                  response.vote_granted)
        elif (response.error_code == Errors.INVALID_VOTER_KEY
              and response.voter_directory_id is not None):
            # A voter whose node now runs another directory (a replaced disk, between AddVoter
            # and RemoveVoter): ask that node again as the voter it is.
            state.election.record_moved(source, response.voter_directory_id)

    # --- BeginQuorumEpoch / EndQuorumEpoch ---------------------------------------------------

    def _leader_request_refusal(
        self, now_ms: int, request: BeginQuorumEpochRequest | EndQuorumEpochRequest
    ) -> Errors | None:
        """Why a request in which a leader speaks of its epoch (it began, or it ends) is refused,
        if it is; checked before anything changes."""
        if not self._cluster_ok(request.cluster_id):
            return Errors.INCONSISTENT_CLUSTER_ID
        if request.leader_epoch < self._quorum.epoch:
            return Errors.FENCED_LEADER_EPOCH
        if request.leader_id < 0 or request.leader_id == self._local_key.id \
                or not epoch_in_bounds(request.leader_epoch):
            return Errors.INVALID_REQUEST
        if not self._is_voter_id(request.leader_id):
            rpc = type(request).__name__.removesuffix("Request")
            self._warnings.warn(now_ms, f"{rpc}-non-voter",
                                "node %d: refused %s naming %d, not a voter, leader of epoch %d",
                                self._local_key.id, rpc, request.leader_id, request.leader_epoch)
            return Errors.INCONSISTENT_VOTER_SET
        if self._claims_other_leader(now_ms, request.leader_id, request.leader_epoch):
            return Errors.INVALID_REQUEST
        return None

    def _follow_requesting_leader(
        self, now_ms: int, request: BeginQuorumEpochRequest | EndQuorumEpochRequest
    ) -> Errors:
        """Adopt the epoch and leader a request that passed ``_leader_request_refusal`` names;
        INVALID_VOTER_KEY if it was meant for another directory of this node's id."""
        rpc = type(request).__name__.removesuffix("Request")
        self._log_moved_by(request.leader_id, rpc, request.leader_epoch, request.leader_id)
        self._maybe_transition(now_ms, request.leader_id, request.leader_id,
                               request.leader_epoch)
        if not self._addressed_to_me(request.voter_id, request.voter_directory_id):
            return Errors.INVALID_VOTER_KEY
        return Errors.NONE

    def handle_begin_quorum_epoch(self, now_ms: int, request: BeginQuorumEpochRequest) -> Errors:
        refusal = self._leader_request_refusal(now_ms, request)
        if refusal is not None:
            return refusal
        return self._follow_requesting_leader(now_ms, request)

    def handle_begin_quorum_epoch_response(
        self, now_ms: int, source: int, response: BeginQuorumEpochResponse
    ) -> None:
        if self.handle_common_response(now_ms, source, response):
            return
        state = self._quorum.state
        if not isinstance(state, LeaderState):
            return
        asked = state.begin_quorum_asked.pop(source, None)
        if response.error_code == Errors.NONE and asked is not None:
            asked.acknowledged = True
            asked.read_barrier_echoed = max(asked.read_barrier_echoed, asked.read_barrier_asked)

    def handle_end_quorum_epoch(self, now_ms: int, request: EndQuorumEpochRequest) -> Errors:
        refusal = self._leader_request_refusal(now_ms, request)
        if refusal is not None:
            return refusal
        if request.leader_epoch > self._quorum.epoch:
            # KIP-595: an EndQuorumEpoch for an epoch not known here is rejected. Adopting the
            # epoch (and at once campaigning past it, Kafka's way) would let one message from
            # any voter id start an election in a quorum with a healthy leader.
            return Errors.UNKNOWN_LEADER_EPOCH
        # Our epoch, whose leader we did not know (Kafka: follow it, then elect a successor).
        error = self._follow_requesting_leader(now_ms, request)
        if error is not Errors.NONE:
            return error
        state = self._quorum.state
        if isinstance(state, FollowerState) and state.leader_id == request.leader_id \
                and self._voters.is_voter:
            logger.info("node %d: EndQuorumEpoch from %d: leader of epoch %d resigned",
                        self._local_key.id, request.leader_id, request.leader_epoch)
            successors = [info.key() for info in request.preferred_successors]
            backoff = self._end_epoch_backoff_ms(successors)
            state.fetch_deadline_ms = now_ms + backoff
            state.leader_resigned = True
        return Errors.NONE

    def _end_epoch_backoff_ms(self, successors: Sequence[ReplicaKey]) -> int:
        """Kafka's strict exponential back-off by position in the preferred-successor list: the
        first successor campaigns at once, the others progressively later, the rest last."""
        limit = self._config.election_backoff_max_ms
        position = next(
            (i for i, key in enumerate(successors) if key.matches(self._local_key)), None
        )
        if position is None:
            return limit
        if position == 0:
            return 0
        return min(limit, (limit >> (len(successors) - 1)) << (position - 1))

    def handle_end_quorum_epoch_response(
        self, now_ms: int, source: int, response: EndQuorumEpochResponse
    ) -> None:
        if self.handle_common_response(now_ms, source, response):
            return
        state = self._quorum.state
        if response.error_code == Errors.NONE and isinstance(state, ResignedState):
            state.unacknowledged.discard(source)
