"""``quorum-node info --log-dir DIR``: what a log directory holds, read-only, like Kafka's
``kafka-storage info`` and ``kafka-dump-log`` at a glance: its meta.properties, the log's range
(segments, from their batch headers), the snapshots, the election state, and which process holds
the directory's lock. Safe on a running node's directory: it takes no lock and writes nothing."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from quorum_node.raft.records import CorruptRecordError, read_batch_header
from quorum_node.storage import kafka_uuid
from quorum_node.storage.dir_lock import LOCK_FILE
from quorum_node.storage.errors import StorageError
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR
from quorum_node.storage.meta_properties import META_PROPERTIES, read_meta_properties
from quorum_node.storage.quorum_state import QUORUM_STATE

EXIT_REFUSED = 2
_SEGMENT = re.compile(r"([0-9]{20})\.log")
_CHECKPOINT = re.compile(r"([0-9]{20})-([0-9]{10})\.checkpoint")


def add_info_command(commands: argparse._SubParsersAction[Any]) -> None:
    info = commands.add_parser(
        "info", help="show what a log directory holds (read-only)",
        description=__doc__.split("\n\n", 1)[0].removeprefix("``quorum-node info --log-dir "
                                                             "DIR``: "))
    info.add_argument("--log-dir", type=Path, required=True, help="the log directory")
    info.add_argument("--json", action="store_true", help="print it as JSON")
    info.set_defaults(command=_cmd_info)


def describe_log_dir(log_dir: Path) -> dict[str, Any]:
    """The facts ``info`` prints. Raises StorageError for a directory that is not a log
    directory (no readable meta.properties)."""
    meta = read_meta_properties(log_dir / META_PROPERTIES)
    partition = log_dir / METADATA_PARTITION_DIR
    segments = sorted((int(m.group(1)), p) for p in _entries(partition)
                      if (m := _SEGMENT.fullmatch(p.name)))
    snapshots = sorted((int(m.group(1)), int(m.group(2)), p) for p in _entries(partition)
                       if (m := _CHECKPOINT.fullmatch(p.name)))
    end_offset, last_epoch, tail = _log_end(segments[-1][1]) if segments else (None, None, None)
    state_path = partition / QUORUM_STATE  # the node keeps it beside its log
    try:
        election: Any = json.loads(state_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        election = None
    except (OSError, ValueError) as error:
        election = f"unreadable: {error}"
    return {
        "log_dir": str(log_dir),
        "cluster_id": meta.cluster_id,
        "node_id": meta.node_id,
        "directory_id": kafka_uuid.to_kafka_string(meta.directory_id),
        "version": meta.version,
        "lock_holder_pid": _lock_holder(log_dir),
        "log_start_offset": segments[0][0] if segments else None,
        "log_end_offset": end_offset,
        "last_epoch": last_epoch,
        "tail": tail,
        "segments": [{"base_offset": base, "size": path.stat().st_size, "file": path.name}
                     for base, path in segments],
        "snapshots": [{"end_offset": end, "epoch": epoch, "size": path.stat().st_size,
                       "file": path.name} for end, epoch, path in snapshots],
        "quorum_state": election,
    }


def _entries(directory: Path) -> list[Path]:
    try:
        return list(directory.iterdir())
    except FileNotFoundError:
        return []


def _log_end(segment: Path) -> tuple[int | None, int | None, str | None]:
    """The last segment's end offset and last epoch, from its batch headers (CRCs checked), and
    what ends it when that is not a whole batch (a torn tail the node cuts when it opens)."""
    data = segment.read_bytes()
    match = _SEGMENT.fullmatch(segment.name)
    end: int | None = int(match.group(1)) if match else None
    epoch: int | None = None
    position = 0
    while position < len(data):
        try:
            header = read_batch_header(data, position)
        except CorruptRecordError as error:
            return end, epoch, f"{segment.name} at byte {position}: {error}"
        end, epoch, position = header.next_offset, header.epoch, header.end
    return end, epoch, None


def _lock_holder(log_dir: Path) -> int | None:
    """The pid recorded in the lock file, if that process still holds the lock. Read without
    locking: the holder is alive and holds it exactly when /proc shows the file locked."""
    lock_path = log_dir / LOCK_FILE
    try:
        pid = int(lock_path.read_text(encoding="ascii").strip())
        inode = lock_path.stat().st_ino
    except (OSError, ValueError):
        return None
    try:
        locks = Path("/proc/locks").read_text(encoding="ascii")
    except OSError:
        return None
    # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF": pid, then device:inode.
    for line in locks.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[4] == str(pid) \
                and fields[5].rsplit(":", 1)[-1] == str(inode):
            return pid
    return None


def _cmd_info(args: argparse.Namespace) -> int:
    try:
        facts = describe_log_dir(args.log_dir)
    except (StorageError, OSError) as error:
        print(f"quorum-node info: error: {error}", file=sys.stderr)
        return EXIT_REFUSED
    if args.json:
        print(json.dumps(facts))
        return 0
    holder = facts["lock_holder_pid"]
    lines = [
        f"log directory:   {facts['log_dir']}",
        f"cluster id:      {facts['cluster_id']}",
        f"node id:         {facts['node_id']}",
        f"directory id:    {facts['directory_id']}",
        f"in use by:       {'pid ' + str(holder) if holder is not None else 'no process'}",
        f"log:             offsets {facts['log_start_offset']} to {facts['log_end_offset']} "
        f"(exclusive), last epoch {facts['last_epoch']}, {len(facts['segments'])} segment(s)"
        if facts["segments"] else "log:             empty",
    ]
    if facts["tail"]:
        lines.append(f"torn tail:       {facts['tail']}")
    lines += [f"  segment {s['file']}: {s['size']} bytes" for s in facts["segments"]]
    lines.append(f"snapshots:       {len(facts['snapshots'])}")
    lines += [f"  snapshot {s['file']}: end offset {s['end_offset']}, epoch {s['epoch']}, "
              f"{s['size']} bytes" for s in facts["snapshots"]]
    lines.append(f"quorum-state:    {json.dumps(facts['quorum_state'])}")
    print("\n".join(lines))
    return 0
