"""``quorum-node export``: stream a log directory (of a running node too) as a tar archive, for the
audit pipeline (``quorum-audit``) to read once extracted, locally or in object storage::

    kubectl exec quorum-0 -- quorum-node export --live --log-dir /var/lib/quorum > quorum-0.tar
    quorum-node export --log-dir ./quorum-data/node-1 --output node-1.tar   # a stopped node

Only reads. It holds the directory's lock while it runs, so that no node starts on the directory
and no ``repair-log`` cuts it meanwhile, and the archive is the directory as it is; a directory in
use is refused, unless ``--live`` says that a running node's directory is meant. Then the lock is
not taken and the node appends to its last segment, rolls segments, and deletes old segments once a
snapshot covers them, while this runs: each file is copied up to the size it had when it was
opened (the last segment may end in a torn batch, which the audit reports as a warning), a file
deleted before it is opened is skipped, and snapshots are listed only after the segments are
copied, so a segment deleted meanwhile is covered by a snapshot in the archive.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import sys
import tarfile
from pathlib import Path
from typing import Any, BinaryIO

from quorum_node.storage.dir_lock import DirectoryInUseError, lock_directory
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR
from quorum_node.storage.meta_properties import META_PROPERTIES
from quorum_node.storage.quorum_state import QUORUM_STATE

_SEGMENT = re.compile(r"[0-9]{20}\.log")
_SNAPSHOT = re.compile(r"[0-9]{20}-[0-9]{10}\.checkpoint")
_CHUNK = 1 << 20


def add_export_command(commands: argparse._SubParsersAction[Any]) -> None:
    export = commands.add_parser(
        "export", help="write a log directory as a tar archive (for quorum-audit)",
        description="Write meta.properties, quorum-state, the segments and the snapshots of a "
        "log directory as a tar archive, under the directory's name. Takes the directory's "
        "lock: a directory in use is refused, unless --live.")
    export.add_argument("--log-dir", type=Path, required=True, help="the log directory")
    export.add_argument("--live", action="store_true",
                        help="export the directory of a running node: no lock is taken, and the "
                        "last segment may end in a torn batch")
    export.add_argument("--output", default="-",
                        help="the archive to write (default -: standard output)")
    export.add_argument("--name", help="the directory name inside the archive (default: the log "
                        "directory's own name)")
    export.set_defaults(command=_cmd_export)


def _cmd_export(args: argparse.Namespace) -> int:
    log_dir: Path = args.log_dir
    if not (log_dir / META_PROPERTIES).is_file():
        print(f"quorum-node export: error: {log_dir / META_PROPERTIES}: not found; not a log "
              "directory", file=sys.stderr)
        return 2
    name = args.name or log_dir.resolve().name
    try:
        lock = None if args.live else lock_directory(log_dir)
    except DirectoryInUseError as exc:
        print(f"quorum-node export: error: {exc} (--live exports a running node's directory)",
              file=sys.stderr)
        return 2
    try:
        if args.output == "-":
            export(log_dir, sys.stdout.buffer, name)
        else:
            try:
                output = open(args.output, "wb")  # noqa: SIM115 (closed below)
            except OSError as exc:
                print(f"quorum-node export: error: --output {args.output}: "
                      f"{exc.strerror or exc}", file=sys.stderr)
                return 2
            with output:
                export(log_dir, output, name)
    finally:
        if lock is not None:
            lock.release()
    return 0


def export(log_dir: Path, output: BinaryIO, name: str) -> list[str]:
    """Stream the archive to ``output`` (no seeking: a pipe will do); the member names."""
    partition = log_dir / METADATA_PARTITION_DIR
    written: list[str] = []
    with tarfile.open(fileobj=output, mode="w|") as archive:
        for path in (log_dir / META_PROPERTIES, partition / QUORUM_STATE):
            _add(archive, path, f"{name}/{path.relative_to(log_dir)}", written)
        for pattern in (_SEGMENT, _SNAPSHOT):  # snapshots listed after the segments are copied
            for entry in sorted(os.listdir(partition)) if partition.is_dir() else []:
                if pattern.fullmatch(entry):
                    _add(archive, partition / entry,
                         f"{name}/{METADATA_PARTITION_DIR}/{entry}", written)
    return written


def _add(archive: tarfile.TarFile, path: Path, member: str, written: list[str]) -> None:
    try:
        source = path.open("rb")
    except FileNotFoundError:
        return  # deleted since it was listed (see the module notes)
    with source:
        stat = os.fstat(source.fileno())
        info = tarfile.TarInfo(member)
        info.size, info.mtime, info.mode = stat.st_size, int(stat.st_mtime), 0o644
        archive.addfile(info, _Exactly(source, stat.st_size))
    written.append(member)


class _Exactly(io.RawIOBase):
    """``size`` bytes of a file that may shrink while it is read (a follower truncating its
    tail): what is missing reads as zeros, which the audit sees as a torn tail."""

    def __init__(self, source: BinaryIO, size: int) -> None:
        self._source = source
        self._left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        want = min(len(buffer), self._left, _CHUNK)
        data = self._source.read(want) if want else b""
        data += bytes(want - len(data))
        buffer[:want] = data
        self._left -= want
        return want
