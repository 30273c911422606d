"""Cost growth: what a larger log and a larger store cost the quorum, with etcd beside it.

    python bench/growth.py [--keys 1000000] [--log-mib 1024] [--json growth.json]
    python bench/growth.py --keys 100000 --log-mib 100     # a quick run (1.5 min here)

Each figure is a measurement, printed and written as JSON; nothing asserts one.

- ``log``: a 3-voter quorum with snapshots off is given ``--log-mib`` MiB of 1 KiB records
  (batches of 1000), then one follower is stopped (SIGTERM) and started again: the seconds from
  its start until its own store serves a key written after the records (a stale read on it).
- ``kv``: a 3-voter quorum (a snapshot every 200,000 records, fewer for fewer keys; 8 MiB
  segments) is loaded with ``--keys`` keys of 100-byte values (from 8 clients, transactions of
  128 puts, as etcd is: ``load_keys_per_s``); then each node's RSS; linearizable reads/s
  (p50/p99, CPU per read) from 64 clients in ``--client-processes`` processes; puts/s with one
  put per call from 8 clients (``puts_8``: the same load without transactions); a follower
  restarted over its snapshot and log tail (start until it serves the last key; its log's
  "loaded snapshot" line says how long the snapshot took), and its RSS after that; and a new
  replica's catch-up through the leader's snapshot (``snapshot_catchup.replace_and_catch_up``)
  in keys/s and MB/s.
- ``etcd`` (when ``etcd`` and the bench extra are installed): a 3-member etcd given the same keys
  (over gRPC, transactions of 128 puts), its RSS, linearizable ranges/s from 64 clients over
  gRPC, puts/s with one put per call from 8 clients, and a member's restart until it serves the
  last key (a serializable range on it).

Restarts also report the CPU seconds the new process used until it served: a shared machine
stretches the wall time, much less that.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from drivers import (
    ETCD_GRPC,
    GRPC_AVAILABLE,
    QUORUM,
    VALUE,
    Load,
    Target,
    etcd_member_has,
    load_keys,
    pick_base_port,
    process_cpu_s,
    rss_mb,
    timed_load,
)
from snapshot_catchup import replace_and_catch_up, snapshot_sizes

from bench import System, running, start_etcd, start_quorum, wait_for_leader
from quorum_node.client import QuorumClient
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR

READ_CLIENTS = 64
LOAD_CLIENTS = 8
LOG_RECORD = b"x" * 1024
LOG_BATCH = 1000


def serves(port: int, key: str) -> bool:
    """Whether the quorum node on ``port`` has ``key`` in its own store."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        conn.request("GET", f"/v1/kv/{key}?stale=true")
        status = conn.getresponse().status
        conn.close()
        return status == 200
    except (OSError, http.client.HTTPException):
        return False


def restart_time(system: System, port: int, ready: Callable[[], bool]) -> tuple[float, float]:
    """Stop the member on ``port`` gracefully, start it, and time it until ``ready()``: wall
    seconds, and the CPU seconds the new process used by then."""
    system.stop_member(port)
    started = time.monotonic()
    system.start_member(port)
    while not ready():
        if time.monotonic() - started > 600:
            raise RuntimeError(f"{system.name}: the member did not come back in 600 s")
        time.sleep(0.02)
    return time.monotonic() - started, process_cpu_s(system.pids[port])


def follower(system: System, leader: int) -> int:
    return next(p for p in system.ports if p != leader)


def log_bytes(log_dir: Path) -> int:
    return sum(p.stat().st_size for p in (log_dir / METADATA_PARTITION_DIR).glob("*.log"))


def log_growth(base_port: int, mib: int) -> dict[str, Any]:
    with running(lambda d: start_quorum(d, base_port,
                                        extra={"snapshot.interval.records": "0"})) as system:
        assert system is not None
        leader = wait_for_leader(system, QUORUM)
        batches = max(1, mib * (1 << 20) // (len(LOG_RECORD) * LOG_BATCH))
        print(f"quorum: appending {batches} batches of {LOG_BATCH} 1 KiB records",
              file=sys.stderr, flush=True)
        started = time.monotonic()

        def writer(share: int) -> None:
            with QuorumClient(f"127.0.0.1:{leader}", timeout_s=60) as client:
                for _ in range(share):
                    client.append([LOG_RECORD] * LOG_BATCH)

        threads = [threading.Thread(target=writer, args=(batches // 4 + (i < batches % 4),))
                   for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        write_s = time.monotonic() - started
        with QuorumClient(f"127.0.0.1:{leader}") as client:
            client.put("growth-end", VALUE)
        port = follower(system, leader)
        while not serves(port, "growth-end"):
            time.sleep(0.05)
        size = log_bytes(system.local_nodes[port].config.log_dir)
        print("quorum: restarting a follower", file=sys.stderr, flush=True)
        restart_s, restart_cpu_s = restart_time(system, port,
                                                lambda: serves(port, "growth-end"))
        return {"log_bytes": size, "write_s": write_s, "write_mb_s": size / write_s / 1e6,
                "restart_s": restart_s, "restart_cpu_s": restart_cpu_s,
                "rss_after_restart_mb": rss_mb([system.pids[port]])[0]}


def kv_growth(base_port: int, keys: int, seconds: float, processes: int) -> dict[str, Any]:
    # Snapshots often enough that a quick run has one too (1M keys: the default, 200,000),
    # and segments small enough that the log below a snapshot is deleted (as in
    # snapshot_catchup), so that a new replica is sent the snapshot.
    settings = {"snapshot.interval.records": str(min(200_000, max(1000, keys // 4))),
                "log.segment.bytes": str(8 << 20)}
    with running(lambda d: start_quorum(d, base_port, extra=settings)) as system:
        assert system is not None
        leader = wait_for_leader(system, QUORUM)
        target = system.target(QUORUM, leader)
        print(f"quorum: loading {keys:,} keys", file=sys.stderr, flush=True)
        load_s = load_keys(target, keys, LOAD_CLIENTS, processes)
        time.sleep(3)  # a snapshot may be being written
        result: dict[str, Any] = {"keys": keys, "load_s": load_s,
                                  "load_keys_per_s": keys / load_s,
                                  "rss_mb": rss_mb(list(system.pids.values()))}
        print("quorum: linearizable reads", file=sys.stderr, flush=True)
        result["reads_64"] = timed_load(target, Load("get", key_space=keys), READ_CLIENTS,
                                        seconds, processes,
                                        server_pids=list(system.pids.values()))
        result["puts_8"] = single_puts("quorum", system, target, seconds, processes)
        port = follower(system, leader)
        node = system.local_nodes[port]
        last = f"k{keys - 1}"
        print("quorum: restarting a follower", file=sys.stderr, flush=True)
        node.log_path.write_text("")
        result["restart_s"], result["restart_cpu_s"] = restart_time(
            system, port, lambda: serves(port, last))
        result["restart_log"] = [line for line in node.log_path.read_text().splitlines()
                                 if "loaded snapshot" in line]
        result["rss_after_restart_mb"] = rss_mb([system.pids[port]])[0]
        print("quorum: a new replica catches up", file=sys.stderr, flush=True)
        leader_dir = system.local_nodes[leader].config.log_dir
        size = max(snapshot_sizes(leader_dir), default=0)
        # What the new replica is sent: the leader's snapshot and the log after it.
        sent = size + log_bytes(leader_dir)
        caught_up = replace_and_catch_up(node, lambda: system.stop_member(port),
                                         lambda: system.start_member(port), last, size)
        caught_up["cpu_s"] = process_cpu_s(system.pids[port])
        caught_up["sent_bytes"] = sent
        caught_up["caught_up_mb_s"] = sent / caught_up["restart_to_caught_up_s"] / 1e6
        if "download_s" in caught_up:
            caught_up["download_keys_per_s"] = keys / caught_up["download_s"]
        caught_up["caught_up_keys_per_s"] = keys / caught_up["restart_to_caught_up_s"]
        result["catch_up"] = caught_up
        return result


def single_puts(name: str, system: System, target: Target, seconds: float,
                processes: int) -> dict[str, Any]:
    """One put per call from LOAD_CLIENTS clients for ``seconds`` (new keys of their own, a
    few thousand beside the loaded ones): the load's rate without transactions."""
    print(f"{name}: one put per call", file=sys.stderr, flush=True)
    return timed_load(target, Load("put"), LOAD_CLIENTS, seconds, processes,
                      server_pids=list(system.pids.values()))


def etcd_growth(base_port: int, keys: int, seconds: float, processes: int) -> dict[str, Any]:
    with running(lambda d: start_etcd(d, base_port)) as system:
        assert system is not None
        leader = wait_for_leader(system, ETCD_GRPC)
        target = system.target(ETCD_GRPC, leader)
        print(f"etcd: loading {keys:,} keys", file=sys.stderr, flush=True)
        load_s = load_keys(target, keys, LOAD_CLIENTS, processes)
        result: dict[str, Any] = {"keys": keys, "load_s": load_s,
                                  "load_keys_per_s": keys / load_s,
                                  "rss_mb": rss_mb(list(system.pids.values()))}
        print("etcd: linearizable ranges", file=sys.stderr, flush=True)
        result["reads_64"] = timed_load(target, Load("get", key_space=keys), READ_CLIENTS,
                                        seconds, processes,
                                        server_pids=list(system.pids.values()))
        result["puts_8"] = single_puts("etcd", system, target, seconds, processes)
        port = follower(system, leader)
        last = f"k{keys - 1}"
        print("etcd: restarting a follower", file=sys.stderr, flush=True)
        result["restart_s"], result["restart_cpu_s"] = restart_time(
            system, port, lambda: etcd_member_has(port, last))
        result["rss_after_restart_mb"] = rss_mb([system.pids[port]])[0]
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--log-mib", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=10, help="length of the read runs")
    parser.add_argument("--client-processes", type=int, default=4)
    parser.add_argument("--skip", action="append", default=[], choices=["log", "kv", "etcd"],
                        help="leave a part out (repeatable)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--base-port", type=int, default=None,
                        help="first of the loopback ports used (up to 300 above it are used too); "
                             "default: a random one with those free")
    args = parser.parse_args()
    if args.base_port is None:
        args.base_port = pick_base_port()
    results: dict[str, Any] = {}
    if "log" not in args.skip:
        results["log"] = log_growth(args.base_port, args.log_mib)
        print(json.dumps(results["log"]), flush=True)
    if "kv" not in args.skip:
        results["kv"] = kv_growth(args.base_port + 100, args.keys, args.seconds,
                                  args.client_processes)
        print(json.dumps(results["kv"]), flush=True)
    if "etcd" not in args.skip and shutil.which("etcd") and GRPC_AVAILABLE:
        results["etcd"] = etcd_growth(args.base_port + 200, args.keys, args.seconds,
                                      args.client_processes)
        print(json.dumps(results["etcd"]), flush=True)
    print_summary(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def print_summary(results: dict[str, Any]) -> None:
    log, kv, etcd = results.get("log"), results.get("kv"), results.get("etcd")

    def pick(part: dict[str, Any] | None, *path: str) -> float | None:
        value: Any = part
        for name in path:
            if not isinstance(value, dict) or name not in value:
                return None
            value = value[name]
        return float(value)

    keys = f"{kv['keys']:,} keys" if kv else "the keys"
    rows = [
        ("start over the log (s)", pick(log, "restart_s"), None),
        ("  CPU until serving (s)", pick(log, "restart_cpu_s"), None),
        (f"start over {keys} (s)", pick(kv, "restart_s"), pick(etcd, "restart_s")),
        ("  CPU until serving (s)", pick(kv, "restart_cpu_s"), pick(etcd, "restart_cpu_s")),
        ("load keys/s, 8 clients, 128-put txns", pick(kv, "load_keys_per_s"),
         pick(etcd, "load_keys_per_s")),
        ("puts/s, 8 clients, one put per call", pick(kv, "puts_8", "per_s"),
         pick(etcd, "puts_8", "per_s")),
        (f"RSS with {keys}, largest (MB)", max(kv["rss_mb"]) if kv else None,
         max(etcd["rss_mb"]) if etcd else None),
        ("linearizable reads/s, 64 clients", pick(kv, "reads_64", "per_s"),
         pick(etcd, "reads_64", "per_s")),
        ("  p50 (ms)", pick(kv, "reads_64", "p50_ms"), pick(etcd, "reads_64", "p50_ms")),
        ("  p99 (ms)", pick(kv, "reads_64", "p99_ms"), pick(etcd, "reads_64", "p99_ms")),
        ("  server CPU per read (us)", pick(kv, "reads_64", "server_cpu_us_per_call"),
         pick(etcd, "reads_64", "server_cpu_us_per_call")),
        ("  client CPU per read (us)", pick(kv, "reads_64", "client_cpu_us_per_call"),
         pick(etcd, "reads_64", "client_cpu_us_per_call")),
        ("new replica caught up (s)", pick(kv, "catch_up", "restart_to_caught_up_s"), None),
        ("  keys/s", pick(kv, "catch_up", "caught_up_keys_per_s"), None),
        ("  MB/s (snapshot and log sent)", pick(kv, "catch_up", "caught_up_mb_s"), None),
    ]
    print(f"{'':36}{'quorum-node':>14}{'etcd':>12}{'ratio':>8}")
    for label, mine, other in rows:
        ratio = f"{mine / other:.2f}x" if mine is not None and other else "-"
        print(f"{label:36}{_number(mine):>14}{_number(other):>12}{ratio:>8}")


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 1000 else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
