"""Find replicas' log directories under local paths or object-storage URIs, and list their files.

A log directory is recognised by its ``meta.properties``, at any depth, so a path may be one
node's directory, a quorum's data directory (``quorum-node local``), or a bucket prefix holding
the backups of a whole fleet. Files are reached through ``pyarrow.fs`` (local disk, S3, GCS,
HDFS, ...), which the Spark workers have anyway, so the same code runs on a laptop and on a cluster
reading a bucket. An S3-compatible server other than AWS is named by an endpoint URL (the
``--s3-endpoint-url`` option, else ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` on the driver),
which travels with each file to the executors; credentials come from where the AWS SDK looks for
them on each machine (environment variables, ``~/.aws``, instance or pod roles).

A directory with a ``backup.json`` is a backup (see ``backup``): its manifest is read here. A
directory named like a backup without one is an incomplete backup: listed, not audited.

The small files are parsed by the node's own readers (``read_meta_properties``,
``QuorumStateStore``), which take local paths: remote ones are staged in a temporary directory.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from quorum_audit.backup import BACKUP_MANIFEST, BackupManifest, parse_manifest
from quorum_node.backup.manifest import BACKUP_DIRECTORY_NAME
from quorum_node.raft.state import ElectionState
from quorum_node.storage import kafka_uuid
from quorum_node.storage.errors import StorageError
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR
from quorum_node.storage.meta_properties import META_PROPERTIES, read_meta_properties
from quorum_node.storage.quorum_state import QUORUM_STATE, QuorumStateStore

_SEGMENT = re.compile(r"([0-9]{20})\.log")
_SNAPSHOT = re.compile(r"([0-9]{20})-([0-9]{10})\.checkpoint")
# Hadoop's names for S3 mean the same bucket to pyarrow's S3 filesystem.
_SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3"}


@dataclass(frozen=True)
class ReplicaFile:
    uri: str  # what resolve() opens
    kind: str  # "log" or "snapshot"
    first_offset: int  # a segment's base offset; 0 for a snapshot
    size: int
    snapshot_end_offset: int | None = None
    snapshot_epoch: int | None = None


@dataclass(frozen=True)
class Replica:
    """One log directory: its identity, its election state and its files, oldest first."""

    root: str
    cluster_id: str
    node_id: int
    directory_id: str
    files: tuple[ReplicaFile, ...]
    quorum_state: ElectionState | None = None
    problem: str | None = None  # why the quorum-state could not be read
    manifest: BackupManifest | None = None  # a backup's backup.json
    manifest_problem: str | None = None  # why its backup.json could not be read
    # A backup's files other than its manifest, relative to its root (to find unlisted ones).
    backup_files: tuple[str, ...] = ()

    @property
    def is_backup(self) -> bool:
        return self.manifest is not None or self.manifest_problem is not None


@dataclass
class Discovery:
    replicas: list[Replica] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # directories that could not be read
    incomplete_backups: list[str] = field(default_factory=list)  # backup roots without backup.json
    endpoint_url: str | None = None  # the S3 endpoint the files were found through


def s3_endpoint(explicit: str | None = None) -> str | None:
    """The S3 endpoint URL to use: the one given, else the AWS SDK's environment variables."""
    return explicit or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def resolve(uri: str, endpoint_url: str | None = None) -> tuple[pafs.FileSystem, str]:
    """The filesystem and the path within it of a local path or a URI (s3://, gs://, hdfs://,
    file://; s3a:// and s3n:// are read as s3://). ``endpoint_url``: an S3-compatible server's."""
    if "://" not in uri:
        return pafs.LocalFileSystem(), str(Path(uri).absolute())
    scheme, rest = uri.split("://", 1)
    scheme = _SCHEME_ALIASES.get(scheme, scheme)
    if scheme == "s3" and endpoint_url:
        # Not from_uri: it would look the bucket's region up at AWS. Any region does for a
        # server of one's own; the usual variables still choose one.
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        filesystem = pafs.S3FileSystem(endpoint_override=endpoint_url,
                                       region=region or "us-east-1")
        return filesystem, rest.rstrip("/") or rest
    filesystem, path = pafs.FileSystem.from_uri(f"{scheme}://{rest}")
    return filesystem, path


def _join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *parts])


def read_file(uri: str, endpoint_url: str | None = None) -> pa.Buffer:
    """A whole file: memory-mapped when local (no copy, pages read on demand), else downloaded."""
    filesystem, path = resolve(uri, endpoint_url)
    if isinstance(filesystem, pafs.LocalFileSystem):
        with pa.memory_map(path) as mapped:
            return mapped.read_buffer()
    with filesystem.open_input_file(path) as remote:
        return remote.read_buffer()


def discover(uris: Iterable[str], endpoint_url: str | None = None) -> Discovery:
    """The replicas under ``uris``; ``endpoint_url`` defaults to ``s3_endpoint()``'s."""
    found = Discovery(endpoint_url=s3_endpoint(endpoint_url))
    seen: set[str] = set()
    for uri in uris:
        roots, incomplete = _log_directories(uri, found.endpoint_url)
        found.incomplete_backups += [root for root in incomplete if root not in seen]
        seen.update(incomplete)
        for root in roots:
            if root in seen:
                continue
            seen.add(root)
            try:
                found.replicas.append(_replica(root, found.endpoint_url))
            except (StorageError, OSError) as error:
                found.problems.append(f"{root}: {error}")
    found.replicas.sort(key=lambda r: (r.cluster_id, r.node_id, r.directory_id))
    return found


def _log_directories(uri: str, endpoint_url: str | None) -> tuple[list[str], list[str]]:
    """The log directories under ``uri``, and the incomplete backups (named like a backup, no
    manifest) which are left out of them."""
    filesystem, base = resolve(uri, endpoint_url)
    # What the filesystem's paths lack to be URIs again: "s3://", "hdfs://namenode:8020", ...
    trimmed = uri.rstrip("/")
    prefix = trimmed[: len(trimmed) - len(base.rstrip("/"))] if "://" in uri else ""
    info = filesystem.get_file_info(base)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"{uri}: no such file or directory")
    if info.type == pafs.FileType.File:
        base = base.rsplit("/", 1)[0]  # a meta.properties (or any file) names its directory
    listing = filesystem.get_file_info(pafs.FileSelector(base, recursive=True))
    files = [entry.path for entry in listing if entry.is_file]
    if filesystem.get_file_info(_join(base, META_PROPERTIES)).is_file:
        files.append(_join(base, META_PROPERTIES))
    roots = {path.rsplit("/", 1)[0] for path in files if path.endswith("/" + META_PROPERTIES)}
    # A backup's root is named like one; its files may be written in any order, the manifest last.
    backups: set[str] = set()
    for path in files:
        parts = path.split("/")
        backups.update("/".join(parts[:i + 1]) for i, part in enumerate(parts[:-1])
                       if BACKUP_DIRECTORY_NAME.fullmatch(part))
    complete = {path.rsplit("/", 1)[0] for path in files if path.endswith("/" + BACKUP_MANIFEST)}
    incomplete = backups - complete
    return (sorted(prefix + root for root in roots - incomplete),
            sorted(prefix + root for root in incomplete))


def _replica(root: str, endpoint_url: str | None) -> Replica:
    filesystem, base = resolve(root, endpoint_url)
    partition = _join(base, METADATA_PARTITION_DIR)
    with tempfile.TemporaryDirectory(prefix="quorum-audit-") as staging:
        local = Path(staging)
        _stage(filesystem, _join(base, META_PROPERTIES), local / META_PROPERTIES)
        meta = read_meta_properties(local / META_PROPERTIES)
        state: ElectionState | None = None
        problem = None
        if _stage(filesystem, _join(partition, QUORUM_STATE), local / QUORUM_STATE):
            try:
                state = QuorumStateStore(local).read()
            except StorageError as error:
                problem = str(error).replace(str(local / QUORUM_STATE), QUORUM_STATE)
    manifest, manifest_problem, backup_files = _backup(filesystem, base)
    return Replica(root=root, cluster_id=meta.cluster_id, node_id=meta.node_id,
                   directory_id=kafka_uuid.to_kafka_string(meta.directory_id),
                   files=_files(filesystem, root, partition), quorum_state=state,
                   problem=problem, manifest=manifest, manifest_problem=manifest_problem,
                   backup_files=backup_files)


def _backup(filesystem: pafs.FileSystem, base: str
            ) -> tuple[BackupManifest | None, str | None, tuple[str, ...]]:
    """A backup's manifest (or why it cannot be read) and its other files; nothing for a plain
    log directory."""
    path = _join(base, BACKUP_MANIFEST)
    if not filesystem.get_file_info(path).is_file:
        return None, None, ()
    with filesystem.open_input_stream(path) as stream:
        data = stream.readall()
    listing = filesystem.get_file_info(pafs.FileSelector(base, recursive=True))
    start = len(base.rstrip("/")) + 1
    files = tuple(sorted(entry.path[start:] for entry in listing
                         if entry.is_file and entry.base_name != BACKUP_MANIFEST))
    try:
        return parse_manifest(data), None, files
    except ValueError as error:  # pydantic's ValidationError is one
        return None, f"{BACKUP_MANIFEST}: {' '.join(str(error).split())}", files


def _stage(filesystem: pafs.FileSystem, path: str, local: Path) -> bool:
    """Copy one small file to ``local``; False if it does not exist."""
    if not filesystem.get_file_info(path).is_file:
        return False
    with filesystem.open_input_stream(path) as stream:
        local.write_bytes(stream.readall())
    return True


def _files(filesystem: pafs.FileSystem, root: str, partition: str) -> tuple[ReplicaFile, ...]:
    if filesystem.get_file_info(partition).type != pafs.FileType.Directory:
        return ()
    files: list[ReplicaFile] = []
    for entry in filesystem.get_file_info(pafs.FileSelector(partition)):
        uri = _join(root, METADATA_PARTITION_DIR, entry.base_name)
        size = entry.size or 0
        if segment := _SEGMENT.fullmatch(entry.base_name):
            files.append(ReplicaFile(uri, "log", int(segment.group(1)), size))
        elif snapshot := _SNAPSHOT.fullmatch(entry.base_name):
            end, epoch = int(snapshot.group(1)), int(snapshot.group(2))
            files.append(ReplicaFile(uri, "snapshot", 0, size, end, epoch))
    files.sort(key=lambda f: (f.kind, f.snapshot_end_offset or 0, f.first_offset))
    return tuple(files)
