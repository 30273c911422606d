"""The quorum's history from its control records: who led each epoch, how the voter set changed.

Control records are few (one LeaderChange per epoch, one VotersRecord per membership change, a
header per snapshot), so Spark only gathers them and this module, plain Python, interprets them
with the node's own parsers (``LeaderChangeMessage``, ``parse_voters_record``). Every replica holds
its own copy of each record; copies are merged by epoch or offset, and copies that disagree about
an epoch's leader are a finding (Raft allows one leader per epoch).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import ValidationError

from quorum_node.raft.messages import LeaderChangeMessage, ReplicaInfo
from quorum_node.raft.types import ControlRecordType, ReplicaKey
from quorum_node.raft.voters import VoterSet, parse_voters_record
from quorum_node.storage import kafka_uuid


@dataclass(frozen=True)
class ControlRow:
    """A control record as one replica holds it."""

    cluster_id: str
    node_id: int
    directory_id: str
    offset: int
    epoch: int
    timestamp_ms: int
    control_type: int
    value: str
    snapshot_end_offset: int | None = None  # set for a snapshot's header records


@dataclass(frozen=True)
class LeaderEpoch:
    """An epoch; its leader as its LeaderChange record says, or None when that record is gone
    (compacted into a snapshot) and only the epoch's batches are left."""

    cluster_id: str
    epoch: int
    leader_id: int | None
    voters: str
    granting_voters: str
    start_offset: int  # of the LeaderChange, else of the epoch's first batch still held
    start_ms: int
    end_ms: int | None  # when the next epoch began
    held_by: int  # how many replicas hold this LeaderChange


@dataclass(frozen=True)
class MembershipChange:
    cluster_id: str
    offset: int  # of the VotersRecord (a snapshot's end offset when only a snapshot holds it)
    timestamp_ms: int
    change: str  # "initial" (the first set the data holds), "add" or "remove"
    node_id: int
    directory_id: str
    voters_after: str


@dataclass(frozen=True)
class Conflict:
    """Two replicas disagree about an epoch's leader."""

    cluster_id: str
    epoch: int
    leaders: dict[int, list[str]]  # leader id -> the replicas ("node:directory") saying so


@dataclass
class History:
    leadership: list[LeaderEpoch]
    membership: list[MembershipChange]
    conflicts: list[Conflict]
    unreadable: list[str]  # control records whose JSON did not parse
    voters: dict[str, VoterSet]  # each cluster's latest voter set


@dataclass(frozen=True)
class EpochSeen:
    """An epoch as its batches show it: its first offset and timestamp in any replica's log."""

    cluster_id: str
    epoch: int
    first_offset: int
    first_ms: int


def build_history(rows: Iterable[ControlRow], last_timestamp_ms: dict[str, int],
                  epochs_seen: Iterable[EpochSeen] = ()) -> History:
    """``last_timestamp_ms``: per cluster, the newest record's timestamp (where the last epoch
    ends); ``epochs_seen``: every epoch of the logs, including those whose LeaderChange is gone."""
    leaders: dict[tuple[str, int], dict[int, list[ControlRow]]] = defaultdict(
        lambda: defaultdict(list))
    changes: dict[tuple[str, int], tuple[ControlRow, LeaderChangeMessage]] = {}
    voter_sets: dict[str, dict[int, tuple[int, VoterSet]]] = defaultdict(dict)
    unreadable: list[str] = []
    for row in rows:
        where = f"node {row.node_id} ({row.directory_id}) offset {row.offset}"
        if row.control_type == ControlRecordType.LEADER_CHANGE and row.snapshot_end_offset is None:
            try:
                message = LeaderChangeMessage.model_validate_json(row.value)
            except ValidationError as error:
                unreadable.append(f"{where}: LeaderChange: {error.errors()[0]['msg']}")
                continue
            leaders[(row.cluster_id, row.epoch)][message.leader_id].append(row)
            changes.setdefault((row.cluster_id, row.epoch), (row, message))
        elif row.control_type == ControlRecordType.KRAFT_VOTERS:
            try:
                voters = parse_voters_record(row.value.encode())
            except ValueError as error:
                unreadable.append(f"{where}: VotersRecord: {error}")
                continue
            offset = row.offset if row.snapshot_end_offset is None else row.snapshot_end_offset
            voter_sets[row.cluster_id].setdefault(offset, (row.timestamp_ms, voters))
    conflicts = [Conflict(cluster, epoch, {leader: sorted({_replica(r) for r in rows})
                                           for leader, rows in by_leader.items()})
                 for (cluster, epoch), by_leader in sorted(leaders.items())
                 if len(by_leader) > 1]
    return History(
        leadership=_leadership(changes, leaders, last_timestamp_ms, epochs_seen),
        membership=[change for cluster, sets in sorted(voter_sets.items())
                    for change in _membership(cluster, sets)],
        conflicts=conflicts, unreadable=unreadable,
        voters={cluster: sets[max(sets)][1] for cluster, sets in voter_sets.items()})


def _replica(row: ControlRow) -> str:
    return f"{row.node_id}:{row.directory_id}"


def _leadership(changes: dict[tuple[str, int], tuple[ControlRow, LeaderChangeMessage]],
                leaders: dict[tuple[str, int], dict[int, list[ControlRow]]],
                last_timestamp_ms: dict[str, int],
                epochs_seen: Iterable[EpochSeen]) -> list[LeaderEpoch]:
    epochs: dict[tuple[str, int], LeaderEpoch] = {
        (seen.cluster_id, seen.epoch): LeaderEpoch(
            seen.cluster_id, seen.epoch, None, "", "", seen.first_offset, seen.first_ms, None, 0)
        for seen in epochs_seen}
    for (cluster, epoch), (row, message) in changes.items():
        holders = {_replica(r) for r in leaders[(cluster, epoch)][message.leader_id]}
        epochs[(cluster, epoch)] = LeaderEpoch(
            cluster_id=cluster, epoch=epoch, leader_id=message.leader_id,
            voters=_infos(message.voters), granting_voters=_infos(message.granting_voters),
            start_offset=row.offset, start_ms=row.timestamp_ms, end_ms=None,
            held_by=len(holders))
    ordered = [epochs[key] for key in sorted(epochs)]
    if not ordered:
        return []
    return [dataclasses.replace(epoch, end_ms=following.start_ms
                                if following is not None and following.cluster_id ==
                                epoch.cluster_id else last_timestamp_ms.get(epoch.cluster_id))
            for epoch, following in zip(ordered, [*ordered[1:], None], strict=True)]


def _infos(infos: Iterable[ReplicaInfo]) -> str:
    return format_voters(info.key() for info in infos)


def format_voters(keys: Iterable[ReplicaKey]) -> str:
    """Voters as people read them: ``1:<directory id>`` (Kafka's uuid form), by id."""
    return ", ".join(f"{key.id}:{uuid_text(key)}" for key in sorted(keys))


def uuid_text(key: ReplicaKey) -> str:
    return "-" if key.directory_id is None else kafka_uuid.to_kafka_string(key.directory_id)


def _membership(cluster: str, sets: dict[int, tuple[int, VoterSet]]
                ) -> list[MembershipChange]:
    changes: list[MembershipChange] = []
    previous: VoterSet | None = None
    for offset in sorted(sets):
        timestamp, voters = sets[offset]
        if previous == voters:
            continue  # a snapshot repeating the set in force, or the same record again
        after = format_voters(voters)
        if previous is None:
            events = [("initial", key) for key in voters]
        else:
            events = [("remove", k) for k in sorted(set(previous) - set(voters))] + \
                     [("add", k) for k in sorted(set(voters) - set(previous))]
        changes += [MembershipChange(cluster, offset, timestamp, change, key.id,
                                     uuid_text(key), after) for change, key in events]
        previous = voters
    return changes
