"""A foreign or corrupt data directory is refused with a one-line error naming what is wrong,
and not a byte of it is changed or deleted: another cluster's or node's meta.properties, a
damaged segment, quorum-state or snapshot, a non-empty unformatted directory."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from proc_cluster import FAST, ProcessCluster
from secured_cluster import InProcessCluster, plain_configs

from quorum_node.cli.local_quorum import lock_local_data_dir, prepare_local_cluster
from quorum_node.cli.node import main as node_main
from quorum_node.client import QuorumClient
from quorum_node.node.config import NodeConfig
from quorum_node.node.wiring import build_node
from quorum_node.storage.dir_lock import LOCK_FILE
from quorum_node.storage.errors import StorageError
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR
from quorum_node.storage.meta_properties import random_cluster_id


@pytest.fixture(scope="module")
def used(tmp_path_factory: pytest.TempPathFactory) -> NodeConfig:
    """A node's directory after some use: several segments, a snapshot, a quorum-state."""
    config = plain_configs(tmp_path_factory.mktemp("used"), 1, snapshot_interval_records=10,
                           segment_bytes=600)[0]
    cluster = InProcessCluster([config])
    try:
        with QuorumClient(cluster.address(1)) as client:
            for i in range(30):
                client.put(f"key-{i}", "value" * 10)
    finally:
        cluster.stop()
    assert list((config.log_dir / METADATA_PARTITION_DIR).glob("*.checkpoint"))
    return config


def fingerprint(directory: Path) -> dict[str, str]:
    # Not the lock file: it holds the pid of the last process that opened the directory.
    return {str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(directory.rglob("*")) if path.is_file() and path.name != LOCK_FILE}


def flip_byte(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def partition(config: NodeConfig) -> Path:
    return config.log_dir / METADATA_PARTITION_DIR


def other_cluster(config: NodeConfig) -> NodeConfig:
    return config.model_copy(update={"cluster_id": random_cluster_id()})


def other_node(config: NodeConfig) -> NodeConfig:
    return config.model_copy(update={"node_id": 7})


def damaged_middle_segment(config: NodeConfig) -> NodeConfig:
    segments = sorted(partition(config).glob("*.log"))
    assert len(segments) >= 2
    flip_byte(segments[0], 40)  # inside the first batch of an older segment
    return config


def damaged_quorum_state(config: NodeConfig) -> NodeConfig:
    (partition(config) / "quorum-state").write_text("{not json")
    return config


def damaged_snapshot(config: NodeConfig) -> NodeConfig:
    latest = max(partition(config).glob("*.checkpoint"))
    flip_byte(latest, os.path.getsize(latest) // 2)
    return config


def truncated_snapshot(config: NodeConfig) -> NodeConfig:
    latest = max(partition(config).glob("*.checkpoint"))
    latest.write_bytes(latest.read_bytes()[:-7])
    return config


CASES: dict[str, tuple[Callable[[NodeConfig], NodeConfig], str]] = {
    "another cluster": (other_cluster, "cluster"),
    "another node": (other_node, "node"),
    "damaged older segment": (damaged_middle_segment, "refusing to open the log"),
    "damaged quorum-state": (damaged_quorum_state, "quorum-state"),
    "damaged snapshot": (damaged_snapshot, "corrupt snapshot"),
    "truncated snapshot": (truncated_snapshot, "corrupt snapshot"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_foreign_or_corrupt_directory_is_refused_untouched(
        used: NodeConfig, tmp_path: Path, case: str) -> None:
    damage, problem = CASES[case]
    copy = used.model_copy(update={"log_dir": tmp_path / "data"})
    shutil.copytree(used.log_dir, copy.log_dir)
    config = damage(copy)
    before = fingerprint(config.log_dir)
    with pytest.raises(StorageError) as refused:
        build_node(config)
    message = str(refused.value)
    assert "\n" not in message and problem in message, message
    assert fingerprint(config.log_dir) == before


def test_quorum_node_run_refuses_in_one_line(used: NodeConfig, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    copy = used.model_copy(update={"log_dir": tmp_path / "data"})
    shutil.copytree(used.log_dir, copy.log_dir)
    damaged_snapshot(copy)
    before = fingerprint(copy.log_dir)
    properties = tmp_path / "node.properties"
    properties.write_text(copy.to_properties())
    assert node_main(["run", "--config", str(properties)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("quorum-node run: error: ") and "corrupt snapshot" in error
    assert "\n" not in error
    assert fingerprint(copy.log_dir) == before


def test_format_if_empty_never_formats_a_directory_with_contents(tmp_path: Path) -> None:
    config = plain_configs(tmp_path, 1, format_if_empty=True)[0]
    (config.log_dir / "meta.properties").unlink()
    (config.log_dir / "precious").write_text("not ours")
    before = fingerprint(config.log_dir)
    with pytest.raises(StorageError):
        build_node(config)
    assert fingerprint(config.log_dir) == before


def _not_private(root: Path) -> dict[str, str]:
    """Entries under ``root`` that another user could read (files not 0600, directories not
    0700)."""
    return {str(path.relative_to(root)): oct(stat.S_IMODE(path.lstat().st_mode))
            for path in [root, *root.rglob("*")]
            if stat.S_IMODE(path.lstat().st_mode) != (0o700 if path.is_dir() else 0o600)}


def test_a_nodes_files_are_its_owners_only_whatever_the_umask(tmp_path: Path) -> None:
    """A node process started under the most permissive umask writes its segments, snapshots,
    quorum-state, meta.properties and lock 0600 in directories 0700; under the default umask
    they were 0644 and 0755 (0666 and 0777 under this one), every record readable by every
    local user."""
    previous = os.umask(0)
    try:
        cluster = ProcessCluster.create(tmp_path, 1, **FAST, snapshot_interval_records=20,
                                        log_segment_bytes=2048)
        cluster.start_all()
        try:
            cluster.wait_for_leader()
            with QuorumClient(cluster.nodes[1].url, timeout_s=10) as client:
                for i in range(60):
                    client.put(f"key-{i}", "value" * 10)
        finally:
            cluster.stop_all()
    finally:
        os.umask(previous)
    node_dir = tmp_path / "node-1"
    names = [path.name for path in node_dir.rglob("*")]
    assert any(name.endswith(".checkpoint") for name in names)
    assert any(name.endswith(".log") for name in names)
    assert {"quorum-state", "meta.properties", LOCK_FILE} <= set(names)
    assert _not_private(node_dir) == {}


def test_a_local_quorums_files_are_its_owners_only_whatever_the_umask(tmp_path: Path) -> None:
    """What `quorum-node local` writes before starting its nodes: the data directory (locked
    first), the peer secret, the cluster id, each node's properties and formatted directory."""
    previous = os.umask(0)
    try:
        data = tmp_path / "data"
        with lock_local_data_dir(data, 3):
            prepare_local_cluster(data, 3)
    finally:
        os.umask(previous)
    assert {"peer-secret", "cluster.id", "node-1.properties", "node-3"} <= {
        path.name for path in data.iterdir()}
    assert _not_private(data) == {}
