"""How much a backup slows commits: a 3-node quorum of processes, ~40 MB preloaded, 4 writer
threads putting 1 KB values, three ``quorum-node backup`` runs of the leader 3 s apart; commit
latency of the writes that started during a backup against those well outside one.

    python bench/backup_stall.py
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "node"))
from proc_cluster import FAST, ProcessCluster

from quorum_node.cli.node import main
from quorum_node.client import QuorumClient

VALUE = "x" * 1000


def _stats(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    return (f"n={len(ordered)} p50={ordered[len(ordered) // 2] * 1000:.1f} ms "
            f"p99={ordered[int(len(ordered) * 0.99)] * 1000:.1f} ms "
            f"max={ordered[-1] * 1000:.1f} ms")


def run() -> None:
    directory = Path(tempfile.mkdtemp(prefix="backup-stall-"))
    cluster = ProcessCluster.create(directory, 3, **FAST, log_segment_bytes=8 << 20)
    cluster.start_all()
    try:
        leader = cluster.wait_for_leader()
        urls = [node.url for node in cluster.nodes.values()]

        def preload(thread: int) -> None:
            with QuorumClient(urls, timeout_s=10) as client:
                for i in range(5000):
                    client.put(f"pre-{thread}-{i}", VALUE)

        threads = [threading.Thread(target=preload, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        latencies: list[tuple[float, float]] = []  # (start, seconds)
        stop = threading.Event()

        def write(thread: int) -> None:
            with QuorumClient(urls, timeout_s=10) as client:
                i = 0
                while not stop.is_set():
                    started = time.perf_counter()
                    client.put(f"w-{thread}-{i % 1000}", VALUE)
                    latencies.append((started, time.perf_counter() - started))
                    i += 1

        writers = [threading.Thread(target=write, args=(t,)) for t in range(4)]
        for writer in writers:
            writer.start()
        windows = []
        time.sleep(3)
        for _ in range(3):
            began = time.perf_counter()
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                assert main(["backup", "-b", cluster.nodes[leader].url,
                             "--to", str(directory / "backups")]) == 0
            windows.append((began, time.perf_counter()))
            print(out.getvalue().strip())
            time.sleep(3)
        stop.set()
        for writer in writers:
            writer.join()
        during = [s for t, s in latencies if any(a <= t <= b for a, b in windows)]
        outside = [s for t, s in latencies if not any(a - 0.5 <= t <= b + 0.5 for a, b in windows)]
        print("commits during backups:", _stats(during))
        print("commits outside:       ", _stats(outside))
    finally:
        cluster.stop_all()
    for line in cluster.nodes[leader].log_path.read_text().splitlines():
        if "pinned in" in line:
            print(line)


if __name__ == "__main__":
    run()
