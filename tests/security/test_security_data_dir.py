"""A foreign or corrupt data directory is refused with a one-line error naming what is wrong,
and not a byte of it is changed or deleted: another cluster's or node's meta.properties, a
damaged segment, quorum-state or snapshot, a non-empty unformatted directory."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from secured_cluster import InProcessCluster, plain_configs

from quorum_node.cli.node import main as node_main
from quorum_node.client import QuorumClient
from quorum_node.node.config import NodeConfig
from quorum_node.node.runtime import QuorumNode
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
        QuorumNode(config)
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
        QuorumNode(config)
    assert fingerprint(config.log_dir) == before
