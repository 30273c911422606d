"""What a restore drill found (``quorum-node restore-drill --report``): the JSON the operator
reads from the drill Job's termination message into ``status.backup.lastDrill``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

# A container's termination message is cut at 4096 bytes: the report stays well within it.
MAX_MESSAGE = 1000


class DrillReport(BaseModel):
    """What a drill found, as the operator records it (``status.backup.lastDrill``)."""

    model_config = ConfigDict(populate_by_name=True)

    passed: bool
    message: str
    backup: str | None = None  # the backup drilled (its location)
    end_offset: int | None = Field(default=None, alias="endOffset")
    keys: int | None = None
    leader: int | None = None
    epoch: int | None = None
    started_at: str = Field(alias="startedAt")
    completed_at: str = Field(alias="completedAt")
    duration_seconds: float = Field(alias="durationSeconds")
