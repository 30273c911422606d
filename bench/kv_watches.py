"""What waiting watches and large stores cost the key-value store: per-write cost with idle
watches, stale reads under watches and a write load, and a page of keys from a large store.

    python bench/kv_watches.py [--json kv-watches.json]
    python bench/kv_watches.py --idle-watches 1000 --keys 100000    # a quick run

Each figure is a measurement, printed and written as JSON; nothing asserts one.

- ``store``: in-process, one ``KvStore``. The CPU per applied write (a put of a 100-byte value)
  with no watch registered and with ``--idle-watches`` watches on prefixes that no write matches
  (the store's ``WatchIndex``); then ``--keys`` keys loaded from a snapshot's records: the
  seconds the load took and, of those, building the ordered index of keys; the index's bytes a
  key (tracemalloc); a page of 100 keys from a random place (``KvStore.scan``): median, p99 and
  worst of 1000 pages (or of those taken in 20 s, where a page sorts the keys).
- ``writes``: a 3-voter quorum on loopback (fsync on, ``http.max.long.polls`` raised for the
  watches). One client puts ``--puts`` 100-byte values one at a time, first with no watch
  waiting, then with ``--idle-watches`` long polls waiting on the leader (over streams, 250 a
  stream) on prefixes that no write matches: the leader's CPU per put and the puts' p50/p99.
- ``stale_reads``: on the same quorum, stale gets of one key on the leader from one client while
  16 clients put (``drivers.timed_load``) for ``--seconds``, first with no watch, then with
  ``--busy-watches`` watches waiting on the leader: the gets' p50/p99, and the p99's ratio.

Runs against any version of the node that serves the client API (its public calls only), so the
same script measures before and after a change.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from drivers import QUORUM, VALUE, Load, percentile, pick_base_port, process_cpu_s, timed_load

from bench import System, running, start_quorum, wait_for_leader
from quorum_node import wire
from quorum_node.client import QuorumClient
from quorum_node.client_stream import ClientStream
from quorum_node.kv.ops import Put, encode_op
from quorum_node.kv.snapshot_data import SnapshotEntries, snapshot_records
from quorum_node.kv.store import KvStore
from quorum_node.raft.records import RecordBatch

WATCHES_PER_STREAM = 250  # below a stream's 256 requests in flight
WATCH_WAIT_MS = 30_000  # the longest a watch waits; each phase is shorter than that


# --- in-process: the store -----------------------------------------------------------------------

class IdleWatcher:
    """A registered watch that no write of the run concerns."""

    def __init__(self, prefix: str) -> None:
        self.watched = prefix
        self.exact = False

    def take(self, offset: int, key: str, value: str | None, size: int) -> bool:
        raise AssertionError(f"an idle watch was handed {key!r}")

    def end(self, *, lost: bool) -> None:
        pass


def write_cpu_us(store: KvStore, writes: int, first_offset: int) -> float:
    batches = [RecordBatch(base_offset=first_offset + i, epoch=1,
                           records=(encode_op(Put(f"w/{i % 1000}", VALUE)),))
               for i in range(writes)]
    started = time.process_time()
    for batch in batches:
        store.apply_batch(batch)
    return (time.process_time() - started) / writes * 1e6


def store_figures(idle_watches: int, keys: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    store = KvStore()
    writes = 50_000
    write_cpu_us(store, writes, 0)  # warm up
    result["write_cpu_us_no_watches"] = write_cpu_us(store, writes, writes)
    if hasattr(store, "watchers"):
        for i in range(idle_watches):
            store.watchers.add(IdleWatcher(f"idle-{i}/"))
        result[f"write_cpu_us_{idle_watches}_idle_watches"] = write_cpu_us(store, writes,
                                                                           2 * writes)
    records = list(snapshot_records(SnapshotEntries.of(
        {f"k{i}": (VALUE, i, 1) for i in range(keys)}, None)))
    store = KvStore()
    started = time.perf_counter()
    store.load_snapshot(records, next_offset=keys)
    result["load_s"] = time.perf_counter() - started
    names = [f"k{i}" for i in range(keys)]
    names.sort()
    try:
        from sortedcontainers import SortedList  # noqa: PLC0415 (the store's own index)
    except ImportError:
        pass
    else:
        tracemalloc.start()
        started = time.perf_counter()
        index = SortedList(names)
        result["index_build_s"] = time.perf_counter() - started
        result["index_bytes_per_key"] = tracemalloc.get_traced_memory()[0] / keys
        tracemalloc.stop()
        del index
    chooser = random.Random(7)
    pages: list[float] = []
    deadline = time.monotonic() + 20
    while len(pages) < 1000 and time.monotonic() < deadline:
        start_after = f"k{chooser.randrange(keys)}"
        started = time.perf_counter()
        scanned = store.scan("k", start_after, 100, 1 << 20) if hasattr(store, "watchers") \
            else store.scan("k", start_after, 101)  # type: ignore[call-arg]
        pages.append((time.perf_counter() - started) * 1000)
        assert scanned
    pages.sort()
    result["page_of_100_ms"] = {"p50": statistics.median(pages),
                                "p99": percentile(pages, 0.99), "max": pages[-1]}
    return result


# --- a quorum ------------------------------------------------------------------------------------

@contextmanager
def idle_watches(port: int, count: int, offset: int) -> Iterator[list[ClientStream]]:
    """``count`` long polls waiting on the node on ``port``, on prefixes no write matches."""
    streams: list[ClientStream] = []
    try:
        for first in range(0, count, WATCHES_PER_STREAM):
            stream = ClientStream.open(f"http://127.0.0.1:{port}", headers={}, ssl_context=None,
                                       timeout_s=10)
            streams.append(stream)
            for i in range(first, min(count, first + WATCHES_PER_STREAM)):
                stream.send(wire.Op.WATCH, 0, (False, f"idle-{i}/", offset, WATCH_WAIT_MS, 100))
        time.sleep(2.0)  # every watch has reached the node and waits
        yield streams
    finally:
        for stream in streams:
            stream.close()
        time.sleep(1.0)  # the node lets them go


def next_offset(port: int) -> int:
    with QuorumClient(f"127.0.0.1:{port}") as client:
        return client.put("bench-offset", VALUE).offset + 1


def sequential_puts(system: System, leader: int, puts: int) -> dict[str, Any]:
    """One client's puts on the leader, one at a time: the leader's CPU per put, p50/p99."""
    latencies = []
    with QuorumClient(f"127.0.0.1:{leader}", timeout_s=30) as client:
        client.put("warm", VALUE)
        cpu_before = process_cpu_s(system.pids[leader])
        for i in range(puts):
            started = time.perf_counter()
            client.put(f"seq/{i}", VALUE)
            latencies.append((time.perf_counter() - started) * 1000)
        cpu = process_cpu_s(system.pids[leader]) - cpu_before
    latencies.sort()
    return {"puts": puts, "leader_cpu_us_per_put": cpu / puts * 1e6,
            "p50_ms": statistics.median(latencies), "p99_ms": percentile(latencies, 0.99)}


def stale_reads_under_writes(system: System, leader: int, seconds: float) -> dict[str, Any]:
    """Stale gets on the leader from one client while 16 clients put for ``seconds``."""
    latencies: list[float] = []
    stop = threading.Event()

    def read() -> None:
        with QuorumClient(f"127.0.0.1:{leader}", timeout_s=30) as client:
            client.put("read-me", VALUE)
            while not stop.is_set():
                started = time.perf_counter()
                client.get("read-me", stale=True)
                latencies.append((time.perf_counter() - started) * 1000)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        writes = timed_load(system.target(QUORUM, leader), Load("put"), 16, seconds, 2,
                            server_pids=[system.pids[leader]])
    finally:
        stop.set()
        reader.join()
    latencies.sort()
    return {"gets": len(latencies), "get_p50_ms": statistics.median(latencies),
            "get_p99_ms": percentile(latencies, 0.99), "get_max_ms": latencies[-1],
            "puts_per_s": writes["per_s"], "put_p99_ms": writes["p99_ms"],
            "put_errors": writes["errors"]}


def quorum_figures(base_port: int, idle: int, busy: int, puts: int,
                   seconds: float) -> dict[str, Any]:
    settings = {"http.max.long.polls": str(max(idle, busy) + 100)}
    result: dict[str, Any] = {}
    with running(lambda d: start_quorum(d, base_port, extra=settings)) as system:
        assert system is not None
        leader = wait_for_leader(system, QUORUM)
        print("writes without watches", file=sys.stderr, flush=True)
        result["writes_no_watches"] = sequential_puts(system, leader, puts)
        print(f"writes with {idle:,} idle watches", file=sys.stderr, flush=True)
        with idle_watches(leader, idle, next_offset(leader)):
            result[f"writes_{idle}_idle_watches"] = sequential_puts(system, leader, puts)
        print("stale reads under writes, no watches", file=sys.stderr, flush=True)
        result["stale_reads_no_watches"] = stale_reads_under_writes(system, leader, seconds)
        print(f"stale reads under writes, {busy:,} watches", file=sys.stderr, flush=True)
        with idle_watches(leader, busy, next_offset(leader)):
            result[f"stale_reads_{busy}_watches"] = stale_reads_under_writes(system, leader,
                                                                             seconds)
        result["leader_still_leads"] = system.leader_port() == leader
    without = result["stale_reads_no_watches"]["get_p99_ms"]
    result["stale_get_p99_ratio"] = result[f"stale_reads_{busy}_watches"]["get_p99_ms"] / without
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle-watches", type=int, default=10_000)
    parser.add_argument("--busy-watches", type=int, default=1_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--puts", type=int, default=2_000)
    parser.add_argument("--seconds", type=float, default=10, help="length of the read runs "
                        f"(below {WATCH_WAIT_MS // 1000} s, the watches' wait)")
    parser.add_argument("--skip", action="append", default=[], choices=["store", "quorum"])
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--base-port", type=int, default=None)
    args = parser.parse_args()
    results: dict[str, Any] = {}
    if "store" not in args.skip:
        results["store"] = store_figures(args.idle_watches, args.keys)
        print(json.dumps(results["store"]), flush=True)
    if "quorum" not in args.skip:
        base_port = args.base_port if args.base_port is not None else pick_base_port(1)
        results["quorum"] = quorum_figures(base_port, args.idle_watches, args.busy_watches,
                                           args.puts, args.seconds)
        print(json.dumps(results["quorum"]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
