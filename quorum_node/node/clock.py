"""The node's one wall clock."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Wall-clock milliseconds: batch timestamps and DescribeQuorum report wall-clock times, as
    in Kafka. The core never lets time go backwards, so a clock step only fires timers early."""
    return time.time_ns() // 1_000_000
