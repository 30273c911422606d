"""Durable file-system steps shared by the storage modules.

POSIX makes a new or renamed file durable only after the file itself *and* its directory are
fsynced; these helpers keep that rule in one place.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable
from pathlib import Path


class WriteStep(enum.Enum):
    """The points of ``atomic_write`` after which a crash can be simulated."""

    TMP_WRITTEN = "tmp written"
    TMP_FSYNCED = "tmp fsynced"
    RENAMED = "renamed"
    DIR_FSYNCED = "directory fsynced"


StepHook = Callable[[WriteStep], None]


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_directory(directory: Path) -> None:
    """Create ``directory`` (and missing parents), making each new entry durable."""
    if directory.is_dir():
        return
    ensure_directory(directory.parent)
    try:
        directory.mkdir()
    except FileExistsError:
        if not directory.is_dir():
            raise
    fsync_directory(directory.parent)


def write_all(fd: int, data: bytes, position: int) -> None:
    """pwrite the whole of ``data``; a regular file may still accept less than asked."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view = view[written:]
        position += written


def atomic_write(
    path: Path, data: bytes, *, replace: bool, after_step: StepHook | None = None
) -> None:
    """Make ``path`` hold exactly ``data``, old content or new after any crash, never a mix.

    Writes ``<name>.tmp`` (truncating a leftover from an earlier crash), fsyncs it, moves it into
    place and fsyncs the directory. With ``replace=False`` an existing ``path`` is never clobbered:
    the tmp file is hard-linked into place, which fails atomically with FileExistsError.
    """
    hook = after_step or (lambda _step: None)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, data, 0)
        hook(WriteStep.TMP_WRITTEN)
        os.fsync(fd)
    finally:
        os.close(fd)
    hook(WriteStep.TMP_FSYNCED)
    if replace:
        os.replace(tmp, path)
    else:
        try:
            os.link(tmp, path)
        finally:
            os.unlink(tmp)
    hook(WriteStep.RENAMED)
    fsync_directory(path.parent)
    hook(WriteStep.DIR_FSYNCED)
