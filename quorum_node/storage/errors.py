"""Errors raised by the storage layer.

Every one of them means "the node must not start (or go on) with this directory as it is": the
storage layer refuses rather than repairs, because a replica that silently forgets a vote or a
flushed record can break Raft's safety. A damaged log is repaired only when an operator asks for
it (``quorum-node repair-log``).
"""

from __future__ import annotations

from pathlib import Path


class StorageError(Exception):
    """A log directory, or a file in it, cannot be used as it is."""


class MetaPropertiesError(StorageError):
    """``meta.properties`` is missing, unreadable or belongs to another node or cluster."""


class NotFormattedError(MetaPropertiesError):
    """The log directory has no ``meta.properties``: it was never formatted."""


class CorruptLogError(StorageError):
    """A segment file holds data that recovery must not cut away."""

    def __init__(self, path: Path, position: int, reason: str) -> None:
        super().__init__(
            f"{path} at byte {position}: {reason}; refusing to open the log (nothing was "
            "modified; see 'quorum-node repair-log --help')"
        )
        self.path = path
        self.position = position
        self.reason = reason


class QuorumStateError(StorageError):
    """The ``quorum-state`` file cannot be read as a known version."""
