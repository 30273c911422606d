"""Backups of a live quorum (real node processes) and restores into new quorums: under write
load every acknowledged key below the backup's end offset comes back with its value; a damaged
backup is refused with one line and nothing written; the same through an S3 server (moto)."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import io
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import pytest
from proc_cluster import FAST, FastTimings, ProcessCluster, http_json

from quorum_node.backup.manifest import MANIFEST_NAME, BackupError, BackupManifest
from quorum_node.backup.restore import new_voter_set, restore
from quorum_node.backup.store import LocalStore, S3Options, S3Store, open_store
from quorum_node.cli.node import main
from quorum_node.client import QuorumClient, QuorumClientError
from quorum_node.raft.records import Record, encode_batch
from quorum_node.raft.snapshot_format import encode_snapshot, read_snapshot
from quorum_node.raft.types import MAX_EPOCH
from quorum_node.storage.kafka_uuid import random_uuid, to_kafka_string
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR
from quorum_node.storage.meta_properties import read_meta_properties

BUCKET = "quorum-backups"  # the s3_server fixture's


class Settings(FastTimings):
    """``SETTINGS``' keys, typed: ``**SETTINGS`` can then only fill ``create``'s ``**settings``."""

    snapshot_interval_records: int
    snapshot_retained_log_records: int
    log_segment_bytes: int


# Small segments and frequent snapshots: a backup holds a snapshot and several segments.
SETTINGS: Settings = {**FAST, "snapshot_interval_records": 300,
                      "snapshot_retained_log_records": 100, "log_segment_bytes": 16_384}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    cluster = ProcessCluster.create(tmp_path_factory.mktemp("live"), 3, **SETTINGS)
    cluster.start_all()
    try:
        cluster.wait_for_leader()
        with _client(cluster) as client:
            for i in range(400):
                client.put(f"seed-{i}", f"value-{i}")
        yield cluster
    finally:
        cluster.stop_all()


def _client(cluster: ProcessCluster) -> QuorumClient:
    return QuorumClient([node.url for node in cluster.nodes.values()], timeout_s=10)


class Writer:
    """Puts keys (overwriting some) until stopped; every acknowledged write with its offset."""

    def __init__(self, cluster: ProcessCluster) -> None:
        self.client = _client(cluster)
        self.acknowledged: list[tuple[str, str, int]] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            key, value = f"load-{i % 300}", f"value-{i}"
            try:
                result = self.client.put(key, value)
            except QuorumClientError as error:
                self.failures.append(str(error))
            else:
                self.acknowledged.append((key, value, result.offset))
            i += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.client.close()


def _backup(server: str, to: str, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    """Run ``quorum-node backup``; the backup's location."""
    assert main(["backup", "-b", server, "--to", to, *extra]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    return out.split(": node ", 1)[0]


def _wait_committed(cluster: ProcessCluster, node_id: int, offset: int,
                    timeout_s: float = 10) -> None:
    """Until node ``node_id`` knows ``offset`` committed (its high watermark is past it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        node = http_json("GET", f"{cluster.nodes[node_id].url}/v1/node")
        if isinstance(node["high_watermark"], int) and node["high_watermark"] > offset:
            return
        assert time.monotonic() < deadline, node
        time.sleep(0.05)


def _restored_quorum(tmp_path: Path, source: str, capsys: pytest.CaptureFixture[str],
                     cluster_id: str, *extra: str) -> ProcessCluster:
    """A new 3-node quorum (new ports) whose directories ``quorum-node restore`` built."""
    tmp_path.mkdir()
    cluster = ProcessCluster.create(tmp_path, 3, cluster_id=cluster_id, **SETTINGS)  # type: ignore[arg-type]
    for node_id in cluster.nodes:
        shutil.rmtree(tmp_path / f"node-{node_id}")  # restore writes new directories only
    code = main(["restore", "--from", source, "--voters", "1,2,3",
                 "--log-dir", str(tmp_path / "node-{id}"), *extra])
    assert code == 0, capsys.readouterr()
    return cluster


def test_backup_under_load_restores_every_acknowledged_key(
        live: ProcessCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    writer = Writer(live)
    try:
        time.sleep(1.0)
        acknowledged_before = len(writer.acknowledged)
        leader = live.wait_for_leader()
        location = _backup(live.nodes[leader].url, str(tmp_path / "backups"), capsys)
        time.sleep(0.5)  # writes go on after the backup, none of them in it
    finally:
        writer.stop()
    assert not writer.failures, writer.failures[:3]
    manifest = BackupManifest.model_validate_json((Path(location) / MANIFEST_NAME).read_bytes())
    assert manifest.cluster_id == live.cluster_id and manifest.node_id == leader
    assert manifest.snapshot is not None, "the backup should hold a snapshot"
    assert sum(f.path.endswith(".log") for f in manifest.files) >= 1
    # Taken from the leader: every write acknowledged before the backup was asked for is in it.
    assert all(offset < manifest.end_offset
               for _, _, offset in writer.acknowledged[:acknowledged_before])
    expected: dict[str, str] = {f"seed-{i}": f"value-{i}" for i in range(400)}
    later: set[str] = set()
    for key, value, offset in writer.acknowledged:
        if offset < manifest.end_offset:
            expected[key] = value
        else:
            later.add(key)
    assert len(writer.acknowledged) > acknowledged_before > 50

    restored = _restored_quorum(tmp_path / "restored", location, capsys, live.cluster_id)
    printed = capsys.readouterr().out
    restored.start_all()
    try:
        restored.wait_for_leader()
        with _client(restored) as client:
            missing = {key: value for key, value in expected.items()
                       if client.get(key) != value}
            assert not missing, f"{len(missing)} of {len(expected)} keys wrong, e.g. " \
                f"{list(missing.items())[:3]}"
            for key in later - expected.keys():
                assert client.get(key) is None  # written only after the backup
            assert client.put("after-restore", "yes").offset > manifest.end_offset
        voters = restored.quorum(restored.wait_for_leader())
        assert voters is not None
        new_ids = {v["id"]: v["directory_id"] for v in voters["voters"]}
        old = {v.id: v.directory_id for v in manifest.voters}
        assert set(new_ids) == {1, 2, 3}
        assert not set(new_ids.values()) & set(old.values()), "new directory ids expected"
        for node_id, directory_id in new_ids.items():
            assert f"node {node_id}: " in printed and directory_id in printed
    finally:
        restored.stop_all()
    print(f"{len(expected)} keys restored; backup at offset {manifest.end_offset}, "
          f"{len(writer.acknowledged)} writes acknowledged under load")


@pytest.fixture(scope="module")
def local_backup(live: ProcessCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("backups")
    code = main(["backup", "-b", live.nodes[1].url, "--to", str(target),
                 "--name", "one"])
    assert code == 0
    return target / "one"


def _damage_segment(backup: Path) -> None:
    segment = max(backup.glob("__cluster_metadata-0/*.log"))
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0x01
    segment.write_bytes(bytes(data))


def _drop_snapshot(backup: Path) -> None:
    next(backup.glob("__cluster_metadata-0/*.checkpoint")).unlink()


def _drop_manifest(backup: Path) -> None:
    (backup / MANIFEST_NAME).unlink()


def _garble_manifest(backup: Path) -> None:
    document = json.loads((backup / MANIFEST_NAME).read_text())
    del document["end_offset"]
    (backup / MANIFEST_NAME).write_text(json.dumps(document))


@pytest.mark.parametrize(("damage", "message"), [
    (_damage_segment, "checksum mismatch"),
    (_drop_snapshot, "missing"),
    (_drop_manifest, "no backup.json: not a backup, or an incomplete one"),
    (_garble_manifest, "not a backup manifest (end_offset: Field required)"),
])
def test_a_damaged_backup_is_refused_and_nothing_is_written(
        local_backup: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        damage: object, message: str) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(local_backup, copy)
    assert callable(damage)
    damage(copy)
    target = tmp_path / "restored"
    code = main(["restore", "--from", str(copy), "--voters", "1,2,3",
                 "--log-dir", str(target / "node-{id}")])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1 and message in err, err
    assert not target.exists()  # nothing written, not even the directory that would hold them


def test_a_restore_into_a_used_directory_is_refused(
        local_backup: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "node-2").mkdir()
    (tmp_path / "node-2" / "keep").write_text("mine")
    code = main(["restore", "--from", str(local_backup), "--voters", "1,2,3",
                 "--log-dir", str(tmp_path / "node-{id}")])
    assert code == 1 and "node-2: not empty" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node-2"]


def test_backup_to_and_restore_from_an_s3_server(
        live: ProcessCluster, s3_server: S3Options, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    endpoint = ["--endpoint-url", str(s3_server.endpoint_url)]
    with _client(live) as client:
        written = client.put("s3-key", "s3-value").offset
    # A follower's backup holds what it knows committed: it learns of the put with its next
    # fetch.
    _wait_committed(live, 2, written)
    location = _backup(live.nodes[2].url, f"s3://{BUCKET}/fleet", capsys, *endpoint)
    assert location.startswith(f"s3://{BUCKET}/fleet/{live.cluster_id}/")
    assert location.endswith("-node-2")
    store = open_store(location, s3_server)
    manifest = BackupManifest.model_validate_json(store.read_bytes(MANIFEST_NAME) or b"")
    assert {f.path for f in manifest.files} >= {"meta.properties"}

    # The cluster id is kept by default; one node's directory at a time, as an init container
    # builds it, with the directory ids chosen beforehand.
    ids = {node_id: to_kafka_string(random_uuid()) for node_id in (1, 2, 3)}
    voters = ",".join(f"{node_id}:{directory}" for node_id, directory in ids.items())
    restored = ProcessCluster.create(tmp_path, 3, cluster_id=live.cluster_id, **SETTINGS)  # type: ignore[arg-type]
    for node_id in restored.nodes:
        shutil.rmtree(tmp_path / f"node-{node_id}")
        args = ["restore", "--from", location, "--voters", voters, "--node-id", str(node_id),
                "--log-dir", str(tmp_path / f"node-{node_id}"), "--skip-formatted", *endpoint]
        assert main(args) == 0, capsys.readouterr()
        assert main(args) == 0 and "formatted already" in capsys.readouterr().out
        meta = read_meta_properties(tmp_path / f"node-{node_id}" / "meta.properties")
        assert meta.cluster_id == live.cluster_id and meta.node_id == node_id
    restored.start_all()
    try:
        restored.wait_for_leader()
        with _client(restored) as client:
            assert client.get("s3-key") == "s3-value"
            assert client.get("seed-7") == "value-7"
    finally:
        restored.stop_all()

    # A flipped byte in the object store is caught before anything is written.
    assert isinstance(store, S3Store)
    segment = max(f.path for f in manifest.files if f.path.endswith(".log"))
    data = bytearray(store.read_bytes(segment) or b"")
    data[-1] ^= 0x40
    store.write_bytes(segment, bytes(data))
    target = tmp_path / "damaged"
    code = main(["restore", "--from", location, "--voters", "1,2,3",
                 "--log-dir", str(target / "node-{id}"), *endpoint])
    err = capsys.readouterr().err
    assert code == 1 and f"{location}/{segment}: checksum mismatch" in err, err
    assert not target.exists()


def test_restore_with_a_new_cluster_id(local_backup: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["restore", "--from", str(local_backup), "--voters", "4,5,6",
                 "--log-dir", str(tmp_path / "node-{id}"), "--new-cluster-id"])
    assert code == 0
    out = capsys.readouterr().out
    new_id = out.rsplit("cluster id ", 1)[1].strip()
    old = BackupManifest.model_validate_json((local_backup / MANIFEST_NAME).read_bytes())
    assert new_id != old.cluster_id
    for node_id in (4, 5, 6):
        meta = read_meta_properties(tmp_path / f"node-{node_id}" / "meta.properties")
        assert (meta.cluster_id, meta.node_id) == (new_id, node_id)


def test_a_backup_holds_committed_records_only(
        live: ProcessCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The leader's log ends in records no majority has (both followers paused): the backup
    stops at the high watermark, at a batch boundary, and restores without them."""
    leader = live.wait_for_leader()
    followers = [i for i in live.nodes if i != leader]
    with QuorumClient([live.nodes[leader].url], timeout_s=10) as client:
        committed = client.put("committed-before-pause", "yes").offset
    described = live.quorum(leader)
    assert described is not None
    high_watermark = described["high_watermark"]
    for node_id in followers:
        live.signal(node_id, signal.SIGSTOP)
    try:
        with QuorumClient([live.nodes[leader].url], timeout_s=1) as client, \
                pytest.raises(QuorumClientError):
            client.put("never-committed", "no")
        described = live.quorum(leader)
        assert described is not None
        leader_row = next(v for v in described["voters"] if v["id"] == leader)
        assert leader_row["log_end_offset"] > described["high_watermark"] == high_watermark
        location = _backup(live.nodes[leader].url, str(tmp_path / "backups"), capsys)
    finally:
        for node_id in followers:
            live.signal(node_id, signal.SIGCONT)
    manifest = BackupManifest.model_validate_json((Path(location) / MANIFEST_NAME).read_bytes())
    assert committed < manifest.end_offset == high_watermark
    assert main(["restore", "--from", location, "--voters", "1,2,3",
                 "--log-dir", str(tmp_path / "restored" / "node-{id}")]) == 0
    assert b"never-committed" not in b"".join(
        path.read_bytes() for path in (tmp_path / "restored").rglob("*.log"))
    assert b"never-committed" in b"".join(
        path.read_bytes() for path in (live.directory / f"node-{leader}").rglob("*.log"))


@pytest.mark.parametrize(("args", "message"), [
    (["--voters", "1,2,3", "--log-dir", "x"], "--log-dir needs {id}"),
    (["--voters", "1,2,3", "--node-id", "2", "--log-dir", "x"],
     "voter 1 needs its directory id (ID:DIRECTORY_ID)"),
    (["--voters", "1,1,2", "--log-dir", "x/{id}"], "a voter id is given twice"),
    (["--voters", "1,two", "--log-dir", "x/{id}"], "--voters: 'two': expected ID or"),
    (["--voters", "1:AAAAAAAAAAAAAAAAAAAAAA,2", "--node-id", "1", "--log-dir", "x"],
     "directory id AAAAAAAAAAAAAAAAAAAAAA is reserved"),
    (["--voters", "5", "--node-id", "4", "--log-dir", "x"], "voter 5 needs its directory id"),
])
def test_restore_refuses_bad_arguments_in_one_line(
        local_backup: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        args: list[str], message: str) -> None:
    args = [arg.replace("x", str(tmp_path / "x")) if arg.startswith("x") else arg
            for arg in args]
    code = main(["restore", "--from", str(local_backup), *args])
    err = capsys.readouterr().err
    assert code in (1, 2) and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "x").exists()


def test_a_backup_needs_the_admin_role(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("admin-token-0123456789 operator admin\nreader-token-0123456789 app read\n")
    (tmp_path / "admin").write_text("admin-token-0123456789\n")
    (tmp_path / "reader").write_text("reader-token-0123456789\n")
    (tmp_path / "quorum").mkdir()
    cluster = ProcessCluster.create(tmp_path / "quorum", 1, **FAST,
                                    auth_token_file=tokens)  # type: ignore[arg-type]
    cluster.start_all()
    try:
        url = cluster.nodes[1].url
        target = str(tmp_path / "backups")
        deadline = time.monotonic() + 20
        while main(["backup", "-b", url, "--to", target, "--name", "ok",
                    "--token-file", str(tmp_path / "admin")]) != 0:
            assert time.monotonic() < deadline, capsys.readouterr().err
            time.sleep(0.2)  # until the node has a committed offset
        assert (tmp_path / "backups" / "ok" / MANIFEST_NAME).exists()
        capsys.readouterr()
        for credential in ([], ["--token-file", str(tmp_path / "reader")]):
            code = main(["backup", "-b", url, "--to", target, "--name", "refused",
                         *credential])
            err = capsys.readouterr().err
            assert code == 1 and err.count("\n") == 1, err
            assert "/v1/backup: HTTP 40" in err, err
        assert not (tmp_path / "backups" / "refused").exists()
    finally:
        cluster.stop_all()


# --- a hostile or altered backup -------------------------------------------------------------


def _copy(local_backup: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(local_backup, copy)
    return copy


def _restore(source: Path | str, target: Path, *extra: str) -> int:
    return main(["restore", "--from", str(source), "--voters", "1,2,3",
                 "--log-dir", str(target / "node-{id}"), *extra])


def _rewrite(backup: Path, path: str, data: bytes, **fields: int) -> None:
    """Give a file of the backup new contents and the manifest its size and sha256 (and
    ``fields``): a backup altered whole, which no checksum catches."""
    (backup / path).write_bytes(data)
    document = json.loads((backup / MANIFEST_NAME).read_text())
    for entry in document["files"]:
        if entry["path"] == path:
            entry["size"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    document.update(fields)
    (backup / MANIFEST_NAME).write_text(json.dumps(document))


def _last_segment(backup: Path) -> str:
    return str(max(backup.glob(f"{METADATA_PARTITION_DIR}/*.log")).relative_to(backup))


def _assert_refused(local_backup: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                    alter: Callable[[Path], str]) -> None:
    """Restoring a copy of the backup that ``alter`` changed is refused in one line, holding
    what ``alter`` returns, and writes nothing."""
    copy = _copy(local_backup, tmp_path)
    message = alter(copy)
    target = tmp_path / "restored"
    code = _restore(copy, target)
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and message in err, err
    assert not target.exists()


def _outside_link(backup: Path) -> str:
    """The last segment becomes a link to a copy outside the backup (same bytes)."""
    segment = backup / _last_segment(backup)
    outside = backup.parent / "elsewhere.log"
    shutil.copyfile(segment, outside)
    segment.unlink()
    segment.symlink_to(outside)
    return "symbolic link"


def _linked_partition(backup: Path) -> str:
    """The partition directory becomes a link to a copy of it outside the backup."""
    partition = backup / METADATA_PARTITION_DIR
    outside = backup.parent / "elsewhere"
    shutil.copytree(partition, outside)
    shutil.rmtree(partition)
    partition.symlink_to(outside)
    return "symbolic link"


def _fifo(backup: Path) -> str:
    """The last segment becomes a FIFO, which nothing writes to: opening it to read blocks."""
    segment = backup / _last_segment(backup)
    segment.unlink()
    os.mkfifo(segment)
    return "not a regular file"


@pytest.mark.parametrize("alter", [_outside_link, _linked_partition, _fifo])
def test_restore_follows_no_link_and_reads_regular_files_only(
        local_backup: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        alter: Callable[[Path], str]) -> None:
    """A backup that links out of itself (to a file with the very bytes the manifest lists, so
    no checksum objects) was read through the link; a FIFO blocked the restore for good."""
    _assert_refused(local_backup, tmp_path, capsys, alter)


class _EndlessFile(io.RawIOBase):
    """A file that never ends; it counts what is read of it."""

    def __init__(self) -> None:
        self.read_bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        if self.read_bytes > 64 << 20:
            raise AssertionError(f"{self.read_bytes} bytes read of an endless file")
        buffer[:] = bytes(len(buffer))
        self.read_bytes += len(buffer)
        return len(buffer)


class _EndlessSegment(LocalStore):
    """A local backup whose last segment reads on without end (as a link to /dev/zero did)."""

    def __init__(self, root: Path, endless: str) -> None:
        super().__init__(root)
        self.endless, self.file = endless, _EndlessFile()

    @contextlib.contextmanager
    def open(self, path: str) -> Iterator[BinaryIO]:
        if path != self.endless:
            with super().open(path) as stream:
                yield stream
            return
        yield io.BufferedReader(self.file)


def test_restore_reads_no_file_past_its_manifest_size(local_backup: Path,
                                                      tmp_path: Path) -> None:
    """A segment that reads on without end (a link to /dev/zero once staged 2 GiB before its
    size was compared) is refused at its first byte past the size the manifest gives."""
    segment = _last_segment(local_backup)
    store = _EndlessSegment(local_backup, segment)
    size = (local_backup / segment).stat().st_size
    with pytest.raises(BackupError, match=r"larger than the \d+ bytes the manifest says"):
        restore(store, new_voter_set([(1, None)], generate=True),
                lambda node_id: tmp_path / f"node-{node_id}")
    assert store.file.read_bytes <= size + (2 << 20)
    assert sorted(tmp_path.iterdir()) == []


def _non_kv_snapshot(backup: Path) -> str:
    """The snapshot's records become ones the key-value store cannot load."""
    path = str(next(backup.glob(f"{METADATA_PARTITION_DIR}/*.checkpoint")).relative_to(backup))
    voters = read_snapshot((backup / path).read_bytes()).voters
    _rewrite(backup, path, encode_snapshot(voters, 0, [Record(b"an application record")]))
    return "a snapshot of the store holds puts only"


def _epoch_at_the_bound(backup: Path) -> str:
    """One more batch, of epoch 2^31 - 1: a node refuses to start on such a log."""
    manifest = BackupManifest.model_validate_json((backup / MANIFEST_NAME).read_bytes())
    path = _last_segment(backup)
    batch = encode_batch(manifest.end_offset, MAX_EPOCH, [Record(b"x")], 0)
    _rewrite(backup, path, (backup / path).read_bytes() + batch,
             end_offset=manifest.end_offset + 1, last_epoch=MAX_EPOCH)
    return f"the last epoch {MAX_EPOCH} is not below {MAX_EPOCH}"


def _epoch_going_back(backup: Path) -> str:
    """One more batch, of epoch 0 after later ones: a node's recovery refuses the log."""
    manifest = BackupManifest.model_validate_json((backup / MANIFEST_NAME).read_bytes())
    path = _last_segment(backup)
    batch = encode_batch(manifest.end_offset, 0, [Record(b"x")], 0)
    _rewrite(backup, path, (backup / path).read_bytes() + batch,
             end_offset=manifest.end_offset + 1, last_epoch=0)
    return "batch epoch 0 is older than"


@pytest.mark.parametrize("alter", [_non_kv_snapshot, _epoch_at_the_bound, _epoch_going_back])
def test_restore_refuses_what_a_node_would_refuse(
        local_backup: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        alter: Callable[[Path], str]) -> None:
    """Backups whose checksums all match, which restore once accepted and the nodes then
    refused: a snapshot the key-value store cannot load (each node's state machine stopped,
    /healthz 503), a last epoch at the int32 bound or a log whose epochs go back (no node
    started). They are checked with the node's own checks and refused in one line."""
    _assert_refused(local_backup, tmp_path, capsys, alter)


def _modes(root: Path) -> dict[str, int]:
    return {str(path.relative_to(root)): stat.S_IMODE(path.lstat().st_mode)
            for path in [root, *root.rglob("*")]}


def test_backups_and_restored_directories_are_private_whatever_the_umask(
        live: ProcessCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Under the most permissive umask, a backup written to a directory and the directories
    restored from it are their owner's only: files 0600, directories 0700 (they were 0644 and
    0755 under the default umask, readable by every local user)."""
    previous = os.umask(0)
    try:
        location = _backup(live.nodes[1].url, str(tmp_path / "backups"), capsys)
        assert _restore(location, tmp_path / "restored") == 0
    finally:
        os.umask(previous)
    for root in (tmp_path / "backups", tmp_path / "restored"):
        modes = _modes(root)
        assert any(name.endswith(".log") for name in modes)
        wrong = {name: oct(mode) for name, mode in modes.items()
                 if mode != (0o700 if (root / name).is_dir() else 0o600)}
        assert not wrong, wrong


class _StallingS3:
    """An object store serving a local backup under ``s3://quorum-backups/one/`` over loopback,
    which stops in the middle of ``stall_path`` until released: a restore that reads it is
    caught mid-way, with its staging directory written to."""

    def __init__(self, backup: Path, stall_path: str) -> None:
        self.backup, self.stall_path = backup, stall_path
        self.stalled, self.release = threading.Event(), threading.Event()
        store = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = urllib.parse.urlsplit(self.path).path.removeprefix(f"/{BUCKET}/one/")
                data = (store.backup / path).read_bytes() if path else b""
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if path != store.stall_path:
                    self.wfile.write(data)
                    return
                self.wfile.write(data[:len(data) // 2])
                self.wfile.flush()
                store.stalled.set()
                store.release.wait(60)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def _restore_process(server: _StallingS3, target: Path, tmp_path: Path
                     ) -> subprocess.Popen[bytes]:
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_DEFAULT_REGION": "us-east-1"}
    return subprocess.Popen(
        [sys.executable, "-m", "quorum_node.cli.node", "restore", "--from",
         f"s3://{BUCKET}/one", "--endpoint-url", server.url, "--voters", "1,2,3",
         "--log-dir", str(target / "node-{id}")],
        stdout=(tmp_path / "restore.out").open("wb"), stderr=subprocess.PIPE, env=env)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_stopped_restore_leaves_no_staging_directory(
        local_backup: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        signum: signal.Signals) -> None:
    """A restore stopped while it copies the backup (its read of a segment stalls) once left
    its staging directory, a copy of the backup, behind. On SIGTERM it now removes it, and every
    directory it created, before it exits (143); after a SIGKILL the next restore removes it."""
    server = _StallingS3(local_backup, _last_segment(local_backup))
    target = tmp_path / "restored"
    try:
        process = _restore_process(server, target, tmp_path)
        try:
            assert server.stalled.wait(30), process.communicate(timeout=10)
            staged = list(target.glob(".restore-*"))
            assert staged and any(path.is_file() for path in staged[0].rglob("*"))
            process.send_signal(signum)
            _, err = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    finally:
        server.close()
    if signum == signal.SIGTERM:
        assert process.returncode == 128 + signal.SIGTERM
        assert err.decode().count("\n") == 1 and "terminated (SIGTERM)" in err.decode(), err
        assert not target.exists()
        return
    assert process.returncode == -signal.SIGKILL
    assert [path.name for path in target.iterdir()] == [staged[0].name]
    assert _restore(local_backup, target) == 0
    out = capsys.readouterr().out
    assert f"{staged[0]}: removed, left by a restore that was killed" in out, out
    assert sorted(path.name for path in target.iterdir()) == ["node-1", "node-2", "node-3"]


def _open_files(pid: int, suffixes: tuple[str, ...]) -> int:
    """How many of the process's descriptors are open on files with these suffixes."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            count += os.readlink(fd).removesuffix(" (deleted)").endswith(suffixes)
    return count


def test_a_stalled_backup_reader_is_cut_off_and_backups_are_capped(tmp_path: Path) -> None:
    """A GET /v1/backup reader that stops reading once held the backup's files open (deleted
    segments keep their disk space) for as long as it liked, and any number of them could.
    Now one that takes no data for backup.write.timeout.ms is cut off and its files released,
    and beyond backup.max.streams a backup is refused with 503 BACKUP_UNAVAILABLE."""
    cluster = ProcessCluster.create(tmp_path, 1, **FAST, backup_write_timeout_ms=1000,
                                    backup_max_streams=1)
    cluster.start_all()
    try:
        cluster.wait_for_leader()
        node = cluster.nodes[1]
        with QuorumClient(node.url, timeout_s=30) as client:
            for i in range(24):  # 12 MB: more than the socket buffers hold
                client.put(f"big-{i}", "v" * (512 * 1024))
        process = node.process
        assert process is not None
        kept_open = _open_files(process.pid, (".log", ".checkpoint"))
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", node.port))
        stalled.sendall(b"GET /v1/backup HTTP/1.1\r\nHost: quorum\r\n\r\n")
        assert stalled.recv(12) == b"HTTP/1.1 200"  # and then it reads no more
        try:
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"{node.url}/v1/backup", timeout=10)
            assert refused.value.code == 503
            assert "backup.max.streams" in refused.value.read().decode()

            def cut_off() -> bool:
                return "cut off" in node.log_path.read_text()

            deadline = time.monotonic() + 15
            while not cut_off():
                assert time.monotonic() < deadline, cluster.logs()
                time.sleep(0.1)
        finally:
            stalled.close()
        deadline = time.monotonic() + 10
        while _open_files(process.pid, (".log", ".checkpoint")) > kept_open:
            assert time.monotonic() < deadline, "the backup's files stay open"
            time.sleep(0.1)
        with urllib.request.urlopen(f"{node.url}/v1/backup", timeout=30) as answer:
            assert len(answer.read()) > 12 * 1024 * 1024  # the slot was given back
    finally:
        cluster.stop_all()
