"""When a state machine snapshots (KIP-630: the state machine, not the Raft core, decides): the
one policy of the key-value state machine (``quorum_node.kv.machine``), which the node and the
simulator both run, so that the simulated seeds take snapshots, and compact the log, when the
node would.

Pure: no clock, no files. The state machine tells the policy what it applied, what it wrote and
what it loaded, and asks it whether a snapshot is due.
"""

from __future__ import annotations

# A restart loads the latest snapshot and replays the log after it, and replaying a record costs
# a few times what loading a key does: a snapshot is due once the log after the last one holds a
# quarter as many records as the map has keys (or ``interval``, whichever is more), so that a
# restart's replay stays a fraction of its snapshot's load, while a large map written to slowly
# is rewritten at most once per quarter of its size in new records.
REPLAY_SHARE_OF_KEYS = 4


def snapshot_due(records_since: int, interval: int, keys: int) -> bool:
    """Whether to snapshot after ``records_since`` records applied since the last snapshot:
    every ``interval`` records (0: never), and no more often than every quarter of the map's
    size in records (``REPLAY_SHARE_OF_KEYS``)."""
    return interval > 0 and records_since >= max(interval, keys // REPLAY_SHARE_OF_KEYS)


class SnapshotPolicy:
    """The records a state machine applied since its last snapshot (written or loaded), and
    whether that makes a snapshot due (``snapshot_due``).

    Records are counted by offset, plus ``extra_ops``: what a record costs to replay beyond one
    (the key-value store counts a txn as many records as it has operations), a counter the state
    machine only increases and resets to 0 when it loads a snapshot."""

    def __init__(self, interval_records: int, last_end: int = 0) -> None:
        self.interval_records = interval_records
        self.last_end = last_end  # the end offset of the last snapshot written or loaded
        self._last_extra_ops = 0  # the state machine's extra_ops then

    def records_since(self, next_offset: int, extra_ops: int = 0) -> int:
        return next_offset - self.last_end + extra_ops - self._last_extra_ops

    def due(self, next_offset: int, keys: int, extra_ops: int = 0) -> bool:
        """Whether a state machine that has applied every offset below ``next_offset`` and
        holds ``keys`` keys should snapshot now."""
        return snapshot_due(self.records_since(next_offset, extra_ops), self.interval_records,
                            keys)

    def written(self, end_offset: int, extra_ops: int = 0) -> None:
        """A snapshot up to ``end_offset`` was written (``extra_ops``: as of its content)."""
        if end_offset < self.last_end:
            return  # taken before the state machine loaded a later one
        self.last_end = end_offset
        self._last_extra_ops = extra_ops

    def loaded(self, end_offset: int) -> None:
        """The state machine loaded a snapshot up to ``end_offset`` (its extra_ops start at 0)."""
        self.last_end = max(self.last_end, end_offset)
        self._last_extra_ops = 0
