"""The supervisor behind ``quorum-node local``: a whole quorum on this machine, one child process
per node. It prepares the data directory (cluster id, peer secret, each node's formatted log
directory and properties file), starts the nodes, reports a node that dies and what is left of
the quorum, follows the leader, and acts on the requests that ``local --restart/--stop-node/
--replace`` sends from another terminal (``local_control``): restart a node, stop it, or give it
a new disk. ``quorum_node.cli.node`` is its command line.
"""

from __future__ import annotations

import os
import random
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
from quorum_node.cli.common import BOOTSTRAP_ENV, LOCAL_DATA_DIR
from quorum_node.cli.local_control import (
    ControlAnswer,
    ControlRequest,
    LeaderWatch,
    answer,
    fetch_status,
    pending_requests,
)
from quorum_node.cli.local_layout import CLUSTER_ID_FILE
from quorum_node.node.config import (
    ENV_PREFIX,
    KEYS_BY_NAME,
    NodeConfig,
    Setting,
    config_from_settings,
    read_properties,
)
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
from quorum_node.storage.meta_properties import (
    META_PROPERTIES,
    format_log_dir,
    random_cluster_id,
    read_meta_properties,
    validate_cluster_id,
)

LOCAL_COMMAND = "quorum-node local"
DEFAULT_DATA_DIR = LOCAL_DATA_DIR  # where quorum-client and quorum-admin look for it
DEFAULT_BASE_PORT = 9091
DEFAULT_HOST = "127.0.0.1"
STOP_GRACE_S = 10.0
SERVING_TIMEOUT_S = 60.0  # a node restarted by `local --restart` must serve within this
STATUS_POLL_S = 0.5  # how often `local` asks its nodes who leads

PEER_SECRET_FILE = "peer-secret"
CLIENT_LISTENER = "CLIENT"
CONTROLLER_LISTENER = "CONTROLLER"
_LOCAL_SOURCE = LOCAL_COMMAND  # where the keys it sets for each node come from, in errors
_NODE_ENTRY = re.compile(r"node-([0-9]+)(?:\.properties)?")


# Below Linux's default ephemeral range (net.ipv4.ip_local_port_range, 32768-60999): a connection
# to a port in that range, made before anything listens there, can be given that very port as its
# source and connect to itself (a health check then reads its own request back).
_PORTS_BELOW_EPHEMERAL = range(20000, 32768)


class LocalClusterError(Exception):
    """``quorum-node local`` cannot use the data directory or ports it was given."""


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


def free_base_port(count: int, host: str = DEFAULT_HOST, attempts: int = 100) -> int | None:
    """A ``--base-port`` whose ``count`` ports in a row on ``host`` are free now, below the
    ephemeral range; None when ``attempts`` draws found none. Another process may still take
    one before ``local`` binds it."""
    for _ in range(attempts):
        base = random.randrange(_PORTS_BELOW_EPHEMERAL.start, _PORTS_BELOW_EPHEMERAL.stop - count)
        try:
            check_ports_free(host, range(base, base + count))
        except LocalClusterError:
            continue
        return base
    return None


def node_command(node: LocalNode, log_flags: Sequence[str] = ()) -> list[str]:
    return [
        sys.executable, "-m", "quorum_node.cli.node", "run", "--config", str(node.config_path),
        "--parent-pid", str(os.getpid()), *log_flags,
    ]


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


def check_control_target(data_dir: Path, node_id: int) -> None:
    """Before asking the running ``local`` to act on a node: refuse, naming the nodes, a node
    that the quorum in ``data_dir`` does not have (LocalClusterError)."""
    if not (data_dir / f"node-{node_id}.properties").exists() \
            and (data_dir / CLUSTER_ID_FILE).exists():
        found = {int(m.group(1)) for e in os.listdir(data_dir)
                 if (m := _NODE_ENTRY.fullmatch(e)) and e.endswith(".properties")}
        raise LocalClusterError(
            f"no node {node_id}: the quorum in {data_dir} has nodes {_id_list(found)}")


def run_local_quorum(nodes: Sequence[LocalNode], data_dir: Path,
                     log_flags: Sequence[str] = ()) -> int:
    """Start the nodes that ``prepare_local_cluster`` set up, say where they serve, and supervise
    them until SIGINT or SIGTERM (a second one kills them at once): each control request found in
    ``data_dir`` is answered, and each change of leader is printed. Returns the exit code."""
    signals_seen = 0

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal signals_seen
        signals_seen += 1

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    cluster = LocalCluster(nodes, lambda node: node_command(node, log_flags))
    watch = LeaderWatch(lambda line: print(line, flush=True))
    next_status = 0.0

    def tick() -> None:
        nonlocal next_status
        for request in pending_requests(data_dir):
            reply = handle_control_request(cluster, request, lambda: signals_seen > 1)
            for line in reply.lines:
                print(line, flush=True)
            answer(data_dir, request.request_id, reply)
        now = time.monotonic()
        if now >= next_status:
            statuses = [fetch_status(listener.host, listener.port)
                        for node in nodes if node.node_id in cluster.running()
                        for listener in node.config.client_listeners[:1]]
            watch.observe([status for status in statuses if status is not None], now)
            next_status = now + STATUS_POLL_S

    try:
        cluster.start()
        _print_started(cluster)
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


def _print_started(cluster: LocalCluster) -> None:
    """Where the nodes just started serve, and how to reach and control them."""
    nodes = cluster.nodes
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
    print(f"Ctrl-C stops every node. From another terminal: {LOCAL_COMMAND} --data-dir "
          f"{data_dir} --restart N (or --stop-node N, --replace N)", flush=True)
