"""What the fuzz tests share: the budget (FUZZ_EXAMPLES, a long run sets it high), a tally of
the generated inputs, and the consistency check of a quorum's replicas after a run."""

from __future__ import annotations

import os
import time
from collections import Counter

from quorum_node.kv.store import KvStore
from quorum_node.node.runtime import QuorumNode
from quorum_node.raft.records import RecordBatch, decode_batches

# Examples per fuzzed target: modest in the default suite; FUZZ_EXAMPLES=2000 for a long run.
FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))
TALLY: Counter[str] = Counter()


def report(what: str) -> None:
    """Print the tally (shown with pytest -s, and in a failing test's output)."""
    print(f"{what}: " + ", ".join(f"{name}={count}" for name, count in sorted(TALLY.items())))


def assert_replicas_consistent(nodes: list[QuorumNode], stores: list[KvStore],
                               timeout_s: float = 15) -> int:
    """Every node healthy and, once they agree on the high watermark and have applied it, the
    same committed batches and the same key-value store everywhere. Returns the high
    watermark."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert all(node.failure is None for node in nodes), [n.failure for n in nodes]
        marks = {node.core.high_watermark for node in nodes}
        ends = {node.log_dir.log.end_offset for node in nodes}
        applied = {store.next_offset for store in stores}
        if len(marks) == 1 and None not in marks and ends == marks == applied:
            break
        assert time.monotonic() < deadline, f"no convergence: {marks} {ends} {applied}"
        time.sleep(0.05)
    high_watermark = marks.pop()
    assert high_watermark is not None
    start = max(node.log_dir.log.start_offset for node in nodes)
    logs = [_committed(node, start, high_watermark) for node in nodes]
    assert all(log == logs[0] for log in logs), "replicas hold different committed records"
    assert all(store.items() == stores[0].items() for store in stores), "stores differ"
    return high_watermark


def _committed(node: QuorumNode, start: int, end: int) -> list[RecordBatch]:
    batches: list[RecordBatch] = []
    offset = start
    while offset < end:
        found = decode_batches(node.log_dir.log.read(offset, 1 << 20))
        assert found, f"node {node.config.node_id}: no batch at {offset}"
        batches += found
        offset = found[-1].next_offset
    return batches
