"""``quorum-node``: format a log directory, run a node, run a whole local quorum, or repair a
damaged log.

Errors are one line on stderr. Exit codes: 0 done, 1 a node failed while running (repair-log:
damage reported and left as it is), 2 refused (bad usage, bad configuration, a port in use, or a
log directory that cannot be used as it is, or is in use by another process), 130 interrupted.
The options follow the conventions of every ``quorum-*`` tool (``quorum_node.cli.common``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from quorum_node.cli.backup import add_backup_commands
from quorum_node.cli.common import (
    CliParser,
    add_logging_options,
    add_standard_options,
    configure_logging,
    run_cli,
)
from quorum_node.cli.export import add_export_command
from quorum_node.cli.info import add_info_command
from quorum_node.cli.local_control import ControlError, send_request
from quorum_node.cli.local_quorum import (
    DEFAULT_BASE_PORT,
    DEFAULT_DATA_DIR,
    DEFAULT_HOST,
    LocalClusterError,
    check_control_target,
    check_ports_free,
    lock_local_data_dir,
    prepare_local_cluster,
    run_local_quorum,
)
from quorum_node.node.config import (
    CONFIG_KEYS,
    ENV_PREFIX,
    KEYS_BY_NAME,
    ConfigError,
    ConfigKey,
    Setting,
    load_config,
    read_properties,
    settings_from_environ,
)
from quorum_node.raft.types import RaftInvariantError
from quorum_node.storage import kafka_uuid
from quorum_node.storage.dir_lock import lock_directory
from quorum_node.storage.errors import StorageError
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR
from quorum_node.storage.meta_properties import (
    META_PROPERTIES,
    format_log_dir,
    random_cluster_id,
    read_meta_properties,
    validate_cluster_id,
    validate_node_id,
)
from quorum_node.storage.segment_log import DroppedBytes, LogDamage, SegmentLog

PROG = "quorum-node"
EXIT_FAILED = 1
EXIT_REFUSED = 2



def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(PROG, _build_parser(), argv, lambda args: args.command(args))


def _build_parser() -> CliParser:
    parser = CliParser(prog=PROG, description="A KRaft-style Raft quorum node.")
    add_standard_options(parser)
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")

    fmt = commands.add_parser(
        "format", help="format a log directory (prints its new directory id)",
        description="Write meta.properties into a log directory, with a new directory id, and "
        "print that id.",
    )
    fmt.add_argument("--config", "-c", type=Path, metavar="FILE",
                     help="a node's properties file: log.dir, node.id and cluster.id are read "
                     "from it unless given as flags (Kafka's format -c)")
    fmt.add_argument("--log-dir", help="the log directory")
    fmt.add_argument("--node-id", type=int, help="the node id it belongs to")
    fmt.add_argument("--cluster-id", help="the cluster id (random-cluster-id)")
    fmt.add_argument(
        "--ignore-formatted", action="store_true",
        help="accept a directory already formatted for this cluster and node (left unchanged)",
    )
    fmt.set_defaults(command=_cmd_format)

    rid = commands.add_parser(
        "random-cluster-id", help="print a new random cluster id",
        description="Print a new cluster id (22 base64url characters, as Kafka's).",
    )
    rid.set_defaults(command=_cmd_random_cluster_id)

    run = commands.add_parser(
        "run", help="run a node",
        description="Run one node until SIGTERM or SIGINT. Every key can come from the config "
        f"file, a flag or an environment variable ({ENV_PREFIX}<KEY>); flags win over the "
        "environment, which wins over the file.",
    )
    run.add_argument("--config", type=Path, metavar="FILE", help="a Kafka-style properties file")
    # Set by `local` for its children (Linux only): stop with SIGTERM when that process is gone.
    run.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    add_logging_options(run)
    _add_key_flags(run, CONFIG_KEYS)
    run.set_defaults(command=_cmd_run)

    repair = commands.add_parser(
        "repair-log", help="cut a damaged log back to its last valid batch (offline)",
        description="For a node that refuses to start because its log is damaged in the middle "
        "(\"refusing to open the log\"): report what cutting the log back to its last valid "
        "batch would drop, and with --yes do it (the damaged segment is truncated there and "
        "later segments are deleted). The node must be stopped; the directory's lock is held "
        "meanwhile. Never run by the node itself. The records dropped may have been "
        "acknowledged: the node rejoins as a follower and its leader sends them again, which "
        "is safe while the quorum's other voters hold them. Repair one voter at a time and let "
        "it catch up before touching another; when a majority of the voters is damaged, "
        "restore from a backup instead. Exit codes: 0 nothing to repair or repaired, 1 damage "
        "reported and left as it is (no --yes), 2 refused.",
    )
    repair.add_argument("--log-dir", type=Path, required=True, help="the node's log directory")
    repair.add_argument("--yes", action="store_true",
                        help="do it: without this flag nothing is changed")
    repair.set_defaults(command=_cmd_repair_log)

    local = commands.add_parser(
        "local", help="run a whole quorum on this machine",
        description="Start a quorum of N nodes on loopback, formatting their directories on first "
        "use, and stop them all on Ctrl-C; a node that dies is reported and the others go on. "
        "Node i serves clients on base-port + i - 1 and its "
        "peers on base-port + N + i - 1 (a controller listener of its own, where every peer RPC "
        "must carry the secret generated once in DATA_DIR/peer-secret); its config, log "
        "directory and output are DATA_DIR/node-i.properties, DATA_DIR/node-i and "
        "DATA_DIR/node-i.log. The timing flags below apply to every node.",
    )
    local.add_argument("--nodes", type=int, default=3, help="how many voters (default 3)")
    local.add_argument(
        "--data-dir", type=Path, default=DEFAULT_DATA_DIR,
        help=f"where the nodes keep their data (default ./{DEFAULT_DATA_DIR})",
    )
    local.add_argument(
        "--base-port", type=int, default=DEFAULT_BASE_PORT,
        help=f"client port of node 1 (default {DEFAULT_BASE_PORT}); the controller ports follow "
        "the client ports",
    )
    local.add_argument("--host", default=DEFAULT_HOST, help=f"address (default {DEFAULT_HOST})")
    add_logging_options(local)  # the nodes'
    control = local.add_argument_group(
        "controlling a running local quorum (from another terminal, same --data-dir)")
    act = control.add_mutually_exclusive_group()
    act.add_argument("--restart", type=int, metavar="N", dest="restart_node",
                     help="restart node N (start it, if it died or was stopped)")
    act.add_argument("--stop-node", type=int, metavar="N",
                     help="stop node N gracefully; the others go on")
    act.add_argument("--replace", type=int, metavar="N", dest="replace_node",
                     help="give node N a new, empty disk (the old log directory is kept aside "
                     "as node-N.replaced-TIME), start it, and print the add-voter and "
                     "remove-voter commands that finish the replacement")
    _add_key_flags(local, [key for key in CONFIG_KEYS if key.shared])
    local.set_defaults(command=_cmd_local)
    add_export_command(commands)
    add_info_command(commands)
    add_backup_commands(commands)
    return parser


def _add_key_flags(parser: argparse.ArgumentParser, keys: Sequence[ConfigKey]) -> None:
    group = parser.add_argument_group("configuration keys")
    for key in keys:
        default = "required" if key.default is None else f"default {key.default}"
        # Values stay strings: load_config validates them and names the flag in its errors. A
        # boolean flag alone means true (--format-if-empty), or takes a value like the others.
        boolean = key.default == "false"
        group.add_argument(
            key.flag, dest=key.name, default=argparse.SUPPRESS,
            metavar="true|false" if boolean else "VALUE",
            nargs="?" if boolean else None, const="true" if boolean else None,
            help=f"{key.help} [{key.name}, {key.env_var}; {default}]",
        )


def _key_flags(args: argparse.Namespace) -> dict[str, str]:
    return {name: value for name, value in vars(args).items() if name in KEYS_BY_NAME}


def _error(prog: str, message: object) -> None:
    print(f"{prog}: error: {message}", file=sys.stderr)


# -- format, random-cluster-id, run ----------------------------------------------------------------


MAX_NODE_ID = 2**31 - 1  # Kafka's node.id is an int32
_CLUSTER_ID_SHAPE = re.compile(r"[A-Za-z0-9_-]{22}")  # 16 bytes in base64url


def check_format_arguments(log_dir: str, node_id: int, cluster_id: str) -> None:
    """What Kafka's ``kafka-storage format`` checks, in one-line ValueErrors, before anything is
    written: a cluster id is a uuid in Kafka's 22-character form, a node id an int32 >= 0, a log
    directory a named path that is a directory or does not exist yet."""
    # Kafka decodes it leniently (its documented example, MkU3OEVBNTcwNTJENDM2Qk, has stray
    # low bits in its last character), so only the shape is checked.
    if not _CLUSTER_ID_SHAPE.fullmatch(cluster_id):
        raise ValueError(f"--cluster-id {cluster_id!r} is not a cluster id: expected a uuid in "
                         f"Kafka's 22-character base64url form ({PROG} random-cluster-id)")
    if not 0 <= node_id <= MAX_NODE_ID:
        raise ValueError(f"--node-id {node_id} is out of range: expected 0 to {MAX_NODE_ID}")
    if not log_dir.strip():
        raise ValueError("--log-dir is empty: name the log directory")
    path = Path(log_dir)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--log-dir {log_dir}: exists and is not a directory")


def _cmd_format(args: argparse.Namespace) -> int:
    prog = f"{PROG} format"
    if args.config is not None:
        try:
            settings = read_properties(args.config)
        except ConfigError as exc:
            _error(prog, exc)
            return EXIT_REFUSED
        # Kafka's `format -c server.properties`: the flags win over the file.
        for name, key in (("log_dir", "log.dir"), ("node_id", "node.id"),
                          ("cluster_id", "cluster.id")):
            if getattr(args, name) is None and key in settings:
                setattr(args, name, settings[key].value)
    missing = [flag for flag, name in (("--log-dir", "log_dir"), ("--node-id", "node_id"),
                                       ("--cluster-id", "cluster_id"))
               if getattr(args, name) is None]
    if missing:
        _error(prog, f"missing {', '.join(missing)} (flags, or log.dir, node.id and cluster.id "
                     "in --config)")
        return EXIT_REFUSED
    if isinstance(args.node_id, str):  # from the file
        try:
            args.node_id = int(args.node_id)
        except ValueError:
            _error(prog, f"node.id {args.node_id!r} in {args.config} is not an integer")
            return EXIT_REFUSED
    try:
        check_format_arguments(str(args.log_dir), args.node_id, args.cluster_id)
    except ValueError as exc:
        _error(prog, exc)
        return EXIT_REFUSED
    log_dir = Path(args.log_dir)
    already = (log_dir / META_PROPERTIES).exists()
    if already and not args.ignore_formatted:
        _error(prog, f"{log_dir / META_PROPERTIES} already exists; refusing to overwrite it "
                     "(--ignore-formatted keeps a directory formatted for this cluster and node)")
        return EXIT_REFUSED
    try:
        validate_cluster_id(args.cluster_id)  # before the lock creates the directory
        validate_node_id(args.node_id)
        with lock_directory(log_dir, create=True):
            meta = format_log_dir(log_dir, args.cluster_id, args.node_id, args.ignore_formatted)
    except (StorageError, ValueError, OSError) as exc:
        _error(prog, exc)
        return EXIT_REFUSED
    if already:
        print(f"{log_dir} is already formatted for node {meta.node_id}; left unchanged",
              file=sys.stderr)
    print(kafka_uuid.to_kafka_string(meta.directory_id))
    return 0


def _cmd_random_cluster_id(args: argparse.Namespace) -> int:
    print(random_cluster_id())
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    prog = f"{PROG} run"
    try:
        config = load_config(args.config, _key_flags(args), os.environ)
    except ConfigError as exc:
        _error(prog, exc)
        return EXIT_REFUSED
    if args.parent_pid is not None and not _stop_with_parent(args.parent_pid):
        _error(prog, f"parent process {args.parent_pid} is gone; not starting")
        return EXIT_FAILED
    configure_logging(args.log_level, args.log_format)
    # Imported here: the runtime pulls in aiohttp and the whole node, which the other commands
    # (and a refused configuration) do not need.
    from quorum_node.node.main import run_node  # noqa: PLC0415

    try:
        return run_node(config)
    except (StorageError, ConfigError) as exc:
        _error(prog, exc)
        return EXIT_REFUSED
    except RaftInvariantError as exc:  # the configuration contradicts the log
        _error(prog, f"refusing to start: {exc}")
        return EXIT_REFUSED
    except OSError as exc:  # a listener's port in use, an address not of this machine
        _error(prog, f"cannot start: {exc}")
        return EXIT_REFUSED


def _cmd_repair_log(args: argparse.Namespace) -> int:
    prog = f"{PROG} repair-log"
    log_dir: Path = args.log_dir
    partition = log_dir / METADATA_PARTITION_DIR
    try:
        read_meta_properties(log_dir / META_PROPERTIES)  # a log directory, before the lock file
        with lock_directory(log_dir):
            damage = SegmentLog.find_damage(partition)
            if damage is None or damage.torn_tail or not args.yes:
                _report_damage(damage, done=False)
                return 0 if damage is None or damage.torn_tail else EXIT_FAILED
            repaired = SegmentLog.repair(partition)
    except (StorageError, OSError) as exc:
        _error(prog, exc)
        return EXIT_REFUSED
    _report_damage(repaired, done=True)
    return 0


def _report_damage(damage: LogDamage | None, *, done: bool) -> None:
    if damage is None:
        print("nothing to repair: every segment is whole")
        return
    if damage.torn_tail:
        print(f"nothing to repair: {damage.path} ends in a torn batch at byte {damage.position} "
              f"({damage.reason}), which the node cuts by itself when it starts")
        return
    print(f"damaged: {damage.path} at byte {damage.position}: {damage.reason}")
    print(f"the log {'now ends' if done else 'would end'} at offset {damage.valid_end_offset}, "
          "after its last valid batch")
    for part in damage.dropped:
        if part.deleted:
            action = "deleted" if done else "would delete"
        else:
            action = f"{'truncated' if done else 'would truncate'} at byte {part.position}"
        print(f"  {action}: {part.path}: {part.size} bytes, {_batches(part)}")
    dropped_end = damage.dropped_end_offset
    print(f"{'dropped' if done else 'would drop'} {damage.dropped_bytes} bytes in all, offsets "
          f"from {damage.valid_end_offset} on"
          + (f" (the last recognisable batch ends at offset {dropped_end})"
             if dropped_end is not None else ""))
    if done:
        print("start the node: it rejoins as a follower and fetches the records it lacks from "
              "the leader")
    else:
        print(f"nothing was changed; rerun with --yes to repair (first read {PROG} repair-log "
              "--help: the records dropped may have been acknowledged)")


def _batches(part: DroppedBytes) -> str:
    if not part.batches:
        return "no recognisable batch"
    noun = "batch" if part.batches == 1 else "batches"
    return (f"{part.batches} recognisable {noun}, offsets {part.first_offset}-"
            f"{(part.end_offset or 0) - 1}")


def _stop_with_parent(parent_pid: int) -> bool:
    """Have Linux send us SIGTERM when ``parent_pid`` (``local``) exits, even by SIGKILL, so that
    its nodes never outlive it holding their ports. False if it is already gone."""
    if sys.platform == "linux":
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    # Checked after prctl: a parent that died before it would otherwise go unnoticed.
    return os.getppid() == parent_pid


# -- local (its supervisor: quorum_node.cli.local_quorum) ---------------------------------------


def _cmd_local(args: argparse.Namespace) -> int:
    prog = f"{PROG} local"
    for action, node_id in (("restart", args.restart_node), ("stop", args.stop_node),
                            ("replace", args.replace_node)):
        if node_id is not None:
            return _control_local(prog, args.data_dir, action, node_id)
    # Holds the data directory's lock, taken before anything is written, until every node stops.
    with contextlib.ExitStack() as held:
        def lock_data_dir(data_dir: Path) -> None:
            held.enter_context(lock_local_data_dir(data_dir, args.nodes))

        try:
            settings = settings_from_environ(os.environ)
            settings.update({k: Setting(v, KEYS_BY_NAME[k].flag)
                             for k, v in _key_flags(args).items()})
            nodes = prepare_local_cluster(
                args.data_dir, args.nodes, host=args.host, base_port=args.base_port,
                settings=settings, before_writing=lock_data_dir,
            )
            check_ports_free(args.host, [listener.port for node in nodes
                                         for listener in node.config.listeners])
        except (LocalClusterError, ConfigError, StorageError, OSError) as exc:
            _error(prog, exc)
            return EXIT_REFUSED
        log_flags = ["--log-level", args.log_level, "--log-format", args.log_format]
        return run_local_quorum(nodes, args.data_dir, log_flags)


def _control_local(prog: str, data_dir: Path, action: str, node_id: int) -> int:
    """Ask the running ``local`` to act on a node: its answer on stdout, or its refusal as one
    error line (exit 1; 2 for a node the quorum does not have)."""
    try:
        check_control_target(data_dir, node_id)
        reply = send_request(data_dir, action, node_id)
    except (LocalClusterError, ControlError) as exc:
        _error(prog, exc)
        return EXIT_REFUSED
    if not reply.ok:
        _error(prog, "; ".join(reply.lines))
        return EXIT_FAILED
    for line in reply.lines:
        print(line)
    return 0




if __name__ == "__main__":
    sys.exit(main())
