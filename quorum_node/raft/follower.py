"""The follower's own state, as Kafka's ``FollowerState`` keeps it (the fetch timer, whether the
leader has been heard from in this epoch, a snapshot download in progress), and the checks a
follower makes of its leader's Fetch answers before it changes anything. ``RaftCore`` sends the
fetches and applies what passes; nothing here reads a clock or does I/O.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from quorum_node.raft.log import RaftLog
from quorum_node.raft.messages import EpochEndOffset, FetchResponse
from quorum_node.raft.records import RecordBatch, decode_batches
from quorum_node.raft.snapshots import PartialSnapshot
from quorum_node.raft.types import MAX_OFFSET, ReplicaKey
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

    def can_grant_vote(self, candidate: ReplicaKey, up_to_date: bool, pre_vote: bool) -> bool:
        # KAFKA-17641: a pre-vote only, and only until the leader has been heard from.
        return pre_vote and up_to_date and not self.has_fetched_from_leader

    def heard_from_leader(self, now_ms: int) -> None:
        """A usable answer from the leader: the fetch timer starts over."""
        self.fetch_deadline_ms = now_ms + self.fetch_timeout_ms
        self.has_fetched_from_leader = True

    def abort_download(self) -> None:
        if self.download is not None:
            self.download.abort()
        self.download = None


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
