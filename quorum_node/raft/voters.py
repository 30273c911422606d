"""The voter set as the log defines it (KIP-856, shipped by Kafka as KIP-853's VotersRecord).

The set lives in the log and in snapshots as whole-set ``VotersRecord`` control records. Every
replica adopts a record as soon as it is in its log, committed or not, and drops it again when the
log is truncated below it; so the set in force is always the newest record at or below the log
end, or, before the first record is written, the statically configured voters (known by id only).

One whole set per record, rather than the seed's AddVoterRecord/RemoveVoterRecord pairs: a record
is then self-contained (a snapshot carries one, a truncation reverts to the previous one without
replaying anything), and "one change at a time" is a check on two consecutive sets.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from pydantic import ValidationError

from quorum_node.raft.messages import Voter, VotersRecord
from quorum_node.raft.records import Record, RecordBatch, control_record, control_record_type
from quorum_node.raft.types import ControlRecordType, ReplicaKey

VoterSet = tuple[ReplicaKey, ...]


def voters_record(voters: Iterable[ReplicaKey]) -> Record:
    """The control record holding ``voters`` (each must have its directory id)."""
    entries = []
    for key in sorted(voters):
        if key.directory_id is None:
            raise ValueError(f"voter {key.id} has no directory id")
        entries.append(Voter(voter_id=key.id, voter_directory_id=key.directory_id))
    if not entries:
        raise ValueError("the voter set is empty")
    payload = VotersRecord(voters=tuple(entries)).model_dump_json(by_alias=True).encode()
    return control_record(ControlRecordType.KRAFT_VOTERS, payload)


def parse_voters_record(payload: bytes) -> VoterSet:
    """The voter set of a VotersRecord payload; ValueError if it is not one."""
    try:
        record = VotersRecord.model_validate_json(payload)
    except ValidationError as error:
        raise ValueError(f"invalid VotersRecord: {error}") from None
    if not record.voters:
        raise ValueError("invalid VotersRecord: no voters")
    return tuple(sorted(ReplicaKey(v.voter_id, v.voter_directory_id) for v in record.voters))


def voter_sets_in(batch: RecordBatch) -> list[tuple[int, VoterSet]]:
    """(offset, voter set) of every VotersRecord in a batch."""
    if not batch.is_control:
        return []
    return [
        (batch.base_offset + index, parse_voters_record(record.value))
        for index, record in enumerate(batch.records)
        if control_record_type(record) is ControlRecordType.KRAFT_VOTERS
    ]


def differ_by_at_most_one(old: VoterSet, new: VoterSet) -> bool:
    """Raft's single-server change rule: at most one voter added or one removed."""
    before, after = set(old), set(new)
    return len(before ^ after) <= 1


class VoterSetHistory:
    """Voter sets by the offset of the record that set them, over a static base."""

    def __init__(self, static_voters: Sequence[ReplicaKey]) -> None:
        if not static_voters:
            raise ValueError("the voter set is empty")
        self.static_voters: VoterSet = tuple(static_voters)
        self._offsets: list[int] = []
        self._sets: list[VoterSet] = []

    def add(self, offset: int, voters: VoterSet) -> None:
        """Record a set read at ``offset``, which must follow every offset recorded so far."""
        if self._offsets and offset <= self._offsets[-1]:
            raise ValueError(f"voter set at {offset} does not follow {self._offsets[-1]}")
        self._offsets.append(offset)
        self._sets.append(voters)

    def latest(self) -> VoterSet:
        return self._sets[-1] if self._sets else self.static_voters

    def latest_offset(self) -> int | None:
        """Offset of the newest VotersRecord, None while the static set is in force."""
        return self._offsets[-1] if self._offsets else None

    def at(self, offset: int) -> VoterSet:
        """The set in force at ``offset`` (set by a record at or below it)."""
        index = bisect.bisect_right(self._offsets, offset) - 1
        return self._sets[index] if index >= 0 else self.static_voters

    def truncate_new(self, end_offset: int) -> None:
        """The log was truncated to ``end_offset``: forget sets recorded at or after it."""
        keep = bisect.bisect_left(self._offsets, end_offset)
        del self._offsets[keep:]
        del self._sets[keep:]

    def reset(self, offset: int | None, voters: VoterSet | None) -> None:
        """Start over from a snapshot: its set (if it carries one) recorded at ``offset``."""
        self._offsets.clear()
        self._sets.clear()
        if offset is not None and voters is not None:
            self.add(offset, voters)
