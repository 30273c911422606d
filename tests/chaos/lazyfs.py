"""A lazy file system for the chaos tests: a FUSE mount (mfusepy over the system's libfuse 3) that
holds written data the way a page cache does and, on command, loses what was never synced.

Run as a process of its own (``python lazyfs.py MOUNTPOINT``); ``LazyFs`` below starts, commands
and unmounts it. Everything lives in this process's memory, in two copies:

- the *volatile* state, what every system call sees: the directory tree and each file's bytes;
- the *durable* state, what a power loss leaves: the tree as of the last journal commit and each
  file's bytes as of its last fsync.

What becomes durable follows ext4 with its default options (``data=ordered``, delayed
allocation), taking the lazy side wherever the kernel may choose:

- A file's data is durable once that file is fsynced (``fsync`` or ``fdatasync``); a file that
  was never fsynced comes back empty. Nothing is written back in the background.
- Directory changes (create, mkdir, rename, link, unlink, rmdir) go to one ordered journal, and
  any fsync, of a directory or of a file, commits all of it (jbd2 commits the whole running
  transaction): a rename is atomic, and only changes made after the last fsync of anything can
  vanish. The periodic five-second commit never happens here.
- A truncation is part of the file's data: durable with the file's next fsync.

Commands, one a line on standard input, each answered by one line (``ok ...`` or ``error ...``):

- ``power-loss``: the volatile state becomes the durable one. Files open before it answer EIO.
- ``fail-fsync N``: the next N fsyncs (of files or directories) fail with EIO, as a failing disk
  does. A failed fsync behaves as Linux's does since 4.13: the dirty data it could not write is
  marked clean, so a later fsync succeeds without having written it ("fsyncgate"), and a power
  loss then loses it.
- ``capacity BYTES`` / ``capacity none``: a disk of that many bytes of file data. A write past it
  writes what fits and then fails with ENOSPC (a short write first, as on a real disk); creating a
  file or directory on a full disk fails too. ``capacity used`` makes the disk full where it is.
- ``stats``: one line of JSON (bytes used, capacity, fsyncs, failed fsyncs, short writes).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

try:
    import mfusepy
except (ImportError, OSError) as missing:  # no binding, or no libfuse: the tests using it skip
    mfusepy = None
    _MISSING = f"no FUSE library: {missing}"

ROOT = 1


@dataclass
class Inode:
    number: int
    mode: int
    data: bytearray = field(default_factory=bytearray)  # files
    entries: dict[str, int] = field(default_factory=dict)  # directories
    dirty_from: int | None = None  # lowest offset changed since the last fsync
    mtime_ns: int = field(default_factory=time.time_ns)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


class LazyState:
    """The two states and the rules that move data from one to the other. Thread-safe: the FUSE
    loop and the command reader share it."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.inodes: dict[int, Inode] = {ROOT: Inode(ROOT, stat.S_IFDIR | 0o755)}
        self._next_inode = ROOT + 1
        # The durable state: each directory's entries and each file's mode at the last journal
        # commit; each file's bytes at its last fsync.
        self.durable_tree: dict[int, tuple[int, dict[str, int]]] = {
            ROOT: (stat.S_IFDIR | 0o755, {})}
        self.durable_data: dict[int, bytearray] = {}
        self.handles: dict[int, tuple[int, int]] = {}  # handle -> (inode, generation)
        self._next_handle = 1
        self.generation = 0  # bumped by every power loss: older handles are dead
        self.failing_fsyncs = 0
        self.capacity: int | None = None
        self.fsyncs = 0
        self.failed_fsyncs = 0
        self.short_writes = 0
        self.power_losses = 0

    # --- paths and handles ---------------------------------------------------------------------
    def lookup(self, path: str) -> Inode:
        node = self.inodes[ROOT]
        for part in _parts(path):
            if not node.is_dir:
                raise OSError(errno.ENOTDIR, path)
            number = node.entries.get(part)
            if number is None:
                raise OSError(errno.ENOENT, path)
            node = self.inodes[number]
        return node

    def parent_of(self, path: str) -> tuple[Inode, str]:
        parts = _parts(path)
        if not parts:
            raise OSError(errno.EBUSY, path)
        parent = self.lookup("/" + "/".join(parts[:-1]))
        if not parent.is_dir:
            raise OSError(errno.ENOTDIR, path)
        return parent, parts[-1]

    def open_handle(self, inode: Inode) -> int:
        handle = self._next_handle
        self._next_handle += 1
        self.handles[handle] = (inode.number, self.generation)
        return handle

    def by_handle(self, handle: int | None, path: str | None) -> Inode:
        if handle:
            number, generation = self.handles.get(handle, (0, -1))
            if generation != self.generation or number not in self.inodes:
                raise OSError(errno.EIO, "a file opened before the power loss")
            return self.inodes[number]
        if path is None:
            raise OSError(errno.EBADF, "no path and no handle")
        return self.lookup(path)

    # --- changes -------------------------------------------------------------------------------
    def new_inode(self, parent: Inode, name: str, mode: int) -> Inode:
        if name in parent.entries:
            raise OSError(errno.EEXIST, name)
        if self.capacity is not None and self.used() >= self.capacity:
            raise OSError(errno.ENOSPC, name)
        inode = Inode(self._next_inode, mode)
        self._next_inode += 1
        self.inodes[inode.number] = inode
        parent.entries[name] = inode.number
        parent.mtime_ns = time.time_ns()
        return inode

    def used(self) -> int:
        return sum(len(inode.data) for inode in self.inodes.values())

    def write(self, inode: Inode, data: bytes, offset: int) -> int:
        end = offset + len(data)
        if self.capacity is not None and end > len(inode.data):
            room = max(0, self.capacity - self.used())
            growth = end - len(inode.data)
            if growth > room:
                fits = max(0, len(data) - (growth - room))
                if fits == 0:
                    raise OSError(errno.ENOSPC, "no space left")
                self.short_writes += 1
                data = data[:fits]
                end = offset + fits
        if offset > len(inode.data):
            inode.data.extend(bytes(offset - len(inode.data)))
        inode.data[offset:end] = data
        self._dirty(inode, offset)
        return len(data)

    def truncate(self, inode: Inode, length: int) -> None:
        if length > len(inode.data):
            if self.capacity is not None and length - len(inode.data) > self.capacity - self.used():
                raise OSError(errno.ENOSPC, "no space left")
            inode.data.extend(bytes(length - len(inode.data)))
        else:
            del inode.data[length:]
        self._dirty(inode, length)

    def _dirty(self, inode: Inode, offset: int) -> None:
        inode.dirty_from = offset if inode.dirty_from is None else min(inode.dirty_from, offset)
        inode.mtime_ns = time.time_ns()

    def unlink(self, parent: Inode, name: str) -> None:
        number = parent.entries.pop(name)
        parent.mtime_ns = time.time_ns()
        self.forget_if_orphan(number)

    def forget_if_orphan(self, number: int) -> None:
        """Free an inode no name and no open handle leads to any more."""
        if number != ROOT and not self._linked(number) and not any(
                n == number and g == self.generation for n, g in self.handles.values()):
            self.inodes.pop(number, None)

    def _linked(self, number: int) -> bool:
        return any(number in inode.entries.values() for inode in self.inodes.values())

    def release(self, handle: int) -> None:
        number, generation = self.handles.pop(handle, (0, -1))
        if generation == self.generation:
            self.forget_if_orphan(number)

    # --- durability ----------------------------------------------------------------------------
    def fsync(self, inode: Inode) -> None:
        """Commit the journal (every directory change so far) and, for a file, its data."""
        if self.failing_fsyncs > 0:
            self.failing_fsyncs -= 1
            self.failed_fsyncs += 1
            # Linux marks the pages it could not write clean: a retry "succeeds" without them.
            inode.dirty_from = None
            raise OSError(errno.EIO, "fsync failed")
        self.fsyncs += 1
        self._commit_journal()
        if not inode.is_dir and inode.dirty_from is not None:
            durable = self.durable_data.setdefault(inode.number, bytearray())
            start = min(inode.dirty_from, len(durable), len(inode.data))
            durable[start:] = inode.data[start:]
            inode.dirty_from = None

    def _commit_journal(self) -> None:
        self.durable_tree = {number: (inode.mode, dict(inode.entries))
                             for number, inode in self.inodes.items()
                             if inode.is_dir or self._linked(number)}

    def power_loss(self) -> None:
        """What a machine that lost power finds when it boots."""
        reachable = self._reachable()
        self.inodes = {}
        for number in reachable:
            mode, entries = self.durable_tree[number]
            data = bytearray(self.durable_data.get(number, b"")) if not stat.S_ISDIR(mode) \
                else bytearray()
            self.inodes[number] = Inode(number, mode, data, dict(entries) if stat.S_ISDIR(mode)
                                        else {})
        self.durable_data = {n: d for n, d in self.durable_data.items() if n in self.inodes}
        self.generation += 1
        self.handles = {}
        self.failing_fsyncs = 0
        self.power_losses += 1

    def _reachable(self) -> set[int]:
        seen, pending = set(), [ROOT]
        while pending:
            number = pending.pop()
            if number in seen or number not in self.durable_tree:
                continue
            seen.add(number)
            pending.extend(self.durable_tree[number][1].values())
        return seen

    def stats(self) -> dict[str, Any]:
        return {"used": self.used(), "capacity": self.capacity, "fsyncs": self.fsyncs,
                "failed_fsyncs": self.failed_fsyncs, "short_writes": self.short_writes,
                "power_losses": self.power_losses}

    def command(self, line: str) -> str:
        words = line.split()
        with self.lock:
            if words == ["power-loss"]:
                self.power_loss()
            elif len(words) == 2 and words[0] == "fail-fsync":
                self.failing_fsyncs = int(words[1])
            elif len(words) == 2 and words[0] == "capacity":
                self.capacity = {"none": None, "used": self.used()}.get(words[1]) \
                    if words[1] in ("none", "used") else int(words[1])
            elif words == ["stats"]:
                return "ok " + json.dumps(self.stats())
            else:
                return f"error unknown command {line.strip()!r}"
        return "ok"


def _parts(path: str) -> list[str]:
    return [part for part in path.split("/") if part]


def _guarded(method: Any) -> Any:
    """A FUSE callback under the state's lock, its OSError as the errno FUSE answers."""

    @functools.wraps(method)
    def call(self: LazyOperations, *args: Any) -> Any:
        with self.state.lock:
            try:
                return method(self, *args)
            except OSError as error:
                raise mfusepy.FuseOSError(error.errno or errno.EIO) from None
    return call


class LazyOperations(mfusepy.Operations if mfusepy is not None else object):  # type: ignore[misc]
    """The FUSE callbacks over a ``LazyState`` (mfusepy's high-level API, paths and handles)."""

    use_ns = True

    def __init__(self, state: LazyState) -> None:
        self.state = state

    @_guarded
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        inode = self.state.by_handle(fh, path)
        return {"st_mode": inode.mode, "st_ino": inode.number,
                "st_nlink": 2 if inode.is_dir else 1, "st_size": len(inode.data),
                "st_uid": os.getuid(), "st_gid": os.getgid(), "st_blocks":
                (len(inode.data) + 511) // 512, "st_mtime": inode.mtime_ns,
                "st_ctime": inode.mtime_ns, "st_atime": inode.mtime_ns}

    @_guarded
    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
        # With a mode each: the kernel's READDIRPLUS drops entries of no file type.
        directory = self.state.lookup(path)
        listed = {".": directory.number, "..": directory.number, **directory.entries}
        return [(name, {"st_mode": self.state.inodes[number].mode, "st_ino": number}, 0)
                for name, number in listed.items()]

    @_guarded
    def mkdir(self, path: str, mode: int) -> int:
        parent, name = self.state.parent_of(path)
        self.state.new_inode(parent, name, stat.S_IFDIR | (mode & 0o7777))
        return 0

    @_guarded
    def rmdir(self, path: str) -> int:
        parent, name = self.state.parent_of(path)
        if self.state.lookup(path).entries:
            raise OSError(errno.ENOTEMPTY, path)
        self.state.unlink(parent, name)
        return 0

    @_guarded
    def unlink(self, path: str) -> int:
        parent, name = self.state.parent_of(path)
        if name not in parent.entries:
            raise OSError(errno.ENOENT, path)
        self.state.unlink(parent, name)
        return 0

    @_guarded
    def rename(self, old: str, new: str) -> int:
        old_parent, old_name = self.state.parent_of(old)
        new_parent, new_name = self.state.parent_of(new)
        number = old_parent.entries.get(old_name)
        if number is None:
            raise OSError(errno.ENOENT, old)
        replaced = new_parent.entries.get(new_name)
        if replaced is not None and self.state.inodes[replaced].entries:
            raise OSError(errno.ENOTEMPTY, new)
        if replaced == number:
            return 0
        del old_parent.entries[old_name]
        new_parent.entries[new_name] = number
        if replaced is not None:
            self.state.forget_if_orphan(replaced)
        return 0

    @_guarded
    def link(self, target: str, source: str) -> int:
        inode = self.state.lookup(source)
        parent, name = self.state.parent_of(target)
        if name in parent.entries:
            raise OSError(errno.EEXIST, target)
        parent.entries[name] = inode.number
        return 0

    @_guarded
    def create(self, path: str, mode: int, fi: Any = None) -> int:
        parent, name = self.state.parent_of(path)
        inode = self.state.new_inode(parent, name, stat.S_IFREG | (mode & 0o7777))
        return self.state.open_handle(inode)

    @_guarded
    def open(self, path: str, flags: int) -> int:
        inode = self.state.lookup(path)
        if flags & os.O_TRUNC:
            self.state.truncate(inode, 0)
        return self.state.open_handle(inode)

    @_guarded
    def opendir(self, path: str) -> int:
        return self.state.open_handle(self.state.lookup(path))

    @_guarded
    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return bytes(self.state.by_handle(fh, path).data[offset:offset + size])

    @_guarded
    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        return self.state.write(self.state.by_handle(fh, path), data, offset)

    @_guarded
    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        self.state.truncate(self.state.by_handle(fh, path), length)
        return 0

    @_guarded
    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self.state.fsync(self.state.by_handle(fh, path))
        return 0

    @_guarded
    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        self.state.fsync(self.state.by_handle(fh, path))
        return 0

    @_guarded
    def release(self, path: str, fh: int) -> int:
        self.state.release(fh)
        return 0

    @_guarded
    def releasedir(self, path: str, fh: int) -> int:
        self.state.release(fh)
        return 0

    @_guarded
    def chmod(self, path: str, mode: int) -> int:
        inode = self.state.lookup(path)
        inode.mode = stat.S_IFMT(inode.mode) | (mode & 0o7777)
        return 0

    @_guarded
    def chown(self, path: str, uid: int, gid: int) -> int:
        return 0

    @_guarded
    def utimens(self, path: str, times: Any = None) -> int:
        return 0

    @_guarded
    def statfs(self, path: str) -> dict[str, int]:
        block = 4096
        total = self.state.capacity if self.state.capacity is not None else 1 << 34
        free = max(0, total - self.state.used()) // block
        return {"f_bsize": block, "f_frsize": block, "f_blocks": total // block,
                "f_bfree": free, "f_bavail": free, "f_files": 1 << 20,
                "f_ffree": 1 << 20, "f_favail": 1 << 20, "f_namemax": 255}



def serve(mountpoint: str) -> None:
    """Mount and serve until unmounted; commands come on standard input."""
    state = LazyState()

    def read_commands() -> None:
        for line in sys.stdin:
            print(state.command(line), flush=True)

    threading.Thread(target=read_commands, daemon=True).start()
    # No kernel caching of names or attributes: a power loss changes both behind its back. File
    # pages are dropped at every open (no keep_cache), and a node reopens everything on restart.
    mfusepy.FUSE(LazyOperations(state), mountpoint, foreground=True, nothreads=True,
                 fsname="lazyfs", hard_remove=True, use_ino=True, attr_timeout=0,
                 entry_timeout=0, negative_timeout=0, default_permissions=True)


class LazyFs:
    """A lazy file system mounted at ``mountpoint`` by a process of its own."""

    def __init__(self, mountpoint: Path) -> None:
        self.mountpoint = mountpoint
        mountpoint.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # Its own messages go to a file beside the mount point: a pipe nobody reads could fill
        # up and stall the file system.
        self.log_path = mountpoint.with_name(mountpoint.name + ".lazyfs.log")
        with self.log_path.open("a") as log:
            self.process = subprocess.Popen(
                [sys.executable, __file__, str(mountpoint)], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1)
        deadline = time.monotonic() + 20
        while not os.path.ismount(mountpoint):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.unmount()
                raise RuntimeError(f"lazyfs did not mount {mountpoint}: {self._stderr()}")
            time.sleep(0.02)

    def command(self, line: str) -> str:
        with self._lock:
            stdin, stdout = self._pipes()
            stdin.write(line + "\n")
            stdin.flush()
            answer = stdout.readline().strip()
        if not answer.startswith("ok"):
            raise RuntimeError(f"lazyfs {line!r}: {answer or self._stderr()}")
        return answer[3:]

    def power_loss(self) -> None:
        self.command("power-loss")

    def fail_fsync(self, count: int) -> None:
        self.command(f"fail-fsync {count}")

    def set_capacity(self, capacity: int | str | None) -> None:
        self.command(f"capacity {'none' if capacity is None else capacity}")

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.command("stats"))
        return result

    def unmount(self) -> None:
        """Detach the mount (lazily: a file still open cannot hold it up) and end the process.
        What it held is gone with it: it lived in the process's memory only. The process is
        ended rather than waited for: a lazily detached FUSE connection can stay open for a
        while after the last user is gone."""
        if os.path.ismount(self.mountpoint):
            tool = "fusermount3" if _on_path("fusermount3") else "umount"
            args = [tool, "-u", "-z"] if tool == "fusermount3" else [tool, "-l"]
            subprocess.run([*args, str(self.mountpoint)], capture_output=True, timeout=30,
                           check=False)
        try:
            self.process.wait(1)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        for pipe in self._pipes():
            pipe.close()

    def _pipes(self) -> tuple[IO[str], IO[str]]:
        assert self.process.stdin is not None and self.process.stdout is not None
        return self.process.stdin, self.process.stdout

    def _stderr(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]


def _on_path(tool: str) -> bool:
    return any(Path(directory, tool).exists()
               for directory in os.environ.get("PATH", "").split(os.pathsep))


def unavailable_reason() -> str | None:
    """Why a lazy file system cannot be mounted here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    return _MISSING if mfusepy is None else None


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        serve(sys.argv[1])
