"""Benchmark: a 3-voter quorum on loopback (fsync on) against etcd in the same run.

    python bench/bench.py [--seconds 10] [--json results.json]

Workloads, the same for both systems, through each one's HTTP API with keep-alive connections:
sequential commit latency of 100-byte key-value puts from one client (p50/p99), put throughput
with 64 concurrent clients, batched append throughput (records/s, 100-byte records; etcd: puts in
transactions of 128 operations, its largest by default), and failover (kill -9 of the leader
until the next successful write), with default timeouts and with election/fetch timeouts of
500/1000 ms. Also each node's RSS. etcd runs when an ``etcd`` binary is on PATH (Debian's
etcd-server); otherwise its columns are empty. Prints a table and writes JSON.

This is a measurement, not a test: nothing here asserts a number.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quorum_node.cli.node import LocalCluster, prepare_local_cluster
from quorum_node.node.config import Setting

VALUE = "v" * 100
CLIENTS = 64


class Http:
    """One keep-alive HTTP connection."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def call(self, method: str, path: str, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        try:
            self.conn.request(method, path, body=body, headers=headers or {})
            response = self.conn.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            raise


@dataclass
class System:
    """What the workloads need from a system under test."""

    name: str
    ports: list[int]
    pids: dict[int, int]
    leader_port: Callable[[], int | None]
    put: Callable[[Http, str, str], bool]
    append_batch: Callable[[Http, int], int]  # records written, 0 on failure
    stop: Callable[[], None]
    kill: Callable[[int], None] = field(default=lambda pid: os.kill(pid, signal.SIGKILL))


# --- quorum-node -----------------------------------------------------------------------------

def start_quorum(directory: Path, base_port: int, election_ms: int | None,
                 fetch_ms: int | None) -> System:
    settings: dict[str, Setting] = {}
    if election_ms is not None and fetch_ms is not None:
        settings = {
            "controller.quorum.election.timeout.ms": Setting(str(election_ms), "bench"),
            "controller.quorum.fetch.timeout.ms": Setting(str(fetch_ms), "bench"),
        }
    nodes = prepare_local_cluster(directory, 3, base_port=base_port, settings=settings)
    cluster = LocalCluster(nodes, out=open(os.devnull, "w"))  # noqa: SIM115
    cluster.start()
    ports = [node.config.client_listeners[0].port for node in nodes]

    def leader_port() -> int | None:
        for port in ports:
            with contextlib.suppress(OSError, http.client.HTTPException):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                conn.request("GET", "/v1/quorum")
                response = conn.getresponse()
                body = response.read()
                conn.close()
                if response.status == 200:
                    return ports[json.loads(body)["leader_id"] - 1]
        return None

    def put(client: Http, key: str, value: str) -> bool:
        status, _ = client.call("PUT", f"/v1/kv/{key}", value.encode())
        return status == 200

    def append_batch(client: Http, count: int) -> int:
        record = b"r" * 100
        body = (len(record).to_bytes(4, "big") + record) * count
        status, _ = client.call("POST", "/v1/records", body,
                                {"Content-Type": "application/octet-stream"})
        return count if status == 200 else 0

    def stop() -> None:
        cluster.stop()

    pids = {node.config.client_listeners[0].port: cluster.processes[node.node_id].pid
            for node in nodes}
    return System("quorum-node", ports, pids, leader_port, put, append_batch, stop)


# --- etcd --------------------------------------------------------------------------------------

def start_etcd(directory: Path, base_port: int, election_ms: int | None) -> System | None:
    binary = shutil.which("etcd")
    if binary is None:
        return None
    names = [f"e{i}" for i in range(3)]
    client_ports = [base_port + i for i in range(3)]
    peer_ports = [base_port + 10 + i for i in range(3)]
    initial = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(names, peer_ports, strict=True))
    processes: dict[int, subprocess.Popen[bytes]] = {}
    for name, client, peer in zip(names, client_ports, peer_ports, strict=True):
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
        log = (directory / f"{name}.log").open("wb")
        processes[client] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True)

    def status(port: int) -> dict[str, Any] | None:
        with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("POST", "/v3/maintenance/status", b"{}")
            response = conn.getresponse()
            body = response.read()
            conn.close()
            if response.status == 200:
                return dict(json.loads(body))
        return None

    def leader_port() -> int | None:
        for port in client_ports:
            found = status(port)
            if found is not None and found["header"]["member_id"] == found.get("leader"):
                return port
        return None

    def put(client: Http, key: str, value: str) -> bool:
        body = json.dumps({"key": base64.b64encode(key.encode()).decode(),
                           "value": base64.b64encode(value.encode()).decode()}).encode()
        status_code, _ = client.call("POST", "/v3/kv/put", body)
        return status_code == 200

    def append_batch(client: Http, count: int) -> int:
        record = base64.b64encode(b"r" * 100).decode()
        written = 0
        while written < count:
            n = min(128, count - written)
            ops = [{"request_put": {"key": base64.b64encode(f"rec-{time.perf_counter_ns()}-{i}"
                                                            .encode()).decode(),
                                    "value": record}} for i in range(n)]
            status_code, _ = client.call("POST", "/v3/kv/txn",
                                         json.dumps({"success": ops}).encode())
            if status_code != 200:
                return written
            written += n
        return written

    def stop() -> None:
        for process in processes.values():
            if process.poll() is None:
                process.terminate()
        for process in processes.values():
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()

    pids = {port: process.pid for port, process in processes.items()}
    return System("etcd", client_ports, pids, leader_port, put, append_batch, stop)


# --- workloads ---------------------------------------------------------------------------------

def wait_for_leader(system: System, timeout_s: float = 30) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        port = system.leader_port()
        if port is not None:
            client = Http(port)
            with contextlib.suppress(OSError, http.client.HTTPException):
                if system.put(client, "warmup", VALUE):
                    return port
        time.sleep(0.05)
    raise RuntimeError(f"{system.name}: no leader within {timeout_s} s")


def sequential_latency(system: System, port: int, count: int) -> dict[str, float]:
    client = Http(port)
    samples = []
    for i in range(count):
        started = time.perf_counter()
        if not system.put(client, f"seq-{i}", VALUE):
            raise RuntimeError(f"{system.name}: a sequential put failed")
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return {"p50_ms": statistics.median(samples),
            "p99_ms": samples[int(len(samples) * 0.99) - 1], "count": len(samples)}


def _run_workers(worker: Callable[[int], None], count: int, seconds: float,
                 stop: threading.Event) -> float:
    """Run ``count`` workers for ``seconds``; return the elapsed time."""
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def concurrent_throughput(system: System, port: int, seconds: float) -> float:
    done = [0] * CLIENTS
    stop = threading.Event()

    def worker(index: int) -> None:
        client = Http(port)
        while not stop.is_set():
            with contextlib.suppress(OSError, http.client.HTTPException):
                if system.put(client, f"c{index}-{done[index]}", VALUE):
                    done[index] += 1

    elapsed = _run_workers(worker, CLIENTS, seconds, stop)
    return sum(done) / elapsed


def batched_append(system: System, port: int, seconds: float) -> float:
    written = [0] * 4
    stop = threading.Event()

    def worker(index: int) -> None:
        client = Http(port)
        while not stop.is_set():
            written[index] += system.append_batch(client, 1000)

    elapsed = _run_workers(worker, 4, seconds, stop)
    return sum(written) / elapsed


def failover(system: System, port: int) -> float:
    """kill -9 the leader, then put to whichever node answers until one put succeeds."""
    system.kill(system.pids[port])
    killed = time.perf_counter()
    survivors = [p for p in system.ports if p != port]
    clients = {p: Http(p) for p in survivors}
    while time.perf_counter() - killed < 60:
        leader = system.leader_port()
        if leader is not None and leader in clients:
            with contextlib.suppress(OSError, http.client.HTTPException):
                if system.put(clients[leader], "after-failover", VALUE):
                    return time.perf_counter() - killed
        time.sleep(0.005)
    raise RuntimeError(f"{system.name}: no write within 60 s of the failover")


def rss_mb(pids: dict[int, int]) -> list[float]:
    sizes = []
    for pid in pids.values():
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    sizes.append(int(line.split()[1]) / 1024)
    return sizes


@contextlib.contextmanager
def running(start: Callable[[Path], System | None]) -> Iterator[System | None]:
    directory = Path(tempfile.mkdtemp(prefix="quorum-bench-"))
    system = start(directory)
    try:
        yield system
    finally:
        if system is not None:
            system.stop()
        shutil.rmtree(directory, ignore_errors=True)


def measure(start: Callable[[Path], System | None], seconds: float,
            sequential: int) -> dict[str, Any] | None:
    with running(start) as system:
        if system is None:
            return None
        port = wait_for_leader(system)
        result: dict[str, Any] = {
            "sequential": sequential_latency(system, port, sequential),
            "concurrent_puts_per_s": concurrent_throughput(system, port, seconds),
            "batched_records_per_s": batched_append(system, port, seconds),
            "rss_mb": rss_mb(system.pids),
        }
        result["failover_s"] = failover(system, port)
        return result


def failover_only(start: Callable[[Path], System | None]) -> float | None:
    with running(start) as system:
        if system is None:
            return None
        return failover(system, wait_for_leader(system))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10, help="length of throughput runs")
    parser.add_argument("--sequential", type=int, default=1000, help="sequential puts")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--base-port", type=int, default=29091)
    args = parser.parse_args()
    base = args.base_port
    results: dict[str, Any] = {
        "quorum-node": measure(lambda d: start_quorum(d, base, None, None), args.seconds,
                               args.sequential),
        "etcd": measure(lambda d: start_etcd(d, base + 100, None), args.seconds,
                        args.sequential),
    }
    results["quorum-node"]["failover_fast_s"] = failover_only(
        lambda d: start_quorum(d, base + 200, 500, 1000))
    if results["etcd"] is not None:
        results["etcd"]["failover_fast_s"] = failover_only(
            lambda d: start_etcd(d, base + 300, 500))
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def print_table(results: dict[str, Any]) -> None:
    ours, theirs = results["quorum-node"], results["etcd"]
    rows = [
        ("sequential put p50 (ms)", ours["sequential"]["p50_ms"],
         theirs and theirs["sequential"]["p50_ms"]),
        ("sequential put p99 (ms)", ours["sequential"]["p99_ms"],
         theirs and theirs["sequential"]["p99_ms"]),
        (f"puts/s, {CLIENTS} clients", ours["concurrent_puts_per_s"],
         theirs and theirs["concurrent_puts_per_s"]),
        ("batched append records/s", ours["batched_records_per_s"],
         theirs and theirs["batched_records_per_s"]),
        ("failover, default timeouts (s)", ours["failover_s"], theirs and theirs["failover_s"]),
        ("failover, 500/1000 ms (s)", ours["failover_fast_s"],
         theirs and theirs["failover_fast_s"]),
        ("RSS per node (MB)", max(ours["rss_mb"]), theirs and max(theirs["rss_mb"])),
    ]
    print(f"{'':34}{'quorum-node':>14}{'etcd':>14}{'ratio':>10}")
    for label, mine, other in rows:
        ratio = f"{mine / other:.2f}x" if other else "-"
        other_text = f"{other:.2f}" if other else "-"
        print(f"{label:34}{mine:>14.2f}{other_text:>14}{ratio:>10}")


if __name__ == "__main__":
    sys.exit(main())
