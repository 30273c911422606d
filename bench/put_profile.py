"""Where a put's time goes: a 3-voter quorum on loopback (fsync on, default settings), one
client putting 100-byte values one at a time (or ``--clients`` of them, as ``bench.py``'s loads
run them), and py-spy sampling the leader and a follower meanwhile (``pip install py-spy``; it
reads the processes' stacks from outside, without slowing them much). Prints each node's top
functions, by the share of samples they are on the stack (inclusive) and at its top (self), idle
time apart, and the puts' p50/p99. With ``--clients``, also each node's user and system CPU and
its context switches per put (voluntary: it slept; involuntary: it was preempted).

    python bench/put_profile.py [--seconds 15] [--top 25] [--rate 2000] [--clients 64] [--gil]

This is a measurement, not a test: nothing here asserts a number.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

from drivers import QUORUM, VALUE, Client, Load, percentile, pick_base_port, timed_load

from bench import start_quorum, wait_for_leader

# The innermost Python frame of a thread waiting for work: the event loop in its select (which
# py-spy shows as the loop's runner), an idle worker thread of a pool, a thread waiting on a
# condition.
IDLE = ("select (selectors.py)", "Runner.run (asyncio/runners.py)",
        "_worker (concurrent/futures/thread.py)", "wait (threading.py)")


def profile(pid: int, seconds: float, rate: int, out: Path, *,
            gil: bool) -> subprocess.Popen[bytes]:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    # Blocked in fsync counts as busy here: only the filter below leaves out waits for work.
    # With ``gil``, only the thread holding the GIL is sampled (a thread preempted while
    # holding it still counts).
    return subprocess.Popen([py_spy, "record", "--pid", str(pid), "--duration", str(round(seconds)),
                             "--rate", str(rate), "--format", "raw", "--nonblocking",
                             "--gil" if gil else "--idle", "--nolineno",
                             "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class Usage(NamedTuple):
    """A process's CPU seconds so far (user, system) and its threads' context switches."""

    user_s: float
    system_s: float
    voluntary: int
    involuntary: int

    @classmethod
    def of(cls, pid: int) -> Usage:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        switches = {"voluntary_ctxt_switches": 0, "nonvoluntary_ctxt_switches": 0}
        for status in Path(f"/proc/{pid}/task").glob("*/status"):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                for line in status.read_text().splitlines():
                    name, _, value = line.partition(":")
                    if name in switches:
                        switches[name] += int(value)
        return cls(int(fields[11]) / tick, int(fields[12]) / tick,
                   switches["voluntary_ctxt_switches"], switches["nonvoluntary_ctxt_switches"])

    def per_put(self, before: Usage, puts: int) -> str:
        return (f"user {(self.user_s - before.user_s) / puts * 1e6:.0f} us, system "
                f"{(self.system_s - before.system_s) / puts * 1e6:.0f} us; context switches "
                f"{(self.voluntary - before.voluntary) / puts:.2f} voluntary, "
                f"{(self.involuntary - before.involuntary) / puts:.2f} involuntary")


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


def sequential_puts(client: Client, seconds: float) -> list[float]:
    """One put at a time for ``seconds``: each one's latency in ms."""
    samples: list[float] = []
    stop = threading.Event()
    threading.Timer(seconds, stop.set).start()
    n = 0
    while not stop.is_set():
        started = time.perf_counter()
        client.put(f"put-{n}", VALUE)
        samples.append((time.perf_counter() - started) * 1000)
        n += 1
    return sorted(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--rate", type=int, default=2000, help="samples per second")
    parser.add_argument("--clients", type=int, default=1,
                        help="concurrent clients, over --client-processes (bench.py's loads)")
    parser.add_argument("--client-processes", type=int, default=4)
    parser.add_argument("--gil", action="store_true",
                        help="sample only the thread holding the GIL: CPU rather than waits")
    parser.add_argument("--no-profile", action="store_true",
                        help="only the puts' latency and each node's CPU per put")
    parser.add_argument("--keep", type=Path, help="copy the raw profiles (collapsed stacks) "
                                                  "into this directory")
    args = parser.parse_args()
    if args.clients < 1 or args.client_processes < 1:
        parser.error("--clients and --client-processes must be at least 1")
    directory = Path(tempfile.mkdtemp(prefix="quorum-put-profile-"))
    system = start_quorum(directory, pick_base_port(clusters=1))
    try:
        port = wait_for_leader(system, QUORUM)
        follower = next(p for p in system.ports if p != port)
        target = system.target(QUORUM, port)
        client = target.connect()
        for i in range(200):  # warm up
            client.put(f"warm-{i}", VALUE)
        # The concurrent clients connect for a few seconds before their clock starts.
        sampled_s = args.seconds + (0 if args.clients == 1 else 3 + args.client_processes)
        outputs = {"leader": directory / "leader.txt", "follower": directory / "follower.txt"}
        spies = [] if args.no_profile else [
            profile(system.pids[port], sampled_s, args.rate, outputs["leader"], gil=args.gil),
            profile(system.pids[follower], sampled_s, args.rate, outputs["follower"],
                    gil=args.gil)]
        before = {p: Usage.of(pid) for p, pid in system.pids.items()}
        if args.clients == 1:
            samples = sequential_puts(client, args.seconds)
            puts, p50, p99 = len(samples), statistics.median(samples), percentile(samples, 0.99)
            summary = f"{puts} puts: "
        else:
            load = timed_load(target, Load("put"), args.clients, args.seconds,
                              args.client_processes)
            puts, p50, p99 = load["calls"], load["p50_ms"], load["p99_ms"]
            summary = (f"{args.clients} clients, {load['per_s']:.0f} puts/s "
                       f"(client CPU {load['client_cpu_us_per_call']:.0f} us a put): ")
        after = {p: Usage.of(pid) for p, pid in system.pids.items()}
        client.close()
        for spy in spies:
            spy.wait(sampled_s + 30)
        cpu = {p: after[p].user_s + after[p].system_s - before[p].user_s - before[p].system_s
               for p in system.ports}
        print(f"{summary}p50 {p50:.3f} ms, p99 {p99:.3f} ms; CPU per put (us): leader "
              f"{cpu[port] / puts * 1e6:.0f}, followers " + ", ".join(
                  f"{cpu[p] / puts * 1e6:.0f}" for p in system.ports if p != port))
        if args.clients > 1:  # the clients' connecting is in it: a few idle seconds
            for p in system.ports:
                role = "leader" if p == port else "follower"
                print(f"  {role:8} {after[p].per_put(before[p], puts)}")
        for role, output in outputs.items():
            if args.keep is not None and output.exists():
                args.keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(output, args.keep / output.name)
            print(f"{role}:")
            print("\n".join(top(output, args.top, args.rate, puts))
                  if output.exists() else "  (no profile)")
    finally:
        system.stop()
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
