"""Chaos: a 3-node quorum of real processes under a schedule of faults, with concurrent clients
whose history must be linearizable.

Five clients put, read (linearizable GET), compare-and-set and delete values on four keys, and
run transactions over two or three of them (``POST /v1/txn``: a value moved to two keys if the
first holds what the client last saw there, else both read; or two or three keys read at once),
each operation recorded with its call and completion times (monotonic) and its outcome: ok, failed
(503 NO_LEADER, APPEND_LOST, NODE_FAILED, SHUTTING_DOWN, or 408: definitely not applied) or
unknown (504 TIMEOUT, 503 OUTCOME_UNKNOWN, no answer: it may commit at any time, or never).
Redirects are followed to the node they name. Meanwhile a nemesis injects, one at a time and in a
seeded order, each of: kill -9 of the leader and of a follower (then a restart), SIGSTOP/SIGCONT of
the leader and of a follower, a two-way partition of the leader and of a follower, and a disk
replacement (kill -9, wipe, ``quorum-node format`` with a new directory id, restart, AddVoter of
the new directory and RemoveVoter of the old one). At the end everything is healed, every key is
read once more (linearizable), every node's copy must converge to those values, and the whole
history goes through the linearizability checker (``linearizability.py``), which checks the keys
that txns join as one group (a txn's compares, branch and every answer against the group's state
at one instant); with the final reads in it, an acknowledged write that was lost is a violation
too. A sixth client writes keys of its own, each once: every write acknowledged must be read back
at the end.

The disk faults run with each node's log directory on a lazy file system (``lazyfs.py``, FUSE):
the power lost on the leader, on a minority and on every node at once (killed, then the disk drops
what was not synced, then restarted), an fsync failing (EIO) on the leader and on a follower (the
node must stop with one line naming it and a non-zero exit; it is restarted on the same page cache),
and the disk full on one node for a while (short writes, then ENOSPC; the node must go on and
resume by itself). After such a run every node loses power once more: each replica's log must be
valid on what its disk kept, and the quorum must come back with every value read and every write
acknowledged before.

The default run is one round of the seven process faults (about 20 s); one round of the six disk
faults is a slow test of its own (about 45 s, CI's chaos step). Environment (not ``QUORUM_*``:
the nodes inherit the environment and take those as configuration keys):

- ``CHAOS_SECONDS=600``: rounds of faults until that many seconds have passed (the keys
  change every minute, so that each key's history stays short enough to check quickly); with
  FUSE available the rounds mix the disk faults in, on lazy file systems.
- ``CHAOS_HISTORY=path``: write the history there, as JSON lines
  (``linearizability.load_history`` reads it back, to check it again).
- ``CHAOS_KINDS=a,b``: the disk test's faults, only these (to repeat one).
- ``CHAOS_SEED=N``: the fault schedule and the clients' choices of that seed (printed by
  every run; the timing of the processes still varies).

Run with ``-s`` to see the summary: operations by type and outcome, error codes, the faults and
their durations, the checker's time.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lazyfs import LazyFs, unavailable_reason
from linearizability import (
    CheckResult,
    Kind,
    Operation,
    Outcome,
    Recorder,
    around,
    check,
    dump_history,
)
from proc_cluster import FAST, ProcessCluster
from workload import (
    ACKNOWLEDGED_PREFIX,
    DISK_FAULT_KINDS,
    FAULT_KINDS,
    AcknowledgedWriter,
    Client,
    KvSession,
    Nemesis,
    Network,
    Tally,
    Worker,
    heal_everything,
    kv_path,
    log_dir_of,
)

from quorum_node.storage.log_dir import METADATA_PARTITION_DIR
from quorum_node.storage.segment_log import SegmentLog

CHAOS_SECONDS = float(os.environ.get("CHAOS_SECONDS", "0"))  # 0: one round of faults
KEYS = 4
KEY_PERIOD_S = 60.0
CLIENTS = 5


LAZY_UNAVAILABLE = unavailable_reason()
NODES = 3


@contextlib.contextmanager
def started_cluster(directory: Path, *, lazy: bool
                    ) -> Iterator[tuple[ProcessCluster, Network, dict[int, LazyFs]]]:
    """A running quorum of ``NODES`` processes; with ``lazy``, each node's log directory is a
    lazy file system of its own (the disks)."""
    disks: dict[int, LazyFs] = {}
    try:
        if lazy:
            for node_id in range(1, NODES + 1):
                disks[node_id] = LazyFs(directory / f"node-{node_id}")
        processes = ProcessCluster.create(directory, NODES, None, False, **FAST)
        network = Network(processes)
        try:
            processes.start_all()
            yield processes, network, disks
        finally:
            processes.stop_all()
            network.close()
    finally:
        for disk in disks.values():
            disk.unmount()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ProcessCluster, Network]]:
    with started_cluster(tmp_path, lazy=False) as (processes, network, _):
        yield processes, network


def wait_writable(processes: ProcessCluster, client: Client, timeout_s: float = 30) -> int:
    """Wait until a write commits; the leader. The first leader of a quorum configured by node
    ids takes writes only once it has heard from every voter (it writes their directory ids
    first, KIP-856): a voter cut off before that would hold every write up."""
    deadline = time.monotonic() + timeout_s
    while True:
        leader = processes.wait_for_leader(timeout_s=timeout_s)
        reply, _ = client.request(leader, "PUT", kv_path("warm-up"), b"-", "text/plain")
        if reply.status == 200:
            return leader
        assert time.monotonic() < deadline, f"no write committed: {reply}\n{processes.logs()}"
        time.sleep(0.1)


def chaos_seed() -> int:
    configured = os.environ.get("CHAOS_SEED")
    return int(configured) if configured else random.randrange(2**31)


@pytest.mark.timeout(CHAOS_SECONDS * 1.5 + 300)  # the faults, then a longer history to check
def test_history_under_faults_is_linearizable(tmp_path: Path) -> None:
    """The process faults; a long run (``CHAOS_SECONDS``) mixes in the disk faults too, on lazy
    file systems (where FUSE is available)."""
    lazy = CHAOS_SECONDS > 0 and LAZY_UNAVAILABLE is None
    kinds = FAULT_KINDS + DISK_FAULT_KINDS if lazy else FAULT_KINDS
    with started_cluster(tmp_path, lazy=lazy) as (processes, network, disks):
        run_chaos(processes, network, disks, kinds, CHAOS_SECONDS)


@pytest.mark.slow  # about 45 s: CI's chaos step
@pytest.mark.skipif(LAZY_UNAVAILABLE is not None, reason=f"lazyfs: {LAZY_UNAVAILABLE}")
@pytest.mark.timeout(300)
def test_history_under_disk_faults_is_linearizable(tmp_path: Path) -> None:
    """One round of the disk faults on lazy file systems; then every machine loses power once
    more, every replica's log must be valid on what was synced, and the quorum must come back
    with every acknowledged write."""
    kinds = tuple(os.environ.get("CHAOS_KINDS", ",".join(DISK_FAULT_KINDS)).split(","))
    with started_cluster(tmp_path, lazy=True) as (processes, network, disks):
        run_chaos(processes, network, disks, kinds, 0)


def run_chaos(processes: ProcessCluster, network: Network, disks: dict[int, LazyFs],
              kinds: tuple[str, ...], seconds: float) -> None:
    seed = chaos_seed()
    print(f"\nchaos seed {seed} (CHAOS_SEED={seed} repeats the schedule)")
    began = time.monotonic()
    recorder, tally, client = Recorder(), Tally(), Client(processes, network)
    wait_writable(processes, client)
    nodes = list(processes.nodes)

    def keys() -> list[str]:
        generation = int((time.monotonic() - began) // KEY_PERIOD_S)
        return [f"k{i}-g{generation}" for i in range(KEYS)]

    stop = threading.Event()
    workers = [Worker(KvSession(client, recorder, tally, number, nodes[number % len(nodes)]),
                      nodes, keys, seed + number, stop) for number in range(CLIENTS)]
    acknowledged = AcknowledgedWriter(
        KvSession(client, recorder, tally, CLIENTS, nodes[0]), nodes, seed, stop)
    nemesis = Nemesis(processes, network, seed, seconds, kinds=kinds, disks=disks)
    for thread in [*workers, acknowledged, nemesis]:
        thread.start()
    nemesis.join(seconds + 240)
    stop.set()
    for thread in [*workers, acknowledged]:
        thread.join(10)
    faulted = time.monotonic() - began
    assert not nemesis.is_alive(), f"the nemesis is stuck (seed {seed})\n{nemesis.report()}"
    assert nemesis.error is None, f"seed {seed}: {nemesis.error!r}\n{processes.logs()}"

    heal_everything(processes, network)
    leader = processes.wait_for_leader(timeout_s=30)
    final = final_values(KvSession(client, recorder, tally, CLIENTS + 1, leader),
                         sorted({op.key for op in recorder.snapshot()
                                 if not op.key.startswith(ACKNOWLEDGED_PREFIX)}))
    converged = time.monotonic()
    wait_converged(client, nodes, final)
    converged = time.monotonic() - converged
    lost = acknowledged.lost(KvSession(client, recorder, tally, CLIENTS + 1, leader))
    after_power_loss = ""
    if disks:
        after_power_loss = every_machine_loses_power(processes, disks, client, final,
                                                     acknowledged)

    history = recorder.snapshot()
    if os.environ.get("CHAOS_HISTORY"):
        dump_history(history, Path(os.environ["CHAOS_HISTORY"]))
    result = check(history)
    ok = sum(op.outcome is Outcome.OK for op in history)
    print(f"{len(history)} operations on {len(final)} keys, {ok} ok; {len(nemesis.faults)} "
          f"faults in {faulted:.1f} s; replicas converged in {converged:.1f} s; checker "
          f"{result.seconds:.3f} s ({sum(r.explored for r in result.keys)} configurations, "
          f"{len(result.keys)} groups of keys); "
          f"{len(acknowledged.written)} acknowledged writes of unique keys, {len(lost)} lost; "
          f"{time.monotonic() - began:.1f} s in all\n{tally.report()}\nfaults:\n"
          f"{nemesis.report()}{after_power_loss}")
    assert not tally.unexpected, tally.unexpected[:5]
    assert {fault.name for fault in nemesis.faults} == set(kinds)
    for kind in (Kind.PUT, Kind.GET, Kind.CAS, Kind.TXN):
        assert tally.outcomes[kind.value, "ok"] >= 10, f"too few {kind.value}s went through"
    assert not lost, f"seed {seed}: acknowledged writes lost: {lost[:10]}"
    assert result.linearizable, f"seed {seed}:\n{result.explain()}\n{context(result, history)}" \
        f"\n{role_changes(processes)}"


def context(result: CheckResult, history: list[Operation]) -> str:
    """Around each violation, every operation on its keys (failed ones too, with the answer)."""
    return "\n".join(
        f"around the violation on {violation.key!r}:\n" + "\n".join(
            f"  {op.describe()}" for op in around(violation, history))
        for violation in result.violations)


def role_changes(processes: ProcessCluster) -> str:
    """Each node's changes of role, on the history's clock (the logs' is the wall clock)."""
    offset = time.time() - time.monotonic()
    lines = []
    for node in processes.nodes.values():
        for line in node.log_path.read_text(errors="replace").splitlines():
            if " quorum_node.node: " in line or "elected leader" in line:
                try:  # "2026-01-02 03:04:05,678 LEVEL logger: message", in local time
                    wall = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S"))
                    lines.append(f"  {wall + int(line[20:23]) / 1000 - offset:.3f}{line[23:]}")
                except ValueError:
                    lines.append(f"  {line}")
    return "the nodes' changes of role:\n" + "\n".join(sorted(lines))


def every_machine_loses_power(processes: ProcessCluster, disks: dict[int, LazyFs],
                              client: Client, final: dict[str, str | None],
                              acknowledged: AcknowledgedWriter) -> str:
    """Every node loses power at once; each replica's log must then be valid on what its disk
    kept (nothing but a torn tail may be cut, and no partial batch was trusted), and the quorum
    must come back with every value read and every write acknowledged before."""
    nodes = list(processes.nodes)
    for node_id in nodes:
        processes.kill(node_id)
    for node_id in nodes:
        disks[node_id].power_loss()
    damage = {node_id: SegmentLog.find_damage(
        log_dir_of(processes, node_id) / METADATA_PARTITION_DIR) for node_id in nodes}
    assert all(found is None or found.torn_tail for found in damage.values()), damage
    processes.start_all()
    leader = processes.wait_for_leader(timeout_s=30)
    recorder = Recorder()  # reads after the history's end, checked against it directly
    session = KvSession(client, recorder, Tally(), -1, leader)
    assert final_values(session, sorted(final)) == final, "values read before were lost"
    lost = acknowledged.lost(session)
    assert not lost, f"acknowledged writes lost in a power loss of every node: {lost[:10]}"
    torn = sum(found is not None for found in damage.values())
    disks_said = "; ".join(
        f"node {n} {s['fsyncs']} fsyncs, {s['failed_fsyncs']} failed, {s['short_writes']} short "
        f"writes, {s['power_losses']} power losses"
        for n, s in ((node_id, disk.stats()) for node_id, disk in disks.items()))
    return (f"\nafter a power loss of every node: logs valid ({torn} torn tails), {len(final)} "
            f"values and {len(acknowledged.written)} acknowledged writes all there; disks: "
            f"{disks_said}")


def final_values(session: KvSession, keys: list[str]) -> dict[str, str | None]:
    """A linearizable read of every key, retried until it answers (each try is recorded)."""
    values: dict[str, str | None] = {}
    for key in keys:
        deadline = time.monotonic() + 30
        while True:
            op = session.get(key)
            if op.outcome is Outcome.OK:
                values[key] = op.result if isinstance(op.result, str) else None
                break
            assert time.monotonic() < deadline, f"no final read of {key!r}"
            time.sleep(0.1)
    return values


def wait_converged(client: Client, nodes: list[int], final: dict[str, str | None],
                   timeout_s: float = 30) -> None:
    """Every node's own copy (a stale read) ends up holding the final values."""
    deadline = time.monotonic() + timeout_s
    differing: list[str] = []
    while time.monotonic() < deadline:
        differing = []
        for node_id in nodes:
            # Not part of the history: stale reads are not linearizable.
            session = KvSession(client, Recorder(), Tally(), -1, node_id)
            for key, value in final.items():
                op = session.get(key, stale=True)
                if op.outcome is not Outcome.OK or op.result != value or session.node_id != node_id:
                    differing.append(f"node {node_id} {key!r}: {op.describe()}, final {value!r}")
        if not differing:
            return
        time.sleep(0.2)
    raise AssertionError("replicas did not converge:\n" + "\n".join(differing[:10]))


def test_checker_catches_stale_reads_of_a_partitioned_follower(
        cluster: tuple[ProcessCluster, Network]) -> None:
    """The same client sequence twice against a quorum with one follower cut off both ways:
    write, then read from a random node. Linearizable reads pass the checker; reads with
    ``?stale=true`` (the read barrier skipped, as a build without it would serve them) return
    the cut-off follower's old copy, and the checker must say so."""
    processes, network = cluster
    client = Client(processes, network)
    leader = wait_writable(processes, client)
    follower = min(n for n in processes.nodes if n != leader)
    network.isolate(follower)
    roles = [leader, follower, *(n for n in processes.nodes if n not in (leader, follower))]
    rng = random.Random(3)  # the same choices of node in both variants, whatever the ids
    targets = [rng.choice(roles) for _ in range(20)]
    results = {}
    served_by_follower = {}
    for variant in ("linearizable", "stale"):
        recorder, tally = Recorder(), Tally()
        writer = KvSession(client, recorder, tally, 0, leader)
        reader = KvSession(client, recorder, tally, 1, leader)
        key = f"probe-{variant}"
        reads: list[tuple[int, Operation]] = []
        for i, target in enumerate(targets):
            attempt = 0
            while writer.put(key, f"{variant}-{i}-{attempt}").outcome is not Outcome.OK:
                attempt += 1  # the leader changed (on a busy machine): write it again
                assert attempt < 20, tally.report()
                writer.node_id = processes.wait_for_leader(among=set(roles) - {follower})
            reader.node_id = target
            op = reader.get(key, stale=variant == "stale")
            reads.append((reader.node_id, op))
        served_by_follower[variant] = sum(node == follower and op.outcome is Outcome.OK
                                          for node, op in reads)
        results[variant] = check(recorder.snapshot())
    print(f"\nreads the cut-off follower answered itself: {served_by_follower}\n"
          f"{results['stale'].explain()}")
    assert results["linearizable"].linearizable, results["linearizable"].explain()
    assert served_by_follower == {"linearizable": 0, "stale": targets.count(follower)}
    assert targets.count(follower) >= 3
    [violation] = results["stale"].violations
    assert violation.key == "probe-stale"
    assert violation.blocking.kind is Kind.GET and violation.blocking.result != violation.state
