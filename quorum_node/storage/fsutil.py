"""Durable, private file-system steps shared by the storage modules.

POSIX makes a new or renamed file durable only after the file itself *and* its directory are
fsynced; these helpers keep that rule in one place. A log directory holds every record of the
quorum and its election state, so what they create is its owner's alone, whatever the umask:
files ``FILE_MODE`` (0600), directories ``DIRECTORY_MODE`` (0700).
"""

from __future__ import annotations

import contextlib
import enum
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

FILE_MODE = 0o600
DIRECTORY_MODE = 0o700


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
    """Create ``directory`` (and missing parents), each new one ``DIRECTORY_MODE`` and durable."""
    if directory.is_dir():
        return
    ensure_directory(directory.parent)
    try:
        make_private_directory(directory)
    except FileExistsError:
        if not directory.is_dir():
            raise
    fsync_directory(directory.parent)


def make_private_directory(directory: Path) -> None:
    """``mkdir`` with ``DIRECTORY_MODE`` exactly (mkdir's mode is masked by the umask)."""
    directory.mkdir(DIRECTORY_MODE)
    os.chmod(directory, DIRECTORY_MODE)


def open_private(path: Path, flags: int) -> int:
    """``os.open`` with ``O_CREAT``: a file it creates is ``FILE_MODE`` exactly, whatever the
    umask (an existing one of this user's is made so too)."""
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        status = os.fstat(fd)
        if stat.S_IMODE(status.st_mode) != FILE_MODE and status.st_uid == os.geteuid():
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def restrict_permissions(paths: Iterable[Path]) -> int:
    """Take group and other permissions off ``paths`` (files ``FILE_MODE``, directories
    ``DIRECTORY_MODE``) where this process's user owns them: what a node created before its
    files were private, under the default umask, was readable by everyone. Symbolic links and
    entries of other users are left alone (the mount point of a volume, say). Returns how many
    were changed."""
    changed = 0
    uid = os.geteuid()
    for path in paths:
        try:
            status = path.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(status.st_mode):
            mode = DIRECTORY_MODE
        elif stat.S_ISREG(status.st_mode):
            mode = FILE_MODE
        else:
            continue
        if status.st_uid != uid or stat.S_IMODE(status.st_mode) & 0o077 == 0:
            continue
        os.chmod(path, mode)
        changed += 1
    return changed


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
    _write_synced(tmp, data, hook, reuse=False)
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


def atomic_rewrite(path: Path, data: bytes, *, after_step: StepHook | None = None) -> None:
    """``atomic_write(path, data, replace=True)`` in the space the file already holds, for a small
    file that must change even on a full disk (ENOSPC): the vote a node may not act on unwritten.

    ``<name>.tmp`` is kept between writes as a spare. The new content is written over it (not
    truncated first, so its blocks are reused), fsynced and renamed into place; just before, the
    file being replaced is hard-linked as ``<name>.old``, and that name then becomes the next spare
    instead of the old file being freed. Content no longer than the spare's so takes no new blocks
    on a file system that overwrites in place (copy-on-write ones need space for any write).

    The spare is a former version of the file, or new; never another name of the file in place (at
    every point a crash can stop the renames), so writing over it cannot touch what a crash leaves.
    The first write makes a spare beside the file; a crash between the two renames leaves none,
    and the next write makes one.
    """
    hook = after_step or (lambda _step: None)
    spare = path.with_name(path.name + ".tmp")
    replaced = path.with_name(path.name + ".old")
    _write_synced(spare, data, hook, reuse=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(replaced)  # left by a crash between the link and the renames
    try:
        os.link(path, replaced)
        kept = True
    except FileNotFoundError:
        kept = False  # the first write
    os.replace(spare, path)
    hook(WriteStep.RENAMED)
    if kept:
        os.replace(replaced, spare)
    else:
        # The first write: no old file to keep, so room for the next one is taken now, while
        # there is some. Its content is never read; a failure is left to the next write.
        with contextlib.suppress(OSError):
            _write_synced(spare, data, lambda _step: None, reuse=False)
    fsync_directory(path.parent)
    hook(WriteStep.DIR_FSYNCED)


def _write_synced(path: Path, data: bytes, hook: StepHook, *, reuse: bool) -> None:
    """Make ``path`` hold ``data`` and fsync it: truncated first, or (``reuse``) written over and
    cut to length after, which keeps the blocks it had."""
    fd = open_private(path, os.O_WRONLY | (0 if reuse else os.O_TRUNC))
    try:
        write_all(fd, data, 0)
        if reuse:
            os.ftruncate(fd, len(data))
        hook(WriteStep.TMP_WRITTEN)
        os.fsync(fd)
    finally:
        os.close(fd)
    hook(WriteStep.TMP_FSYNCED)
