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
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

from quorum_node.addresses import host_port
from quorum_node.cli.backup import add_backup_commands
from quorum_node.cli.common import (
    BOOTSTRAP_ENV,
    LOCAL_DATA_DIR,
    CliParser,
    add_logging_options,
    add_standard_options,
    configure_logging,
    run_cli,
)
from quorum_node.cli.export import add_export_command
from quorum_node.cli.info import add_info_command
from quorum_node.cli.local_control import (
    ControlAnswer,
    ControlError,
    ControlRequest,
    LeaderWatch,
    answer,
    fetch_status,
    pending_requests,
    send_request,
)
from quorum_node.cli.local_layout import CLUSTER_ID_FILE
from quorum_node.node.config import (
    CONFIG_KEYS,
    ENV_PREFIX,
    KEYS_BY_NAME,
    ConfigError,
    ConfigKey,
    NodeConfig,
    Setting,
    config_from_settings,
    load_config,
    read_properties,
    settings_from_environ,
)
from quorum_node.raft.types import RaftInvariantError
from quorum_node.security.peer_secret import PeerSecretError, load_peer_secret
from quorum_node.storage import kafka_uuid
from quorum_node.storage.dir_lock import (
    LOCK_FILE,
    DirectoryInUseError,
    DirectoryLock,
    lock_directory,
)
from quorum_node.storage.errors import StorageError
from quorum_node.storage.fsutil import atomic_write
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

DEFAULT_DATA_DIR = LOCAL_DATA_DIR  # where quorum-client and quorum-admin look for it
DEFAULT_BASE_PORT = 9091
DEFAULT_HOST = "127.0.0.1"
STOP_GRACE_S = 10.0
SERVING_TIMEOUT_S = 60.0  # a node restarted by `local --restart` must serve within this
STATUS_POLL_S = 0.5  # how often `local` asks its nodes who leads
PEER_SECRET_FILE = "peer-secret"
CLIENT_LISTENER = "CLIENT"
CONTROLLER_LISTENER = "CONTROLLER"
_LOCAL_SOURCE = "quorum-node local"
_NODE_ENTRY = re.compile(r"node-([0-9]+)(?:\.properties)?")


class LocalClusterError(Exception):
    """``quorum-node local`` cannot use the data directory or ports it was given."""


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


# -- local -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalNode:
    """One node of a local quorum, as ``prepare_local_cluster`` set it up."""

    config: NodeConfig
    config_path: Path
    log_path: Path  # the node's stdout and stderr

    @property
    def node_id(self) -> int:
        return self.config.node_id


def prepare_local_cluster(
    data_dir: Path,
    nodes: int,
    *,
    host: str = DEFAULT_HOST,
    base_port: int = DEFAULT_BASE_PORT,
    settings: Mapping[str, Setting] | None = None,
    before_writing: Callable[[Path], object] | None = None,
) -> list[LocalNode]:
    """Set up (first use) or check and reuse (later) a local quorum's data directory: its
    cluster id in ``cluster.id``, node i's log directory ``node-i`` (formatted once), and
    ``node-i.properties``, rewritten every time from the arguments and ``settings`` (shared keys
    only, e.g. timeouts). Raises LocalClusterError, ConfigError or StorageError; nothing is
    written when the directory belongs to a quorum of another size or to something else.
    ``before_writing(data_dir)`` runs once everything is checked, before the first write (it
    locks the data directory: see ``lock_local_data_dir``)."""
    if nodes < 1:
        raise LocalClusterError(f"--nodes must be at least 1, got {nodes}")
    if not 1 <= base_port <= 65536 - 2 * nodes:
        raise LocalClusterError(f"--base-port {base_port}: ports up to "
                                f"{base_port + 2 * nodes - 1} do not fit below 65536")
    overrides = dict(settings or {})
    for name, setting in overrides.items():
        if not KEYS_BY_NAME[name].shared:
            raise LocalClusterError(f"{setting.source}: quorum-node local sets {name} for each "
                                    "node itself; remove it")
    # Absolute paths, so that a node-i.properties also works when run by hand from elsewhere.
    data_dir = data_dir.absolute()
    _check_existing_layout(data_dir, nodes)
    cluster_id = _local_cluster_id(data_dir)
    secret_path = data_dir / PEER_SECRET_FILE
    _check_peer_secret(secret_path)
    ports = {i: base_port + i - 1 for i in range(1, nodes + 1)}
    peer_ports = {i: base_port + nodes + i - 1 for i in range(1, nodes + 1)}
    voters = ",".join(f"{i}@{host_port(host, port)}" for i, port in peer_ports.items())
    client_endpoints = ",".join(f"{i}@{host_port(host, port)}"
                                for i, port in ports.items())
    # Every config is validated before anything is formatted or written.
    prepared = [
        LocalNode(
            config_from_settings({
                **overrides,
                "node.id": Setting(str(node_id), _LOCAL_SOURCE),
                "cluster.id": Setting(cluster_id, _LOCAL_SOURCE),
                "log.dir": Setting(str(data_dir / f"node-{node_id}"), _LOCAL_SOURCE),
                "listeners": Setting(
                    f"{CLIENT_LISTENER}://{host_port(host, port)},"
                    f"{CONTROLLER_LISTENER}://{host_port(host, peer_ports[node_id])}",
                    _LOCAL_SOURCE),
                "listener.security.protocol.map": Setting(
                    f"{CLIENT_LISTENER}:PLAINTEXT,{CONTROLLER_LISTENER}:PLAINTEXT", _LOCAL_SOURCE),
                "controller.listener.names": Setting(CONTROLLER_LISTENER, _LOCAL_SOURCE),
                "controller.listener.secret.file": Setting(str(secret_path), _LOCAL_SOURCE),
                "controller.quorum.voters": Setting(voters, _LOCAL_SOURCE),
                "controller.quorum.client.endpoints": Setting(client_endpoints, _LOCAL_SOURCE),
            }),
            data_dir / f"node-{node_id}.properties",
            data_dir / f"node-{node_id}.log",
        )
        for node_id, port in ports.items()
    ]
    if before_writing is not None:
        before_writing(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    _store_cluster_id(data_dir, cluster_id)
    _store_peer_secret(secret_path)
    for node in prepared:
        # Formats a new directory; checks that an existing one is this cluster's and node's.
        format_log_dir(node.config.log_dir, cluster_id, node.node_id, ignore_formatted=True)
        atomic_write(node.config_path, node.config.to_properties().encode("utf-8"), replace=True)
    return prepared


def lock_local_data_dir(data_dir: Path, nodes: int) -> DirectoryLock:
    """Lock the data directory of a local quorum (creating it if missing), for the lifetime of
    ``local``, and check that no node directory in it is in use. Raises LocalClusterError having
    written nothing but the lock file.

    The data directory's own lock, rather than the node directories' locks: the nodes are child
    processes that lock their own directories, so ``local`` must not hold those; and probing them
    alone would leave a window between the probe and the children's start in which a second
    ``local`` passes the same probe and rewrites node-*.properties. Two ``local``s on one data
    directory meet at its lock, before either writes anything. The node directories are probed
    too (locked and released at once), for a node run by hand from its node-i.properties."""
    try:
        lock = lock_directory(data_dir, create=True, what="data directory")
    except DirectoryInUseError as exc:
        raise LocalClusterError(f"{exc} (another quorum-node local?)") from None
    try:
        for node_id in range(1, nodes + 1):
            node_dir = data_dir / f"node-{node_id}"
            if (node_dir / META_PROPERTIES).exists():
                try:
                    lock_directory(node_dir).release()
                except DirectoryInUseError as exc:
                    holder = "unknown" if exc.holder_pid is None else exc.holder_pid
                    raise LocalClusterError(
                        f"data directory {data_dir} is in use by another process (pid {holder}, "
                        f"which holds {node_dir}); stop it first, or use another --data-dir"
                    ) from None
    except BaseException:
        lock.release()
        raise
    return lock


def _check_existing_layout(data_dir: Path, nodes: int) -> None:
    if not data_dir.exists():
        return
    if not data_dir.is_dir():
        raise LocalClusterError(f"{data_dir} is not a directory")
    entries = sorted(entry for entry in os.listdir(data_dir) if entry != LOCK_FILE)
    if not entries:
        return
    if CLUSTER_ID_FILE not in entries:
        raise LocalClusterError(
            f"{data_dir} is not empty and holds no local quorum ({CLUSTER_ID_FILE} is missing); "
            "choose a new or empty --data-dir"
        )
    found = {int(m.group(1)) for e in entries if (m := _NODE_ENTRY.fullmatch(e))}
    expected = set(range(1, nodes + 1))
    if found and found != expected:
        raise LocalClusterError(
            f"{data_dir} holds a local quorum of nodes {_id_list(found)}, not {_id_list(expected)}"
            f"; run with --nodes {len(found)} or choose another --data-dir"
        )
    for node_id in sorted(found):
        path = data_dir / f"node-{node_id}.properties"
        if path.exists():
            voters = read_properties(path).get("controller.quorum.voters")
            count = len(voters.value.split(",")) if voters else 0
            if count != nodes:
                raise LocalClusterError(
                    f"{path} lists {count} voters, not {nodes}; run with --nodes {count} or "
                    "choose another --data-dir"
                )


def _id_list(ids: set[int]) -> str:
    return ", ".join(str(i) for i in sorted(ids))


def _local_cluster_id(data_dir: Path) -> str:
    """The cluster id kept in the data directory, or a new one (stored by _store_cluster_id)."""
    path = data_dir / CLUSTER_ID_FILE
    try:
        cluster_id = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return random_cluster_id()
    except (OSError, UnicodeDecodeError) as exc:
        raise LocalClusterError(f"{path}: unreadable: {exc}") from None
    try:
        validate_cluster_id(cluster_id)
    except ValueError as exc:
        raise LocalClusterError(f"{path}: {exc}") from None
    return cluster_id


def _store_cluster_id(data_dir: Path, cluster_id: str) -> None:
    path = data_dir / CLUSTER_ID_FILE
    if not path.exists():
        atomic_write(path, f"{cluster_id}\n".encode("ascii"), replace=False)


def _check_peer_secret(path: Path) -> None:
    """An existing secret file must be usable (it is kept: the nodes may be running with it)."""
    if path.exists():
        try:
            load_peer_secret(path)
        except PeerSecretError as exc:
            raise LocalClusterError(f"{exc}; remove it to have a new one generated") from None


def _store_peer_secret(path: Path) -> None:
    """Generate the quorum's peer secret once, readable by its owner only (mode 0600)."""
    if path.exists():
        return
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a leftover tmp file of a crash may have had other bits
        os.write(fd, f"{secrets.token_urlsafe(32)}\n".encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # never clobbers a secret written meanwhile
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)


def check_ports_free(host: str, ports: Sequence[int]) -> None:
    """Fail early, with the port's number, instead of letting a node die on a taken port."""
    for port in ports:
        try:
            family, kind, proto, _, address = socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM)[0]
            with socket.socket(family, kind, proto) as sock:
                # As asyncio's server does, so a port in TIME_WAIT counts as free.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(address)
        except OSError as exc:
            raise LocalClusterError(
                f"cannot listen on {host_port(host, port)}: {exc.strerror or exc}; is another "
                "quorum running? (--base-port picks other ports)"
            ) from None


def node_command(node: LocalNode, log_flags: Sequence[str] = ()) -> list[str]:
    return [
        sys.executable, "-m", "quorum_node.cli.node", "run", "--config", str(node.config_path),
        "--parent-pid", str(os.getpid()), *log_flags,
    ]


def _stop_with_parent(parent_pid: int) -> bool:
    """Have Linux send us SIGTERM when ``parent_pid`` (``local``) exits, even by SIGKILL, so that
    its nodes never outlive it holding their ports. False if it is already gone."""
    if sys.platform == "linux":
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    # Checked after prctl: a parent that died before it would otherwise go unnoticed.
    return os.getppid() == parent_pid


class LocalCluster:
    """Child processes of a local quorum: started together, watched, stopped together; a node
    that dies is reported and the others go on, and a node can be stopped, restarted or given a
    new disk while the others run.

    Only the processes it started are ever signalled, each through its own Popen."""

    def __init__(
        self,
        nodes: Sequence[LocalNode],
        command: Callable[[LocalNode], list[str]] = node_command,
        *,
        out: IO[str] | None = None,
        grace_s: float = STOP_GRACE_S,
        serving_timeout_s: float = SERVING_TIMEOUT_S,
    ) -> None:
        self.nodes = list(nodes)
        self._command = command
        self._out = out if out is not None else sys.stderr
        self._grace_s = grace_s
        self.serving_timeout_s = serving_timeout_s  # how long a restart waits for the node
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self._reported: set[int] = set()  # nodes whose exit was reported (or requested)

    def node(self, node_id: int) -> LocalNode:
        found = next((n for n in self.nodes if n.node_id == node_id), None)
        if found is None:
            raise LocalClusterError(f"no node {node_id}: this quorum has nodes "
                                    f"{_id_list({n.node_id for n in self.nodes})}")
        return found

    def start(self) -> None:
        for node in self.nodes:
            self.start_node(node.node_id)

    def start_node(self, node_id: int) -> subprocess.Popen[bytes]:
        """Start a node (that is not running)."""
        node = self.node(node_id)
        # The config file is the whole configuration: QUORUM_* variables would override it.
        env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
        env["PYTHONUNBUFFERED"] = "1"  # so that node-i.log is current
        with node.log_path.open("ab") as log:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"--- {stamp} quorum-node local: starting node {node.node_id}\n".encode())
            log.flush()
            process = subprocess.Popen(
                self._command(node), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, env=env,
                # Its own session: a Ctrl-C in the terminal reaches only us, and we stop the
                # nodes one way, with SIGTERM (a graceful resignation), not twice.
                start_new_session=True,
            )
        self.processes[node.node_id] = process
        self._reported.discard(node.node_id)
        return process

    def running(self) -> list[int]:
        return sorted(i for i, p in self.processes.items() if p.poll() is None)

    def supervise(
        self,
        stop_requested: Callable[[], bool],
        kill_now: Callable[[], bool] = lambda: False,
        *,
        poll_s: float = 0.1,
        tick: Callable[[], None] = lambda: None,
    ) -> int:
        """Until ``stop_requested()`` (then stop all and return 0): report each node that exits
        on its own, once, and what is left of the quorum, and call ``tick`` (control requests,
        status). ``kill_now`` is passed on to ``stop``."""
        while True:
            if stop_requested():
                self.stop(kill_now)
                return 0
            for node_id, process in sorted(self.processes.items()):
                code = process.poll()
                if code is not None and node_id not in self._reported:
                    self._reported.add(node_id)
                    self._say(f"node {node_id} {_describe_exit(code)}; its log: "
                              f"{self.node(node_id).log_path}; {self.quorum_left()}")
            tick()
            time.sleep(poll_s)

    def quorum_left(self) -> str:
        """What the nodes still running mean for the quorum (every node is a voter)."""
        up, total = self.running(), len(self.nodes)
        if not up:
            return "no node is running"
        majority = len(up) > total // 2
        return (f"{'the quorum goes on with' if majority else 'no majority left:'} node"
                f"{'s' if len(up) != 1 else ''} {_id_list(set(up))} ({len(up)} of {total} "
                f"voters{'' if majority else '; writes wait until a majority is back'})")

    def stop_node(self, node_id: int, kill_now: Callable[[], bool] = lambda: False) -> bool:
        """Stop one node as ``stop`` does; False if it was not running."""
        process = self.processes.get(node_id)
        if process is None or process.poll() is not None:
            return False
        self._reported.add(node_id)  # asked for: not news
        self._stop({node_id: process}, kill_now)
        return True

    def stop(self, kill_now: Callable[[], bool] = lambda: False) -> None:
        """SIGTERM every running node, wait up to the grace period (all in parallel), SIGKILL
        the ones still running (at once when ``kill_now()`` turns true)."""
        running = {i: p for i, p in self.processes.items() if p.poll() is None}
        self._reported.update(running)
        self._stop(running, kill_now)

    def _stop(self, running: Mapping[int, subprocess.Popen[bytes]],
              kill_now: Callable[[], bool]) -> None:
        for process in running.values():
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self._grace_s
        forced = False
        while any(p.poll() is None for p in running.values()):
            forced = kill_now()
            if forced or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        for node_id, process in running.items():
            if process.poll() is None:
                process.kill()
                process.wait()
                why = "on a second signal" if forced else (
                    f"after {self._grace_s:g} s (SIGTERM did not stop it)")
                self._say(f"node {node_id} killed {why}")

    def _say(self, line: str) -> None:
        print(line, file=self._out, flush=True)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _cmd_local(args: argparse.Namespace) -> int:
    prog = f"{PROG} local"
    for action, node_id in (("restart", args.restart_node), ("stop", args.stop_node),
                            ("replace", args.replace_node)):
        if node_id is not None:
            return _control_local(prog, args.data_dir, action, node_id)
    # Holds the data directory's lock, taken before anything is written, until every node stops.
    with contextlib.ExitStack() as held:
        return _run_local(args, prog, held)


def _control_local(prog: str, data_dir: Path, action: str, node_id: int) -> int:
    """Ask the running ``local`` to act on a node: its answer on stdout, or its refusal as one
    error line (exit 1; 2 for a node the quorum does not have)."""
    if not (data_dir / f"node-{node_id}.properties").exists() \
            and (data_dir / CLUSTER_ID_FILE).exists():
        found = {int(m.group(1)) for e in os.listdir(data_dir)
                 if (m := _NODE_ENTRY.fullmatch(e)) and e.endswith(".properties")}
        _error(prog, f"no node {node_id}: the quorum in {data_dir} has nodes {_id_list(found)}")
        return EXIT_REFUSED
    try:
        reply = send_request(data_dir, action, node_id)
    except ControlError as exc:
        _error(prog, exc)
        return EXIT_REFUSED
    if not reply.ok:
        _error(prog, "; ".join(reply.lines))
        return EXIT_FAILED
    for line in reply.lines:
        print(line)
    return 0


def handle_control_request(cluster: LocalCluster, request: ControlRequest,
                           kill_now: Callable[[], bool]) -> ControlAnswer:
    """Do what ``quorum-node local --restart/--stop-node/--replace`` asked."""
    node_id = request.node_id
    try:
        cluster.node(node_id)
    except LocalClusterError as exc:
        return ControlAnswer(False, [str(exc)])
    if request.action == "stop":
        if not cluster.stop_node(node_id, kill_now):
            return ControlAnswer(False, [f"node {node_id} is not running"])
        return ControlAnswer(True, [f"node {node_id} stopped; {cluster.quorum_left()}"])
    if request.action == "restart":
        was_running = cluster.stop_node(node_id, kill_now)
        process = cluster.start_node(node_id)
        serving = wait_until_serving(cluster, node_id, kill_now)
        return ControlAnswer(serving.startswith("serving"), [
            f"node {node_id} {'restarted' if was_running else 'started'} (pid {process.pid}), "
            f"{serving}; {cluster.quorum_left()}"])
    try:
        return ControlAnswer(True, replace_node_disk(cluster, node_id, kill_now))
    except (StorageError, OSError) as exc:
        return ControlAnswer(False, [f"cannot replace node {node_id}'s disk: {exc}"])


def wait_until_serving(cluster: LocalCluster, node_id: int,
                       kill_now: Callable[[], bool] = lambda: False) -> str:
    """Wait until a node just started serves clients (its client listener answers and it knows
    its leader, to which it redirects), and say so: "serving ... after N s", or why not."""
    node = cluster.node(node_id)
    listener = node.config.client_listeners[0]
    started = time.monotonic()
    while time.monotonic() - started < cluster.serving_timeout_s and not kill_now():
        process = cluster.processes.get(node_id)
        if process is None or process.poll() is not None:
            return f"but it exited (its log: {node.log_path})"
        status = fetch_status(listener.host, listener.port)
        if status is not None and status.get("leader_id") is not None:
            return (f"serving clients on {node.config.client_url} after "
                    f"{time.monotonic() - started:.1f} s (leader: node {status['leader_id']})")
        time.sleep(0.1)
    return (f"not serving clients after {time.monotonic() - started:.0f} s "
            f"(its log: {node.log_path})")


def replace_node_disk(cluster: LocalCluster, node_id: int,
                      kill_now: Callable[[], bool] = lambda: False) -> list[str]:
    """Stop the node, keep its log directory aside, format a new one (a new directory id), start
    the node on it: it rejoins as an observer, which AddVoter makes a voter again."""
    node = cluster.node(node_id)
    cluster.stop_node(node_id, kill_now)
    log_dir = node.config.log_dir
    old = read_meta_properties(log_dir / META_PROPERTIES)
    kept = log_dir.with_name(f"{log_dir.name}.replaced-{time.strftime('%Y%m%dT%H%M%S')}")
    log_dir.rename(kept)
    new = format_log_dir(log_dir, node.config.cluster_id, node_id)
    process = cluster.start_node(node_id)
    serving = wait_until_serving(cluster, node_id, kill_now)
    old_id = kafka_uuid.to_kafka_string(old.directory_id)
    new_id = kafka_uuid.to_kafka_string(new.directory_id)
    bootstrap = local_bootstrap(cluster.nodes)
    return [
        f"node {node_id} restarted (pid {process.pid}) on a new disk, {serving}: directory id "
        f"{new_id} (the old disk, {old_id}, is kept in {kept})",
        "it joins as an observer; once it has caught up, make it a voter and retire the old "
        "directory:",
        f"  quorum-admin -b {bootstrap} add-voter --id {node_id} --uuid {new_id}",
        f"  quorum-admin -b {bootstrap} remove-voter --id {node_id} --uuid {old_id}",
    ]


def local_bootstrap(nodes: Sequence[LocalNode]) -> str:
    """The nodes' client listeners, as -b and $QUORUM_BOOTSTRAP_SERVER take them."""
    return ",".join(node.config.client_listeners[0].address for node in nodes)


def _run_local(args: argparse.Namespace, prog: str, held: contextlib.ExitStack) -> int:
    def lock_data_dir(data_dir: Path) -> None:
        held.enter_context(lock_local_data_dir(data_dir, args.nodes))

    try:
        settings = settings_from_environ(os.environ)
        settings.update({k: Setting(v, KEYS_BY_NAME[k].flag) for k, v in _key_flags(args).items()})
        nodes = prepare_local_cluster(
            args.data_dir, args.nodes, host=args.host, base_port=args.base_port, settings=settings,
            before_writing=lock_data_dir,
        )
        check_ports_free(args.host, [listener.port for node in nodes
                                     for listener in node.config.listeners])
    except (LocalClusterError, ConfigError, StorageError, OSError) as exc:
        _error(prog, exc)
        return EXIT_REFUSED

    signals_seen = 0

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal signals_seen
        signals_seen += 1

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    log_flags = ["--log-level", args.log_level, "--log-format", args.log_format]
    cluster = LocalCluster(nodes, lambda node: node_command(node, log_flags))
    watch = LeaderWatch(lambda line: print(line, flush=True))
    next_status = 0.0

    def tick() -> None:
        nonlocal next_status
        for request in pending_requests(args.data_dir):
            reply = handle_control_request(cluster, request, lambda: signals_seen > 1)
            for line in reply.lines:
                print(line, flush=True)
            answer(args.data_dir, request.request_id, reply)
        now = time.monotonic()
        if now >= next_status:
            statuses = [fetch_status(listener.host, listener.port)
                        for node in nodes if node.node_id in cluster.running()
                        for listener in node.config.client_listeners[:1]]
            watch.observe([status for status in statuses if status is not None], now)
            next_status = now + STATUS_POLL_S

    try:
        cluster.start()
        print(f"local quorum of {len(nodes)} nodes, cluster id {nodes[0].config.cluster_id}, "
              f"data in {nodes[0].config_path.parent}")
        for node in nodes:
            pid = cluster.processes[node.node_id].pid
            url = node.config.client_url
            peers = node.config.controller_listener.address
            print(f"node {node.node_id}: {url}  (peers on {peers}; pid {pid}, "
                  f"log {node.log_path})")
        print(f"peer RPCs need the secret in {nodes[0].config.controller_listener_secret_file}")
        data_dir = nodes[0].config_path.parent
        # From the directory holding ./quorum-data the other CLIs find the nodes by
        # themselves (its node-*.properties); elsewhere, or with another --data-dir, this does.
        print("quorum-client and quorum-admin in another terminal reach these nodes after:")
        print(f"  export {BOOTSTRAP_ENV}={local_bootstrap(nodes)}")
        print(f"Ctrl-C stops every node. From another terminal: {PROG} local --data-dir "
              f"{data_dir} --restart N (or --stop-node N, --replace N)", flush=True)
        code = cluster.supervise(lambda: signals_seen > 0, lambda: signals_seen > 1, tick=tick)
        if code == 0:
            print("all nodes stopped", file=sys.stderr)
        return code
    finally:
        # Also on an error while starting: never leave started nodes behind. A second Ctrl-C
        # while they shut down kills them at once.
        cluster.stop(kill_now=lambda: signals_seen > 1)
        for signum, handler in previous.items():
            signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(main())
