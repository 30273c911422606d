"""How fast a replaced replica catches up through a snapshot (KIP-630 FetchSnapshot).

Starts a 3-voter quorum on loopback that snapshots its key-value store and deletes the log below
the snapshots, loads it with KEYS values of VALUE_BYTES, then replaces a follower's disk (kill -9,
wipe, format with a new directory id, restart). The new replica is sent the leader's snapshot,
downloads it, checks it and loads it. Reported: the snapshot's size; the download (from the
"fetching snapshot" to the "loaded snapshot" log line of the new node) and the whole catch-up
(restart until it serves the last key) in MB/s and records/s; and, for scale, this machine's
fsynced disk write speed and loopback TCP speed for the same number of bytes.

    python bench/snapshot_catchup.py [--keys 20000] [--value-bytes 4096] [--json out.json]

A measurement, not a test: nothing asserts a figure.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from quorum_node.cli.local_quorum import LocalNode, node_command, prepare_local_cluster
from quorum_node.node.config import Setting
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR
from quorum_node.storage.meta_properties import format_log_dir

BASE_PORT = 19391
SNAPSHOT_LINE = re.compile(r"^(\S+ \S+) .*(fetching snapshot|loaded snapshot)")


def call(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def leader_port(ports: list[int]) -> int | None:
    for port in ports:
        try:
            status, body = call(port, "GET", "/v1/quorum")
        except OSError:
            continue
        if status == 200:
            leader_id: int = json.loads(body)["leader_id"]
            return ports[leader_id - 1]
    return None


def start(node: LocalNode) -> subprocess.Popen[bytes]:
    with node.log_path.open("ab") as log:
        return subprocess.Popen(node_command(node), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})


def load(port: int, keys: int, value_bytes: int) -> float:
    """Put every key (32 clients, keep-alive); seconds taken."""
    value = b"v" * value_bytes
    started = time.monotonic()

    def worker(index: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for key in range(index, keys, 32):
            conn.request("PUT", f"/v1/kv/k{key}", value)
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"put k{key}: {response.status}")
        conn.close()

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        list(pool.map(worker, range(32)))
    return time.monotonic() - started


def snapshot_sizes(log_dir: Path) -> list[int]:
    return [p.stat().st_size for p in (log_dir / METADATA_PARTITION_DIR).glob("*.checkpoint")]


def disk_write_mb_s(directory: Path, size: int) -> float:
    """Write ``size`` bytes in 8 MiB chunks and fsync: the disk's speed for this much."""
    path = directory / "disk-speed.tmp"
    chunk = os.urandom(8 << 20)
    started = time.monotonic()
    with path.open("wb") as out:
        written = 0
        while written < size:
            written += out.write(chunk[: size - written])
        out.flush()
        os.fsync(out.fileno())
    seconds = time.monotonic() - started
    path.unlink()
    return size / seconds / 1e6


def loopback_mb_s(size: int) -> float:
    """Send ``size`` bytes over a loopback TCP connection."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def sink() -> None:
        conn, _ = server.accept()
        while conn.recv(1 << 20):
            pass
        conn.close()

    thread = threading.Thread(target=sink)
    thread.start()
    chunk = b"x" * (8 << 20)
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as client:
        sent = 0
        while sent < size:
            client.sendall(chunk[: size - sent])
            sent += min(len(chunk), size - sent)
    thread.join()
    server.close()
    return size / (time.monotonic() - started) / 1e6


def log_times(log_path: Path) -> dict[str, float]:
    """Timestamps (seconds) of the new node's snapshot log lines."""
    found: dict[str, float] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        match = SNAPSHOT_LINE.match(line)
        if match:
            stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            found.setdefault(match.group(2), stamp)  # the first of each
    return found


def replace_and_catch_up(victim: LocalNode, stop: Callable[[], object],
                         start_node: Callable[[], None], last_key: str,
                         snapshot_bytes: int) -> dict[str, Any]:
    """Stop ``victim``, give it a new empty disk, start it, and time it until its own store
    serves ``last_key`` (a stale read on it): the download of the leader's snapshot, and the
    whole catch-up, in s and MB/s (of ``snapshot_bytes``)."""
    port = victim.config.client_listeners[0].port
    stop()
    shutil.rmtree(victim.config.log_dir)
    format_log_dir(victim.config.log_dir, victim.config.cluster_id, victim.node_id)
    victim.log_path.write_text("")
    restarted = time.monotonic()
    wall_restarted = time.time()
    start_node()
    while True:
        try:
            status, _ = call(port, "GET", f"/v1/kv/{last_key}?stale=true")
        except OSError:
            status = 0
        if status == 200:
            break
        if time.monotonic() - restarted > 600:
            raise RuntimeError("the new replica did not catch up in 600 s")
        time.sleep(0.05)
    catch_up_s = time.monotonic() - restarted
    times = log_times(victim.log_path)
    if "loaded snapshot" not in times:  # no snapshot yet: it replayed the leader's whole log
        return {"snapshot_bytes": 0, "restart_to_caught_up_s": round(catch_up_s, 3)}
    download_s = times["loaded snapshot"] - times["fetching snapshot"]
    return {
        "snapshot_bytes": snapshot_bytes,
        "download_s": round(download_s, 3),
        "download_mb_s": round(snapshot_bytes / download_s / 1e6, 1),
        "restart_to_caught_up_s": round(catch_up_s, 3),
        "restart_to_caught_up_mb_s": round(snapshot_bytes / catch_up_s / 1e6, 1),
        "process_start_to_fetch_s": round(times["fetching snapshot"] - wall_restarted, 3),
    }


def run(keys: int, value_bytes: int, directory: Path, base_port: int = BASE_PORT) -> dict[str, Any]:
    settings = {
        "snapshot.interval.records": Setting(str(max(1000, keys // 4)), "bench"),
        "log.segment.bytes": Setting(str(8 << 20), "bench"),
    }
    nodes = prepare_local_cluster(directory, 3, base_port=base_port, settings=settings)
    ports = [node.config.client_listeners[0].port for node in nodes]
    processes = {node.node_id: start(node) for node in nodes}
    try:
        deadline = time.monotonic() + 30
        leader = None
        while leader is None and time.monotonic() < deadline:
            leader = leader_port(ports)
            time.sleep(0.1)
        assert leader is not None, "no leader"
        load_s = load(leader, keys, value_bytes)
        victim = next(n for n in nodes if n.config.client_listeners[0].port != leader)
        time.sleep(2)  # let the last snapshot be written
        size = max(snapshot_sizes(nodes[ports.index(leader)].config.log_dir))

        def stop_victim() -> None:
            processes[victim.node_id].kill()
            processes[victim.node_id].wait(10)

        def start_victim() -> None:
            processes[victim.node_id] = start(victim)

        caught_up = replace_and_catch_up(victim, stop_victim, start_victim,
                                         f"k{keys - 1}", size)
        if "download_s" in caught_up:
            caught_up["download_records_per_s"] = round(keys / caught_up["download_s"])
        caught_up["caught_up_records_per_s"] = round(keys / caught_up["restart_to_caught_up_s"])
        return {
            "keys": keys, "value_bytes": value_bytes, "load_s": round(load_s, 2),
            **caught_up,
            "disk_fsync_write_mb_s": round(disk_write_mb_s(directory, size), 1),
            "loopback_tcp_mb_s": round(loopback_mb_s(size), 1),
        }
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes.values():
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--value-bytes", type=int, default=4096)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--base-port", type=int, default=BASE_PORT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="snapshot-bench-") as tmp:
        results = run(args.keys, args.value_bytes, Path(tmp), args.base_port)
    width = max(map(len, results))
    for name, value in results.items():
        print(f"{name:<{width}}  {value}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
