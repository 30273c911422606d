"""Notice when files change, by polling their metadata.

Kubernetes updates a mounted Secret by swapping a symlink (``..data``) to a new directory, so a
file's path stays the same while what it resolves to changes: the signature follows symlinks and
includes the inode, not only the modification time.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)
T = TypeVar("T")

_Signature = tuple[int, int, int, int] | None


def _signature(path: Path) -> _Signature:
    try:
        stat = os.stat(path)
    except OSError:
        return None  # missing for now (mid-rotation): compared like any other state
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


class FileWatch:
    """Remembers the files' signatures; ``changed()`` tells whether any differs since the last
    call that answered True (or since creation)."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = tuple(paths)
        self._seen = self._current()

    def _current(self) -> tuple[_Signature, ...]:
        return tuple(_signature(path) for path in self.paths)

    def changed(self) -> bool:
        current = self._current()
        if current == self._seen:
            return False
        self._seen = current
        return True


class Reloading(Generic[T]):
    """A value loaded from files, loaded again by ``reload_if_changed`` when they change. A
    load that fails (files caught mid-rotation: a new certificate with the old key) keeps the
    previous value and is tried again at every later check until it succeeds."""

    def __init__(self, paths: Sequence[Path], load: Callable[[], T], what: str) -> None:
        self._watch = FileWatch(paths)
        self._load = load
        self._what = what
        self.current = load()  # the first load's error is the caller's to report
        self.reloads = 0
        self._retry = False

    def reload_if_changed(self) -> bool:
        """True once a new value is in use."""
        if not self._watch.changed() and not self._retry:
            return False
        try:
            value = self._load()
        except ValueError as error:
            self._retry = True
            logger.warning("%s changed but cannot be loaded (keeping the previous one): %s",
                           self._what, error)
            return False
        self._retry = False
        self.current = value
        self.reloads += 1
        logger.info("%s reloaded from %s", self._what,
                    ", ".join(str(path) for path in self._watch.paths))
        return True
