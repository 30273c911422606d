"""The ``quorum-state`` file: the election state a voter must never forget (epoch and vote).

Raft's safety needs a node to remember across restarts the highest epoch it has seen and whom it
voted for in it, so the state is replaced atomically and durably before the node acts on it. A
file that cannot be read is an error, never a reason to start from scratch: forgetting a vote would
let the node vote twice in one epoch.

The file is one line of JSON with Kafka's field names (QuorumStateData v1): ``leaderId``,
``leaderEpoch``, ``votedId``, ``votedDirectoryId`` and ``data_version``; -1 means "none".
Spaces pad the line to one size, and a rewrite goes over the spare ``quorum-state.tmp`` kept
beside it, so changing the vote needs no new space on a full disk.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from quorum_node.raft.state import ElectionState
from quorum_node.raft.types import MAX_EPOCH, ReplicaKey
from quorum_node.storage import kafka_uuid
from quorum_node.storage.errors import QuorumStateError
from quorum_node.storage.fsutil import StepHook, atomic_rewrite, fsync_directory

QUORUM_STATE = "quorum-state"
DATA_VERSION = 1
NO_ID = -1  # the file's sentinel for "no leader" / "no vote", as in Kafka
FILE_SIZE = 256  # every write's length: the JSON, spaces, a newline

_Id = Annotated[int, Field(ge=NO_ID)]


class _QuorumStateData(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    leader_id: _Id = Field(alias="leaderId")
    # The bound every epoch this node adopts keeps (see MAX_EPOCH): a file beyond it was not
    # written by this node's core, and starting from it would wedge the node at that epoch.
    leader_epoch: int = Field(alias="leaderEpoch", ge=0, lt=MAX_EPOCH)
    voted_id: _Id = Field(alias="votedId")
    voted_directory_id: str | None = Field(alias="votedDirectoryId")
    data_version: int

    @field_validator("data_version")
    @classmethod
    def _known_version(cls, version: int) -> int:
        if version != DATA_VERSION:
            raise ValueError(f"unsupported data_version {version} (expected {DATA_VERSION})")
        return version

    @field_validator("voted_directory_id")
    @classmethod
    def _uuid_text(cls, text: str | None) -> str | None:
        if text is not None:
            kafka_uuid.parse_uuid(text)  # raises ValueError on a malformed uuid
        return text


class QuorumStateStore:
    """Reads and atomically replaces ``<log_dir>/quorum-state``.

    ``after_step`` is called after each step of a write (see ``WriteStep``); tests raise from it to
    simulate a crash at that point.
    """

    def __init__(self, log_dir: str | os.PathLike[str], after_step: StepHook | None = None) -> None:
        self.path = Path(log_dir) / QUORUM_STATE
        self._after_step = after_step

    def read(self) -> ElectionState | None:
        """The stored state, or None when no state was ever written. The spare
        ``quorum-state.tmp`` is never read: only a renamed file counts.

        What is read is made durable first (the file and its directory fsynced): a process that
        died between the rename and the directory's fsync left the new state in the page cache
        only, and a node acting on a vote a power loss then takes back could vote twice in one
        epoch."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise QuorumStateError(f"{self.path}: unreadable: {exc}") from exc
        try:
            with os.fdopen(fd, "rb") as file:
                raw = file.read()
                os.fsync(file.fileno())
            fsync_directory(self.path.parent)
        except OSError as exc:
            raise QuorumStateError(f"{self.path}: unreadable or not made durable (fsync "
                                   f"failed): {exc}") from exc
        try:
            data = _QuorumStateData.model_validate_json(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'file'}: {err['msg']}"
                for err in exc.errors()
            )
            raise QuorumStateError(f"{self.path}: invalid quorum-state ({problems})") from exc
        if data.voted_directory_id is not None and data.voted_id == NO_ID:
            raise QuorumStateError(f"{self.path}: votedDirectoryId without votedId")
        voted_key = None
        if data.voted_id != NO_ID:
            directory = data.voted_directory_id
            voted_key = ReplicaKey(
                data.voted_id, kafka_uuid.parse_uuid(directory) if directory else None
            )
        return ElectionState(
            epoch=data.leader_epoch,
            leader_id=None if data.leader_id == NO_ID else data.leader_id,
            voted_key=voted_key,
        )

    def write(self, state: ElectionState) -> None:
        """Durably replace the file; when this returns the new state survives a crash."""
        voted = state.voted_key
        data = _QuorumStateData(
            leader_id=NO_ID if state.leader_id is None else state.leader_id,
            leader_epoch=state.epoch,
            voted_id=NO_ID if voted is None else voted.id,
            voted_directory_id=(
                None if voted is None or voted.directory_id is None
                else kafka_uuid.to_kafka_string(voted.directory_id)
            ),
            data_version=DATA_VERSION,
        )
        # Padded to one size, so that each rewrite fits the spare it is written over (see
        # atomic_rewrite) whatever the vote: a full disk must not stop an election.
        line = data.model_dump_json(by_alias=True).ljust(FILE_SIZE - 1) + "\n"
        atomic_rewrite(self.path, line.encode("utf-8"), after_step=self._after_step)
