"""What an insider, a buggy peer or a fake leader can send to a quorum of real processes: each
of these once wedged the quorum, stopped nodes (at every start, too) or misled them. Peer RPCs
are forged as POSTs to ``/raft/v1/<Rpc>`` through ``forge``, where credentials for a secured
controller listener would be added; a fake leader serves a stopped voter's port."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fake_leader import FakeLeader, forge
from proc_cluster import FAST, NodeProcess, ProcessCluster

from quorum_node.kv.ops import KV_RECORD_KEY, Delete, Put, encode_op
from quorum_node.raft.messages import (
    BeginQuorumEpochRequest,
    EndQuorumEpochRequest,
    FetchRequest,
    VoteRequest,
)
from quorum_node.raft.records import Record, encode_batch
from quorum_node.raft.snapshot_format import encode_snapshot
from quorum_node.raft.snapshots import SnapshotId
from quorum_node.raft.types import MAX_EPOCH, Errors, ReplicaKey
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR
from quorum_node.storage.meta_properties import META_PROPERTIES, read_meta_properties
from quorum_node.storage.snapshot_store import snapshot_file_name


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    cluster = ProcessCluster.create(tmp_path, 3, **FAST)
    cluster.start_all()
    try:
        # Forged messages go to every node: each must be listening before the test starts.
        cluster.wait_all_serving()
        yield cluster
    finally:
        cluster.stop_all()


def epoch_of(cluster: ProcessCluster, leader: int) -> int:
    described = cluster.quorum(leader)
    assert described is not None
    return int(described["leader_epoch"])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:  # not listening (yet)
        return 0, str(error)


def put(cluster: ProcessCluster, key: str, value: str, timeout_s: float = 15) -> None:
    """Write through whichever node leads, retrying while there is none."""
    deadline = time.monotonic() + timeout_s
    while True:
        leader = cluster.wait_for_leader(timeout_s=timeout_s)
        request = urllib.request.Request(f"{cluster.nodes[leader].url}/v1/kv/{key}",
                                         data=value.encode(), method="PUT")
        try:
            with urllib.request.urlopen(request, timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def assert_all_running(cluster: ProcessCluster, ids: set[int] | None = None) -> None:
    for node_id in ids or set(cluster.nodes):
        process = cluster.nodes[node_id].process
        assert process is not None and process.poll() is None, \
            f"node {node_id} exited\n{cluster.logs()}"
        status, text = get(f"{cluster.nodes[node_id].url}/healthz")
        assert status == 200, (node_id, text)


def wait_for(what: str, condition: Callable[[], bool], cluster: ProcessCluster,
             timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} in {timeout_s} s\n{cluster.logs()}")
        time.sleep(0.05)


# --- forged requests -------------------------------------------------------------------------


def test_a_non_voters_vote_at_epoch_2_30_wedges_nothing(cluster: ProcessCluster) -> None:
    """One Vote from id 7 at epoch 2^30 once moved all three nodes there, where no later vote
    was accepted: no leader ever again. It is refused, and the quorum still elects and
    commits (the leader is stopped to force an election)."""
    leader = cluster.wait_for_leader()
    epoch = epoch_of(cluster, leader)
    answer = forge(cluster, cluster.nodes[leader], VoteRequest(
        cluster_id=cluster.cluster_id, voter_id=leader, replica_epoch=2**30, replica_id=7,
        last_offset_epoch=2**30 - 1, last_offset=10**6))
    time.sleep(0.2)
    assert epoch_of(cluster, leader) == epoch
    assert answer.error_code is Errors.INCONSISTENT_VOTER_SET
    cluster.kill(leader)
    others = set(cluster.nodes) - {leader}
    successor = cluster.wait_for_leader(among=others)
    assert epoch_of(cluster, successor) < 2**30
    put(cluster, "after-wedge", "1")
    cluster.start(leader)
    assert_all_running(cluster, others)


def test_conflicting_leaders_for_one_epoch_stop_no_node(cluster: ProcessCluster) -> None:
    """Three BeginQuorumEpoch, one per node, each naming another voter leader of the same new
    epoch: the nodes once stopped (and, the leaders saved, at every start). Each follows its
    'leader', hears of another, ignores it, and an election ends it; after restarting them
    all the quorum still commits."""
    leader = cluster.wait_for_leader()
    epoch = epoch_of(cluster, leader) + 5
    ids = sorted(cluster.nodes)
    for node_id in ids:
        named = ids[(ids.index(node_id) + 1) % len(ids)]
        forge(cluster, cluster.nodes[node_id], BeginQuorumEpochRequest(
            cluster_id=cluster.cluster_id, leader_id=named, leader_epoch=epoch,
            voter_id=node_id))
    put(cluster, "after-conflict", "1")
    assert_all_running(cluster)
    _restart_all(cluster)
    put(cluster, "after-restart", "1")
    assert_all_running(cluster)


def _restart_all(cluster: ProcessCluster) -> None:
    """Stop every node and start them again (on new proxies: stop_all closed the old ones)."""
    cluster.stop_all()
    for node in cluster.nodes.values():
        node.proxy = type(node.proxy)(node.peer_port)
    _repoint_voters(cluster)
    cluster.start_all()


def _repoint_voters(cluster: ProcessCluster) -> None:
    """After stop_all closed the proxies, new ones listen on new ports: name those."""
    voters = ",".join(f"{i}@127.0.0.1:{n.proxy.port}" for i, n in cluster.nodes.items())
    for node in cluster.nodes.values():
        lines = node.config_path.read_text().splitlines()
        lines = [f"controller.quorum.voters={voters}"
                 if line.startswith("controller.quorum.voters=") else line for line in lines]
        node.config_path.write_text("\n".join(lines) + "\n")


def test_begin_quorum_epoch_naming_leader_99_is_refused(cluster: ProcessCluster) -> None:
    """BeginQuorumEpoch naming a leader that does not exist, three times a second, once let 1
    write in 40 through and made /readyz say 'following 99'."""
    cluster.wait_for_leader()
    stop = time.monotonic() + 2
    answers = []
    writes = 0
    while time.monotonic() < stop:
        for node_id, node in cluster.nodes.items():
            answers.append(forge(cluster, node, BeginQuorumEpochRequest(
                cluster_id=cluster.cluster_id, leader_id=99,
                leader_epoch=epoch_of(cluster, cluster.wait_for_leader()) + 1,
                voter_id=node_id)).error_code)
            _, text = get(f"{node.url}/readyz")
            assert "99" not in text, (node_id, text)
        put(cluster, f"k{writes}", "v", timeout_s=2)
        writes += 1
        time.sleep(0.3)
    assert set(answers) == {Errors.INCONSISTENT_VOTER_SET}
    assert writes >= 4


def test_end_quorum_epoch_from_a_non_leader_is_ignored(cluster: ProcessCluster) -> None:
    """A forged EndQuorumEpoch from a follower (not the leader of the epoch) asking another
    follower to succeed it: refused, and no election follows."""
    leader = cluster.wait_for_leader()
    epoch = epoch_of(cluster, leader)
    sender, target = sorted(set(cluster.nodes) - {leader})
    time.sleep(0.3)  # let every follower hear of the leader
    same_epoch = forge(cluster, cluster.nodes[target], EndQuorumEpochRequest(
        cluster_id=cluster.cluster_id, leader_id=sender, leader_epoch=epoch, voter_id=target,
        preferred_successors=()))
    newer_epoch = forge(cluster, cluster.nodes[target], EndQuorumEpochRequest(
        cluster_id=cluster.cluster_id, leader_id=sender, leader_epoch=epoch + 1,
        voter_id=target))
    time.sleep(1.5)  # more than an election timeout
    assert cluster.wait_for_leader() == leader
    assert epoch_of(cluster, leader) == epoch
    assert same_epoch.error_code is Errors.INVALID_REQUEST
    assert newer_epoch.error_code is Errors.UNKNOWN_LEADER_EPOCH


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_observer_flood_is_bounded(cluster: ProcessCluster) -> None:
    """Fetches with made-up replicas once grew the leader's observer table (and /v1/quorum)
    without bound. Unconfigured ids are refused; configured ids under 3,000 new directories
    leave at most 64 observers. (On a busy machine the flood can cost the leader its
    followers' fetches and so its leadership: then it is run again on the new leader.)"""
    for _ in range(3):
        leader = cluster.wait_for_leader()
        target = cluster.nodes[leader]
        epoch = epoch_of(cluster, leader)
        process = cluster.nodes[leader].process
        assert process is not None
        rss_before = _rss_kib(process.pid)
        started = time.monotonic()
        for i in range(3000):
            forge(cluster, target, FetchRequest(cluster_id=cluster.cluster_id, replica_id=1 + i % 3,
                                    replica_directory_id=uuid.UUID(int=10_000 + i),
                                    max_wait_ms=0, current_leader_epoch=epoch,
                                    fetch_offset=0, last_fetch_epoch=0, max_bytes=1))
        elapsed = time.monotonic() - started
        described = cluster.quorum(leader)
        if described is not None and described["leader_epoch"] == epoch:
            break
    else:
        raise AssertionError(f"the leader kept changing\n{cluster.logs()}")
    size = len(json.dumps(described))
    rss_after = _rss_kib(process.pid)
    print(f"3000 fetches in {elapsed:.1f} s; observers {len(described['observers'])}, "
          f"/v1/quorum {size} bytes, leader RSS {rss_before} -> {rss_after} KiB")
    assert len(described["observers"]) <= 64
    assert size < 64 * 1024
    assert rss_after - rss_before < 20 * 1024
    answer = forge(cluster, target, FetchRequest(cluster_id=cluster.cluster_id, replica_id=7,
                                     max_wait_ms=0, current_leader_epoch=epoch, fetch_offset=0,
                                     last_fetch_epoch=0))
    assert answer.error_code is Errors.INCONSISTENT_VOTER_SET
    assert_all_running(cluster)


# --- a fake leader ---------------------------------------------------------------------------


def _values(count: int) -> list[Record]:
    return [Record(value=f"fake-{i}".encode()) for i in range(count)]


def _gap(fetch: FetchRequest, epoch: int) -> tuple[bytes, int]:
    offset = fetch.fetch_offset
    return (encode_batch(offset, epoch, _values(1), 0)
            + encode_batch(offset + 5, epoch, _values(1), 0), offset)


def _backward_epoch(fetch: FetchRequest, epoch: int) -> tuple[bytes, int]:
    return encode_batch(fetch.fetch_offset, 0, _values(2), 0), fetch.fetch_offset


def _epoch_at_the_bound(fetch: FetchRequest, epoch: int) -> tuple[bytes, int]:
    return encode_batch(fetch.fetch_offset, MAX_EPOCH, _values(2), 0), fetch.fetch_offset


def _nested_kv_op(fetch: FetchRequest, epoch: int) -> tuple[bytes, int]:
    nested = (b'{"op":"put","key":"deep","value":' + b"[" * 50_000 + b"]" * 50_000 + b"}")
    records = [Record(value=nested, key=KV_RECORD_KEY), encode_op(Put("after-deep", "1"))]
    return encode_batch(fetch.fetch_offset, epoch, records, 0), fetch.fetch_offset + 2


@pytest.mark.parametrize("records_for", [_gap, _backward_epoch, _epoch_at_the_bound,
                                         _nested_kv_op])
def test_a_fake_leader_stops_no_node(
    cluster: ProcessCluster, records_for: Callable[[FetchRequest, int], tuple[bytes, int]],
) -> None:
    """A process on a stopped voter's port announces itself leader of a new epoch and answers
    each follower's first Fetch with CRC-valid batches: with an offset gap, an epoch going
    backwards, an epoch at the int32 bound, or a committed KV op nested 50,000 deep. Each
    stopped both real nodes (or wedged them, or stopped their KV applier, after restart too).
    Now the bad batches are refused whole, the followers elect a new leader, the nested op is
    skipped alike everywhere; once the fake is gone and the voter back, all three agree."""
    leader = cluster.wait_for_leader()
    victim = max(set(cluster.nodes) - {leader})
    real = sorted(set(cluster.nodes) - {victim})
    epoch = epoch_of(cluster, leader) + 3
    put(cluster, "before", "1")
    cluster.kill(victim)
    fake = FakeLeader(cluster.nodes[victim].peer_port, victim, epoch,
                      lambda fetch: records_for(fetch, epoch))
    try:
        for node_id in real:
            answer = forge(cluster, cluster.nodes[node_id], BeginQuorumEpochRequest(
                cluster_id=cluster.cluster_id, leader_id=victim, leader_epoch=epoch,
                voter_id=node_id))
            assert answer.error_code is Errors.NONE
        wait_for("fetch from the fake leader", lambda: fake.served == set(real), cluster)
        new_leader = cluster.wait_for_leader(among=set(real))
        assert epoch_of(cluster, new_leader) > epoch
        put(cluster, "during", "1")
        assert_all_running(cluster, set(real))
    finally:
        fake.close()
    cluster.start(victim)
    put(cluster, "after", "1")

    def converged() -> bool:
        return all(get(f"{node.url}/v1/kv/after?stale=true")[0] == 200
                   for node in cluster.nodes.values())

    wait_for("every replica applying the last write", converged, cluster)
    assert_all_running(cluster)
    if records_for is _nested_kv_op:
        for node in cluster.nodes.values():
            status, text = get(f"{node.url}/v1/kv/after-deep?stale=true")
            assert status == 200 and json.loads(text)["value"] == "1", (node.node_id, text)
            assert get(f"{node.url}/v1/kv/deep?stale=true")[0] == 404
    # Restarted, every node comes back as it was (nothing bad was persisted).
    _restart_all(cluster)
    put(cluster, "after-restart", "1")
    assert_all_running(cluster)


# --- a fake leader's snapshot ----------------------------------------------------------------

# Far past anything the followers committed: a snapshot must end at or past their high watermark.
_FAKE_SNAPSHOT_END = 10_000


def _unconfigured_voters(cluster: ProcessCluster) -> bytes:
    """A well-formed snapshot of key-value puts whose voter set names ids 7, 8 and 9, which
    controller.quorum.voters does not configure."""
    voters = [ReplicaKey(node_id, uuid.uuid4()) for node_id in (7, 8, 9)]
    return encode_snapshot(voters, 0, [encode_op(Put("fake", "1"))])


def _non_kv_records(cluster: ProcessCluster) -> bytes:
    """A well-formed snapshot with the quorum's own voter set, whose records are not puts of
    the key-value store (an application record, a delete)."""
    voters = [ReplicaKey(node_id, read_meta_properties(
        cluster.directory / f"node-{node_id}" / META_PROPERTIES).directory_id)
        for node_id in cluster.nodes]
    return encode_snapshot(voters, 0, [Record(value=b"an application record"),
                                       encode_op(Delete("fake"))])


def _metric(node: NodeProcess, name: str) -> float:
    _, text = get(f"{node.url}/metrics")
    values = [float(line.split()[-1]) for line in text.splitlines()
              if line.startswith(name + " ")]
    assert values, f"no {name} in /metrics"
    return values[0]


def _committed_everywhere(cluster: ProcessCluster, keys: list[str], ids: set[int]) -> bool:
    return all(get(f"{cluster.nodes[i].url}/v1/kv/{key}?stale=true")[0] == 200
               for i in ids for key in keys)


@pytest.mark.parametrize("snapshot_for", [_unconfigured_voters, _non_kv_records])
def test_a_fake_leaders_snapshot_truncates_nothing(
    cluster: ProcessCluster, snapshot_for: Callable[[ProcessCluster], bytes],
) -> None:
    """A process on a stopped voter's port announces itself leader of a new epoch and answers
    each follower's Fetch with a snapshot: one whose voter set names unconfigured ids once made
    both followers replace their logs by it (five committed writes gone), exit, and refuse to
    start again; one of records that are not key-value puts stopped both state machines
    (/healthz 503, after a restart too). Each is now validated whole before it is kept, and
    refused: logged, counted, the log kept, the followers elect a new leader, and every
    committed write is still on every node, after a restart too."""
    leader = cluster.wait_for_leader()
    victim = max(set(cluster.nodes) - {leader})
    real = set(cluster.nodes) - {victim}
    committed = [f"committed-{i}" for i in range(5)]
    for key in committed:
        put(cluster, key, "1")
    wait_for("the writes applied on every node",
             lambda: _committed_everywhere(cluster, committed, set(cluster.nodes)), cluster)
    epoch = epoch_of(cluster, leader) + 3
    cluster.kill(victim)
    snapshot_id = SnapshotId(_FAKE_SNAPSHOT_END, epoch)
    fake = FakeLeader(cluster.nodes[victim].peer_port, victim, epoch,
                      snapshot=(snapshot_id, snapshot_for(cluster)))
    try:
        for node_id in sorted(real):
            answer = forge(cluster, cluster.nodes[node_id], BeginQuorumEpochRequest(
                cluster_id=cluster.cluster_id, leader_id=victim, leader_epoch=epoch,
                voter_id=node_id))
            assert answer.error_code is Errors.NONE
        wait_for("the fake snapshot downloaded", lambda: fake.served == real, cluster)
        new_leader = cluster.wait_for_leader(among=real)
        assert epoch_of(cluster, new_leader) > epoch
        put(cluster, "during", "1")
        assert_all_running(cluster, real)
        for node_id in real:
            assert _metric(cluster.nodes[node_id], "quorum_snapshots_refused_total") >= 1
            partition = cluster.directory / f"node-{node_id}" / METADATA_PARTITION_DIR
            assert not (partition / snapshot_file_name(snapshot_id)).exists()
        assert _committed_everywhere(cluster, committed, real)
        assert "refused snapshot" in cluster.logs()
    finally:
        fake.close()
    cluster.start(victim)
    put(cluster, "after", "1")
    wait_for("every replica applying the last write",
             lambda: _committed_everywhere(cluster, [*committed, "after"], set(cluster.nodes)),
             cluster)
    assert_all_running(cluster)
    _restart_all(cluster)
    put(cluster, "after-restart", "1")
    wait_for("every write on every node after a restart",
             lambda: _committed_everywhere(cluster, [*committed, "after-restart"],
                                           set(cluster.nodes)), cluster)
    assert_all_running(cluster)
