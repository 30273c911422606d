"""Fencing around a voter change: an operator whose Lease ran out while its AddVoter was under
way (a slow call, a paused process) says nothing of the answer, neither an Event nor a status;
the pass ends there, and its successor settles the change that status.pendingChange recorded."""

from __future__ import annotations

from typing import Any

from kafka_quorum_operator import KIND
from kafka_quorum_operator import reconcile as rc
from kafka_quorum_operator import resources as r
from kafka_quorum_operator.kube import Kube, path
from kafka_quorum_operator.nodes import ChangeResult
from kafka_quorum_operator.observe import ActionKind
from kafka_quorum_operator.plan import plan
from kafka_quorum_operator.reconcile import CR_API
from kq_builders import NEW, NOW, healthy, replaced
from kq_harness import NAMESPACE, quorum_object


class _LeaseRunsOutDuringTheCall:
    """The quorum's nodes: AddVoter commits, but the operator's Lease runs out meanwhile."""

    def __init__(self) -> None:
        self.lease_held = True
        self.calls: list[tuple[int, str]] = []

    async def add_voter(self, address: str, node_id: int, directory_id: str) -> ChangeResult:
        self.calls.append((node_id, directory_id))
        self.lease_held = False
        return ChangeResult(True, "NONE", "committed")

    async def close(self) -> None:
        pass


async def test_an_answer_that_comes_after_the_lease_ran_out_is_not_reported(kube: Kube) -> None:
    observed = replaced(healthy(), 3, since=NOW - 11)
    decided = plan(observed)
    assert [action.kind for action in decided.actions] == [ActionKind.ADD_VOTER]
    created = await kube.create(path(KIND, NAMESPACE, api=CR_API), quorum_object("kq", 3))
    nodes = _LeaseRunsOutDuringTheCall()
    reconciler = rc.Reconciler(kube, nodes,  # type: ignore[arg-type]
                               may_act=lambda: nodes.lease_held, clock=lambda: NOW)
    run = rc.PassContext(created)
    run.owner = r.Owner("kq", NAMESPACE, created["metadata"]["uid"])
    run.spec, run.status, run.memory = observed.spec, {}, rc.Memory()
    run.observed, run.decided = observed, decided

    await reconciler._act_on_plan(run)

    assert nodes.calls == [(3, NEW[3])]
    assert run.ended  # nothing after it in this pass: no status, no backups
    events: list[dict[str, Any]] = await kube.list(path("Event", NAMESPACE), {})
    assert not [e for e in events if e.get("reason") == "VoterAdded"], events
    status = (await kube.get(path(KIND, NAMESPACE, "kq", api=CR_API)) or {}).get("status") or {}
    assert status["pendingChange"]["nodeId"] == 3  # recorded before the call, for the successor
