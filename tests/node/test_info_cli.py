"""``quorum-node info``: a log directory's facts, read-only, also while its node runs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from test_admin_api import running_cluster

from quorum_node.cli.node import main
from quorum_node.raft.records import Record
from quorum_node.storage.kafka_uuid import to_kafka_string


def info(capsys: pytest.CaptureFixture[str], log_dir: Path) -> dict[str, object]:
    assert main(["info", "--log-dir", str(log_dir), "--json"]) == 0
    facts: dict[str, object] = json.loads(capsys.readouterr().out)
    return facts


async def test_info_on_a_running_node_and_a_copy_with_a_torn_tail(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async with running_cluster(tmp_path, size=1) as cluster:
        node = await cluster.wait_for_leader()
        await node.append([Record(b"a"), Record(b"b")], timeout_s=5)
        log_dir = node.config.log_dir
        before = sorted(p.name for p in log_dir.rglob("*"))
        facts = info(capsys, log_dir)
        assert sorted(p.name for p in log_dir.rglob("*")) == before  # nothing written
        assert facts["node_id"] == 1 and facts["cluster_id"] == cluster.cluster_id
        assert facts["directory_id"] == to_kafka_string(node.log_dir.meta.directory_id)
        assert facts["lock_holder_pid"] == os.getpid()  # the node runs in this process
        assert facts["log_start_offset"] == 0
        assert facts["log_end_offset"] == node.log_dir.log.end_offset
        assert facts["last_epoch"] == node.core.epoch
        assert facts["tail"] is None
        # The election state the node keeps beside its log (not above it).
        election = facts["quorum_state"]
        assert isinstance(election, dict), election
        assert election["leaderEpoch"] == node.core.epoch and election["leaderId"] == 1
        copy = tmp_path / "copy"
        shutil.copytree(log_dir, copy)
    segment = sorted((copy / "__cluster_metadata-0").glob("*.log"))[-1]
    with segment.open("ab") as out:
        out.write(b"\x00" * 7)  # a torn batch header
    facts = info(capsys, copy)
    assert facts["lock_holder_pid"] is None
    assert facts["log_end_offset"] == node.log_dir.log.end_offset
    assert str(facts["tail"]).startswith(f"{segment.name} at byte ")
    assert main(["info", "--log-dir", str(copy)]) == 0
    text = capsys.readouterr().out
    assert "in use by:       no process" in text and "torn tail:" in text
    assert "quorum-state:    {" in text and "quorum-state:    null" not in text


def test_info_on_something_else_is_one_line(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--log-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("quorum-node info: error: ")
