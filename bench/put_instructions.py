"""The instructions a lone put costs each node, counted by valgrind's callgrind: a 3-voter quorum
on loopback (fsync on) with every node under callgrind, one client putting 100-byte values one
at a time, and each node's user-space instructions over those puts divided by their number.

    python bench/put_instructions.py [--puts 400] [--rounds 1]

A put's CPU time moves with the machine (another process's load, the caches a sleep left cold),
so a change of a few percent in what a put costs is lost in the noise of its latency or its CPU
seconds. The count of instructions it executes is not: rounds of one tree differ by about two
percent (what the processes' timing still changes: a follower's Fetch handled in the leader's
step or in one of its own), so a change to the hot path can be compared by it, run against run.
It counts neither the kernel's work (system calls, wake-ups) nor cache misses: the CPU seconds
say those.

Under callgrind a node runs about fifty times slower, so the quorum's timers are stretched (an
election in seconds, a fetch timeout of half a minute, ``STRETCHED``) and a put takes tens of
milliseconds.
Needs ``valgrind`` (Debian's package) on PATH. This is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from drivers import VALUE, pick_base_port

from quorum_node.cli.local_quorum import LocalCluster, node_command, prepare_local_cluster
from quorum_node.client import QuorumClient
from quorum_node.node.config import Setting

T = TypeVar("T")
IDLE_S = 5
WARM_UP_PUTS = 50  # before the count starts: connections made, first-call paths taken
# Long enough for nodes fifty times slower; an election still within seconds. The linger of a
# high watermark that has moved is stretched as much, so that it carries on with the next put's
# records as it does at full speed (else each put would cost its followers a Fetch more).
STRETCHED = {"controller.quorum.election.timeout.ms": "4000",
             "controller.quorum.fetch.timeout.ms": "30000",
             "controller.quorum.request.timeout.ms": "60000",
             "controller.quorum.high.watermark.linger.ms": "250"}


def callgrind(out: Path) -> list[str]:
    """The command prefix that runs a process under callgrind, its counts written to ``out``
    and ``out``.N at each dump (the process keeps its own pid: valgrind runs it in place)."""
    return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no",
            "--log-file=/dev/null"]


def dumped_instructions(out: Path) -> int:
    """The instructions counted since the last zeroing, in the latest dump of ``out``."""
    dumps = sorted(out.parent.glob(f"{out.name}.*"), key=lambda p: int(p.suffix[1:]))
    found = re.search(r"^(?:summary|totals): (\d+)", dumps[-1].read_text(), re.MULTILINE)
    assert found is not None, dumps[-1]
    return int(found.group(1))


def control(pid: int, action: str) -> None:
    """``callgrind_control -z`` (zero the counts) or ``-d`` (dump them) on one process."""
    subprocess.run(["callgrind_control", action, str(pid)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def counted(outs: Mapping[int, Path], pids: Mapping[int, int],
            work: Callable[[], T]) -> tuple[dict[int, int], T]:
    """Each node's instructions while ``work`` runs (counts zeroed before it, dumped after),
    and what ``work`` returned."""
    for pid in pids.values():
        control(pid, "-z")
    result = work()
    for pid in pids.values():
        control(pid, "-d")
    return {node_id: dumped_instructions(outs[node_id]) for node_id in pids}, result


def by_role(values: Mapping[int, float], leader: int, digits: int) -> str:
    """``leader X, followers Y Z``."""
    followers = " ".join(f"{values[n]:.{digits}f}" for n in sorted(values) if n != leader)
    return f"leader {values[leader]:.{digits}f}, followers {followers}"


def leader_id(port: int) -> int:
    """The leader's node id, as the node at client port ``port`` tells (a follower redirects to
    the leader, which describes the quorum)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/quorum", timeout=60) as answer:
        return int(json.load(answer)["leader_id"])


def measure(directory: Path, puts: int, rounds: int) -> None:
    base_port = pick_base_port(1)
    nodes = prepare_local_cluster(directory / "quorum", 3, base_port=base_port,
                                  settings={k: Setting(v, "bench") for k, v in STRETCHED.items()})
    outs = {node.node_id: directory / f"callgrind-{node.node_id}" for node in nodes}
    cluster = LocalCluster(nodes, lambda node: [*callgrind(outs[node.node_id]),
                                                *node_command(node)],
                           out=open(os.devnull, "w"))  # noqa: SIM115
    cluster.start()
    try:
        bootstrap = ",".join(f"127.0.0.1:{node.config.client_listeners[0].port}"
                             for node in nodes)
        with QuorumClient(bootstrap, timeout_s=300) as client:
            started = time.monotonic()
            for n in range(WARM_UP_PUTS):
                client.put(f"warm-{n}", VALUE)
            print(f"quorum up and warm after {time.monotonic() - started:.0f} s",
                  file=sys.stderr)
            leader = leader_id(nodes[0].config.client_listeners[0].port)
            pids = {node_id: process.pid for node_id, process in cluster.processes.items()}
            # What an idle node does (its timers, the followers' long polls), for scale: a round
            # of puts takes seconds here, and this goes on beside them.
            idle, _ = counted(outs, pids, lambda: time.sleep(IDLE_S))
            print("idle, million instructions a second: "
                  + by_role({n: count / IDLE_S / 1e6 for n, count in idle.items()}, leader, 2),
                  flush=True)
            for round_number in range(rounds):
                def put_round(prefix: str = f"key-{round_number}") -> float:
                    started = time.monotonic()
                    for n in range(puts):
                        client.put(f"{prefix}-{n}", VALUE)
                    return time.monotonic() - started

                counts, took = counted(outs, pids, put_round)
                print(f"round {round_number + 1}: {puts} puts in {took:.1f} s; million "
                      f"instructions a put: "
                      + by_role({n: count / puts / 1e6 for n, count in counts.items()}, leader, 3),
                      flush=True)
    finally:
        cluster.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--puts", type=int, default=400, help="puts counted in each round")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("put_instructions: needs valgrind (callgrind_control) on PATH", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="put-instructions-") as directory:
        measure(Path(directory), args.puts, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
