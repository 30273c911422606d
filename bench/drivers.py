"""The clients and the load harness the benchmarks share: one client interface over the quorum
(through the product client, ``quorum_node.client.QuorumClient``), etcd over native gRPC and etcd
over its HTTP/JSON gateway, and a harness that drives any of them from several client
processes, each running a number of threads, so that what is measured is the system and not one
Python process's GIL. A process's threads share one client (a QuorumClient, a gRPC channel),
as applications do.

etcd over gRPC needs the ``bench`` extra (``pip install -e '.[bench]'``: grpcio and the etcd v3
stubs that the maintained ``aetcd`` client ships, generated from etcd's protos).
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import http.client
import json
import multiprocessing
import os
import random
import socket
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from quorum_node.client import QuorumClient

try:  # the bench extra; without it, etcd over gRPC is not measured
    import grpc
    from aetcd.rpc import rpc_pb2, rpc_pb2_grpc
    GRPC_AVAILABLE = True
except ImportError:
    GRPC_AVAILABLE = False

VALUE = "v" * 100
RECORD = b"r" * 100
ETCD_TXN_MAX_OPS = 128  # etcd's default --max-txn-ops
QUORUM = "quorum-node"
ETCD_GRPC = "etcd-grpc"
ETCD_GATEWAY = "etcd-gateway"
KINDS = (QUORUM, ETCD_GRPC, ETCD_GATEWAY)


class Client(Protocol):
    """One connection's worth of client: every call raises on failure."""

    def put(self, key: str, value: str) -> None: ...

    def get(self, key: str) -> None: ...  # linearizable

    def put_many(self, items: Sequence[tuple[str, str]]) -> None: ...  # as few calls as it can

    def append_batch(self, count: int) -> int: ...  # records written

    def close(self) -> None: ...


@dataclass(frozen=True)
class Target:
    """Which system a client talks to and where (picklable, for the client processes)."""

    kind: str
    port: int  # the member to send to (the leader, when the bench knows it)
    ports: tuple[int, ...]  # every member's client port

    def connect(self, timeout_s: float = 10.0) -> Client:
        if self.kind == QUORUM:
            return QuorumDriver(self, timeout_s)
        if self.kind == ETCD_GRPC:
            return EtcdGrpcDriver(self.port, timeout_s)
        if self.kind == ETCD_GATEWAY:
            return EtcdGatewayDriver(self.port, timeout_s)
        raise ValueError(f"unknown system {self.kind!r}")


_quorum_clients: dict[tuple[tuple[int, ...], float], tuple[QuorumClient, int]] = {}
_quorum_clients_lock = threading.Lock()


class QuorumDriver:
    """The product client, so that the bench follows its default protocol. The threads of a
    process share one client (one stream per node carrying concurrent calls), as the etcd
    drivers' threads share a gRPC channel."""

    def __init__(self, target: Target, timeout_s: float) -> None:
        # The chosen member first: the client starts there and follows redirects to the leader.
        order = (target.port, *(p for p in target.ports if p != target.port))
        self._key = (order, timeout_s)
        with _quorum_clients_lock:
            client, users = _quorum_clients.get(self._key) or (
                QuorumClient([f"127.0.0.1:{p}" for p in order], timeout_s=timeout_s), 0)
            _quorum_clients[self._key] = (client, users + 1)
        self.client = client

    def put(self, key: str, value: str) -> None:
        self.client.put(key, value)

    def get(self, key: str) -> None:
        self.client.get(key)

    def put_many(self, items: Sequence[tuple[str, str]]) -> None:
        # A transaction of puts, as many as etcd's default --max-txn-ops (the quorum's bound
        # too), as the etcd drivers write them.
        for start in range(0, len(items), ETCD_TXN_MAX_OPS):
            self.client.txn(success=[{"op": "put", "key": key, "value": value}
                                     for key, value in items[start:start + ETCD_TXN_MAX_OPS]])

    def append_batch(self, count: int) -> int:
        self.client.append([RECORD] * count)
        return count

    def close(self) -> None:
        with _quorum_clients_lock:
            client, users = _quorum_clients[self._key]
            if users > 1:
                _quorum_clients[self._key] = (client, users - 1)
                return
            del _quorum_clients[self._key]
        client.close()


_channels: dict[int, Any] = {}
_channels_lock = threading.Lock()


class EtcdGrpcDriver:
    """etcd's KV service over gRPC. The threads of a process share one channel per member
    (one HTTP/2 connection carrying concurrent calls), as etcd's own clients do."""

    def __init__(self, port: int, timeout_s: float) -> None:
        if not GRPC_AVAILABLE:
            raise RuntimeError("etcd over gRPC needs the bench extra: "
                               "pip install -e '.[bench]'")
        with _channels_lock:
            channel = _channels.get(port)
            if channel is None:
                channel = _channels[port] = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.pb = rpc_pb2
        self.kv = rpc_pb2_grpc.KVStub(channel)
        self.timeout_s = timeout_s

    def put(self, key: str, value: str) -> None:
        self.kv.Put(self.pb.PutRequest(key=key.encode(), value=value.encode()),
                    timeout=self.timeout_s)

    def get(self, key: str) -> None:
        self.kv.Range(self.pb.RangeRequest(key=key.encode()), timeout=self.timeout_s)

    def put_many(self, items: Sequence[tuple[str, str]]) -> None:
        for start in range(0, len(items), ETCD_TXN_MAX_OPS):
            ops = [self.pb.RequestOp(request_put=self.pb.PutRequest(key=k.encode(),
                                                                      value=v.encode()))
                   for k, v in items[start:start + ETCD_TXN_MAX_OPS]]
            self.kv.Txn(self.pb.TxnRequest(success=ops), timeout=self.timeout_s)

    def append_batch(self, count: int) -> int:
        prefix = f"rec-{os.getpid()}-{threading.get_ident()}-{time.perf_counter_ns()}"
        self.put_many([(f"{prefix}-{i}", RECORD.decode()) for i in range(count)])
        return count

    def close(self) -> None:
        pass  # the channel is the process's


class GatewayError(Exception):
    pass


class EtcdGatewayDriver:
    """etcd's HTTP/JSON gateway (grpc-gateway) on a keep-alive connection."""

    def __init__(self, port: int, timeout_s: float) -> None:
        self.port = port
        self.timeout_s = timeout_s
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)

    def _post(self, path: str, document: dict[str, Any]) -> None:
        try:
            self.conn.request("POST", path, body=json.dumps(document).encode())
            response = self.conn.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                                   timeout=self.timeout_s)
            raise
        if response.status != 200:
            raise GatewayError(f"{path}: {response.status} {body[:200]!r}")

    def put(self, key: str, value: str) -> None:
        self._post("/v3/kv/put", {"key": _b64(key), "value": _b64(value)})

    def get(self, key: str) -> None:
        self._post("/v3/kv/range", {"key": _b64(key)})

    def put_many(self, items: Sequence[tuple[str, str]]) -> None:
        for start in range(0, len(items), ETCD_TXN_MAX_OPS):
            ops = [{"request_put": {"key": _b64(k), "value": _b64(v)}}
                   for k, v in items[start:start + ETCD_TXN_MAX_OPS]]
            self._post("/v3/kv/txn", {"success": ops})

    def append_batch(self, count: int) -> int:
        prefix = f"rec-{os.getpid()}-{threading.get_ident()}-{time.perf_counter_ns()}"
        self.put_many([(f"{prefix}-{i}", RECORD.decode()) for i in range(count)])
        return count

    def close(self) -> None:
        self.conn.close()


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# --- the load harness ------------------------------------------------------------------------

@dataclass(frozen=True)
class Load:
    """What each client thread does in a timed run."""

    op: str  # "put", "get" (linearizable), "append" (a batch of ``batch`` records)
    batch: int = 1000
    key_space: int = 0  # get: keys k0 .. k<key_space - 1>, at random


def _run_threads(target: Target, load: Load, threads: int, *, start_at: float, seconds: float,
                 tag: str) -> tuple[int, int, list[float]]:
    """In one client process: ``threads`` clients run ``load`` from ``start_at`` (wall clock)
    for ``seconds``. Returns (operations, errors, latencies in ms) of what ended in time."""
    clients = [target.connect() for _ in range(threads)]
    done = [0] * threads
    errors = [0] * threads
    latencies: list[list[float]] = [[] for _ in range(threads)]
    end_at = start_at + seconds

    def worker(index: int) -> None:
        client = clients[index]
        chooser = random.Random(f"{tag}-{index}")
        operation: Callable[[int], int]
        if load.op == "put":
            def operation(n: int) -> int:
                client.put(f"{tag}-{index}-{n}", VALUE)
                return 1
        elif load.op == "get":
            def operation(n: int) -> int:
                client.get(f"k{chooser.randrange(load.key_space)}")
                return 1
        else:
            def operation(n: int) -> int:
                return client.append_batch(load.batch)
        # One call before the clock starts: connections are made outside the measured time
        # (256 connections at once can overflow a listen backlog: a SYN retried after 1 s).
        with contextlib.suppress(Exception):
            operation(-1)
        time.sleep(max(0.0, start_at - time.time()))
        n = 0
        while time.time() < end_at:  # the wall clock: the processes share the window
            started = time.perf_counter()
            try:
                count = operation(n)
            except Exception:  # counted: a refused or timed-out call is not a success
                errors[index] += 1
                time.sleep(0.01)
                continue
            latency_ms = (time.perf_counter() - started) * 1000
            if time.time() <= end_at:
                done[index] += count
                latencies[index].append(latency_ms)
            n += 1

    _each_in_a_thread(worker, threads)
    for client in clients:
        client.close()
    return sum(done), sum(errors), [x for per in latencies for x in per]


def _each_in_a_thread(worker: Callable[[int], None], threads: int) -> None:
    """Run ``worker(0)`` .. ``worker(threads - 1)`` at once, each in its thread, until all end."""
    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()


def _spread(clients: int, processes: int) -> list[int]:
    processes = max(1, min(processes, clients))
    return [clients // processes + (1 if i < clients % processes else 0)
            for i in range(processes)]


def etcd_member_has(port: int, key: str) -> bool:
    """Whether the etcd member on ``port`` has ``key`` (a serializable range: its own copy)."""
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        answer = rpc_pb2_grpc.KVStub(channel).Range(
            rpc_pb2.RangeRequest(key=key.encode(), serializable=True), timeout=1)
        return len(answer.kvs) == 1
    except grpc.RpcError:
        return False
    finally:
        channel.close()


# The ports a benchmark takes above its base port: a cluster every 100 ports, each on the first
# six (the quorum: three client and three controller ports; etcd: three client ports, and three
# peer ports from the tenth).
CLUSTER_PORTS = (*range(6), *range(10, 13))


def pick_base_port(clusters: int = 6, attempts: int = 200) -> int:
    """A random base port whose clusters' ports are all free now (other programs on the machine
    take ports too), below Linux's default ephemeral range (32768 up), which outgoing
    connections take from."""
    for _ in range(attempts):
        base = random.randrange(20000, 32768 - 100 * clusters, 10)
        ports = [base + 100 * c + p for c in range(clusters) for p in CLUSTER_PORTS]
        if all(_port_free(port) for port in ports):
            return base
    raise RuntimeError("no free ports found in 20000-32767")


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        # As the servers bind: a port left in TIME_WAIT by a closed connection is free to them.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def client_pool(processes: int) -> concurrent.futures.ProcessPoolExecutor:
    # spawn: the bench process has threads (and maybe gRPC's), which fork would copy badly.
    return concurrent.futures.ProcessPoolExecutor(
        processes, mp_context=multiprocessing.get_context("spawn"))


def _run_threads_timed(target: Target, load: Load, threads: int, *, start_at: float,
                       seconds: float, tag: str) -> tuple[int, int, list[float], float]:
    """``_run_threads``, and the CPU seconds this client process used (its connections and one
    call per client before the clock starts included: little beside the run)."""
    before = time.process_time()
    done, errors, latencies = _run_threads(target, load, threads, start_at=start_at,
                                           seconds=seconds, tag=tag)
    return done, errors, latencies, time.process_time() - before


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user and system, every thread) a process has used so far; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_load(target: Target, load: Load, clients: int, seconds: float,
               processes: int, *, server_pids: Sequence[int] = ()) -> dict[str, Any]:
    """``clients`` clients over ``processes`` processes run ``load`` for ``seconds``: the rate
    of operations (records, for appends) per second, the calls' p50/p99 latency, and the CPU
    per call of the clients and of the servers (``server_pids``): on a machine with few cores
    clients and servers share them, so what a client library costs counts too."""
    spread = _spread(clients, processes)
    with client_pool(len(spread)) as pool:
        # Started a moment later than now, so that every process has connected by then.
        start_at = time.time() + 2.0 + 0.5 * len(spread)
        futures = [pool.submit(_run_threads_timed, target, load, threads, start_at=start_at,
                               seconds=seconds, tag=f"{load.op}-{time.time_ns()}-{i}")
                   for i, threads in enumerate(spread)]
        time.sleep(max(0.0, start_at - time.time()))
        servers_before = sum(process_cpu_s(pid) for pid in server_pids)
        results = [future.result() for future in futures]
        servers_cpu = sum(process_cpu_s(pid) for pid in server_pids) - servers_before
    operations = sum(r[0] for r in results)
    latencies = sorted(x for r in results for x in r[2])
    calls = max(1, len(latencies))
    return {
        "clients": clients, "processes": len(spread),
        "per_s": operations / seconds,
        "p50_ms": statistics.median(latencies) if latencies else None,
        "p99_ms": percentile(latencies, 0.99),
        "calls": len(latencies), "errors": sum(r[1] for r in results),
        "client_cpu_us_per_call": sum(r[3] for r in results) / calls * 1e6,
        "server_cpu_us_per_call": servers_cpu / calls * 1e6 if server_pids else None,
    }


def _load_share(target: Target, keys: Sequence[int], chunk: int, threads: int) -> int:
    """In one client process: write keys k<i> (100-byte values), ``chunk`` keys per call."""
    clients = [target.connect(timeout_s=30) for _ in range(threads)]

    def worker(index: int) -> None:
        mine = keys[index::threads]
        for start in range(0, len(mine), chunk):
            items = [(f"k{i}", VALUE) for i in mine[start:start + chunk]]
            for attempt in range(5):
                try:
                    clients[index].put_many(items)
                    break
                except Exception:
                    if attempt == 4:
                        raise
                    time.sleep(0.5)

    _each_in_a_thread(worker, threads)
    for client in clients:
        client.close()
    return len(keys)


def load_keys(target: Target, keys: int, clients: int, processes: int,
              chunk: int = ETCD_TXN_MAX_OPS) -> float:
    """Write keys k0 .. k<keys - 1> with 100-byte values from ``clients`` clients in
    ``processes`` processes, ``chunk`` puts per transaction (``put_many``, on either system);
    the seconds it took."""
    spread = _spread(clients, processes)
    started = time.monotonic()
    with client_pool(len(spread)) as pool:
        futures = [pool.submit(_load_share, target, range(i, keys, len(spread)), chunk,
                               threads)
                   for i, threads in enumerate(spread)]
        for future in futures:
            future.result()
    return time.monotonic() - started


@dataclass
class SequentialTarget:
    """A system for ``sequential_latencies``: where to put, and the processes whose CPU counts."""

    target: Target
    server_pids: Sequence[int] = ()
    leader_pid: int | None = None


@dataclass
class _SequentialRun:
    client: Client
    samples: list[float] = field(default_factory=list)
    client_cpu_s: float = 0.0
    servers_cpu_s: dict[int, float] = field(default_factory=dict)


# Puts each client makes before its first measured one (a new connection's first calls are slow).
_SEQUENTIAL_WARM_UP = 20


def sequential_latencies(systems: Mapping[str, SequentialTarget], count: int,
                         rounds: int = 5) -> dict[str, dict[str, Any]]:
    """One client a system, one put at a time, ``count`` puts: each put's commit latency, and
    the CPU each put cost the servers, the leader among them, and the client. The systems take
    turns, ``rounds`` times, so that what else the machine runs meanwhile weighs on each alike.
    A lone put runs on cold caches at every hop, so what it costs is mostly what it waits for."""
    runs = {kind: _SequentialRun(system.target.connect()) for kind, system in systems.items()}
    try:
        for run in runs.values():
            for i in range(_SEQUENTIAL_WARM_UP):
                run.client.put(f"seq-warm-{i}", VALUE)
        for turn in range(rounds):
            for kind, run in runs.items():
                _sequential_turn(run, systems[kind], range(turn * count // rounds,
                                                           (turn + 1) * count // rounds))
    finally:
        for run in runs.values():
            run.client.close()
    return {kind: _sequential_result(run, systems[kind]) for kind, run in runs.items()}


def _sequential_turn(run: _SequentialRun, system: SequentialTarget, keys: range) -> None:
    servers_before = {pid: process_cpu_s(pid) for pid in system.server_pids}
    client_before = time.thread_time()
    for i in keys:
        started = time.perf_counter()
        run.client.put(f"seq-{i}", VALUE)
        run.samples.append((time.perf_counter() - started) * 1000)
    run.client_cpu_s += time.thread_time() - client_before
    for pid, before in servers_before.items():
        run.servers_cpu_s[pid] = run.servers_cpu_s.get(pid, 0.0) + process_cpu_s(pid) - before


def _sequential_result(run: _SequentialRun, system: SequentialTarget) -> dict[str, Any]:
    samples = sorted(run.samples)
    calls = max(1, len(samples))
    leader_s = (run.servers_cpu_s.get(system.leader_pid)
                if system.leader_pid is not None else None)
    return {"p50_ms": statistics.median(samples) if samples else None,
            "p99_ms": percentile(samples, 0.99), "count": len(samples),
            "client_cpu_us_per_call": run.client_cpu_s / calls * 1e6,
            "server_cpu_us_per_call": (sum(run.servers_cpu_s.values()) / calls * 1e6
                                       if system.server_pids else None),
            "leader_cpu_us_per_call": leader_s / calls * 1e6 if leader_s is not None else None}


def percentile(ordered: Sequence[float], fraction: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, int(len(ordered) * fraction) - 1))]


def rss_mb(pids: Sequence[int]) -> list[float]:
    sizes = []
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    sizes.append(int(line.split()[1]) / 1024)
    return sizes
