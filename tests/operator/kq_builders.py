"""Builders of observed states for the planner's tests: a healthy quorum by default, changed
one fact at a time."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kafka_quorum_operator.observe import (
    ActionKind,
    ClaimView,
    MemberRecord,
    NodeView,
    Observed,
    PendingChange,
    PodView,
    QuorumView,
    ReplicaRow,
)
from kafka_quorum_operator.spec import Spec

NOW_MS = 1_700_000_000_000
NOW = NOW_MS / 1000
HASH = "h1"
DIRS = {1: "A" * 22, 2: "B" * 22, 3: "C" * 22, 4: "D" * 22, 5: "E" * 22}
NEW = {i: d.lower() for i, d in DIRS.items()}  # a replaced volume's directory id


def row(node_id: int, directory_id: str | None = None, *, lag: int = 0,
        caught_up_ago_ms: int = 0, fetched: bool = True) -> ReplicaRow:
    return ReplicaRow(node_id, directory_id or DIRS[node_id], log_end_offset=100 - lag, lag=lag,
                      last_fetch_ms=NOW_MS if fetched else -1,
                      last_caught_up_ms=NOW_MS - caught_up_ago_ms if lag == 0 or
                      caught_up_ago_ms else -1)


def quorum(voters: list[ReplicaRow] | None = None, observers: list[ReplicaRow] | None = None,
           leader: int = 1, hwm: int = 100) -> QuorumView:
    voters = voters if voters is not None else [row(i) for i in (1, 2, 3)]
    return QuorumView(leader, 5, hwm, tuple(voters), tuple(observers or ()))


def node(node_id: int, directory_id: str | None = None, leader: int | None = 1) -> NodeView:
    return NodeView(node_id, directory_id or DIRS[node_id],
                    "leader" if leader == node_id else "follower", leader, 5, 100, 100, False)


def pod(node_id: int, *, ready: bool = True, config_hash: str = HASH,
        terminating: bool = False) -> PodView:
    return PodView(f"kq-{node_id}", node_id, uid=f"pod-{node_id}", ip=f"10.0.0.{node_id}",
                   ready=ready, phase="Running", terminating=terminating,
                   config_hash=config_hash, claim_name=f"data-kq-{node_id}")


def claim(node_id: int, uid: str | None = None, terminating: bool = False) -> ClaimView:
    return ClaimView(f"data-kq-{node_id}", node_id, uid or f"claim-{node_id}", terminating)


def member(node_id: int, **changes: Any) -> MemberRecord:
    record = MemberRecord(node_id, claim_uid=f"claim-{node_id}", directory_id=DIRS[node_id],
                          role="voter")
    return replace(record, **changes)


def healthy(ids: tuple[int, ...] = (1, 2, 3), replicas: int | None = None,
            **changes: Any) -> Observed:
    """A bootstrapped quorum of ``ids``, every member recorded, running and caught up."""
    observed = Observed(
        name="kq", spec=Spec(replicas=replicas or len(ids)), now=NOW, generation=1,
        cluster_id="cluster", bootstrapped=True, config_hash=HASH,
        pods={i: pod(i) for i in ids}, claims={i: claim(i) for i in ids},
        nodes={i: node(i) for i in ids}, quorum=quorum([row(i) for i in ids]),
        members={i: member(i) for i in ids})
    return replace(observed, **changes)


def with_spec(observed: Observed, **changes: Any) -> Observed:
    return replace(observed, spec=replace(observed.spec, **changes))


def updated(mapping: Mapping[int, Any], **entries: Any) -> dict[int, Any]:
    """``mapping`` with entries replaced (``n3=value``) or removed (``n3=None``)."""
    result = dict(mapping)
    for key, value in entries.items():
        node_id = int(key.removeprefix("n"))
        if value is None:
            result.pop(node_id, None)
        else:
            result[node_id] = value
    return result


def replaced(observed: Observed, node_id: int, *, lag: int = 0, since: float | None = None
             ) -> Observed:
    """``node_id``'s volume wiped and its pod back: the node runs a new directory and fetches
    as an observer; the leader still has the old directory as a voter."""
    assert observed.quorum is not None
    members = updated(observed.members, **{
        f"n{node_id}": replace(observed.members[node_id], caught_up_since=since)})
    return replace(
        observed,
        nodes=updated(observed.nodes, **{f"n{node_id}": node(node_id, NEW[node_id])}),
        quorum=replace(observed.quorum, voters=tuple(
            replace(r, lag=7, last_caught_up_ms=NOW_MS - 60_000) if r.node_id == node_id
            else r for r in observed.quorum.voters),
            observers=(row(node_id, NEW[node_id], lag=lag),)),
        members=members)


def lagging(observed: Observed, *ids: int) -> Observed:
    """Voters ``ids`` behind the leader, and not caught up for a minute, in its view."""
    assert observed.quorum is not None
    return replace(observed, quorum=replace(observed.quorum, voters=tuple(
        replace(r, lag=9, last_caught_up_ms=NOW_MS - 60_000) if r.node_id in ids else r
        for r in observed.quorum.voters)))


def pending(kind: str, node_id: int, directory_id: str, reason: str = "Remediation",
            old: str | None = None) -> PendingChange:
    return PendingChange(ActionKind(kind), node_id, directory_id, reason, "2023-11-14T22:13:20Z",
                         old)
