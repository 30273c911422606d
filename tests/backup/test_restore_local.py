"""A restored backup starts the way a quorum was started: ``restore --local`` writes what
``quorum-node local`` starts as it is, prints that command, and the restored nodes start without
the warning a quorum-state behind its log gives; docs/backup.md's worked example run as a user
types it; ``quorum-node restore-drill`` on real processes, by hand and from a directory of
backups."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from proc_cluster import FAST, ProcessCluster

from quorum_node.backup.manifest import MANIFEST_NAME, BackupManifest
from quorum_node.cli.local_layout import CLUSTER_ID_FILE
from quorum_node.cli.node import main
from quorum_node.client import QuorumClient
from quorum_node.raft.state import ElectionState
from quorum_node.storage.log_dir import METADATA_PARTITION_DIR
from quorum_node.storage.meta_properties import read_meta_properties
from quorum_node.storage.quorum_state import QuorumStateStore

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "backup.md"
EXAMPLE = "### A worked example: restoring on one machine"
BEHIND = "is behind the log's last epoch"
KEYS = 120


@pytest.fixture(scope="module")
def backups(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory of two backups of a live 3-node quorum holding ``KEYS`` keys (one deleted,
    one overwritten after the first backup), and an incomplete third, newest by name."""
    directory = tmp_path_factory.mktemp("quorum")
    cluster = ProcessCluster.create(directory, 3, **FAST)
    cluster.start_all()
    target = tmp_path_factory.mktemp("backups")
    try:
        cluster.wait_for_leader()
        with QuorumClient([node.url for node in cluster.nodes.values()], timeout_s=20) as client:
            for i in range(KEYS):
                client.put(f"key-{i:03d}", f"value-{i}")
            assert main(["backup", "-b", cluster.nodes[2].url, "--to", str(target),
                         "--name", "20260101T000000Z-node-2"]) == 0
            client.delete("key-000")
            client.put("key-001", "overwritten")
            assert main(["backup", "-b", cluster.nodes[3].url, "--to", str(target),
                         "--name", "20260101T010000Z-node-3"]) == 0
    finally:
        cluster.stop_all()
    # An upload that failed before its manifest: newest by name, and not a backup.
    shutil.copytree(target / "20260101T010000Z-node-3", target / "20260101T020000Z-node-1")
    (target / "20260101T020000Z-node-1" / MANIFEST_NAME).unlink()
    yield target


def test_restore_local_writes_what_local_starts_and_prints_the_command(
        backups: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = backups / "20260101T010000Z-node-3"
    data_dir = tmp_path / "restored"
    assert main(["restore", "--from", str(source), "--local", str(data_dir),
                 "--nodes", "1"]) == 0
    out = capsys.readouterr().out
    assert f"  quorum-node local --data-dir {data_dir} --nodes 1\n" in out, out
    manifest = BackupManifest.parse((source / MANIFEST_NAME).read_bytes(), "manifest")
    assert (data_dir / CLUSTER_ID_FILE).read_text() == f"{manifest.cluster_id}\n"
    assert sorted(p.name for p in data_dir.iterdir()) == [CLUSTER_ID_FILE, "node-1"]
    assert read_meta_properties(data_dir / "node-1" / "meta.properties").node_id == 1
    # A new voter's election state in the log's last epoch: nothing for the node to warn of.
    stored = QuorumStateStore(data_dir / "node-1" / METADATA_PARTITION_DIR).read()
    assert stored == ElectionState(manifest.last_epoch)


@pytest.mark.parametrize(("args", "message"), [
    (["--local", "{tmp}/used"], "not empty; restore writes a new data directory only"),
    (["--local", "{tmp}/x", "--voters", "1,2,3"], "--voters goes with --log-dir"),
    (["--local", "{tmp}/x", "--node-id", "1"], "--node-id goes with --log-dir"),
    (["--local", "{tmp}/x", "--nodes", "0"], "--nodes must be at least 1"),
    (["--log-dir", "{tmp}/x/{id}", "--nodes", "3"], "--nodes goes with --local"),
    (["--log-dir", "{tmp}/x/{id}"], "--log-dir needs --voters"),
])
def test_restore_local_refuses_bad_arguments_in_one_line(
        backups: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        args: list[str], message: str) -> None:
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "something").write_text("mine")
    args = [arg.replace("{tmp}", str(tmp_path)) for arg in args]
    code = main(["restore", "--from", str(backups / "20260101T010000Z-node-3"), *args])
    err = capsys.readouterr().err
    assert code in (1, 2) and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "x").exists()
    assert [p.name for p in (tmp_path / "used").iterdir()] == ["something"]


def _network_namespaces() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    done = subprocess.run(["unshare", "--net", "true"], capture_output=True, check=False)
    return done.returncode == 0


@pytest.mark.skipif(not _network_namespaces(), reason="needs root and unshare --net")
def test_the_worked_example_runs_as_written(tmp_path: Path) -> None:
    """docs/backup.md's transcript, each line as typed (``quorum-node`` and ``quorum-client``
    of this checkout), in a network namespace of its own: its default ports are free there
    whatever else runs on the machine."""
    bin_dir = str(Path(sys.executable).parent)
    environment = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    driver = Path(__file__).with_name("doc_transcript.py")
    done = subprocess.run(
        ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$0" "$@"',
         sys.executable, str(driver), str(DOC), EXAMPLE],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=400,
        check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    logs = sorted((tmp_path / "restored").glob("node-*.log"))
    assert [log.name for log in logs] == ["node-1.log", "node-2.log", "node-3.log"]
    for log in logs:
        assert BEHIND not in log.read_text(), log.read_text()


def test_a_restore_drill_serves_the_newest_complete_backup(
        backups: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "report.json"
    assert main(["restore-drill", "--from", str(backups), "--report", str(report),
                 "--work-dir", str(tmp_path / "scratch")]) == 0, capsys.readouterr()
    found = json.loads(report.read_text())
    newest = backups / "20260101T010000Z-node-3"  # the incomplete one after it is skipped
    manifest = BackupManifest.parse((newest / MANIFEST_NAME).read_bytes(), "manifest")
    assert found["passed"] is True, found
    assert found["backup"] == str(newest)
    assert found["endOffset"] == manifest.end_offset
    # Every key the backup's files hold, compared one by one by the drill (a follower's backup
    # may end a write or two before the last acknowledged one).
    assert KEYS - 1 <= found["keys"] <= KEYS
    assert found["leader"] in (1, 2, 3) and found["durationSeconds"] > 0
    assert not (tmp_path / "scratch").exists()  # removed after the drill
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("passed: ")


def test_a_restore_drill_of_one_backup_by_hand(backups: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["restore-drill", "--from", str(backups / "20260101T000000Z-node-2"),
                 "--nodes", "1"]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert "restored as 1 voters" in out and " keys served as of offset " in out, out


@pytest.mark.parametrize("damage", ["none", "checksum"])
def test_a_failed_restore_drill_says_why(backups: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str], damage: str
                                         ) -> None:
    source = tmp_path / "backups"
    if damage == "none":
        source.mkdir()
        expected = "no complete backup there"
    else:
        shutil.copytree(backups / "20260101T000000Z-node-2", source)
        segment = next((source / METADATA_PARTITION_DIR).glob("*.log"))
        data = bytearray(segment.read_bytes())
        data[-5] ^= 0xFF
        segment.write_bytes(bytes(data))
        expected = "checksum mismatch"
    report = tmp_path / "report.json"
    assert main(["restore-drill", "--from", str(source), "--report", str(report)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err, err
    found = json.loads(report.read_text())
    assert found["passed"] is False and expected in found["message"]
