"""The leader's batch accumulator (Kafka's BatchAccumulator): what it holds for the linger, and
when its records are due (through the core: the group-commit tests of test_raft_replication)."""

from __future__ import annotations

from quorum_node.raft.leader import BatchAccumulator, record_size
from quorum_node.raft.records import Record
from quorum_node.raft.types import NEVER

RECORD = Record(value=b"v" * 92)  # 100 bytes with its framing


def test_records_wait_for_the_linger_while_the_disk_is_busy() -> None:
    accumulator = BatchAccumulator()
    assert record_size(RECORD) == 100
    assert not accumulator.is_due(0, 1000, disk_idle=True)  # nothing held
    accumulator.add([RECORD], 100, now_ms=10, linger_ms=5)
    accumulator.add([RECORD], 100, now_ms=12, linger_ms=5)  # the first record's linger holds
    assert accumulator.deadline_ms == 15
    assert not accumulator.is_due(14, 1000, disk_idle=False)
    assert accumulator.is_due(14, 1000, disk_idle=True)
    assert accumulator.is_due(15, 1000, disk_idle=False)
    assert accumulator.is_due(14, 200, disk_idle=False)  # a full batch goes at once
    held = accumulator.records
    accumulator.appended()
    assert (accumulator.records, accumulator.size_bytes, accumulator.deadline_ms) == ([], 0, NEVER)
    assert held == [RECORD, RECORD]  # the list the log was given is left as it was


def test_a_batch_never_outgrows_the_limit() -> None:
    accumulator = BatchAccumulator()
    assert not accumulator.overflows(1000, 1000)  # one proposal of up to the limit fits alone
    accumulator.add([RECORD], 100, now_ms=0, linger_ms=5)
    assert not accumulator.overflows(900, 1000)
    assert accumulator.overflows(901, 1000)
