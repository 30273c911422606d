"""One process per log directory: a second node, format, export or repair-log on a directory in
use is refused in one line, naming the holder's pid, and changes nothing; a killed holder's lock
is gone with it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from proc_cluster import FAST, ProcessCluster, free_port

from quorum_node.cli.local_quorum import prepare_local_cluster
from quorum_node.cli.node import main
from quorum_node.storage.dir_lock import lock_directory
from quorum_node.storage.meta_properties import format_log_dir, random_cluster_id

CLI = [sys.executable, "-m", "quorum_node.cli.node"]


def files(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Every file's bytes and modification time."""
    return {str(p.relative_to(directory)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file()}


def in_use(directory: Path, pid: int, what: str = "log directory") -> str:
    return f"{what} {directory} is in use by another process (pid {pid})"


def wait_healthy(port: int, process: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError), urllib.request.urlopen(
                f"http://127.0.0.1:{port}/healthz", timeout=2) as reply:
            if reply.status == 200:
                return
        assert process.poll() is None, f"the node exited with {process.returncode}"
        assert time.monotonic() < deadline, "the node did not become healthy"
        time.sleep(0.1)


def test_a_second_run_on_a_directory_in_use_is_refused_until_the_first_is_killed(
    tmp_path: Path,
) -> None:
    cluster = ProcessCluster.create(tmp_path, 1, **FAST)
    node = cluster.nodes[1]
    log_dir = tmp_path / "node-1"
    # The same directory on other ports, so that only the lock can refuse it.
    second_port = free_port()
    second_config = tmp_path / "second.properties"
    original = node.config_path.read_text()
    assert f"127.0.0.1:{node.port}," in original and f"127.0.0.1:{node.peer_port}\n" in original
    second_config.write_text(original.replace(
        f"127.0.0.1:{node.port},", f"127.0.0.1:{second_port},").replace(
        f"127.0.0.1:{node.peer_port}\n", f"127.0.0.1:{free_port()}\n"))
    second: subprocess.Popen[bytes] | None = None
    try:
        cluster.start(1)
        cluster.wait_for_leader()
        assert node.process is not None
        time.sleep(0.5)  # let the new leader's writes settle
        before = files(log_dir)
        started = time.monotonic()
        refused = subprocess.run([*CLI, "run", "--config", str(second_config)],
                                 capture_output=True, text=True, timeout=60, check=False)
        elapsed = time.monotonic() - started
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert refused.stderr.startswith(
            f"quorum-node run: error: {in_use(log_dir, node.process.pid)}"), refused.stderr
        assert files(log_dir) == before
        assert cluster.quorum(1) is not None  # the first one goes on

        cluster.kill(1)  # kill -9: the kernel drops its lock with it
        second = subprocess.Popen([*CLI, "run", "--config", str(second_config)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_healthy(second_port, second)
        print(f"refused in {elapsed:.2f} s")
    finally:
        if second is not None:
            second.kill()
            second.wait()
        cluster.stop_all()


@pytest.fixture
def held(tmp_path: Path) -> Path:
    """A formatted log directory, locked by this process as a running node would lock it."""
    log_dir = tmp_path / "node-1"
    format_log_dir(log_dir, random_cluster_id(), 1)
    return log_dir


def test_format_on_a_directory_in_use_is_refused(
    held: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    with lock_directory(held):
        before = files(held)
        assert main(["format", "--log-dir", str(held), "--node-id", "1", "--cluster-id",
                     random_cluster_id(), "--ignore-formatted"]) == 2
        assert files(held) == before
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert error.startswith(f"quorum-node format: error: {in_use(held, os.getpid())}")


def test_export_on_a_directory_in_use_is_refused_unless_live(
    held: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    archive = tmp_path / "node-1.tar"
    with lock_directory(held):
        before = files(held)
        assert main(["export", "--log-dir", str(held), "--output", str(archive)]) == 2
        assert not archive.exists() and files(held) == before
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and in_use(held, os.getpid()) in error
        assert "--live" in error
        assert main(["export", "--live", "--log-dir", str(held), "--output", str(archive)]) == 0
        assert archive.stat().st_size > 0
    assert main(["export", "--log-dir", str(held), "--output", str(archive)]) == 0


def test_repair_log_on_a_directory_in_use_is_refused(
    held: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    with lock_directory(held):
        before = files(held)
        assert main(["repair-log", "--log-dir", str(held), "--yes"]) == 2
        assert files(held) == before
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert error.startswith(f"quorum-node repair-log: error: {in_use(held, os.getpid())}")


def test_local_refuses_a_data_directory_whose_node_runs_by_hand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    data = tmp_path / "data"
    prepare_local_cluster(data, 3, base_port=free_port())
    with lock_directory(data / "node-2"):  # `quorum-node run --config data/node-2.properties`
        before = files(data)
        assert main(["local", "--data-dir", str(data), "--base-port", str(free_port())]) == 2
        # Nothing but lock files: `local` itself took the free data directory's lock (and
        # node-1's, to see that it was free) before it found node-2 in use.
        after = files(data)
        assert after.keys() - before.keys() == {".lock", "node-1/.lock"}
        assert {name: after[name] for name in before} == before
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert error.startswith(f"quorum-node local: error: data directory {data} is in use by "
                            f"another process (pid {os.getpid()}, which holds {data / 'node-2'})")
