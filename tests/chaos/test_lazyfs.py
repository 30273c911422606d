"""The lazy file system itself: what is synced survives a power loss, what is not may vanish,
renames and directory fsyncs behave as on ext4 with its default options, and the failing-fsync
and full-disk faults look like a real disk's. Real system calls through a real FUSE mount."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from lazyfs import LazyFs, unavailable_reason

from quorum_node.storage.fsutil import (
    StepHook,
    WriteStep,
    atomic_rewrite,
    atomic_write,
    fsync_directory,
)

pytestmark = pytest.mark.skipif(unavailable_reason() is not None,
                                reason=f"lazyfs: {unavailable_reason()}")


@pytest.fixture
def lazy(tmp_path: Path) -> Iterator[LazyFs]:
    mounted = LazyFs(tmp_path / "mnt")
    try:
        yield mounted
    finally:
        mounted.unmount()


def write_file(path: Path, data: bytes, *, sync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def test_synced_data_survives_and_unsynced_data_vanishes(lazy: LazyFs) -> None:
    root = lazy.mountpoint
    write_file(root / "never-synced", b"lost", sync=False)
    write_file(root / "log", b"synced", sync=True)
    write_file(root / "log", b" and lost", sync=False)
    assert (root / "log").read_bytes() == b"synced and lost"  # the page cache serves it
    lazy.power_loss()
    assert (root / "log").read_bytes() == b"synced"
    # Its name was committed with the journal by the other file's fsync; its data never was.
    assert (root / "never-synced").read_bytes() == b""


def test_a_new_name_needs_a_commit_and_the_data_its_own_fsync(lazy: LazyFs) -> None:
    root = lazy.mountpoint
    write_file(root / "a", b"a", sync=True)
    write_file(root / "b", b"b", sync=False)  # after the last commit: name and data vanish
    (root / "dir").mkdir()
    lazy.power_loss()
    assert sorted(p.name for p in root.iterdir()) == ["a"]
    (root / "dir").mkdir()
    write_file(root / "dir" / "c", b"c", sync=False)
    fsync_directory(root / "dir")  # commits the names, not c's data
    lazy.power_loss()
    assert (root / "dir" / "c").read_bytes() == b""


def test_truncation_is_durable_with_the_files_next_fsync(lazy: LazyFs) -> None:
    path = lazy.mountpoint / "segment"
    write_file(path, b"0123456789", sync=True)
    os.truncate(path, 4)
    lazy.power_loss()
    assert path.read_bytes() == b"0123456789"
    fd = os.open(path, os.O_RDWR)
    os.ftruncate(fd, 4)
    os.fsync(fd)
    os.close(fd)
    lazy.power_loss()
    assert path.read_bytes() == b"0123"


def replace(path: Path, data: bytes, after_step: StepHook | None = None) -> None:
    atomic_write(path, data, replace=True, after_step=after_step)


def rewrite(path: Path, data: bytes, after_step: StepHook | None = None) -> None:
    atomic_rewrite(path, data, after_step=after_step)


@pytest.mark.parametrize("step", list(WriteStep))
@pytest.mark.parametrize("write", [replace, rewrite])
def test_an_atomic_replace_is_old_or_new_after_a_power_loss_at_each_step(
        lazy: LazyFs, step: WriteStep, write: Callable[..., None]) -> None:
    """The product's own atomic replacements (``atomic_rewrite`` is the quorum-state file's),
    with the power lost after each of their steps: never a mix, never a missing file. The
    rewrite runs over a spare kept from the writes before."""
    path = lazy.mountpoint / "quorum-state"
    write(path, b"older\n")
    write(path, b"old\n")

    class PowerLost(Exception):
        pass

    def lose_power(reached: WriteStep) -> None:
        if reached is step:
            lazy.power_loss()
            raise PowerLost

    with pytest.raises(PowerLost):
        write(path, b"new\n", after_step=lose_power)
    expected = b"old\n" if step in (WriteStep.TMP_WRITTEN,) else None
    content = path.read_bytes()
    if step is WriteStep.DIR_FSYNCED:
        expected = b"new\n"
    assert content in (b"old\n", b"new\n")
    if expected is not None:
        assert content == expected


def test_a_rename_without_a_commit_is_undone_whole(lazy: LazyFs) -> None:
    root = lazy.mountpoint
    write_file(root / "state", b"old", sync=True)
    write_file(root / "state.tmp", b"new", sync=True)
    os.replace(root / "state.tmp", root / "state")
    assert (root / "state").read_bytes() == b"new"
    lazy.power_loss()
    assert (root / "state").read_bytes() == b"old"
    assert (root / "state.tmp").read_bytes() == b"new"
    os.replace(root / "state.tmp", root / "state")
    fsync_directory(root)
    lazy.power_loss()
    assert sorted(p.name for p in root.iterdir()) == ["state"]
    assert (root / "state").read_bytes() == b"new"


def test_an_unlink_is_undone_without_a_commit(lazy: LazyFs) -> None:
    root = lazy.mountpoint
    write_file(root / "old-segment", b"records", sync=True)
    (root / "old-segment").unlink()
    lazy.power_loss()
    assert (root / "old-segment").read_bytes() == b"records"
    (root / "old-segment").unlink()
    fsync_directory(root)
    lazy.power_loss()
    assert not (root / "old-segment").exists()


def test_a_file_open_across_a_power_loss_is_dead(lazy: LazyFs) -> None:
    fd = os.open(lazy.mountpoint / "f", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.fsync(fd)
        lazy.power_loss()
        with pytest.raises(OSError) as raised:
            os.write(fd, b"after")
        assert raised.value.errno == errno.EIO
    finally:
        os.close(fd)


def test_a_failed_fsync_then_a_retry_that_succeeds_loses_the_data(lazy: LazyFs) -> None:
    """fsyncgate: after EIO the dirty data is marked clean, so retrying the fsync succeeds and
    the data is still not on disk."""
    path = lazy.mountpoint / "log"
    write_file(path, b"durable ", sync=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b"written")
        lazy.fail_fsync(1)
        with pytest.raises(OSError) as raised:
            os.fsync(fd)
        assert raised.value.errno == errno.EIO
        os.fsync(fd)  # "succeeds"
    finally:
        os.close(fd)
    assert path.read_bytes() == b"durable written"
    lazy.power_loss()
    assert path.read_bytes() == b"durable "
    assert lazy.stats()["failed_fsyncs"] == 1


def test_a_directory_fsync_can_fail_too(lazy: LazyFs) -> None:
    lazy.fail_fsync(1)
    with pytest.raises(OSError) as raised:
        fsync_directory(lazy.mountpoint)
    assert raised.value.errno == errno.EIO
    fsync_directory(lazy.mountpoint)


def test_a_full_disk_writes_what_fits_then_refuses_until_freed(lazy: LazyFs) -> None:
    root = lazy.mountpoint
    write_file(root / "a", b"x" * 1000, sync=True)
    lazy.set_capacity(1500)
    fd = os.open(root / "b", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        assert os.write(fd, b"y" * 800) == 500  # a short write: what fits
        with pytest.raises(OSError) as raised:
            os.write(fd, b"y" * 300)
        assert raised.value.errno == errno.ENOSPC
        os.pwrite(fd, b"z" * 100, 0)  # overwriting allocated bytes needs no space
        with pytest.raises(OSError) as raised:
            os.open(root / "c", os.O_WRONLY | os.O_CREAT, 0o600)
        assert raised.value.errno == errno.ENOSPC
        assert os.statvfs(root).f_bavail == 0
        lazy.set_capacity(None)
        assert os.write(fd, b"y" * 300) == 300
        os.fsync(fd)
    finally:
        os.close(fd)
    assert (root / "b").read_bytes() == b"z" * 100 + b"y" * 700
