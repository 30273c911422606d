"""Backups as the audit reads them: a log directory (or object-store prefix) with ``backup.json``.

The manifest is the backup's own statement of what it holds: every record below ``end_offset`` is
committed (so the audit knows the committed range without estimating it), and every other file of
the backup is listed with its size and SHA-256. The model here is the reader's side of the backup
format: it validates the fields the audit uses and ignores fields it does not know, so a newer
writer's manifest still reads. A backup is written manifest last, so a directory named like a
backup (``<YYYYMMDDTHHMMSSZ>-node-<id>``, maybe with a suffix: ``BACKUP_DIRECTORY_NAME``) without a
manifest is an incomplete backup.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pyarrow.fs as pafs
from pydantic import BaseModel, ConfigDict, Field

BACKUP_MANIFEST = "backup.json"
SUPPORTED_FORMAT = 1
_CHUNK = 8 << 20


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class SnapshotRef(_Lenient):
    end_offset: int = Field(ge=0)
    epoch: int = Field(ge=0)


class BackupVoter(_Lenient):
    id: int = Field(ge=0)
    directory_id: str


class BackupFile(_Lenient):
    path: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class BackupManifest(_Lenient):
    format_version: int
    cluster_id: str
    node_id: int
    directory_id: str
    created_at: str
    snapshot: SnapshotRef | None
    log_start_offset: int = Field(ge=0)
    end_offset: int = Field(ge=0)
    last_epoch: int = Field(ge=0)
    voters: list[BackupVoter]
    files: list[BackupFile]


def parse_manifest(data: bytes) -> BackupManifest:
    """The manifest, or ValueError with a one-line reason (pydantic's, or the version's)."""
    manifest = BackupManifest.model_validate_json(data)
    if manifest.format_version != SUPPORTED_FORMAT:
        raise ValueError(f"format_version {manifest.format_version} is not supported "
                         f"(this audit reads {SUPPORTED_FORMAT})")
    return manifest


@dataclass(frozen=True)
class FileCheck:
    """One file of a backup to check against its manifest entry (picklable: runs on executors)."""

    root: str  # the backup's URI
    path: str  # relative to it, as the manifest names it
    size: int
    sha256: str
    endpoint_url: str | None


def file_problem(check: FileCheck, filesystem: pafs.FileSystem, base: str) -> str | None:
    """Why the file does not match its manifest entry (missing, size, SHA-256), or None."""
    path = f"{base.rstrip('/')}/{check.path}"
    info = filesystem.get_file_info(path)
    if not info.is_file:
        return "listed in the manifest but missing"
    if info.size != check.size:
        return f"{info.size} bytes, the manifest says {check.size}"
    digest = hashlib.sha256()
    with filesystem.open_input_stream(path) as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    if digest.hexdigest() != check.sha256:
        return f"sha256 {digest.hexdigest()}, the manifest says {check.sha256}"
    return None
