"""When the key-value store snapshots: every snapshot.interval.records, and no more often than
every quarter of the map's size in records (a restart's replay stays a fraction of its load)."""

from __future__ import annotations

import pytest

from quorum_node.raft.snapshot_policy import snapshot_due


@pytest.mark.parametrize(
    ("records_since", "interval", "keys", "due"),
    [
        (999, 1000, 10, False),
        (1000, 1000, 10, True),
        (1000, 1000, 8000, False),  # an 8000-key snapshot for 1000 records of log: not yet
        (1999, 1000, 8000, False),
        (2000, 1000, 8000, True),  # a quarter of the map: a restart would replay more than that
        (250_000, 200_000, 1_000_000, True),
        (10**9, 0, 0, False),  # 0: never
    ],
)
def test_snapshot_due(records_since: int, interval: int, keys: int, due: bool) -> None:
    assert snapshot_due(records_since, interval, keys) is due
