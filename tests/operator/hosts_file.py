"""A test cluster's DNS records as a hosts file, rewritten in place: every container binds it
over ``/etc/hosts``, and a bind mount follows the file's inode, so a new file in its place would
never be seen."""

from __future__ import annotations

from pathlib import Path


def rewrite_in_place(path: Path, text: str) -> None:
    """``path`` holds ``text`` (untouched when it does already)."""
    with path.open("a+") as hosts:
        hosts.seek(0)
        if hosts.read() == text:
            return
        hosts.seek(0)
        hosts.truncate()
        hosts.write(text)
