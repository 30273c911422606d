"""What a node does when its disk fails as real disks do, each on the lazy file system: a failed
fsync (the node stops, and what it had not synced is never counted durable, not even after a
restart on the same page cache), a power loss (what a node reads back at start is durable, so a
vote it acts on is never forgotten), a full disk (appends refused whole with DISK_FULL, the rest
served, resumed by itself once space comes back)."""

from __future__ import annotations

import errno
import json
import os
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from lazyfs import LazyFs, unavailable_reason
from proc_cluster import FAST, ProcessCluster, http_json

from quorum_node.raft.log import LogFullError
from quorum_node.raft.records import Record
from quorum_node.raft.state import ElectionState
from quorum_node.raft.types import ReplicaKey
from quorum_node.storage.errors import StorageError
from quorum_node.storage.fsutil import WriteStep, atomic_write
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR
from quorum_node.storage.quorum_state import QuorumStateStore
from quorum_node.storage.segment_log import SegmentLog

pytestmark = pytest.mark.skipif(unavailable_reason() is not None,
                                reason=f"lazyfs: {unavailable_reason()}")

DIRECTORY_ID = uuid.UUID("27c6803d-c7cb-42dd-9baa-cd494ffacc81")


@pytest.fixture
def lazy(tmp_path: Path) -> Iterator[LazyFs]:
    mounted = LazyFs(tmp_path / "disk")
    try:
        yield mounted
    finally:
        mounted.unmount()


def test_a_log_reopened_after_a_failed_fsync_is_durable_to_its_end(lazy: LazyFs) -> None:
    """fsyncgate across a restart: the fsync fails, the process stops, a supervisor restarts it
    on the same page cache, which still shows the records the fsync could not write (marked
    clean). Opening counts everything it finds as flushed, so it must make it durable: after a
    power loss the log still ends there."""
    directory = lazy.mountpoint / "log"
    log = SegmentLog(directory)
    log.append_as_leader([Record(b"synced")], 1, 0)
    assert log.flush() == 1
    log.append_as_leader([Record(b"fsync failed")], 1, 0)
    lazy.fail_fsync(1)
    with pytest.raises(StorageError, match="fsync failed"):
        log.flush()
    log.close()
    reopened = SegmentLog(directory)  # the restart
    assert reopened.end_offset == 2  # counted as flushed from here on
    reopened.close()
    lazy.power_loss()
    after = SegmentLog(directory)
    assert after.end_offset == 2, "the restart counted records durable that were not"
    after.close()


def test_a_vote_read_back_after_a_crash_survives_a_power_loss(lazy: LazyFs) -> None:
    """The process dies after renaming the new quorum-state into place, before the directory
    fsync; the restart reads the vote (from the page cache) and acts on it. If the power then
    goes, the vote must still be there, or the node could vote again in the same epoch."""
    directory = lazy.mountpoint / "state"
    directory.mkdir()
    QuorumStateStore(directory).write(ElectionState(epoch=4, leader_id=None, voted_key=None))

    class Crashed(Exception):
        pass

    def crash(step: WriteStep) -> None:
        if step is WriteStep.RENAMED:
            raise Crashed

    voted = ElectionState(epoch=5, leader_id=None, voted_key=ReplicaKey(2, None))
    with pytest.raises(Crashed):
        QuorumStateStore(directory, after_step=crash).write(voted)
    assert QuorumStateStore(directory).read() == voted  # the restart acts on this vote
    lazy.power_loss()
    assert QuorumStateStore(directory).read() == voted, "a vote acted on was forgotten"


def test_the_vote_changes_on_a_full_disk(lazy: LazyFs) -> None:
    """A node must write a new epoch or vote before it acts on it, also while its disk is full
    (an election can come then): the rewrite goes over the spare the write before kept (the
    first write makes one), in place, and takes no space."""
    directory = lazy.mountpoint / "state"
    directory.mkdir()
    store = QuorumStateStore(directory)
    store.write(ElectionState(epoch=1))
    lazy.set_capacity("used")
    with pytest.raises(OSError) as full:  # the disk is full: no new file, no growth
        atomic_write(directory / "other", b"x", replace=True)
    assert full.value.errno == errno.ENOSPC
    states = [ElectionState(epoch=3, voted_key=ReplicaKey(2, DIRECTORY_ID)),
              ElectionState(epoch=3, leader_id=2, voted_key=ReplicaKey(2, DIRECTORY_ID)),
              ElectionState(epoch=4)]
    for state in states:
        store.write(state)
        assert QuorumStateStore(directory).read() == state
    lazy.power_loss()
    assert QuorumStateStore(directory).read() == states[-1]


def single_node(tmp_path: Path) -> tuple[ProcessCluster, LazyFs]:
    disk = LazyFs(tmp_path / "node-1")
    try:
        cluster = ProcessCluster.create(tmp_path, 1, None, False, **FAST)
        cluster.start_all()
    except BaseException:
        disk.unmount()
        raise
    return cluster, disk


def put(cluster: ProcessCluster, key: str, value: str) -> tuple[int, str | None]:
    """The status and error code of a PUT (0: no answer, the node stopped)."""
    request = urllib.request.Request(
        f"{cluster.nodes[1].url}/v1/kv/{key}?timeout_ms=2000", data=value.encode(),
        method="PUT", headers={"Content-Type": "text/plain"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, None
    except urllib.error.HTTPError as error:
        body = json.loads(error.read() or b"{}")
        return error.code, body.get("code")
    except OSError:
        return 0, None


def test_a_failed_fsync_stops_the_node_with_one_line_and_acknowledges_nothing(
        tmp_path: Path) -> None:
    cluster, disk = single_node(tmp_path)
    try:
        cluster.wait_for_leader(timeout_s=30)
        deadline = time.monotonic() + 30
        while put(cluster, "k", "synced")[0] != 200:
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.1)
        disk.fail_fsync(1)
        assert put(cluster, "k", "never synced")[0] != 200
        process = cluster.nodes[1].process
        assert process is not None
        code = process.wait(30)
        log = cluster.nodes[1].log_path.read_text()
        stopping = [line for line in log.splitlines() if "stopping: " in line]
        assert code != 0
        assert len(stopping) == 1, log[-3000:]
        assert "CRITICAL" in stopping[0] and "fsync failed" in stopping[0] \
            and "Input/output error" in stopping[0], stopping
        assert "Task exception was never retrieved" not in log
        # The one line says it; nothing after it at WARNING or above repeats it or a traceback.
        after = log[log.index(stopping[0]) + len(stopping[0]):]
        assert "Traceback" not in after and " ERROR " not in after \
            and " CRITICAL " not in after, after[:3000]
        # Restarted on the same page cache, then the power goes: the acknowledged value stays.
        cluster.start(1)
        cluster.wait_for_leader(timeout_s=30)
        cluster.kill(1)
        disk.power_loss()
        cluster.start(1)
        cluster.wait_for_leader(timeout_s=30)
        value = http_json("GET", f"{cluster.nodes[1].url}/v1/kv/k")
        assert value["value"] in ("synced", "never synced")
    finally:
        cluster.stop_all()
        disk.unmount()


def test_the_lazy_disk_is_under_the_node(tmp_path: Path) -> None:
    """The harness mounts before the node formats: the node's files are on the lazy disk."""
    cluster, disk = single_node(tmp_path)
    try:
        assert os.path.ismount(tmp_path / "node-1")
        assert (tmp_path / "node-1" / "meta.properties").exists()
        assert disk.stats()["fsyncs"] > 0
    finally:
        cluster.stop_all()
        disk.unmount()


def test_a_full_disk_refuses_the_append_whole_and_takes_the_next_once_freed(
        lazy: LazyFs) -> None:
    """A short write then ENOSPC: the part written is cut off (no partial batch stays in the
    file to be flushed or read), the log stays usable, and appends go on once there is room."""
    directory = lazy.mountpoint / "log"
    log = SegmentLog(directory)
    log.append_as_leader([Record(b"first")], 1, 0)
    log.flush()
    size = (directory / log.segment_paths[-1].name).stat().st_size
    lazy.set_capacity(lazy.stats()["used"] + 10)  # room for part of the next batch only
    with pytest.raises(LogFullError, match="no space left"):
        log.append_as_leader([Record(b"x" * 100)], 1, 0)
    assert lazy.stats()["short_writes"] == 1
    assert log.full and log.end_offset == 1
    assert log.segment_paths[-1].stat().st_size == size, "a partial batch stayed in the file"
    log.flush()
    lazy.set_capacity(None)
    log.append_as_leader([Record(b"x" * 100)], 1, 0)
    assert not log.full and log.refused_for_space == 1
    assert log.flush() == 2
    log.close()
    lazy.power_loss()
    assert SegmentLog.find_damage(directory) is None
    reopened = SegmentLog(directory)
    assert reopened.end_offset == 2
    reopened.close()


def scrape(cluster: ProcessCluster, name: str) -> float:
    with urllib.request.urlopen(f"{cluster.nodes[1].url}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def readyz(cluster: ProcessCluster) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"{cluster.nodes[1].url}/readyz", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())["message"]


def test_a_leader_on_a_full_disk_refuses_writes_with_disk_full_and_resumes_by_itself(
        tmp_path: Path) -> None:
    cluster, disk = single_node(tmp_path)
    try:
        cluster.wait_for_leader(timeout_s=30)
        deadline = time.monotonic() + 30
        while put(cluster, "k", "before")[0] != 200:
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.1)
        disk.set_capacity("used")
        refused = [put(cluster, "k", f"full-{i}") for i in range(5)]
        assert (507, "DISK_FULL") in refused, refused
        assert all(answer in ((507, "DISK_FULL"), (504, "TIMEOUT")) for answer in refused)
        # It keeps serving what it can: reads, probes, metrics.
        value = http_json("GET", f"{cluster.nodes[1].url}/v1/kv/k?timeout_ms=2000")
        assert value["value"] == "before" or value["value"].startswith("full-")
        status, why = readyz(cluster)
        assert status == 503 and "disk is full" in why, why
        assert scrape(cluster, "quorum_log_disk_full") == 1
        assert scrape(cluster, "quorum_log_appends_refused_disk_full_total") >= 1
        disk.set_capacity(None)  # space comes back: no restart, no operator
        deadline = time.monotonic() + 30
        while put(cluster, "k", "after")[0] != 200:
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.1)
        assert readyz(cluster)[0] == 200
        assert scrape(cluster, "quorum_log_disk_full") == 0
        process = cluster.nodes[1].process
        assert process is not None and process.poll() is None
        cluster.kill(1)
        disk.power_loss()
        log_dir = tmp_path / "node-1" / METADATA_PARTITION_DIR
        assert SegmentLog.find_damage(log_dir) is None  # no partial batch was ever synced
        cluster.start(1)
        cluster.wait_for_leader(timeout_s=30)
        assert http_json("GET", f"{cluster.nodes[1].url}/v1/kv/k")["value"] == "after"
    finally:
        cluster.stop_all()
        disk.unmount()


def test_a_failed_fsync_while_opening_refuses_to_open_with_one_clear_error(
        lazy: LazyFs) -> None:
    """Opening makes what it found durable: if that fsync fails, the node does not start (a
    StorageError, which ``quorum-node run`` prints as its one error line, exit 2)."""
    directory = lazy.mountpoint / "log"
    log = SegmentLog(directory)
    log.append_as_leader([Record(b"found")], 1, 0)
    log.close()
    lazy.fail_fsync(1)
    with pytest.raises(StorageError, match=r"durable failed \(fsync failed\).*Input/output"):
        SegmentLog(directory)
    reopened = SegmentLog(directory)  # the disk works again
    assert reopened.end_offset == 1
    reopened.close()
