"""The directory lock: one holder at a time, its pid in the refusal, and gone with its holder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from quorum_node.storage.dir_lock import LOCK_FILE, DirectoryInUseError, lock_directory
from quorum_node.storage.errors import MetaPropertiesError
from quorum_node.storage.log_dir import LogDirectory
from quorum_node.storage.meta_properties import format_log_dir, random_cluster_id


def files(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(directory)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_second_lock_is_refused_naming_the_holder_and_changing_nothing(tmp_path: Path) -> None:
    with lock_directory(tmp_path / "d", create=True) as held:
        assert held.held
        before = files(tmp_path / "d")
        assert before[LOCK_FILE][0] == f"{os.getpid()}\n".encode()
        with pytest.raises(DirectoryInUseError) as refused:
            lock_directory(tmp_path / "d")
        message = str(refused.value)
        assert message.startswith(f"log directory {tmp_path / 'd'} is in use by another process "
                                  f"(pid {os.getpid()})")
        assert "\n" not in message and refused.value.holder_pid == os.getpid()
        assert files(tmp_path / "d") == before
    assert not held.held
    lock_directory(tmp_path / "d").release()  # free again


def test_a_missing_directory_is_not_created_without_create(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        lock_directory(tmp_path / "absent")
    assert not (tmp_path / "absent").exists()


def test_the_kernel_releases_the_lock_of_a_killed_holder(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import time
            from quorum_node.storage.dir_lock import lock_directory
            lock = lock_directory({str(tmp_path)!r})
            print("locked", flush=True)
            time.sleep(60)
        """)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        with pytest.raises(DirectoryInUseError, match=rf"\(pid {holder.pid}\)"):
            lock_directory(tmp_path)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    lock_directory(tmp_path).release()  # no stale lock: the file is there, the lock is not


def test_an_open_log_directory_holds_its_lock_until_closed(tmp_path: Path) -> None:
    cluster_id = random_cluster_id()
    format_log_dir(tmp_path, cluster_id, 1)
    opened = LogDirectory.open(tmp_path, cluster_id=cluster_id, node_id=1)
    try:
        with pytest.raises(DirectoryInUseError):
            LogDirectory.open(tmp_path, cluster_id=cluster_id, node_id=1)
    finally:
        opened.close()
    LogDirectory.open(tmp_path, cluster_id=cluster_id, node_id=1).close()


def test_another_nodes_directory_gets_no_lock_file(tmp_path: Path) -> None:
    format_log_dir(tmp_path, random_cluster_id(), 1)
    with pytest.raises(MetaPropertiesError, match="does not match the configured node id"):
        LogDirectory.open(tmp_path, cluster_id=random_cluster_id(), node_id=2)
    assert not (tmp_path / LOCK_FILE).exists()
