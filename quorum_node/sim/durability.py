"""Who holds a committed offset on disk, and who could still be elected without it.

A voter is a replica, (node id, directory id): once a node's disk is wiped, the voter its old
directory was is *lost* (it holds nothing and can never vote again, KIP-856), while the node
comes back as a new replica. A statically configured voter known by id only is whatever disk the
node has now. A replica holds an offset when its log has the committed batch there (durably, where
that matters) or its snapshot covers it.

Committed data is safe while no replica lacking it could be elected: a candidate wins with the
votes of a majority of *its own* voter set, and a voter grants only a candidate whose log is at
least as up to date as its own. Counting, for each replica lacking the newest committed offset,
the voters of its set that could grant it (present, and not more up to date) covers every voter
set in use, wiped disks and replicas that still believe in the static voters alike.
"""

from __future__ import annotations

import bisect
import uuid
from collections.abc import Iterable, Sequence, Sized
from dataclasses import dataclass

from quorum_node.raft.log import MemoryLog
from quorum_node.raft.records import RecordBatch
from quorum_node.raft.snapshots import SnapshotStore
from quorum_node.raft.types import ReplicaKey
from quorum_node.raft.voters import VoterSet, voter_sets_in
from quorum_node.sim.cluster import Cluster
from quorum_node.sim.node import SimNode

# What identifies the data at one offset: the epoch, base offset and CRC of the batch holding it.
Entry = tuple[int, int, int]


def entry_of(batch: RecordBatch) -> Entry:
    return batch.epoch, batch.base_offset, batch.crc


def majority(voters: Sized) -> int:
    return len(voters) // 2 + 1


# The directory a wiped disk would get, in a what-if: random_uuid never makes it (version bits).
_UNKNOWN_DIRECTORY = uuid.UUID(int=0)


@dataclass(frozen=True, slots=True)
class Candidate:
    """What decides whether a replica could be elected: its identity, the voter set its log puts
    in force, how up to date its log is, and whether it holds the offset in question."""

    key: ReplicaKey
    voters: VoterSet
    position: tuple[int, int]  # (last epoch, end offset) of its log
    holds: bool

    @property
    def campaigns(self) -> bool:
        """Whether it is a voter of its own voter set, the only way to become a candidate."""
        return any(key.matches(self.key) for key in self.voters)


def describe(voters: Iterable[ReplicaKey]) -> str:
    return "{" + ", ".join(f"{key.id}:{str(key.directory_id)[:8]}" if key.directory_id
                           else str(key.id) for key in voters) + "}"


class Durability:
    def __init__(self, cluster: Cluster, committed: Sequence[Entry]) -> None:
        self._cluster = cluster
        self._committed = committed
        self._disk_voters: dict[int, tuple[tuple[int, uuid.UUID, int], VoterSet]] = {}

    def holds(self, key: ReplicaKey, offset: int, *, acknowledged: bool = False) -> bool | None:
        """Whether the voter ``key`` holds committed ``offset`` durably; None for a lost voter
        (``acknowledged``: whether it held it when its disk was lost, so that a leader may have
        counted it)."""
        node = self._cluster.nodes.get(key.id)
        if node is None:
            return None
        if key.directory_id is not None and key.directory_id != node.directory_id:
            lost = node.lost_disks.get(key.directory_id)
            if acknowledged and lost is not None:
                return self._disk_holds(*lost, offset, durably=True)
            return None
        return self.node_holds(node, offset)

    def node_holds(self, node: SimNode, offset: int, *, durably: bool = True) -> bool:
        return self._disk_holds(node.log, node.snapshots, offset, durably=durably)

    def _disk_holds(
        self, log: MemoryLog, snapshots: SnapshotStore, offset: int, *, durably: bool
    ) -> bool:
        if offset < log.start_offset:
            latest = snapshots.latest()
            return latest is not None and latest.end_offset > offset
        if (durably and log.durable_end_offset <= offset) or offset >= len(self._committed):
            return False
        batch = log.batch_containing(offset)
        return batch is not None and entry_of(batch) == self._committed[offset]

    def tally(
        self, voters: Sequence[ReplicaKey], offset: int, *, acknowledged: bool = False
    ) -> tuple[list[int], list[int], list[int]]:
        """Node ids of the voters that hold ``offset``, that do not, and that are lost."""
        holders: list[int] = []
        lacking: list[int] = []
        lost: list[int] = []
        for key in voters:
            held = self.holds(key, offset, acknowledged=acknowledged)
            (lost if held is None else holders if held else lacking).append(key.id)
        return holders, lacking, lost

    def candidates(self, offset: int, wiped: int | None = None) -> list[Candidate]:
        """Every replica, running or stopped (it may come back), as a candidate for ``offset``;
        ``wiped``: that node as it would come back after losing its disk."""
        found = []
        for node in self._cluster.nodes.values():
            if node.node_id == wiped:
                found.append(Candidate(ReplicaKey(node.node_id, _UNKNOWN_DIRECTORY),
                                       self._cluster.static_voters, (0, 0), False))
                continue
            voters = node.core.voters if node.core is not None else self.voters_on_disk(node)
            found.append(Candidate(
                ReplicaKey(node.node_id, node.directory_id), voters, node.log_position,
                self.node_holds(node, offset, durably=False)))
        return found

    def voters_on_disk(self, node: SimNode) -> VoterSet:
        """A stopped node's voter set, read once per disk and process lifetime."""
        identity = (node.node_id, node.directory_id, node.incarnation)
        cached = self._disk_voters.get(node.node_id)
        if cached is None or cached[0] != identity:
            cached = self._disk_voters[node.node_id] = (
                identity, voters_on_disk(node, self._cluster.static_voters)[1])
        return cached[1]

    @staticmethod
    def electable_without(candidates: Sequence[Candidate]) -> tuple[Candidate, list[int]] | None:
        """A candidate lacking the offset that is a voter of its own set and that enough of that
        set's voters could vote for (their logs are no more up to date): it, and their ids."""
        for candidate in candidates:
            if candidate.holds or not candidate.campaigns:
                continue
            granting = [
                key.id for key in candidate.voters
                if any(key.matches(voter.key) and voter.position <= candidate.position
                       for voter in candidates)
            ]
            if len(granting) >= majority(candidate.voters):
                return candidate, granting
        return None

    @staticmethod
    def voters_without_quorum(candidates: Sequence[Candidate]) -> VoterSet | None:
        """The voter set of a would-be candidate of which no majority is present any more (too
        many voters lost): it could never be elected."""
        for candidate in candidates:
            if not candidate.campaigns:
                continue
            present = [key for key in candidate.voters
                       if any(key.matches(other.key) for other in candidates)]
            if len(present) < majority(candidate.voters):
                return candidate.voters
        return None

    def majority_acknowledged(self, voters: Sequence[ReplicaKey], offset: int) -> bool:
        """A majority of ``voters`` holds ``offset``, or held it when its disk was lost: what a
        leader may count towards committing it."""
        holders, _, _ = self.tally(voters, offset, acknowledged=True)
        return len(holders) >= majority(voters)


    def every_quorum_holds(self, voters: Sequence[ReplicaKey], offset: int) -> bool:
        """No majority of ``voters`` can be formed from voters lacking ``offset`` (lost voters
        can form nothing: they never vote again)."""
        _, lacking, _ = self.tally(voters, offset)
        return len(lacking) < majority(voters)


def voters_on_disk(node: SimNode, static: VoterSet, below: int | None = None) -> tuple[
    int | None, VoterSet
]:
    """The voter set a node's disk puts in force below ``below`` (default: the log end), and the
    offset of the record that set it (None for the static voters)."""
    batches = node.log.batches
    stop = len(batches) if below is None else bisect.bisect_left(
        batches, below, key=lambda batch: batch.base_offset)
    for index in range(stop - 1, -1, -1):
        if batches[index].is_control:
            found = [(offset, voters) for offset, voters in voter_sets_in(batches[index])
                     if below is None or offset < below]
            if found:
                return found[-1]
    latest = node.snapshots.latest()
    if latest is not None:
        carried = node.snapshots.voters(latest)
        if carried is not None:
            return latest.end_offset - 1, carried
    return None, static
