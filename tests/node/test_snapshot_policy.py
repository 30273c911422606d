"""When the key-value store snapshots: every snapshot.interval.records, never for less log than
the snapshot itself."""

from __future__ import annotations

import pytest

from quorum_node.node.snapshotting import snapshot_due


@pytest.mark.parametrize(
    ("records_since", "interval", "keys", "due"),
    [
        (999, 1000, 10, False),
        (1000, 1000, 10, True),
        (1000, 1000, 5000, False),  # a 5000-key snapshot for 1000 records of log: not yet
        (5000, 1000, 5000, True),
        (10**9, 0, 0, False),  # 0: never
    ],
)
def test_snapshot_due(records_since: int, interval: int, keys: int, due: bool) -> None:
    assert snapshot_due(records_since, interval, keys) is due
