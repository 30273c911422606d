"""A container's start, run by the process kubelet as root inside the pod's network namespace and a
mount and UTS namespace of the container's own (``nsenter --net ... unshare --mount --uts``):

    python container.py SPEC.json

It sets the pod's hostname; builds the container's root file system as an overlay of the host's
(writes land in a tmpfs of the container's, so the host is never written), with ``/proc``, ``/dev``
and ``/sys``, an empty ``/tmp``, the image's user and directories, the image's Python environment at
``/opt/venv``, the pod's volumes at their mount paths (read-only where the pod says so), and,
read-only and over those volumes, the virtual environment and the project where they are
installed (which may be under ``/tmp``, where a pod often mounts an emptyDir); makes that root
read-only when the container's ``readOnlyRootFilesystem`` says so; changes root into it,
takes the pod's user, group and supplementary groups (``fsGroup``), and executes the container's
command in place of itself, so the kubelet's child is the container's process.

Standard library only: it runs before anything of the test's is importable in the new root."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def within(root: Path, path: str) -> Path:
    """``path`` inside ``root`` with every symlink on the way resolved inside ``root`` too (the
    host's ``/var/run -> /run`` must lead to the container's ``/run``, never the host's)."""
    current = root
    pending = [part for part in path.split("/") if part not in ("", ".")]
    hops = 0
    while pending:
        part = pending.pop(0)
        if part == "..":
            current = current.parent if current != root else root
            continue
        candidate = current / part
        if candidate.is_symlink():
            hops += 1
            if hops > 40:
                raise OSError(f"too many symlinks resolving {path}")
            link = os.readlink(candidate)
            pending = [p for p in link.split("/") if p not in ("", ".")] + pending
            if link.startswith("/"):
                current = root
            continue
        current = candidate
    return current


def mount_point(source: str, target: Path) -> None:
    if Path(source).is_dir():
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch(exist_ok=True)


def bind(source: str, target: Path, read_only: bool) -> None:
    """Mount ``source`` on ``target``, whose mount point exists."""
    mount("--rbind", source, str(target))
    if read_only:
        mount("-o", "remount,bind,ro", str(target))


def reachable(path: str, root: Path) -> None:
    """Let any user through the directories above ``path`` (the interpreter under a private
    home, for one): in the overlay only, where a change never reaches the host. Through the
    group's bits too: a user of group 0 (an arbitrary uid, as OpenShift runs images) is held
    to those of root's directories, not to the others'."""
    current = Path(path).resolve().parent
    for directory in [current, *current.parents]:
        inside = root / directory.relative_to("/")
        mode = inside.stat().st_mode
        if mode & 0o011 != 0o011:
            inside.chmod((mode & 0o7777) | 0o055)


def build_root(spec: dict[str, object], scratch: Path) -> Path:
    mount("-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(scratch))
    for part in ("upper", "work", "root"):
        (scratch / part).mkdir()
    root = scratch / "root"
    mount("-t", "overlay", "overlay", "-o",
          f"lowerdir=/,upperdir={scratch / 'upper'},workdir={scratch / 'work'}", str(root))
    mount("-t", "proc", "proc", str(root / "proc"))
    mount("--rbind", "/dev", str(root / "dev"))
    mount("--rbind", "-o", "ro", "/sys", str(root / "sys"))
    # The image's /tmp is empty, and writable only when the root is (made read-only below).
    read_only = bool(spec["readOnlyRoot"])
    mount("-t", "tmpfs", "-o", "mode=1777", "tmpfs", str(root / "tmp"))
    # The image's software where it is installed, under /tmp too (a checkout there): the
    # virtual environment's scripts name its interpreter by path, and its packages the source.
    # Mounted last (below), over a volume at /tmp; its mount points made while /tmp is writable.
    software = [(str(p), within(root, str(p))) for p in spec["software"]]  # type: ignore[attr-defined]
    for source, target in software:
        mount_point(source, target)
    for directory, (uid, gid) in dict(spec["directories"]).items():  # type: ignore[call-overload]
        inside = within(root, str(directory))
        inside.mkdir(parents=True, exist_ok=True)
        os.chown(inside, int(uid), int(gid))
    for line in spec["passwd"]:  # type: ignore[attr-defined]
        name, _, _, gid = line.split(":")[:4]
        with (root / "etc" / "passwd").open("a") as passwd:
            passwd.write(line + "\n")
        with (root / "etc" / "group").open("a") as group:
            group.write(f"{name}:x:{gid}:\n")
    reachable(sys.executable, root)
    mount_point(str(spec["venv"]), within(root, str(spec["venv_target"])))
    bind(str(spec["venv"]), within(root, str(spec["venv_target"])), read_only=True)
    volumes = [(entry, within(root, entry["target"])) for entry in spec["mounts"]]  # type: ignore[attr-defined]
    for entry, target in volumes:
        mount_point(entry["source"], target)
    if read_only:
        # The image's /tmp before a volume covers it (an emptyDir there, often): a remount
        # without "bind" acts on the topmost mount's whole filesystem.
        mount("-o", "remount,ro", str(root / "tmp"))
    for entry, target in volumes:
        bind(entry["source"], target, bool(entry["readOnly"]))
    for source, target in software:
        mount_point(source, target)  # again: in the volume covering it, if one does
        bind(source, target, read_only=True)
    if read_only:
        # The overlay; the mounts on it stay as they are.
        mount("-o", "remount,ro", str(root))
    return root


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    socket.sethostname(spec["hostname"])
    root = build_root(spec, Path(spec["scratch"]))
    os.chroot(root)
    os.chdir(spec["workingDir"])
    user, group = int(spec["user"]), int(spec["group"])
    os.setgroups([int(g) for g in spec["groups"]])
    os.setgid(group)
    os.setuid(user)
    os.umask(0o022)
    argv, env = list(spec["argv"]), dict(spec["env"])
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as error:
        # What a container runtime reports for a command it cannot start.
        print(f"exec {argv[0]!r}: {error.strerror}", file=sys.stderr, flush=True)
        sys.exit(127)


if __name__ == "__main__":
    main()
