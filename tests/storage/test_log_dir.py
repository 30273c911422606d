"""The core on real files: a log directory opened, written through the core, reopened."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from quorum_node.raft.config import QuorumConfig
from quorum_node.raft.core import RaftCore
from quorum_node.raft.records import Record, decode_batches
from quorum_node.raft.state import RaftState
from quorum_node.raft.types import ControlRecordType, ReplicaKey
from quorum_node.storage.errors import MetaPropertiesError, NotFormattedError
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR, LogDirectory
from quorum_node.storage.meta_properties import format_log_dir

CLUSTER = "MkU3OEVBNTcwNTJENDM2Qg"


def _open_core(log_dir: LogDirectory, now_ms: int) -> RaftCore:
    return RaftCore(
        node_id=1, directory_id=log_dir.meta.directory_id, cluster_id=CLUSTER,
        voters=[ReplicaKey(1, log_dir.meta.directory_id)], log=log_dir.log,
        election_state=log_dir.quorum_state.read(), config=QuorumConfig(append_linger_ms=0),
        random=random.Random(7), now_ms=now_ms, snapshots=log_dir.snapshots,
    )


def _apply(core: RaftCore, log_dir: LogDirectory, now_ms: int) -> None:
    """The driver's side of the contract: persist, then flush and report."""
    for _ in range(10):
        effects = core.take_effects()
        if effects.persist is not None:
            log_dir.quorum_state.write(effects.persist)
        assert not effects.messages  # a lone voter talks to nobody
        if not effects.flush:
            return
        core.handle_flushed(now_ms, log_dir.log.flush())


def test_single_voter_survives_a_restart_on_disk(tmp_path: Path) -> None:
    format_log_dir(tmp_path, CLUSTER, 1)
    log_dir = LogDirectory.open(tmp_path, cluster_id=CLUSTER, node_id=1)
    core = _open_core(log_dir, 0)
    _apply(core, log_dir, 0)
    assert (core.state, core.epoch) == (RaftState.LEADER, 1)
    first, last = core.propose(1, [Record(b"a"), Record(b"b"), Record(b"c")])
    assert (first, last) == (2, 4)  # offset 0: the LeaderChange, 1: the bootstrap voters
    core.poll(1)
    _apply(core, log_dir, 1)
    assert core.high_watermark == last + 1
    log_dir.close()

    reopened = LogDirectory.open(tmp_path, cluster_id=CLUSTER, node_id=1)
    assert reopened.quorum_state.read() is not None
    core = _open_core(reopened, 10)
    _apply(core, reopened, 10)
    # It led epoch 1, so it never leads it again: it leaves it and is elected in a later epoch.
    assert core.state == RaftState.LEADER and core.epoch > 1
    # The records written before the restart are still there, after the first LeaderChange.
    written = decode_batches(reopened.log.read(0, 1 << 20))
    assert [r.value for b in written if not b.is_control for r in b.records] == [b"a", b"b", b"c"]
    assert written[0].is_control and next(iter(written[0].control_records()))[0] == (
        ControlRecordType.LEADER_CHANGE)
    assert written[-1].is_control and written[-1].epoch == core.epoch
    reopened.close()


def test_refuses_an_unformatted_directory(tmp_path: Path) -> None:
    with pytest.raises(NotFormattedError, match=r"meta\.properties"):
        LogDirectory.open(tmp_path, cluster_id=CLUSTER, node_id=1)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("cluster", "node", "message"), [
    (CLUSTER, 2, "node.id 1 does not match the configured node id 2"),
    ("b3RoZXJDbHVzdGVySWRYWA", 1, "cluster.id 'MkU3OEVBNTcwNTJENDM2Qg' does not match"),
])
def test_refuses_another_nodes_or_clusters_directory(
    tmp_path: Path, cluster: str, node: int, message: str
) -> None:
    format_log_dir(tmp_path, CLUSTER, 1)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(MetaPropertiesError, match=message):
        LogDirectory.open(tmp_path, cluster_id=cluster, node_id=node)
    # The check comes first: the partition directory was not even created.
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert not (tmp_path / METADATA_PARTITION_DIR).exists()
