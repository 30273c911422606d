"""The follower's own state, as Kafka's ``FollowerState`` keeps it (the fetch timer, whether the
leader has been heard from in this epoch, a snapshot download in progress), and the checks a
follower makes of its leader's Fetch answers before it changes anything. ``FollowerFetcher``
(``follower_fetch.py``) sends the fetches and applies what passes; nothing here reads a clock or
does I/O.

**A leader that is gone.** Kafka's follower starts an election only once it has not heard from
its leader for ``controller.quorum.fetch.timeout.ms``. Silence is all a partition or a paused
process gives, and the timeout is what tells them from a slow answer; but a leader whose process
has died says more: the follower's connection to it ends and the next one is refused, since
nothing listens at its address any more. The transport reports that refusal as
``RequestFailure.REFUSED``, distinct from a request that timed out, failed its handshake or got
an unusable answer (``UNANSWERED``, which changes nothing here). A refusal of a Fetch (or
FetchSnapshot) to the leader, in this state, makes the leader *gone* (``saw_leader_gone``), and
the rules are:

- The follower asks for pre-votes (KIP-996) without waiting out the fetch timeout. Nothing
  durable changes: a pre-vote moves no epoch and records no vote, so Raft's safety is the
  standard vote's and is untouched; what is at stake is only whether a healthy leader is
  disturbed, which the pre-vote's majority still decides.
- A follower that saw its leader gone grants pre-votes again (``can_grant_vote``). Kafka's rule
  (KAFKA-17641) rejects them once the leader has been heard from in the epoch, to protect a
  leader others still follow; a follower whose leader refused it no longer has one to protect,
  and if it kept rejecting, the two survivors of a three-voter quorum would reject each other
  until their fetch timeouts ran out anyway.
- A disruptive or cut-off follower still cannot unseat a live leader: the followers still
  fetching from that leader reject its pre-vote, and a lost pre-vote takes it back to following
  the leader it knew in the same epoch (``_lose_pre_vote``), with nothing bumped. A later
  successful fetch makes the leader present again (``heard_from_leader``).
- The survivors of a crash see the refusal within the same milliseconds, and two that ask at
  once grant each other's pre-votes and split the vote (what the fetch timeout's jitter avoids
  on the slow path). So the first round is staggered by rank, as Kafka staggers the successors
  an EndQuorumEpoch names: the voters other than the gone leader, by id, ask a tenth of the
  election timeout apart (the first at once); and granting a pre-vote puts this follower's own
  round off by an election timer, as a Raft follower's timer restarts when it grants a vote, so
  the one that asked first wins alone.
- Churn is bounded: a follower refused by a leader that others still follow would otherwise
  ask again after every lost round. Each further round in the same epoch, with the same leader,
  waits as an election backs off: a randomized election timer, doubling with each round
  (``gone_leader_delay_ms``). The fetch timeout bounds it from above, as before.
- The refusal comes within a round trip of the death. A dying process's connections end
  first, the one under a parked Fetch among them (``CLOSED``): a leader that closed one stream
  and still listens would give the same. The request after a CLOSED is not backed off (once
  until the peer answers again: ``RequestManager.on_failure``), so the refusal, or the live
  leader's answer, comes at once.
- Until then the follower grants pre-votes (``lost_leader_connection``). The survivors see the
  connection end in the same instant, and the first of them to be refused may ask before the
  others' own retries are refused: a follower that still counted the leader as present would
  reject it (KAFKA-17641) and cost the quorum a round. A live leader's answer undoes it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from quorum_node.raft.log import RaftLog
from quorum_node.raft.messages import EpochEndOffset, FetchResponse
from quorum_node.raft.records import RecordBatch, decode_batches
from quorum_node.raft.snapshots import PartialSnapshot
from quorum_node.raft.types import MAX_OFFSET, NEVER, ReplicaKey
from quorum_node.raft.voters import voter_sets_in


@dataclass(slots=True)
class FollowerState:
    epoch: int
    leader_id: int
    voted_key: ReplicaKey | None
    fetch_deadline_ms: int
    # controller.quorum.fetch.timeout.ms plus up to a tenth more, drawn once per state: the
    # followers of a leader hear from it in the same instant, and without the jitter they would
    # time out in the same instant too, grant each other's pre-votes and split the vote.
    fetch_timeout_ms: int
    # KAFKA-17641: a follower grants pre-votes only until its first successful fetch in the epoch.
    has_fetched_from_leader: bool = False
    # KIP-630: the leader's snapshot being downloaded, instead of fetching, when the log it needs
    # is gone from the leader.
    download: PartialSnapshot | None = None
    # The leader's EndQuorumEpoch came: the fetch timer runs out after the successor back-off.
    leader_resigned: bool = False
    # The leader refused a connection (see the module docstring): a pre-vote is due at
    # ``pre_vote_at_ms``, before the fetch timer runs out.
    leader_gone: bool = False
    pre_vote_at_ms: int = NEVER
    # The leader ended the connection a request of ours was on, and has not answered since
    # (see the module docstring): until the retry tells, pre-votes are granted, and a round of
    # our own waits for a pre-vote granted meanwhile (``deferred_until_ms``).
    lost_leader_connection: bool = False
    deferred_until_ms: int = 0
    # The newest read barrier this leader's answers named: echoed in every fetch to it
    # (``FetchRequest.read_barrier``).
    read_barrier: int = 0

    @property
    def deadline_ms(self) -> int:
        """When this follower stops following: its fetch timer, or a gone leader's pre-vote."""
        return min(self.fetch_deadline_ms, self.pre_vote_at_ms)

    def can_grant_vote(self, candidate: ReplicaKey, up_to_date: bool, pre_vote: bool) -> bool:
        # KAFKA-17641: a pre-vote only, and only until the leader has been heard from, or once
        # it may be gone.
        return pre_vote and up_to_date and (
            self.leader_gone or self.lost_leader_connection or not self.has_fetched_from_leader)

    def heard_from_leader(self, now_ms: int) -> None:
        """A usable answer from the leader: the fetch timer starts over, and a leader thought
        gone is back."""
        self.fetch_deadline_ms = now_ms + self.fetch_timeout_ms
        self.has_fetched_from_leader = True
        self.leader_gone = False
        self.pre_vote_at_ms = NEVER
        self.lost_leader_connection = False
        self.deferred_until_ms = 0

    def saw_leader_gone(self, now_ms: int, delay_ms: int) -> None:
        """The leader refused a connection: ask for pre-votes ``delay_ms`` from now, or once a
        pre-vote granted before is due. The first refusal sets the time; the next ones, every
        retry back-off while it waits, keep it (a pre-vote granted meanwhile may have put it
        off)."""
        if not self.leader_gone:
            self.leader_gone = True
            self.pre_vote_at_ms = max(now_ms + delay_ms, self.deferred_until_ms)

    def granted_pre_vote(self, not_before_ms: int) -> None:
        """This follower granted a pre-vote: a round of its own on a gone leader waits until
        ``not_before_ms``, and the candidate it granted goes first."""
        if self.leader_gone:
            self.pre_vote_at_ms = max(self.pre_vote_at_ms, not_before_ms)
        elif self.lost_leader_connection:
            self.deferred_until_ms = max(self.deferred_until_ms, not_before_ms)

    def abort_download(self) -> None:
        if self.download is not None:
            self.download.abort()
        self.download = None


def gone_leader_delay_ms(rounds: int, rank: int, election_timeout_ms: int,
                         draw: Callable[[int], int]) -> int:
    """How long a follower whose leader is gone waits before asking for pre-votes, having asked
    ``rounds`` times already in this epoch with this leader, at ``rank`` among the voters other
    than the leader (by id); ``draw(n)`` is uniform in [0, n). The first round is staggered by
    rank; each further one waits a randomized election timer, doubled per round, as a candidate
    that keeps losing backs off."""
    if rounds == 0:
        return rank * (election_timeout_ms // 10)
    return (election_timeout_ms << min(rounds - 1, 16)) + draw(election_timeout_ms)


def fetch_response_problem(response: FetchResponse, committed: int | None) -> str | None:
    """What makes a leader's answer unusable as a whole, if anything (its records apart), to a
    follower that knows every offset below ``committed`` is committed (its high watermark, or
    its latest snapshot's end before it learns one)."""
    epoch = response.leader_epoch
    hwm = response.high_watermark
    if hwm is not None and committed is not None and hwm < committed:
        # A leader's high watermark covers every committed offset (Raft), so ours is never
        # ahead of it: the answer is broken or forged.
        return f"its high watermark {hwm} is below our committed offset {committed}"
    if hwm is not None and hwm < 0:
        return f"negative high watermark {hwm}"
    snapshot = response.snapshot_id
    if snapshot is not None:
        if not 0 < snapshot.end_offset <= MAX_OFFSET or not 0 <= snapshot.epoch <= epoch:
            return f"invalid snapshot id ({snapshot.end_offset}, {snapshot.epoch})"
        if committed is not None and snapshot.end_offset < committed:
            return (f"snapshot ({snapshot.end_offset}, {snapshot.epoch}) ends below the "
                    f"committed offset {committed}")
    diverging = response.diverging_epoch
    if diverging is not None and (diverging.end_offset < 0
                                  or not 0 <= diverging.epoch <= epoch):
        return f"invalid diverging epoch ({diverging.epoch}, {diverging.end_offset})"
    return None


def validated_batches(response: FetchResponse, log: RaftLog,
                      voter_ids: Collection[int]) -> tuple[list[RecordBatch], str | None]:
    """The fetched batches, or why they cannot be appended to ``log``: each must pass its CRC,
    start where the previous one (the log, for the first) ends, and carry an epoch no older than
    the one before it and no newer than the leader's; voter records may name only
    ``voter_ids`` (controller.quorum.voters)."""
    try:
        batches = decode_batches(response.records)
    except ValueError as error:
        return [], f"corrupt records: {error}"
    expected_offset = log.end_offset
    previous_epoch = log.last_fetched_epoch()
    for batch in batches:
        if batch.base_offset != expected_offset:
            return [], f"a batch at offset {batch.base_offset} where {expected_offset} was due"
        if not previous_epoch <= batch.epoch <= response.leader_epoch:
            return [], (f"a batch of epoch {batch.epoch} at offset {batch.base_offset} "
                        f"(after epoch {previous_epoch}, leader epoch {response.leader_epoch})")
        if not batch.records:
            return [], f"an empty batch at offset {batch.base_offset}"
        if batch.is_control:
            problem = _voter_records_problem(batch, voter_ids)
            if problem is not None:
                return [], problem
        expected_offset = batch.next_offset
        previous_epoch = batch.epoch
    return batches, None


def _voter_records_problem(batch: RecordBatch, voter_ids: Collection[int]) -> str | None:
    """Why a fetched control batch's voter records cannot be adopted, if they cannot: once in
    the log they define the voters, at once and at every start."""
    try:
        sets = voter_sets_in(batch)
    except ValueError as error:
        return f"an unreadable voter record at offset {batch.base_offset}: {error}"
    for offset, voters in sets:
        problem = voter_set_problem(voters, voter_ids)
        if problem is not None:
            return f"a voter record at offset {offset} {problem}"
    return None


def voter_set_problem(voters: Collection[ReplicaKey], voter_ids: Collection[int]) -> str | None:
    """Why a voter set read from a leader (a VotersRecord fetched, or a snapshot's) cannot be
    adopted: it must be a set of configured ids (``voter_ids``, controller.quorum.voters), the
    rule AddVoter keeps, or this replica could never start again."""
    unknown = sorted(key.id for key in voters if key.id not in voter_ids)
    if not voters or unknown:
        return f"names voters {unknown or 'none'} outside controller.quorum.voters"
    return None


def diverging_point(log: RaftLog, diverging: EpochEndOffset) -> int:
    """Where ``log`` is truncated to for a leader's diverging epoch (Kafka's rule)."""
    if diverging.epoch == 0:
        return min(diverging.end_offset, log.end_offset)
    local = log.end_offset_for_epoch(diverging.epoch)
    return min(local.offset, diverging.end_offset) if local.epoch == diverging.epoch \
        else local.offset
