"""Benchmark: QuorumClient over HTTP against QuorumClient over the binary stream, on one 3-voter
quorum on loopback (fsync on), runs alternating (http, binary, http, binary, ...).

    python bench/client_protocols.py [--seconds 5] [--rounds 2] [--json results.json]

Per run: sequential 100-byte puts from one client (p50/p99 ms, and the leader process's CPU time
per put, from /proc: what the protocol costs the node), puts/s with 64 concurrent
clients (a thread and a client each), and puts/s of one client pipelining (``put_many``, 64 in
flight; over HTTP put_many is sequential puts). The same client code on both sides: only the
protocol differs. A measurement, not a test: nothing here asserts a number.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from quorum_node.cli.local_quorum import LocalCluster, prepare_local_cluster
from quorum_node.client import PROTOCOLS, QuorumClient, QuorumClientError

VALUE = "v" * 100
CLIENTS = 64
WINDOW = 64


def wait_for_leader(bootstrap: str, timeout_s: float = 30) -> None:
    """Until a put succeeds. (Each client then finds the leader with its first put, which is
    never one of the samples.)"""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with QuorumClient(bootstrap, timeout_s=5, protocol="http") as client:
                client.put("warmup", VALUE)
                return
        except QuorumClientError:
            time.sleep(0.2)
    raise RuntimeError(f"no leader within {timeout_s} s")


def cpu_s(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def leader_pid(cluster: LocalCluster, ports: list[int]) -> int:
    for port in ports:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            connection.request("GET", "/v1/quorum")
            response = connection.getresponse()
            body = response.read()
        except OSError:
            continue
        finally:
            connection.close()
        if response.status == 200:
            return cluster.processes[json.loads(body)["leader_id"]].pid
    raise RuntimeError("no node describes the quorum")


def sequential(leader: str, protocol: str, count: int, run: int,
               pid: int) -> dict[str, float]:
    samples = []
    with QuorumClient(leader, protocol=protocol) as client:
        client.put("seq-warmup", VALUE)  # the connection is made outside the samples
        cpu_before = cpu_s(pid)
        for i in range(count):
            started = time.perf_counter()
            client.put(f"seq-{run}-{i}", VALUE)
            samples.append((time.perf_counter() - started) * 1000)
        cpu_after = cpu_s(pid)
    samples.sort()
    return {"p50_ms": statistics.median(samples),
            "p99_ms": samples[int(len(samples) * 0.99) - 1],
            "leader_cpu_ms_per_put": (cpu_after - cpu_before) * 1000 / count}


def concurrent(leader: str, protocol: str, seconds: float, run: int) -> float:
    done = [0] * CLIENTS
    stop = threading.Event()

    def worker(index: int) -> None:
        with QuorumClient(leader, protocol=protocol) as client:
            client.put(f"c{run}-{index}-warmup", VALUE)
            while not stop.is_set():
                client.put(f"c{run}-{index}-{done[index]}", VALUE)
                done[index] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(CLIENTS)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    return sum(done) / (time.perf_counter() - started)


def pipelined(leader: str, protocol: str, seconds: float, run: int) -> float:
    done = 0
    with QuorumClient(leader, protocol=protocol) as client:
        client.put(f"p{run}-warmup", VALUE)
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            client.put_many([(f"p{run}-{done + i}", VALUE) for i in range(WINDOW)],
                            window=WINDOW)
            done += WINDOW
        return done / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5, help="length of throughput runs")
    parser.add_argument("--sequential", type=int, default=1000, help="sequential puts a run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each protocol")
    parser.add_argument("--base-port", type=int, default=29491)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="quorum-bench-protocols-"))
    nodes = prepare_local_cluster(directory, 3, base_port=args.base_port)
    cluster = LocalCluster(nodes, out=open(os.devnull, "w"))  # noqa: SIM115
    cluster.start()
    runs: list[dict[str, Any]] = []
    try:
        bootstrap = ",".join(node.config.client_listeners[0].address for node in nodes)
        wait_for_leader(bootstrap)
        leader = bootstrap
        pid = leader_pid(cluster, [node.config.client_listeners[0].port for node in nodes])
        for run in range(args.rounds * len(PROTOCOLS)):
            protocol = ("http", "binary")[run % 2]
            result: dict[str, Any] = {"protocol": protocol}
            result.update(sequential(leader, protocol, args.sequential, run, pid))
            result["puts_per_s_64_clients"] = concurrent(leader, protocol, args.seconds, run)
            result["puts_per_s_pipelined"] = pipelined(leader, protocol, args.seconds, run)
            runs.append(result)
            print(f"{protocol:>6}  sequential p50 {result['p50_ms']:.2f} ms  p99 "
                  f"{result['p99_ms']:.2f} ms  leader CPU "
                  f"{result['leader_cpu_ms_per_put']:.2f} ms/put  64 clients "
                  f"{result['puts_per_s_64_clients']:.0f} puts/s  pipelined "
                  f"{result['puts_per_s_pipelined']:.0f} puts/s", flush=True)
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
