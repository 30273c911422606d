"""One process at a time per directory: an exclusive lock held for as long as a process uses it.

As Kafka's ``.lock``: a ``.lock`` file in the directory, locked with ``flock(LOCK_EX | LOCK_NB)``.
The kernel releases the lock when its holder exits, however it exits (kill -9 included), so a
stale lock is never left behind; the file itself stays and means nothing. The holder writes its
pid into the file, only so that the process refused can name it.

Every process that writes to a log directory, or reads it as a whole, takes this lock first, before
it writes anything, through ``lock_directory``: two nodes on one directory would both append to
the same segments and both vote as one voter.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from quorum_node.storage.errors import StorageError
from quorum_node.storage.fsutil import ensure_directory, open_private, write_all

LOCK_FILE = ".lock"


class DirectoryInUseError(StorageError):
    """Another process holds the directory's lock."""

    def __init__(self, directory: Path, holder_pid: int | None, what: str) -> None:
        holder = f"pid {holder_pid}" if holder_pid is not None else "pid unknown"
        super().__init__(
            f"{what} {directory} is in use by another process ({holder}); stop it first, or "
            "use another directory"
        )
        self.directory = directory
        self.holder_pid = holder_pid


class DirectoryLock:
    """A held lock; ``release`` (or leaving the ``with`` block, or exiting) gives it up."""

    def __init__(self, directory: Path, fd: int) -> None:
        self.directory = directory
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            # Closing the only descriptor of the open file releases the flock. The pid stays in
            # the file: it is only read by a process that failed to take the lock.
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> DirectoryLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()


def lock_directory(
    directory: str | os.PathLike[str], *, create: bool = False, what: str = "log directory"
) -> DirectoryLock:
    """Take the exclusive lock on ``directory`` or raise ``DirectoryInUseError`` (naming the
    holder's pid) having changed nothing. With ``create`` a missing directory is created first;
    without it, a missing directory raises FileNotFoundError. ``what`` names the directory in the
    error ("log directory", "data directory")."""
    path = Path(directory)
    if create:
        ensure_directory(path)
    # No O_TRUNC: while another process holds the lock, its pid must stay readable.
    fd = open_private(path / LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_pid(fd)
        os.close(fd)
        raise DirectoryInUseError(path, holder, what) from None
    except BaseException:
        os.close(fd)
        raise
    try:
        os.ftruncate(fd, 0)
        write_all(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    except BaseException:
        os.close(fd)
        raise
    return DirectoryLock(path, fd)


def _read_pid(fd: int) -> int | None:
    """The holder's pid, or None while it has not written it yet (or wrote something else)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None
