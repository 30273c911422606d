"""``backup.json``, the manifest of a backup, and the backup's layout.

A backup is laid out like a node's log directory, so that whatever reads log directories (the
audit, ``quorum-node restore``) reads it::

    meta.properties                                   the node's, unchanged
    __cluster_metadata-0/<end offset>-<epoch>.checkpoint   the latest snapshot, if any
    __cluster_metadata-0/<base offset>.log            the committed log after it, cut at a batch
                                                      boundary at or below the high watermark
    backup.json                                       this manifest, written last

A prefix without ``backup.json`` is an incomplete backup: the manifest is written only once every
file it names is.
"""

from __future__ import annotations

import datetime
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from quorum_node.storage.log_dir import METADATA_PARTITION_DIR
from quorum_node.storage.meta_properties import META_PROPERTIES

MANIFEST_NAME = "backup.json"
# The members a backup may hold besides the manifest: nothing else is read or written.
_MEMBER = re.compile(
    rf"{re.escape(META_PROPERTIES)}"
    rf"|{re.escape(METADATA_PARTITION_DIR)}/([0-9]{{20}}\.log|[0-9]{{20}}-[0-9]{{10}}\.checkpoint)")


class BackupError(Exception):
    """A backup cannot be taken, read or restored; the message is one line."""


class SnapshotRef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    end_offset: int = Field(ge=0)
    epoch: int = Field(ge=0)


class VoterEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: int = Field(ge=0)
    directory_id: str | None  # None for a statically configured voter known by id only
    endpoints: list[str]  # its controller listener(s), "scheme://host:port"


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str  # relative to the backup's root, "/"-separated
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class BackupManifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format_version: Literal[1] = 1
    cluster_id: str
    node_id: int = Field(ge=0)
    directory_id: str
    created_at: str  # RFC 3339, UTC ("2026-01-02T03:04:05Z")
    snapshot: SnapshotRef | None
    log_start_offset: int = Field(ge=0)
    end_offset: int = Field(ge=0)  # exclusive: every record below it is committed
    last_epoch: int = Field(ge=0)
    voters: list[VoterEntry]
    files: list[FileEntry]

    def to_json(self) -> bytes:
        return (self.model_dump_json(indent=2) + "\n").encode()

    @classmethod
    def parse(cls, raw: bytes, where: str) -> BackupManifest:
        """The manifest in ``raw``; BackupError (one line) if it is not one."""
        try:
            manifest = cls.model_validate_json(raw)
        except ValidationError as error:
            first = error.errors()[0]
            location = ".".join(str(part) for part in first["loc"]) or "document"
            raise BackupError(f"{where}: not a backup manifest ({location}: {first['msg']})"
                              ) from None
        for entry in manifest.files:
            check_member(entry.path, where)
        return manifest


def check_member(path: str, where: str) -> None:
    """Refuse a file name a backup cannot hold (``..``, absolute paths, anything unexpected)."""
    if not _MEMBER.fullmatch(path):
        raise BackupError(f"{where}: unexpected file {path!r} in a backup")


def rfc3339(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# A backup's directory as ``default_backup_name`` names it under its cluster's: without a suffix
# (the operator's schedule counts those), and with or without one (what tells a backup's
# directory from any other: the audit's incomplete backups).
_STAMPED_NAME = r"[0-9]{8}T[0-9]{6}Z-node-[0-9]+"
UNSUFFIXED_BACKUP_NAME = re.compile(_STAMPED_NAME)
BACKUP_DIRECTORY_NAME = re.compile(rf"{_STAMPED_NAME}(?:-.+)?")


def default_backup_name(cluster_id: str, node_id: int, created_at: datetime.datetime,
                        suffix: str = "") -> str:
    """``<cluster_id>/<YYYYMMDDTHHMMSSZ>-node-<id>[-<suffix>]``: the place of a backup under a
    prefix (its name starts with its time, so that names sort by age; the operator's on-demand
    backups carry their resource's name as the suffix)."""
    stamp = created_at.astimezone(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{cluster_id}/{stamp}-node-{node_id}" + (f"-{suffix}" if suffix else "")
