"""The simulator runs the node's key-value state machine (``quorum_node.kv.machine.KvMachine``):
a broken apply or snapshot there is caught, as a broken core is (``test_sim_mutations``). The
mutations patch the shared machine itself, so the simulator finds what the node would do; the
checker's model applies the committed records to its own store, record by record, apart from
the machine under test. Each run enables only the check under test.
"""

from __future__ import annotations

import dataclasses

import pytest

from quorum_node.kv.machine import KvMachine, SnapshotPlan
from quorum_node.raft.core import RaftCore
from quorum_node.raft.records import BatchHeader
from quorum_node.raft.voters import VoterSet
from quorum_node.sim.invariants import CONSISTENT_COMMITTED_DATA
from quorum_node.sim.runner import first_violation

SKIPPED_OFFSET = 30
apply_as_shipped = KvMachine.apply
plan_as_shipped = KvMachine.plan_snapshot


def skips_a_record(machine: KvMachine, encoded: bytes, high_watermark: int) -> None:
    """Applies everything but the record at SKIPPED_OFFSET, as an off-by-one would."""
    store = machine.store
    if store.next_offset == SKIPPED_OFFSET < high_watermark:
        store.next_offset += 1
        return
    if store.next_offset < SKIPPED_OFFSET < high_watermark:
        high_watermark = SKIPPED_OFFSET
    apply_as_shipped(machine, encoded, high_watermark)


def snapshots_lose_a_key(machine: KvMachine, last_batch: BatchHeader,
                         voters: VoterSet) -> SnapshotPlan | None:
    """Writes snapshots without the first of the store's keys."""
    plan = plan_as_shipped(machine, last_batch, voters)
    if plan is None or not plan.content.entries:
        return plan
    first, *keys = plan.content.keys
    entries = plan.content.entries.copy()
    del entries[first]
    content = plan.content._replace(keys=keys, entries=entries)
    return dataclasses.replace(plan, content=content)


def _first_violation(scenario: str, seeds: int) -> str:
    violation = first_violation(range(seeds), scenario, RaftCore, {CONSISTENT_COMMITTED_DATA})
    if violation is None:
        pytest.fail(f"the mutation went unnoticed in {seeds} seeds of {scenario}")
    assert violation.invariant == CONSISTENT_COMMITTED_DATA
    return str(violation)


def test_an_apply_that_skips_a_record_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(KvMachine, "apply", skips_a_record)
    violation = _first_violation("initial_election", 5)
    assert "store" in violation, violation
    print(violation)


def test_a_snapshot_that_loses_a_key_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(KvMachine, "plan_snapshot", snapshots_lose_a_key)
    violation = _first_violation("snapshot_catch_up", 5)
    assert "snapshot" in violation, violation
    print(violation)
