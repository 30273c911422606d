"""This replica's two marks on its log: how far it is durable (the flushed offset) and how far it
is committed (the high watermark). The leader's replication raises the high watermark to what a
majority holds; a follower's fetches raise it to the leader's; both only ever raise it."""

from __future__ import annotations

from quorum_node.raft.types import RaftInvariantError


class Watermarks:
    def __init__(self, *, node_id: int, flushed_offset: int) -> None:
        self._node_id = node_id
        self.flushed_offset = flushed_offset  # what start-up recovery found is on disk
        # The log's end when a flush was last asked for: one runs while the flushed offset is
        # below it.
        self.flush_asked_to = flushed_offset
        # Not persisted, as in Kafka: learned again after a restart.
        self.high_watermark: int | None = None

    def advance_high_watermark(self, offset: int) -> None:
        """The local high watermark: every offset below it is committed. Never decreases."""
        # Truncation never goes below the high watermark and a leader's HWM starts above every
        # committed offset, so a smaller value means a broken peer or a bug: stop, loudly.
        if self.high_watermark is not None and offset < self.high_watermark:
            raise RaftInvariantError(
                f"node {self._node_id}: high watermark would go back from "
                f"{self.high_watermark} to {offset}"
            )
        self.high_watermark = offset
