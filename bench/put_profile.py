"""Where a lone put's time goes: a 3-voter quorum on loopback (fsync on, default settings), one
client putting 100-byte values one at a time, and py-spy sampling the leader and a follower
meanwhile (``pip install py-spy``; it reads the processes' stacks from outside, without slowing
them much). Prints each node's top functions, by the share of samples they are on the stack
(inclusive) and at its top (self), idle time apart, and the puts' p50/p99.

    python bench/put_profile.py [--seconds 15] [--top 25] [--rate 2000]

This is a measurement, not a test: nothing here asserts a number.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from drivers import QUORUM, VALUE, percentile, pick_base_port, process_cpu_s

from bench import start_quorum, wait_for_leader

# The innermost Python frame of a thread waiting for work: the event loop in its select (which
# py-spy shows as the loop's runner), an idle worker thread of a pool, a thread waiting on a
# condition.
IDLE = ("select (selectors.py)", "Runner.run (asyncio/runners.py)",
        "_worker (concurrent/futures/thread.py)", "wait (threading.py)")


def profile(pid: int, seconds: float, rate: int, out: Path) -> subprocess.Popen[bytes]:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen([py_spy, "record", "--pid", str(pid), "--duration", str(round(seconds)),
                             "--rate", str(rate), "--format", "raw", "--nonblocking",
                             # Blocked in fsync counts as busy here: only the filter below
                             # leaves out waits for work.
                             "--idle", "--nolineno",
                             "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def top(collapsed: Path, count: int, rate: int, puts: int) -> list[str]:
    """The busiest functions of a raw (collapsed-stack) profile, idle samples left out, and
    the busy time per put (a thread blocked in fsync counts as busy)."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    busy = 0
    for line in collapsed.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        frames = stack.split(";")
        if frames[-1] in IDLE:
            continue
        weight = int(samples)
        busy += weight
        own[frames[-1]] += weight
        for frame in set(frames):
            inclusive[frame] += weight
    lines = [f"  {busy} busy samples: {busy / rate / puts * 1000:.3f} ms per put"]
    lines.append("  by inclusive share:")
    for frame, weight in inclusive.most_common(count + 8):
        if weight == busy:
            continue  # the process's main frames, on every busy stack
        lines.append(f"  {100 * weight / busy:5.1f}% incl {100 * own[frame] / busy:5.1f}% self"
                     f"  {frame}")
    lines.append("  by self share:")
    for frame, weight in own.most_common(count):
        lines.append(f"  {100 * inclusive[frame] / busy:5.1f}% incl {100 * weight / busy:5.1f}% "
                     f"self  {frame}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--rate", type=int, default=2000, help="samples per second")
    parser.add_argument("--no-profile", action="store_true",
                        help="only the puts' latency and each node's CPU per put")
    parser.add_argument("--keep", type=Path, help="copy the raw profiles (collapsed stacks) "
                                                  "into this directory")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="quorum-put-profile-"))
    system = start_quorum(directory, pick_base_port(clusters=1))
    try:
        port = wait_for_leader(system, QUORUM)
        follower = next(p for p in system.ports if p != port)
        client = system.target(QUORUM, port).connect()
        for i in range(200):  # warm up
            client.put(f"warm-{i}", VALUE)
        outputs = {"leader": directory / "leader.txt", "follower": directory / "follower.txt"}
        spies = [] if args.no_profile else [
            profile(system.pids[port], args.seconds, args.rate, outputs["leader"]),
            profile(system.pids[follower], args.seconds, args.rate, outputs["follower"])]
        cpu_before = {p: process_cpu_s(pid) for p, pid in system.pids.items()}
        samples: list[float] = []
        stop = threading.Event()
        threading.Timer(args.seconds, stop.set).start()
        n = 0
        while not stop.is_set():
            started = time.perf_counter()
            client.put(f"put-{n}", VALUE)
            samples.append((time.perf_counter() - started) * 1000)
            n += 1
        cpu = {p: process_cpu_s(pid) - cpu_before[p] for p, pid in system.pids.items()}
        client.close()
        for spy in spies:
            spy.wait(args.seconds + 30)
        samples.sort()
        print(f"{len(samples)} puts: p50 {statistics.median(samples):.3f} ms, "
              f"p99 {percentile(samples, 0.99):.3f} ms; CPU per put (us): leader "
              f"{cpu[port] / len(samples) * 1e6:.0f}, followers " + ", ".join(
                  f"{cpu[p] / len(samples) * 1e6:.0f}" for p in system.ports if p != port))
        for role, output in outputs.items():
            if args.keep is not None and output.exists():
                args.keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(output, args.keep / output.name)
            print(f"{role}:")
            print("\n".join(top(output, args.top, args.rate, len(samples)))
                  if output.exists() else "  (no profile)")
    finally:
        system.stop()
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
