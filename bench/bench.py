"""Benchmark: a 3-voter quorum on loopback (fsync on) against a 3-member etcd in the same run,
etcd both over its native gRPC API and over its HTTP/JSON gateway.

    python bench/bench.py [--seconds 10] [--client-processes 4] [--json results.json]
    python bench/bench.py --failover-only     # only the failovers, on fresh clusters

Workloads, the same harness for every system (``drivers.py``): sequential commit latency of
100-byte key-value puts from one client (p50/p99); puts/s with 64 and with 256 concurrent
clients, and the puts' p50/p99 under that load; batched append throughput (records/s, 100-byte
records, 1000 per call from 4 clients; etcd: transactions of 128 puts, its largest by default);
failover (kill -9 of the leader until the next successful write) with default timeouts and
with equal leader-loss detection on both sides (the quorum's fetch timeout, etcd's election
timeout: 500 ms each), with the times of the quorum's election steps from its logs, and the same
two for a leader paused (SIGSTOP) instead, silent as behind a partition (the median of
``--failover-rounds`` rounds on one cluster); each node's RSS after the loads. Before the
systems start, the physical floor of a pull-based commit here (``floor.py``: two loopback
WebSocket round trips and the fsync of a small append on the data directories' filesystem) is
measured and printed beside them. Concurrent clients run in several client processes (threads
sharing one client a process), so that one Python process's GIL is not what is measured. The
systems run at the same time and take turns at each workload, so that a shared machine's
changing load falls on all of them alike. The quorum is driven through the product client
(``quorum_node.client.QuorumClient``). etcd runs when an ``etcd`` binary is on PATH (Debian's
etcd-server) and its gRPC columns when the ``bench`` extra is installed. Prints a table (ratios:
quorum/etcd-gRPC, and quorum/etcd-gateway beside it) and writes JSON.

This is a measurement, not a test: nothing here asserts a number.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import datetime
import functools
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from drivers import (
    ETCD_GATEWAY,
    ETCD_GRPC,
    GRPC_AVAILABLE,
    QUORUM,
    VALUE,
    Load,
    SequentialTarget,
    Target,
    pick_base_port,
    rss_mb,
    sequential_latencies,
    timed_load,
)
from floor import measure_floor

import quorum_node
from quorum_node.cli.local_quorum import LocalCluster, LocalNode, prepare_local_cluster
from quorum_node.node.config import Setting
from quorum_node.raft.config import QuorumConfig

CONCURRENCY = (64, 256)
# The fast failover run: leader-loss detection set equal on both sides. A quorum follower starts
# an election once it has not heard from its leader for the fetch timeout (at once when the
# leader's address refuses its connection, as a killed leader's does), an etcd follower once it
# has heard no heartbeat for the election timeout; the quorum's election timeout spaces out the
# survivors' first rounds (a tenth of it) and any second round.
FAST_DETECTION_MS = 500
APPEND_CLIENTS = 4
APPEND_BATCH = 1000


class LeaderFinder(Protocol):
    """The client port of the leader, asking the members at ``among`` (default: all of them);
    None while there is none."""

    def __call__(self, among: Sequence[int] | None = None) -> int | None: ...


@dataclass
class System:
    """A running cluster: what the workloads need to find, stop and restart its members."""

    name: str
    ports: list[int]  # client ports
    pids: dict[int, int]  # client port -> process id
    leader_port: LeaderFinder
    stop: Callable[[], None]
    stop_member: Callable[[int], object]  # graceful (SIGTERM)
    start_member: Callable[[int], None]
    # The leader as the member at a client port sees it (an id of the system's own), None while
    # that member does not answer or knows no leader.
    leader_seen: Callable[[int], str | None]
    directories: dict[int, Path] = field(default_factory=dict)  # client port -> data directory
    local_nodes: dict[int, LocalNode] = field(default_factory=dict)  # quorum: client port ->
    logs: list[Path] = field(default_factory=list)  # the members' output

    def target(self, kind: str, port: int) -> Target:
        return Target(kind, port, tuple(self.ports))


# --- quorum-node -----------------------------------------------------------------------------

def compile_bytecode() -> None:
    """Compile the node's modules, as an installed package (a wheel, the container image) has
    them compiled: where PYTHONDONTWRITEBYTECODE is set, a node started from a checkout would
    compile every module of its own again at each start, and a restart's figure would count
    it (etcd starts a compiled binary)."""
    compileall.compile_dir(Path(quorum_node.__file__).parent, quiet=1)


def start_quorum(directory: Path, base_port: int, election_ms: int | None = None,
                 fetch_ms: int | None = None,
                 extra: dict[str, str] | None = None) -> System:
    # Every bench client connects from loopback: above the per-address cap's default (100), as
    # etcd's own bench has no such cap.
    settings: dict[str, Setting] = {"max.connections.per.ip": Setting("1000", "bench")}
    settings.update({k: Setting(v, "bench") for k, v in (extra or {}).items()})
    if election_ms is not None and fetch_ms is not None:
        settings["controller.quorum.election.timeout.ms"] = Setting(str(election_ms), "bench")
        settings["controller.quorum.fetch.timeout.ms"] = Setting(str(fetch_ms), "bench")
    nodes = prepare_local_cluster(directory, 3, base_port=base_port, settings=settings)
    compile_bytecode()
    cluster = LocalCluster(nodes, out=open(os.devnull, "w"))  # noqa: SIM115
    cluster.start()
    ports = [node.config.client_listeners[0].port for node in nodes]
    ids = {node.config.client_listeners[0].port: node.node_id for node in nodes}

    def leader_id_seen(port: int, *, only_itself: bool = False) -> int | None:
        """The leader's id as the member at ``port`` sees it: the leader describes the quorum,
        another member redirects to the leader it knows (None with ``only_itself``)."""
        with contextlib.suppress(OSError, http.client.HTTPException, ValueError, KeyError,
                                 TypeError):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/v1/quorum")
            response = conn.getresponse()
            body = json.loads(response.read())
            conn.close()
            if response.status == 200:
                return int(body["leader_id"])
            if response.status == 307 and not only_itself:
                return int(body["leader"]["id"])
        return None

    def leader_port(among: Sequence[int] | None = None) -> int | None:
        for port in among or ports:
            leader = leader_id_seen(port, only_itself=True)
            if leader is not None:
                return next((p for p, i in ids.items() if i == leader), None)
        return None

    def leader_seen(port: int) -> str | None:
        leader = leader_id_seen(port)
        return None if leader is None else str(leader)

    system = System(QUORUM, ports, {}, leader_port, cluster.stop,
                    lambda port: cluster.stop_node(ids[port]), lambda port: None, leader_seen,
                    {node.config.client_listeners[0].port: node.config.log_dir
                     for node in nodes})

    def start_member(port: int) -> None:
        system.pids[port] = cluster.start_node(ids[port]).pid

    system.start_member = start_member
    system.local_nodes = {node.config.client_listeners[0].port: node for node in nodes}
    system.logs = [node.log_path for node in nodes]
    system.pids.update({port: cluster.processes[ids[port]].pid for port in ports})
    return system


# --- etcd --------------------------------------------------------------------------------------

def _etcd_command(binary: str, directory: Path, name: str, *, client: int, peer: int,
                  initial: str, election_ms: int | None) -> list[str]:
    """One member's command line (``initial``: --initial-cluster)."""
    args = [binary, "--name", name, "--data-dir", str(directory / name),
            "--listen-client-urls", f"http://127.0.0.1:{client}",
            "--advertise-client-urls", f"http://127.0.0.1:{client}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", initial, "--initial-cluster-state", "new",
            "--log-level", "error"]
    if election_ms is not None:
        args += ["--election-timeout", str(election_ms), "--heartbeat-interval",
                 str(max(10, election_ms // 10))]
    return args


def _etcd_status(port: int) -> dict[str, Any] | None:
    """A member's maintenance status; None while it does not answer."""
    with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        conn.request("POST", "/v3/maintenance/status", b"{}")
        response = conn.getresponse()
        body = response.read()
        conn.close()
        if response.status == 200:
            return dict(json.loads(body))
    return None


def _stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, and SIGKILL after 10 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_etcd(directory: Path, base_port: int, election_ms: int | None = None) -> System | None:
    binary = shutil.which("etcd")
    if binary is None:
        return None
    names = [f"e{i}" for i in range(3)]
    client_ports = [base_port + i for i in range(3)]
    peer_ports = [base_port + 10 + i for i in range(3)]
    initial = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(names, peer_ports, strict=True))
    commands = {client: _etcd_command(binary, directory, name, client=client, peer=peer,
                                      initial=initial, election_ms=election_ms)
                for name, client, peer in zip(names, client_ports, peer_ports, strict=True)}
    processes: dict[int, subprocess.Popen[bytes]] = {}

    def start_member(port: int) -> None:
        name = names[client_ports.index(port)]
        with (directory / f"{name}.log").open("ab") as log:
            processes[port] = subprocess.Popen(commands[port], stdout=log,
                                               stderr=subprocess.STDOUT,
                                               start_new_session=True)
        system.pids[port] = processes[port].pid

    def leader_port(among: Sequence[int] | None = None) -> int | None:
        for port in among or client_ports:
            found = _etcd_status(port)
            if found is not None and found["header"]["member_id"] == found.get("leader"):
                return port
        return None

    def leader_seen(port: int) -> str | None:
        found = _etcd_status(port)
        leader = None if found is None else found.get("leader")
        return None if leader in (None, "0", 0) else str(leader)

    def stop_member(port: int) -> None:
        _stop_process(processes[port])

    def stop() -> None:
        for process in processes.values():
            if process.poll() is None:
                process.terminate()
        for process in processes.values():
            _stop_process(process)

    directories = {port: directory / name
                   for port, name in zip(client_ports, names, strict=True)}
    system = System("etcd", client_ports, {}, leader_port, stop, stop_member, start_member,
                    leader_seen, directories)
    system.logs = [directory / f"{name}.log" for name in names]
    for port in client_ports:
        start_member(port)
    return system


# --- workloads ---------------------------------------------------------------------------------

def wait_for_leader(system: System, kind: str, timeout_s: float = 60) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        port = system.leader_port()
        if port is not None:
            client = system.target(kind, port).connect(timeout_s=2)
            try:
                client.put("warmup", VALUE)
                return port
            except Exception:  # not ready yet: any error of any client
                pass
            finally:
                client.close()
        time.sleep(0.05)
    tails = "".join(f"\n--- {log}\n" + "\n".join(log.read_text(errors="replace")
                                                   .splitlines()[-5:])
                    for log in system.logs if log.exists())
    raise RuntimeError(f"{system.name}: no leader within {timeout_s} s{tails}")


def failover(system: System, kind: str, port: int, *, pause: bool = False) -> dict[str, Any]:
    """kill -9 the leader (with ``pause``, SIGSTOP it: a leader gone silent, as behind a
    partition or on a stalled host, which refuses no connection), then put through the new
    leader until one put succeeds: the seconds that took, and (the quorum) when each step of
    the election happened after the kill."""
    pid = system.pids[port]
    os.kill(pid, signal.SIGSTOP if pause else signal.SIGKILL)
    killed = time.perf_counter()
    killed_wall = time.time()
    survivors = tuple(p for p in system.ports if p != port)
    try:
        while time.perf_counter() - killed < 60:
            # Only the survivors are asked: a paused member would hold each question.
            leader = system.leader_port(survivors)
            if leader is not None and leader in survivors:
                client = Target(kind, leader, survivors).connect(timeout_s=1)
                try:
                    client.put("after-failover", VALUE)
                    took = time.perf_counter() - killed
                    return {"s": took, "steps_s": {
                        **failover_steps(system, killed_wall), "write_accepted": took}}
                except Exception:  # the new leader is not serving yet
                    pass
                finally:
                    client.close()
            time.sleep(0.005)
    finally:
        if pause:
            os.kill(pid, signal.SIGCONT)  # so that it can be stopped
    raise RuntimeError(f"{system.name}: no write within 60 s of the failover")


# The quorum's story lines that mark the steps of an election (quorum_node.node.story). A
# follower leaves its leader when the leader's address refuses its connection (a killed
# process), or else when its fetch timeout runs out.
FAILOVER_STEPS = {
    "leader_lost": re.compile(r"node \d+: follower -> prospective "),
    "pre_vote_granted": re.compile(r"node \d+: prospective -> candidate "),
    "vote_granted": re.compile(r"node \d+: candidate -> leader "),
    "leader_change_committed": re.compile(r"node \d+: the LeaderChange of epoch \d+ is "
                                          r"committed"),
}
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def failover_steps(system: System, killed_wall: float) -> dict[str, float]:
    """Seconds from the kill to the first line of each step in the members' logs (a quorum's;
    etcd's say nothing at its log level). The logs' clock has millisecond resolution."""
    found: dict[str, float] = {}
    for log in system.logs:
        with contextlib.suppress(OSError):
            for line in log.read_text(errors="replace").splitlines():
                stamp = _LOG_TIME.match(line)
                if stamp is None:
                    continue
                at = datetime.datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f")
                after = at.timestamp() - killed_wall
                if after < -0.001:
                    continue
                for step, pattern in FAILOVER_STEPS.items():
                    if pattern.search(line) and (step not in found or after < found[step]):
                        found[step] = max(0.0, after)
    return {step: found[step] for step in FAILOVER_STEPS if step in found}


@contextlib.contextmanager
def running_directory() -> Iterator[Path]:
    """A directory where the systems keep their data, removed afterwards."""
    directory = Path(tempfile.mkdtemp(prefix="quorum-bench-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def running(start: Callable[[Path], System | None]) -> Iterator[System | None]:
    with running_directory() as directory:
        system = None
        try:
            system = start(directory)
            yield system
        finally:
            if system is not None:
                system.stop()


def measure(starts: dict[str, Callable[[Path], System | None]], seconds: float,
            sequential: int, processes: int, *, loads: bool = True) -> dict[str, dict[str, Any]]:
    """Every system runs at once and each workload runs on each system in turn before the next
    workload, so that a change in what else the machine runs weighs on all of them alike. The
    results by system, and the floor of a commit (``floor.measure_floor``) under "floor"."""
    with contextlib.ExitStack() as stack:
        systems: dict[str, tuple[System, int]] = {}
        for kind, start in starts.items():
            system = stack.enter_context(running(start))
            if system is not None:
                systems[kind] = (system, wait_for_leader(system, kind))
        results: dict[str, dict[str, Any]] = {kind: {} for kind in systems}

        def each(name: str, run: Callable[[System, Target], Any]) -> None:
            for kind, (system, port) in systems.items():
                print(f"{kind}: {name}", file=sys.stderr, flush=True)
                results[kind][name] = run(system, system.target(kind, port))

        print("sequential puts, the systems taking turns", file=sys.stderr, flush=True)
        for kind, result in sequential_latencies({
                kind: SequentialTarget(system.target(kind, port), list(system.pids.values()),
                                       system.pids.get(port))
                for kind, (system, port) in systems.items()}, sequential).items():
            results[kind]["sequential"] = result
        # Right after the sequential puts, so that the machine's load then weighs on it too.
        print("the floor of a commit", file=sys.stderr, flush=True)
        with running_directory() as directory:
            floor = measure_floor(directory)
        for clients in CONCURRENCY if loads else ():
            each(f"puts_{clients}", functools.partial(_puts, clients=clients, seconds=seconds,
                                                      processes=processes))
        if loads:
            each("batched_append", lambda system, target: timed_load(
                target, Load("append", batch=APPEND_BATCH), APPEND_CLIENTS, seconds,
                processes, server_pids=list(system.pids.values())))
        each("rss_mb", lambda system, _: rss_mb(list(system.pids.values())))
        each("failover", lambda system, target: failover(system, target.kind, target.port))
        for kind in systems:
            results[kind]["failover_s"] = results[kind]["failover"]["s"]
        return {"floor": floor, **results}


def _puts(system: System, target: Target, *, clients: int, seconds: float,
          processes: int) -> dict[str, Any]:
    return timed_load(target, Load("put"), clients, seconds, processes,
                      server_pids=list(system.pids.values()))


def failover_only(kind: str, start: Callable[[Path], System | None]) -> dict[str, Any] | None:
    """One failover of a killed leader on a fresh cluster."""
    with running(start) as system:
        if system is None:
            return None
        return failover(system, kind, wait_for_leader(system, kind))


def paused_failovers(kind: str, start: Callable[[Path], System | None],
                     rounds: int) -> dict[str, Any] | None:
    """``rounds`` failovers of a paused leader on one cluster, each once the member paused in
    the round before is back and follows the new leader: the median round, with every round's
    seconds under ``rounds_s``. etcd draws its election timer anew each time, so one round
    says little about it."""
    with running(start) as system:
        if system is None:
            return None
        results = []
        for _ in range(rounds):
            wait_until_whole(system)
            port = wait_for_leader(system, kind)
            results.append(failover(system, kind, port, pause=True))
        median = sorted(results, key=lambda result: float(result["s"]))[(rounds - 1) // 2]
        return {**median, "rounds_s": [result["s"] for result in results]}


def wait_until_whole(system: System, timeout_s: float = 60) -> None:
    """Until every member answers and names one leader: a member paused before has learnt of
    the election it missed, and can vote again."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen = {system.leader_seen(port) for port in system.ports}
        if len(seen) == 1 and None not in seen:
            return
        time.sleep(0.05)
    raise RuntimeError(f"{system.name}: its members did not agree on a leader in {timeout_s} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10, help="length of throughput runs")
    parser.add_argument("--sequential", type=int, default=1000, help="sequential puts")
    parser.add_argument("--client-processes", type=int, default=4,
                        help="client processes that share the concurrent clients")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--skip-loads", action="store_true",
                        help="only the floor, sequential puts and failovers (no concurrent "
                             "clients, no batched appends)")
    parser.add_argument("--failover-only", action="store_true",
                        help="only the failovers, with default timeouts and with equal "
                             "detection (no floor, puts or appends)")
    parser.add_argument("--failover-rounds", type=positive_int, default=5,
                        help="failovers of a paused leader for each timeout setting, one after "
                             "another on one cluster; the median is reported")
    parser.add_argument("--base-port", type=int, default=None,
                        help="first of the loopback ports used (up to 600 above it are used too); "
                             "default: a random one with those free")
    args = parser.parse_args()
    if args.base_port is None:
        args.base_port = pick_base_port()
    base = args.base_port
    have_etcd = shutil.which("etcd") is not None
    if have_etcd and not GRPC_AVAILABLE:
        print("etcd over gRPC needs the bench extra: pip install -e '.[bench]'",
              file=sys.stderr)
    starts: dict[str, tuple[Callable[[Path], System | None], Callable[[Path], System | None]]]
    fast = FAST_DETECTION_MS
    starts = {
        QUORUM: (lambda d: start_quorum(d, base),
                 lambda d: start_quorum(d, base + 300, election_ms=fast, fetch_ms=fast)),
    }
    if have_etcd and GRPC_AVAILABLE:
        starts[ETCD_GRPC] = (lambda d: start_etcd(d, base + 100),
                             lambda d: start_etcd(d, base + 400, fast))
    if have_etcd:
        starts[ETCD_GATEWAY] = (lambda d: start_etcd(d, base + 200),
                                lambda d: start_etcd(d, base + 500, fast))
    results: dict[str, Any] = {"clients_processes": args.client_processes,
                               "seconds": args.seconds}
    if args.failover_only:
        for kind, (start, _) in starts.items():
            print(f"{kind}: failover, default timeouts", file=sys.stderr, flush=True)
            default_failover = failover_only(kind, start)
            results[kind] = {"failover": default_failover,
                             "failover_s": default_failover["s"] if default_failover else None}
    else:
        results.update(measure({kind: start for kind, (start, _) in starts.items()},
                               args.seconds, args.sequential, args.client_processes,
                               loads=not args.skip_loads))
    for kind, (_, start_fast) in starts.items():
        print(f"{kind}: failover, detection {fast} ms", file=sys.stderr, flush=True)
        fast_failover = failover_only(kind, start_fast)
        results[kind]["failover_fast"] = fast_failover
        results[kind]["failover_fast_s"] = fast_failover["s"] if fast_failover else None
    for name, (start, start_fast) in starts.items():
        for key, starting, timeouts in (("paused", start, "default timeouts"),
                                        ("paused_fast", start_fast, f"detection {fast} ms")):
            print(f"{name}: failover of a paused leader, {timeouts}", file=sys.stderr,
                  flush=True)
            paused = paused_failovers(name, starting, args.failover_rounds)
            results[name][f"failover_{key}"] = paused
            results[name][f"failover_{key}_s"] = paused["s"] if paused else None
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more: {text}")
    return value


def table_rows(result: dict[str, Any]) -> list[tuple[str, float | None]]:
    sequential = result.get("sequential", {})
    rows: list[tuple[str, float | None]] = [
        ("sequential put p50 (ms)", sequential.get("p50_ms")),
        ("sequential put p99 (ms)", sequential.get("p99_ms")),
        ("  server CPU per put (us)", sequential.get("server_cpu_us_per_call")),
        ("    of which the leader's (us)", sequential.get("leader_cpu_us_per_call")),
        ("  client CPU per put (us)", sequential.get("client_cpu_us_per_call")),
    ]
    for clients in CONCURRENCY:
        load = result.get(f"puts_{clients}", {})
        rows += [(f"puts/s, {clients} clients", load.get("per_s")),
                 (f"  put p50 at {clients} (ms)", load.get("p50_ms")),
                 (f"  put p99 at {clients} (ms)", load.get("p99_ms")),
                 ("  server CPU per put (us)", load.get("server_cpu_us_per_call")),
                 ("  client CPU per put (us)", load.get("client_cpu_us_per_call"))]
    rows += [
        ("batched append records/s", result.get("batched_append", {}).get("per_s")),
        ("failover, default timeouts (s)", result["failover_s"]),
        (f"failover, detection {FAST_DETECTION_MS} ms (s)", result["failover_fast_s"]),
        ("paused leader, default timeouts (s)", result["failover_paused_s"]),
        (f"paused leader, detection {FAST_DETECTION_MS} ms (s)",
         result["failover_paused_fast_s"]),
        ("RSS per node, largest (MB)", max(result.get("rss_mb", []), default=None)),
    ]
    return rows


def print_floor(floor: dict[str, Any]) -> None:
    """The floor beside the figures: what a lone put must wait for on this machine."""
    parts = {name: floor[f"{name}_ms"] for name in ("websocket_rtt", "tcp_rtt", "fsync")}
    print(f"floor of a commit here: {floor['commit_floor_ms']['p50']:.2f} ms p50, "
          f"{floor['commit_floor_ms']['p99']:.2f} ms p99 = 2 WebSocket round trips + 1 fsync "
          f"({floor['hops']})")
    print("  " + "; ".join(f"{name.replace('_', ' ')} p50 {part['p50']:.3f} ms, "
                           f"p99 {part['p99']:.3f} ms" for name, part in parts.items()))
    print(f"  default detection: the quorum's fetch timeout "
          f"{QuorumConfig().fetch_timeout_ms} ms (a killed leader's refused "
          f"connections, at once), etcd's election timeout 1000 ms; the fast run sets both "
          f"timeouts to {FAST_DETECTION_MS} ms")


def print_table(results: dict[str, Any]) -> None:
    if "floor" in results:
        print_floor(results["floor"])
    ours = table_rows(results[QUORUM])
    columns = [(kind, table_rows(results[kind])) for kind in (ETCD_GRPC, ETCD_GATEWAY)
               if kind in results]
    header = f"{'':32}{QUORUM:>12}"
    for kind, _ in columns:
        header += f"{kind:>14}{'ratio':>8}"
    print(header)
    for index, (label, mine) in enumerate(ours):
        line = f"{label:32}{_number(mine):>12}"
        for _, rows in columns:
            other = rows[index][1]
            ratio = f"{mine / other:.2f}x" if mine is not None and other else "-"
            line += f"{_number(other):>14}{ratio:>8}"
        print(line)
    kinds = [kind for kind in (QUORUM, ETCD_GRPC, ETCD_GATEWAY) if kind in results]
    for name, timeouts in (("failover_paused", "default timeouts"),
                           ("failover_paused_fast", f"detection {FAST_DETECTION_MS} ms")):
        rounds = {kind: (results[kind].get(name) or {}).get("rounds_s") for kind in kinds}
        print(f"paused leader, {timeouts}, each round (s; the table has the median): "
              + "; ".join(f"{kind} " + " ".join(f"{seconds:.2f}" for seconds in found)
                          for kind, found in rounds.items() if found))
    for name in ("failover", "failover_fast", "failover_paused", "failover_paused_fast"):
        steps = (results[QUORUM].get(name) or {}).get("steps_s", {})
        if steps:
            print(f"{QUORUM} {name.replace('_', ' ')}, seconds from the kill: " + ", ".join(
                f"{step.replace('_', ' ')} {at:.3f}" for step, at in steps.items()))
    if "floor" in results:
        floor = results["floor"]["commit_floor_ms"]["p50"]
        print("sequential put p50 over the floor: " + ", ".join(
            f"{kind} {results[kind]['sequential']['p50_ms'] / floor:.2f}x" for kind in kinds))


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 1000 else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
