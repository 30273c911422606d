"""``quorum-node backup`` and ``quorum-node restore``::

    quorum-node backup -b 127.0.0.1:9092 --to s3://backups/quorums
    quorum-node backup -b 127.0.0.1:9092 --to ./backups --name before-upgrade
    quorum-node restore --from s3://backups/quorums/CLUSTER/20260102T030405Z-node-2 \\
        --local ./restored          # then: quorum-node local --data-dir ./restored
    quorum-node restore --from ... --voters 1,2,3 --log-dir './restored/node-{id}'
    quorum-node restore --from ... --voters 1:DIRID1,2:DIRID2,3:DIRID3 --node-id 2 \\
        --log-dir /var/lib/quorum --skip-formatted     # one node's directory (an init container)

``backup`` asks a running node (leader or follower) for a consistent, committed-only backup
(``GET /v1/backup``, admin) and writes it under ``--to`` at
``<cluster_id>/<YYYYMMDDTHHMMSSZ>-node-<id>/`` (or ``--name``), ``backup.json`` last. ``restore``
builds new voters' log directories from a backup (``quorum_node.backup.restore``). Object
storage (``s3://``) needs the ``s3`` extra; credentials come from the usual AWS variables and
files, ``--endpoint-url`` (or ``AWS_ENDPOINT_URL``) names an S3-compatible server. Errors are one
line on stderr, exit code 1 (2 for bad usage). A restore ended by SIGTERM removes what it was
staging and building first (exit code 143); one killed outright leaves them to the next restore.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import signal
import sys
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from quorum_node.backup.manifest import BackupError
from quorum_node.backup.restore import RestoredNode, new_voter_set, restore
from quorum_node.backup.store import S3Options, open_store
from quorum_node.backup.writer import DEFAULT_TIMEOUT_S, take_backup
from quorum_node.cli.common import positive_float
from quorum_node.cli.credentials import add_credential_options, credentials_from_args
from quorum_node.cli.local_layout import restore_local
from quorum_node.cli.restore_drill import add_restore_drill_command
from quorum_node.client import parse_bootstrap
from quorum_node.security.client_credentials import CredentialsError
from quorum_node.storage.kafka_uuid import parse_uuid, to_kafka_string
from quorum_node.storage.meta_properties import META_PROPERTIES, random_cluster_id

EXIT_FAILED = 1
EXIT_USAGE = 2
DEFAULT_LOCAL_NODES = 3  # as quorum-node local's --nodes


def add_backup_commands(commands: argparse._SubParsersAction[Any]) -> None:
    backup = commands.add_parser(
        "backup", help="back a running node up (to a directory or s3://bucket/prefix)",
        description="Take a consistent backup of a running node: its latest snapshot and its "
        "committed log after it, up to its high watermark, with a manifest (backup.json), "
        "written under --to as <cluster_id>/<YYYYMMDDTHHMMSSZ>-node-<id>/.")
    backup.add_argument("-b", "--bootstrap-server", "--bootstrap-controller", dest="server",
                        required=True, metavar="HOST:PORT",
                        help="the node's client listener (http:// or https:// optional)")
    backup.add_argument("--to", required=True, metavar="LOCATION",
                        help="a directory or s3://bucket/prefix")
    backup.add_argument("--name", help="the backup's place under --to (default "
                        "<cluster_id>/<YYYYMMDDTHHMMSSZ>-node-<id>)")
    backup.add_argument("--timeout", dest="timeout_s", type=positive_float,
                        default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help=f"give up when the node is silent this long (default "
                        f"{DEFAULT_TIMEOUT_S:g})")
    _add_endpoint_option(backup)
    add_credential_options(backup)
    backup.set_defaults(command=_cmd_backup)

    restore_ = commands.add_parser(
        "restore", help="build a new quorum's log directories from a backup",
        description="Build the log directories of a new quorum from a backup (like etcdutl "
        "snapshot restore): new directory ids, the voter set given by --voters, the backup's "
        "committed records and key-value state. The backup is checked whole (checksums, "
        "batches) before anything is written. The cluster id is the backup's unless "
        "--cluster-id or --new-cluster-id.")
    restore_.add_argument("--from", dest="source", required=True, metavar="LOCATION",
                          help="the backup: a directory or s3://bucket/prefix/.../NAME")
    where = restore_.add_mutually_exclusive_group(required=True)
    where.add_argument("--local", type=Path, metavar="DATA_DIR",
                       help="build the data directory of a quorum of --nodes voters (ids 1..N) "
                       "that `quorum-node local --data-dir DATA_DIR` starts as it is")
    where.add_argument("--log-dir", metavar="PATH",
                       help="where each node's directory goes; {id} stands for its node id")
    restore_.add_argument("--nodes", type=int, metavar="N",
                          help=f"with --local: how many voters (default {DEFAULT_LOCAL_NODES})")
    restore_.add_argument("--voters", metavar="ID[:DIRECTORY_ID],...",
                          help="with --log-dir: the new voter set; directory ids are chosen at "
                          "random where none is given (all are needed with --node-id)")
    restore_.add_argument("--node-id", type=int,
                          help="build this node's directory only (default: every voter's)")
    ids = restore_.add_mutually_exclusive_group()
    ids.add_argument("--cluster-id", help="a new cluster id for the restored quorum")
    ids.add_argument("--new-cluster-id", action="store_true",
                     help="a new random cluster id for the restored quorum")
    restore_.add_argument("--skip-formatted", action="store_true",
                          help="do nothing (exit 0) when the directory is formatted already: a "
                          "restored node restarting")
    _add_endpoint_option(restore_)
    restore_.set_defaults(command=_cmd_restore)
    add_restore_drill_command(commands)


def _add_endpoint_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint-url", help="an S3-compatible server (default: "
                        "$AWS_ENDPOINT_URL, else AWS)")


def _fail(command: str, message: str, code: int = EXIT_FAILED) -> int:
    print(f"quorum-node {command}: error: {message}", file=sys.stderr)
    return code


def _cmd_backup(args: argparse.Namespace) -> int:
    try:
        credentials = credentials_from_args(args)
        server = parse_bootstrap(args.server,
                                 "https" if credentials.uses_tls else "http")
    except (CredentialsError, ValueError) as error:
        return _fail("backup", str(error), EXIT_USAGE)
    if len(server) != 1:
        return _fail("backup", "-b names one node", EXIT_USAGE)
    try:
        target = open_store(args.to, S3Options(endpoint_url=args.endpoint_url))
        taken = take_backup(server[0], target, credentials, name=args.name,
                            timeout_s=args.timeout_s)
    except BackupError as error:
        return _fail("backup", str(error))
    manifest = taken.manifest
    snapshot = "no snapshot" if manifest.snapshot is None else \
        f"snapshot {manifest.snapshot.end_offset}-{manifest.snapshot.epoch}"
    print(f"{taken.uri}: node {manifest.node_id} of cluster {manifest.cluster_id}, offsets "
          f"{manifest.log_start_offset}-{manifest.end_offset} (epoch {manifest.last_epoch}, "
          f"{snapshot}), {len(manifest.files)} files, {taken.bytes} bytes in "
          f"{taken.seconds:.2f} s")
    return 0


def _cmd_restore(args: argparse.Namespace) -> int:
    if args.local is not None:
        return _restore_local(args)
    template: str = args.log_dir
    if args.nodes is not None:
        return _fail("restore", "--nodes goes with --local; --voters names the voters of "
                     "--log-dir", EXIT_USAGE)
    if args.voters is None:
        return _fail("restore", "--log-dir needs --voters", EXIT_USAGE)
    if args.node_id is None and "{id}" not in template:
        return _fail("restore", "--log-dir needs {id} when every voter's directory is built "
                     "(or give --node-id)", EXIT_USAGE)
    try:
        voters = _parse_voters(args.voters)
    except ValueError as error:
        return _fail("restore", f"--voters: {error}", EXIT_USAGE)

    def log_dir_of(node_id: int) -> Path:
        return Path(template.replace("{id}", str(node_id)))

    if args.skip_formatted and args.node_id is not None \
            and (log_dir_of(args.node_id) / META_PROPERTIES).exists():
        print(f"{log_dir_of(args.node_id)}: formatted already; nothing restored")
        return 0
    cluster_id = random_cluster_id() if args.new_cluster_id else args.cluster_id
    try:
        keys = new_voter_set(voters, generate=args.node_id is None)
        source = open_store(args.source, S3Options(endpoint_url=args.endpoint_url))
        with _terminate_unwinds():
            restored = restore(source, keys, log_dir_of,
                               node_ids=None if args.node_id is None else [args.node_id],
                               cluster_id=cluster_id, on_leftover=_report_leftover)
    except BackupError as error:
        return _fail("restore", str(error))
    except _Terminated:
        return _terminated()
    voter_list = ",".join(f"{key.id}:{to_kafka_string(key.directory_id)}" for key in keys
                          if key.directory_id is not None)
    _print_restored(restored)
    if args.node_id is None:
        print("start each node with `quorum-node run --config FILE`, FILE setting its node.id "
              "and log.dir as above, cluster.id, controller.quorum.voters naming these ids at "
              "the nodes' new addresses, and its listeners (docs/backup.md, \"Starting the "
              "restored nodes\"); or restore with --local DATA_DIR instead, which "
              "`quorum-node local` starts as it is")
    print(f"voters: {voter_list}" + (f"; cluster id {cluster_id}" if cluster_id else ""))
    return 0


def _restore_local(args: argparse.Namespace) -> int:
    """``restore --local DATA_DIR``: a local quorum's data directory, and the command that
    starts it."""
    for flag, given in (("--voters", args.voters), ("--node-id", args.node_id),
                        ("--skip-formatted", args.skip_formatted)):
        if given not in (None, False):
            return _fail("restore", f"{flag} goes with --log-dir; --local restores voters "
                         f"1..N (--nodes N)", EXIT_USAGE)
    nodes = DEFAULT_LOCAL_NODES if args.nodes is None else args.nodes
    new_id = random_cluster_id() if args.new_cluster_id else args.cluster_id
    try:
        source = open_store(args.source, S3Options(endpoint_url=args.endpoint_url))
        with _terminate_unwinds():
            cluster_id, restored = restore_local(source, args.local, nodes, cluster_id=new_id,
                                                 on_leftover=_report_leftover)
    except BackupError as error:
        return _fail("restore", str(error))
    except _Terminated:
        return _terminated()
    _print_restored(restored)
    print(f"cluster id {cluster_id}; start the restored quorum with:")
    print(f"  {shlex.join(local_command(args.local, nodes))}")
    print("(add --base-port PORT if another quorum uses its ports; docs/backup.md)")
    return 0


def local_command(data_dir: Path, nodes: int) -> list[str]:
    """The command that starts the local quorum ``restore --local`` built."""
    command = ["quorum-node", "local", "--data-dir", str(data_dir)]
    return command if nodes == DEFAULT_LOCAL_NODES else [*command, "--nodes", str(nodes)]


def _print_restored(restored: Sequence[RestoredNode]) -> None:
    for node in restored:
        print(f"node {node.node_id}: {node.log_dir} (directory id "
              f"{to_kafka_string(node.directory_id)})")


def _terminated() -> int:
    return _fail("restore", "terminated (SIGTERM); the directories it was staging and "
                 "building were removed", 128 + signal.SIGTERM)


class _Terminated(BaseException):
    """SIGTERM, raised wherever the restore is: it unwinds as Ctrl-C does, through the clean-up
    of what it staged and built (not an Exception: nothing on the way may swallow it)."""


@contextlib.contextmanager
def _terminate_unwinds() -> Iterator[None]:
    """Turn SIGTERM into ``_Terminated`` while the block runs; a second one is ignored, so that
    the clean-up the first started can finish."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread; the default action stays
        return

    def terminate(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _report_leftover(path: Path) -> None:
    print(f"{path}: removed, left by a restore that was killed")


def _parse_voters(text: str) -> list[tuple[int, uuid.UUID | None]]:
    voters: list[tuple[int, uuid.UUID | None]] = []
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        node, _, directory = entry.partition(":")
        if not node.isascii() or not node.isdigit():
            raise ValueError(f"{entry!r}: expected ID or ID:DIRECTORY_ID")
        voters.append((int(node), parse_uuid(directory) if directory else None))
    if not voters:
        raise ValueError("no voter given")
    return voters
