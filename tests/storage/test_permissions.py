"""A log directory holds every record of the quorum: what the node creates in it is its owner's
only, whatever the umask, and what an older version left readable by all is made so at open."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorum_node.raft.records import Record
from quorum_node.raft.snapshot_format import encode_snapshot
from quorum_node.raft.snapshots import SnapshotId
from quorum_node.raft.state import ElectionState
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR, LogDirectory
from quorum_node.storage.meta_properties import format_log_dir

CLUSTER = "MkU3OEVBNTcwNTJENDM2Qg"


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The most permissive umask, for the test's duration."""
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def _use(root: Path) -> None:
    """Everything a node writes: meta.properties, the lock, segments (several), quorum-state, a
    snapshot saved and one downloaded."""
    format_log_dir(root, CLUSTER, 1)
    log_dir = LogDirectory.open(root, cluster_id=CLUSTER, node_id=1, segment_bytes=200)
    try:
        for epoch in (1, 2, 3):
            log_dir.log.append_as_leader([Record(b"x" * 100)], epoch, 0)
        log_dir.log.flush()
        log_dir.quorum_state.write(ElectionState(epoch=3, leader_id=1))
        log_dir.snapshots.save(SnapshotId(1, 1), encode_snapshot(None, 0, [Record(b"a")]))
        partial = log_dir.snapshots.begin_download(SnapshotId(2, 2))
        partial.append(encode_snapshot(None, 0, [Record(b"b")]))
        partial.freeze(lambda data: None)
    finally:
        log_dir.close()


def _modes(root: Path) -> dict[str, int]:
    return {str(path.relative_to(root)): stat.S_IMODE(path.lstat().st_mode)
            for path in [root, *root.rglob("*")]}


def _not_private(root: Path) -> dict[str, str]:
    return {name: oct(mode) for name, mode in _modes(root).items()
            if mode != (0o700 if (root / name).is_dir() else 0o600)}


@pytest.mark.usefixtures("open_umask")
def test_what_a_node_writes_is_its_owners_only_whatever_the_umask(tmp_path: Path) -> None:
    root = tmp_path / "node"
    _use(root)
    names = set(_modes(root))
    partition = METADATA_PARTITION_DIR
    assert {"meta.properties", ".lock", f"{partition}/quorum-state",
            f"{partition}/00000000000000000002-0000000002.checkpoint"} <= names
    assert sum(name.endswith(".log") for name in names) > 1
    assert _not_private(root) == {}


def test_an_older_layout_is_made_private_when_opened(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before, files were created 0644 and directories 0755 under the default umask: every
    local user could read every record. Opening such a directory (the node's start) takes
    those permissions back, once, and says so."""
    root = tmp_path / "node"
    _use(root)
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    with caplog.at_level(logging.INFO, logger="quorum_node.storage.log_dir"):
        LogDirectory.open(root, cluster_id=CLUSTER, node_id=1, segment_bytes=200).close()
    assert _not_private(root) == {}
    assert "files and directories were readable by other users" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="quorum_node.storage.log_dir"):
        LogDirectory.open(root, cluster_id=CLUSTER, node_id=1, segment_bytes=200).close()
    assert "readable by other users" not in caplog.text
