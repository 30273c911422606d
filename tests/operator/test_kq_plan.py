"""The planner by decision tables: each test changes one observed fact of a healthy quorum and
checks the one thing the operator does (or that it does nothing), gate by gate."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from kafka_quorum_operator import ANNOTATION_REJECTIONS, LABEL_NODE_ID
from kafka_quorum_operator.observe import ActionKind, CreateRefused, Observed, TlsSwitch, pod_view
from kafka_quorum_operator.plan import (
    Action,
    assess,
    configured_voter_ids,
    is_caught_up,
    majority,
    plan,
    tls_switch_after,
    tls_switch_started,
    trusts,
)
from kafka_quorum_operator.reconcile import _ACTS
from kafka_quorum_operator.spec import Remediation, Security
from kq_builders import (
    DIRS,
    HASH,
    NEW,
    NOW,
    NOW_MS,
    claim,
    healthy,
    lagging,
    member,
    node,
    pending,
    pod,
    quorum,
    replaced,
    row,
    updated,
    with_spec,
)


def actions(observed: Observed) -> list[tuple[str, int]]:
    return [(a.kind, a.node_id) for a in plan(observed).actions]


def only(observed: Observed) -> Action:
    decided = plan(observed).actions
    assert len(decided) == 1, decided
    return decided[0]


# --- basics ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("voters", "needed"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (7, 4)])
def test_majority(voters: int, needed: int) -> None:
    assert majority(voters) == needed


@pytest.mark.parametrize(("lag", "ago_ms", "expected"), [
    (0, 0, True), (5, 100, True), (5, 1999, True), (5, 2000, False), (5, 60_000, False),
])
def test_caught_up_is_strimzis_rule(lag: int, ago_ms: int, expected: bool) -> None:
    q = quorum()
    assert is_caught_up(row(2, lag=lag, caught_up_ago_ms=ago_ms), q, 2000) is expected


def test_a_replica_that_never_caught_up_is_not() -> None:
    assert not is_caught_up(row(2, lag=3), quorum(), 2000)
    assert is_caught_up(row(1, lag=3), quorum(leader=1), 2000)  # the leader itself


def test_healthy_quorum_needs_nothing() -> None:
    decided = plan(healthy())
    assert decided.actions == ()
    assert decided.waiting == ""
    assert decided.assessment.leader_id == 1
    assert not decided.assessment.quorum_lost


# --- bootstrap --------------------------------------------------------------------------------


def test_new_quorum_creates_every_claim_then_every_pod() -> None:
    fresh = Observed(name="kq", spec=healthy().spec, now=NOW, cluster_id="c", config_hash=HASH)
    assert actions(fresh) == [("CreateClaim", 1), ("CreateClaim", 2), ("CreateClaim", 3)]
    claimed = replace(fresh, claims={i: claim(i) for i in (1, 2, 3)})
    assert actions(claimed) == [("CreatePod", 1), ("CreatePod", 2), ("CreatePod", 3)]


def test_bootstrapped_once_every_voter_fetched_without_lag() -> None:
    fresh = healthy(bootstrapped=False, members={})
    assert assess(fresh).bootstrapped
    lagging = replace(fresh, quorum=quorum([row(1), row(2), row(3, lag=1, caught_up_ago_ms=5)]))
    assert not assess(lagging).bootstrapped
    unfetched = replace(fresh, quorum=quorum([row(1), row(2), row(3, fetched=False)]))
    assert not assess(unfetched).bootstrapped
    no_directory = replace(fresh, quorum=quorum([row(1), row(2), replace(row(3),
                                                                         directory_id=None)]))
    assert not assess(no_directory).bootstrapped


def test_first_pass_records_each_members_identity() -> None:
    fresh = healthy(bootstrapped=False, members={})
    records = {m.node_id: m for m in plan(fresh).members}
    assert {i: (m.claim_uid, m.directory_id, m.role) for i, m in records.items()} == {
        i: (f"claim-{i}", DIRS[i], "voter") for i in (1, 2, 3)}


# --- replaced volume (remediation) ----------------------------------------------------------


def test_replacement_waits_until_the_new_replica_has_caught_up() -> None:
    decided = plan(replaced(healthy(), 3, lag=40))
    assert decided.actions == ()
    assert "catching up" in decided.blocked["MemberReplacing"]
    assert decided.assessment.lost == frozenset({(3, DIRS[3])})


def test_replacement_waits_for_min_caught_up_seconds() -> None:
    observed = replaced(healthy(), 3, since=NOW - 3)
    decided = plan(observed)
    assert decided.actions == ()
    assert "3 s of 10 s" in decided.blocked["MemberReplacing"]


def test_replacement_adds_the_new_directory_first() -> None:
    observed = replaced(healthy(), 3, since=NOW - 11)
    assert only(observed) == Action(ActionKind.ADD_VOTER, 3, "Remediation", NEW[3], DIRS[3])


def test_caught_up_since_starts_when_first_seen_caught_up() -> None:
    records = {m.node_id: m for m in plan(replaced(healthy(), 3)).members}
    assert records[3].caught_up_since == NOW
    lagging = {m.node_id: m for m in plan(replaced(healthy(), 3, lag=9, since=NOW - 50)).members}
    assert lagging[3].caught_up_since is None  # fell behind: the wait starts over


def test_replacement_needs_a_caught_up_majority_of_the_other_voters() -> None:
    decided = plan(lagging(replaced(healthy(), 3, since=NOW - 11), 2))
    assert decided.actions == ()
    assert "only 1 of the other voters" in decided.blocked["MemberReplacing"]


def test_replacement_of_the_leaders_volume() -> None:
    # Node 1 led; its volume was wiped, node 2 leads now and node 1 is back as an observer.
    observed = healthy(quorum=quorum(leader=2), nodes={i: node(i, leader=2) for i in (1, 2, 3)})
    wiped = replaced(observed, 1, since=NOW - 11)
    assert only(wiped) == Action(ActionKind.ADD_VOTER, 1, "Remediation", NEW[1], DIRS[1])


def test_then_the_old_directory_is_removed() -> None:
    observed = replaced(healthy(), 3)
    assert observed.quorum is not None
    both = replace(observed, quorum=replace(
        observed.quorum, voters=(*observed.quorum.voters, row(3, NEW[3])), observers=()))
    assert only(both) == Action(ActionKind.REMOVE_VOTER, 3, "Remediation", DIRS[3])


def test_after_the_replacement_status_records_the_new_identity() -> None:
    done = healthy(nodes=updated(healthy().nodes, n3=node(3, NEW[3])),
                   quorum=quorum([row(1), row(2), row(3, NEW[3])]))
    decided = plan(done)
    assert decided.actions == ()
    records = {m.node_id: m for m in decided.members}
    assert records[3].directory_id == NEW[3] and records[3].role == "voter"


@pytest.mark.parametrize("gate", ["paused", "no_leader", "disabled", "refused"])
def test_replacement_gates(gate: str) -> None:
    observed = replaced(healthy(), 3, since=NOW - 11)
    if gate == "paused":
        observed = with_spec(observed, paused=True)
    elif gate == "no_leader":
        observed = replace(observed, quorum=None)
    elif gate == "disabled":
        observed = with_spec(observed, remediation=Remediation(enabled=False))
    else:
        observed = replace(observed, refused={3: (NOW + 30, "INVALID_REQUEST")})
    decided = plan(observed)
    assert decided.actions == ()
    if gate in ("disabled", "refused"):
        assert "MemberReplacing" in decided.blocked


def test_a_replaced_claim_uid_marks_the_volume_lost_before_the_pod_starts() -> None:
    observed = healthy(claims=updated(healthy().claims, n3=claim(3, uid="claim-3-new")),
                       pods=updated(healthy().pods, n3=None),
                       nodes=updated(healthy().nodes, n3=None))
    decided = plan(observed)
    assert decided.assessment.lost == frozenset({(3, DIRS[3])})
    assert [(a.kind, a.node_id) for a in decided.actions] == [("CreatePod", 3)]
    records = {m.node_id: m for m in decided.members}
    assert records[3].claim_uid == "claim-3"  # kept until the new directory is a voter


def test_a_deleted_claim_is_recreated_while_the_majority_is_intact() -> None:
    observed = healthy(claims=updated(healthy().claims, n3=None),
                       pods=updated(healthy().pods, n3=None),
                       nodes=updated(healthy().nodes, n3=None))
    assert actions(observed) == [("CreateClaim", 3)]


def test_a_terminating_claim_is_not_recreated_until_gone() -> None:
    observed = healthy(claims=updated(healthy().claims, n3=claim(3, terminating=True)),
                       pods=updated(healthy().pods, n3=None))
    assert actions(observed) == []


# --- quorum lost --------------------------------------------------------------------------------


def two_wiped() -> Observed:
    observed = healthy(quorum=None, nodes={1: node(1, leader=None), 2: node(2, NEW[2], None),
                                           3: node(3, NEW[3], None)})
    return observed


def test_two_of_three_volumes_lost_is_quorum_lost_and_nothing_changes() -> None:
    decided = plan(two_wiped())
    assert decided.assessment.quorum_lost
    assert decided.actions == ()
    assert "manual recovery" in decided.waiting


def test_quorum_lost_even_when_pods_are_missing() -> None:
    observed = replace(two_wiped(), pods=updated(two_wiped().pods, n2=None))
    assert plan(observed).actions == ()


def test_two_deleted_claims_of_three_are_not_recreated() -> None:
    observed = healthy(quorum=None, claims={1: claim(1)}, pods={1: pod(1)},
                       nodes={1: node(1, leader=None)})
    decided = plan(observed)
    assert decided.assessment.quorum_lost
    assert decided.actions == ()


def test_a_leader_elected_by_wiped_replicas_is_not_trusted() -> None:
    rogue = quorum([row(1, fetched=False), row(2, NEW[2]), row(3, NEW[3])], leader=2, hwm=1)
    observed = replace(two_wiped(), quorum=rogue)
    decided = plan(observed)
    assert decided.assessment.leader_id is None
    assert decided.assessment.untrusted_leader == 2
    assert decided.assessment.quorum_lost
    assert decided.actions == ()


@pytest.mark.parametrize(("described", "trusted"), [
    ([(1, "A"), (2, "B"), (3, "C")], True),
    ([(1, "A"), (2, "B"), (3, "C"), (3, "c")], True),  # mid-replacement
    ([(1, "A"), (2, "B"), (3, "c")], True),  # replaced, status not written yet
    ([(1, "A"), (2, "b"), (3, "c")], False),
    ([(1, None), (2, "b"), (3, "c")], False),
])
def test_trust_needs_a_majority_of_recorded_voters(described: list[tuple[int, str | None]],
                                                   trusted: bool) -> None:
    recorded = [(1, "A"), (2, "B"), (3, "C")]
    q = quorum([replace(row(i), directory_id=d) for i, d in described])
    assert trusts(q, recorded) is trusted
    assert trusts(q, [])  # nothing recorded: the first bootstrap


def test_one_wiped_voter_of_three_is_not_quorum_lost() -> None:
    observed = healthy(quorum=None, nodes=updated(healthy().nodes, n3=node(3, NEW[3], None)))
    decided = plan(observed)
    assert not decided.assessment.quorum_lost
    assert decided.assessment.lost == frozenset({(3, DIRS[3])})
    assert decided.actions == ()  # no leader: nothing to do yet


# --- pending changes (operator restarts) ------------------------------------------------------


def test_a_pending_add_is_retried_until_in_force() -> None:
    observed = replace(replaced(healthy(), 3, lag=50),
                       pending=pending("AddVoter", 3, NEW[3], old=DIRS[3]))
    assert only(observed) == Action(ActionKind.ADD_VOTER, 3, "Remediation", NEW[3], DIRS[3])


def test_a_pending_add_in_force_moves_on_to_the_removal() -> None:
    observed = replaced(healthy(), 3)
    assert observed.quorum is not None
    both = replace(observed, quorum=replace(
        observed.quorum, voters=(*observed.quorum.voters, row(3, NEW[3])), observers=()),
        pending=pending("AddVoter", 3, NEW[3], old=DIRS[3]))
    decided = plan(both)
    assert decided.actions == (Action(ActionKind.REMOVE_VOTER, 3, "Remediation", DIRS[3]),)


def test_a_pending_change_waits_for_a_leader() -> None:
    observed = replace(healthy(quorum=None), pending=pending("AddVoter", 3, NEW[3]))
    decided = plan(observed)
    assert decided.actions == () and decided.pending == observed.pending


def test_a_completed_pending_change_is_cleared() -> None:
    observed = replace(healthy(), pending=pending("RemoveVoter", 3, NEW[3]))
    assert plan(observed).pending is None


# --- rolling updates ----------------------------------------------------------------------------


def outdated(observed: Observed, *ids: int, ready: bool = True) -> Observed:
    return replace(observed, pods=updated(observed.pods, **{
        f"n{i}": pod(i, config_hash="old", ready=ready) for i in ids}))


def test_roll_followers_first_leader_last() -> None:
    observed = outdated(healthy(), 1, 2, 3)
    assert only(observed) == Action(ActionKind.DELETE_POD, 2, "RollingUpdate")
    assert only(outdated(healthy(), 1, 3)) == Action(ActionKind.DELETE_POD, 3, "RollingUpdate")
    assert only(outdated(healthy(), 1)) == Action(ActionKind.DELETE_POD, 1, "RollingUpdate")


def on_tls(observed: Observed, tls: bool, *ids: int) -> Observed:
    """Pods ``ids`` serve clients with (``tls``) or without TLS (their probes' scheme)."""
    return replace(observed, pods={i: replace(p, tls=tls) if i in ids else p
                                   for i, p in observed.pods.items()})


def test_a_tls_switch_starts_when_a_pod_serves_the_other_protocol() -> None:
    off = with_spec(healthy(), security=Security(tls=False))
    assert tls_switch_started(on_tls(off, True, 1, 2, 3), None) == TlsSwitch(False, 1)
    assert tls_switch_started(on_tls(off, False, 1, 2, 3), None) is None
    assert tls_switch_started(off, None) is None  # the probes' scheme unknown: nothing to do
    # A recorded switch goes on, whatever the spec says now (it may have flipped back).
    assert tls_switch_started(on_tls(off, True, 1, 2, 3), TlsSwitch(True, 3)) == \
        TlsSwitch(True, 3)


@pytest.mark.parametrize(("change", "expected"), [
    ({}, TlsSwitch(False, 3)),  # every pod on the stage, ready, a leader: the next stage
    ({"pods": {1: pod(1, config_hash="old")}}, TlsSwitch(False, 2)),  # one pod to roll yet
    ({"pods": {2: pod(2, ready=False)}}, TlsSwitch(False, 2)),  # one pod not ready
    ({"pods": {3: pod(3, terminating=True)}}, TlsSwitch(False, 2)),
    ({"drop_pod": 3}, TlsSwitch(False, 2)),  # a member's pod missing
    ({"leaderless": True}, TlsSwitch(False, 2)),  # no leader answers
])
def test_a_tls_switch_moves_to_the_next_stage_once_every_pod_runs_this_one(
        change: dict[str, object], expected: TlsSwitch) -> None:
    observed = replace(with_spec(healthy(), security=Security(tls=False)),
                       tls_switch=TlsSwitch(False, 2))
    pods = dict(observed.pods)
    pods.update(change.get("pods", {}))  # type: ignore[call-overload]
    if "drop_pod" in change:
        del pods[change["drop_pod"]]  # type: ignore[arg-type]
    observed = replace(observed, pods=pods)
    if change.get("leaderless"):
        observed = replace(observed, nodes={}, quorum=None)
    assert tls_switch_after(observed) == expected


def test_a_tls_switch_ends_in_the_steady_configuration_or_turns_back() -> None:
    on = replace(healthy(), tls_switch=TlsSwitch(True, 4))
    assert tls_switch_after(on) is None
    # The spec flipped back during the switch: the way back starts from its last stage.
    flipped = with_spec(on, security=Security(tls=False))
    assert tls_switch_after(flipped) == TlsSwitch(False, 1)
    assert tls_switch_after(healthy()) is None


def test_a_tls_switch_rolls_one_pod_at_a_time_followers_first() -> None:
    """Each stage is an ordinary roll: nodes of neighbouring stages can talk, so the quorum check
    holds and no pods restart together (they did before: a short outage)."""
    switching = replace(with_spec(healthy(), security=Security(tls=False)),
                        tls_switch=TlsSwitch(False, 1))
    stage = on_tls(outdated(switching, 1, 2, 3), True, 1, 2, 3)
    assert only(stage) == Action(ActionKind.DELETE_POD, 2, "RollingUpdate")
    assert only(on_tls(outdated(switching, 1, 3), True, 1, 3)) == \
        Action(ActionKind.DELETE_POD, 3, "RollingUpdate")
    # Without a leader (the operator cannot reach one), nothing is restarted.
    assert plan(replace(stage, nodes={}, quorum=None)).actions == ()


def test_roll_unready_pods_first() -> None:
    observed = outdated(outdated(healthy(), 1, 2), 3, ready=False)
    assert only(observed).node_id == 3


def test_roll_waits_for_other_pods_to_be_ready() -> None:
    observed = replace(outdated(healthy(), 2), pods=updated(
        outdated(healthy(), 2).pods, n3=pod(3, ready=False)))
    decided = plan(observed)
    assert decided.actions == () and "kq-3" in decided.waiting


def test_roll_waits_while_a_pod_is_stopping() -> None:
    observed = replace(outdated(healthy(), 2), pods=updated(
        outdated(healthy(), 2).pods, n3=pod(3, terminating=True)))
    assert plan(observed).actions == ()


def test_roll_quorum_check_counts_the_other_voters() -> None:
    observed = outdated(healthy(), 2)
    lagging = replace(observed, quorum=quorum([row(1), row(2), row(3, lag=9,
                                                                   caught_up_ago_ms=9000)]))
    decided = plan(lagging)
    assert decided.actions == ()
    assert "quorum check" in decided.waiting


@pytest.mark.parametrize("blocker", ["no_leader", "pending", "paused"])
def test_roll_gates(blocker: str) -> None:
    observed = outdated(healthy(), 2)
    if blocker == "no_leader":
        observed = replace(observed, quorum=None)
    elif blocker == "pending":
        observed = replace(observed, pending=pending("AddVoter", 3, NEW[3]),
                           quorum=quorum(observers=[row(3, NEW[3])]))
    else:
        observed = with_spec(observed, paused=True)
    assert [a for a in plan(observed).actions if a.kind == "DeletePod"] == []


def test_roll_before_bootstrap_needs_no_quorum_check() -> None:
    observed = outdated(healthy(bootstrapped=False, quorum=None, members={}), 1, 2)
    assert only(observed) == Action(ActionKind.DELETE_POD, 1, "RollingUpdate")


# --- failed pods (eviction, node shutdown) ----------------------------------------------------


def failed(observed: Observed, *ids: int, reason: str = "Evicted",
           caught_up: bool = False) -> Observed:
    """Pods ``ids`` in phase Failed (the kubelet stopped them for good): no metrics of their
    own, and the leader no longer counts them caught up unless ``caught_up`` (it noticed not
    yet: their last fetch within the fetch timeout)."""
    pods = updated(observed.pods, **{f"n{i}": replace(
        pod(i), phase="Failed", reason=reason, ready=False, ip=None) for i in ids})
    return replace(observed if caught_up else lagging(observed, *ids), pods=pods,
                   nodes={i: n for i, n in observed.nodes.items() if i not in ids})


def test_pod_view_reads_a_failed_pod() -> None:
    body = {"metadata": {"name": "kq-2", "labels": {LABEL_NODE_ID: "2"}},
            "status": {"phase": "Failed", "reason": "Evicted",
                       "message": "The node was low on resource: memory."}}
    view = pod_view(body)
    assert view is not None and view.terminal and view.reason == "Evicted"
    assert replace(view, phase="Succeeded").terminal  # a container that exited 0 on SIGTERM
    assert not replace(view, terminating=True).terminal  # being deleted already
    assert not replace(view, phase="Running").terminal
    assert not replace(view, phase="Pending").terminal


@pytest.mark.parametrize("reason", ["Evicted", "Terminated"])
def test_a_failed_pod_is_deleted_then_made_again(reason: str) -> None:
    decided = plan(failed(healthy(), 3, reason=reason))
    assert decided.actions == (Action(ActionKind.DELETE_POD, 3, "Failed"),)
    assert decided.waiting == f"replacing failed pod kq-3 ({reason})"
    gone = replace(failed(healthy(), 3), pods=updated(healthy().pods, n3=None))
    assert actions(gone) == [("CreatePod", 3)]
    exited = failed(healthy(), 3)
    exited = replace(exited, pods=updated(exited.pods, n3=replace(exited.pods[3],
                                                                  phase="Succeeded")))
    assert only(exited) == Action(ActionKind.DELETE_POD, 3, "Failed")


def test_failed_pods_are_deleted_one_at_a_time_without_a_leader() -> None:
    """Two of three voters evicted: no leader, no caught-up majority, and the replacements are
    what brings them back. The voters' pods go first, one at a time."""
    observed = replace(failed(healthy(), 2, 3), quorum=None,
                       nodes={1: node(1, leader=None)})
    assert only(observed) == Action(ActionKind.DELETE_POD, 2, "Failed")
    stopping = replace(observed, pods=updated(observed.pods, n2=pod(2, terminating=True)))
    decided = plan(stopping)
    assert decided.actions == ()
    assert decided.waiting == "failed pod kq-3 waits for kq-2 to stop"
    made_again = replace(observed, pods=updated(observed.pods, n2=replace(pod(2, ready=False),
                                                                           phase="Pending")))
    assert only(made_again) == Action(ActionKind.DELETE_POD, 3, "Failed")


def test_a_failed_pod_waits_for_any_pod_stopping() -> None:
    observed = failed(healthy(), 3)
    rolling = replace(observed, pods=updated(observed.pods, n2=pod(2, terminating=True)))
    assert plan(rolling).actions == ()


def test_a_failed_voter_still_counted_caught_up_waits_for_the_quorum_check() -> None:
    """Just evicted: the leader still counts node 3 caught up. With node 2 lagging, 3 is one of
    the majority on the leader's books; it goes once the leader stops counting it."""
    observed = failed(healthy(), 3, caught_up=True)
    assert only(observed) == Action(ActionKind.DELETE_POD, 3, "Failed")  # 1 and 2 are a majority
    decided = plan(lagging(observed, 2))
    assert decided.actions == ()
    assert decided.waiting == ("failed pod kq-3 waits for the quorum check (1 other voters "
                               "caught up, 2 needed)")
    noticed = lagging(observed, 2, 3)
    assert only(noticed) == Action(ActionKind.DELETE_POD, 3, "Failed")


def test_a_failed_voter_goes_before_a_failed_new_member() -> None:
    base = healthy(replicas=5)
    joining = replace(base, pods=updated(base.pods, n4=pod(4)),
                      claims=updated(base.claims, n4=claim(4)),
                      quorum=quorum(observers=[row(4)]))
    assert only(failed(joining, 4, 3)) == Action(ActionKind.DELETE_POD, 3, "Failed")
    assert only(failed(joining, 4)) == Action(ActionKind.DELETE_POD, 4, "Failed")


def test_a_failed_pod_goes_before_the_roll_that_waits_for_it() -> None:
    """An outdated failed pod is replaced (on the current revision) rather than left to block
    the roll, which waits for every voter's pod to be ready."""
    observed = failed(outdated(healthy(), 1, 2), 3)
    assert only(observed) == Action(ActionKind.DELETE_POD, 3, "Failed")


def test_pod_view_tells_a_pod_rejected_at_admission_from_one_that_ran() -> None:
    """Failed before any container started: the kubelet refused it at admission. An evicted pod
    whose container ran is not."""
    body: dict[str, Any] = {
        "metadata": {"name": "kq-2", "labels": {LABEL_NODE_ID: "2"},
                     "annotations": {ANNOTATION_REJECTIONS: "3"}},
        "status": {"phase": "Failed", "reason": "OutOfcpu",
                   "message": "Pod was rejected: Node didn't have enough resource: cpu"}}
    view = pod_view(body)
    assert view is not None and view.rejected and view.terminal
    assert (view.reason, view.rejections) == ("OutOfcpu", 3)
    assert view.message.startswith("Pod was rejected")
    unknown = {"name": "node", "state": {"terminated": {"exitCode": 137,
                                                        "reason": "ContainerStatusUnknown"}}}
    body["status"]["containerStatuses"] = [unknown]
    assert pod_view(body).rejected  # type: ignore[union-attr]
    ran = {"name": "node", "state": {"terminated": {"exitCode": 143, "reason": "Error",
                                                    "startedAt": "2026-01-01T00:00:00Z"}}}
    body["status"].update(reason="Evicted", containerStatuses=[ran])
    evicted = pod_view(body)
    assert evicted is not None and evicted.terminal and not evicted.rejected
    running = {"name": "node", "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}
    body["status"].update(phase="Running", containerStatuses=[running])
    assert not pod_view(body).rejected  # type: ignore[union-attr]


def rejected(observed: Observed, node_id: int, retry_at: float) -> Observed:
    """Pod ``node_id`` rejected at admission, its rejection recorded with that back-off."""
    observed = failed(observed, node_id, reason="OutOfcpu")
    pods = updated(observed.pods, **{f"n{node_id}": replace(observed.pods[node_id],
                                                            started=False)})
    record = CreateRefused("Pod", f"kq-{node_id}", "OutOfcpu", "rejected", 2, retry_at, 0)
    return replace(observed, pods=pods, creates_refused={f"Pod/kq-{node_id}": record})


def test_a_pod_rejected_at_admission_is_replaced_once_its_back_off_ran_out() -> None:
    waiting = rejected(healthy(), 3, retry_at=NOW + 10)
    assert not plan(waiting).actions
    assert only(rejected(healthy(), 3, retry_at=NOW)) == Action(ActionKind.DELETE_POD, 3, "Failed")
    # Another failed pod is not held up by the one backing off.
    both = failed(waiting, 2)
    assert only(replace(both, pods=updated(both.pods, n3=waiting.pods[3]))) == \
        Action(ActionKind.DELETE_POD, 2, "Failed")


@pytest.mark.parametrize("gate", ["paused", "quorum_lost"])
def test_failed_pod_gates(gate: str) -> None:
    if gate == "paused":
        observed = with_spec(failed(healthy(), 3), paused=True)
    else:  # two volumes of three lost: manual recovery, nothing is touched
        wiped = two_wiped()
        observed = replace(wiped, pods=updated(wiped.pods, n3=replace(
            pod(3), phase="Failed", reason="Evicted", ready=False)))
    assert plan(observed).actions == ()


# --- scaling ------------------------------------------------------------------------------------


def test_scale_up_configures_the_new_ids_then_rolls() -> None:
    observed = healthy(replicas=5)
    assert configured_voter_ids(observed, assess(observed)) == (1, 2, 3, 4, 5)
    assert actions(observed) == [("CreateClaim", 4)]  # one new member at a time


def test_scale_up_adds_a_caught_up_new_member_as_voter() -> None:
    base = healthy(replicas=5)
    joined = replace(base, pods=updated(base.pods, n4=pod(4)),
                     claims=updated(base.claims, n4=claim(4)),
                     nodes=updated(base.nodes, n4=node(4)),
                     quorum=quorum(observers=[row(4)]),
                     members=updated(base.members, n4=member(4, role="observer",
                                                             caught_up_since=NOW - 20)))
    assert only(joined) == Action(ActionKind.ADD_VOTER, 4, "ScaleUp", DIRS[4])
    not_long_enough = replace(joined, members=updated(
        joined.members, n4=member(4, role="observer", caught_up_since=NOW - 1)))
    assert plan(not_long_enough).actions == ()


def test_scale_up_waits_for_the_roll() -> None:
    base = healthy(replicas=5)
    joined = replace(base, pods=updated(base.pods, n4=pod(4), n1=pod(1, config_hash="old")),
                     claims=updated(base.claims, n4=claim(4)),
                     nodes=updated(base.nodes, n4=node(4)), quorum=quorum(observers=[row(4)]),
                     members=updated(base.members, n4=member(4, role="observer",
                                                             caught_up_since=NOW - 20)))
    assert only(joined) == Action(ActionKind.DELETE_POD, 1, "RollingUpdate")


def test_scale_down_removes_the_highest_voter_first() -> None:
    observed = healthy((1, 2, 3, 4, 5), replicas=3)
    assert only(observed) == Action(ActionKind.REMOVE_VOTER, 5, "ScaleDown", DIRS[5])


def test_scale_down_of_the_leader_removes_it_too() -> None:
    observed = healthy((1, 2, 3, 4, 5), replicas=3,
                       quorum=quorum([row(i) for i in (1, 2, 3, 4, 5)], leader=5))
    assert only(observed) == Action(ActionKind.REMOVE_VOTER, 5, "ScaleDown", DIRS[5])


def test_scale_down_then_deletes_the_pod_then_the_claim() -> None:
    base = healthy((1, 2, 3, 4, 5), replicas=3)
    removed = replace(base, quorum=quorum([row(i) for i in (1, 2, 3, 4)],
                                          observers=[row(5)]))
    assert only(removed) == Action(ActionKind.DELETE_POD, 5, "ScaleDown")
    gone = replace(removed, pods=updated(removed.pods, n5=None),
                   nodes=updated(removed.nodes, n5=None))
    assert only(gone) == Action(ActionKind.DELETE_CLAIM, 5, "ScaleDown")
    finished = replace(gone, claims=updated(gone.claims, n5=None),
                       members=updated(gone.members, n5=None))
    assert configured_voter_ids(finished, assess(finished)) == (1, 2, 3, 4)


def test_scale_down_never_leaves_a_minority_caught_up() -> None:
    base = healthy((1, 2, 3, 4, 5), replicas=3)
    lagging = replace(base, quorum=quorum([row(1), row(2), row(3, lag=9), row(4, lag=9),
                                           row(5)]))
    decided = plan(lagging)
    assert decided.actions == ()
    assert "caught-up voters" in decided.waiting


def test_a_refused_scale_down_is_not_retried_at_once() -> None:
    observed = healthy((1, 2, 3, 4, 5), replicas=3,
                       refused={5: (NOW + 60, "removing node 5 would remove node 5")})
    decided = plan(observed)
    assert decided.actions == ()
    assert "refused" in decided.blocked["ScalingBlocked"]
    again = replace(observed, refused={5: (NOW - 1, "old")})
    assert only(again).kind == "RemoveVoter"


def test_a_removed_member_is_forgotten() -> None:
    base = healthy(replicas=3)
    leftover = replace(base, members=updated(base.members, n5=member(5, role="observer")))
    assert [m.node_id for m in plan(leftover).members] == [1, 2, 3]


def test_nothing_is_deleted_without_a_leader() -> None:
    base = healthy(replicas=3, pods=updated(healthy().pods, n5=pod(5)))
    assert plan(replace(base, quorum=None)).actions == ()
    assert only(base) == Action(ActionKind.DELETE_POD, 5, "ScaleDown")


def test_records_keep_the_voter_set_through_passes_without_a_leader() -> None:
    observed = replaced(healthy(), 3)  # one pass with the leader: node 3 is an observer now
    observed = replace(observed, members={m.node_id: m for m in plan(observed).members})
    observed = replace(observed, quorum=None, nodes=updated(
        observed.nodes, n1=node(1, leader=None), n2=node(2, NEW[2], leader=None)))
    for _ in range(3):
        decided = plan(observed)
        assert decided.assessment.voters == ((1, DIRS[1]), (2, DIRS[2]), (3, DIRS[3]))
        assert decided.assessment.quorum_lost and decided.actions == ()
        observed = replace(observed, members={m.node_id: m for m in decided.members})


def test_scale_down_comes_before_the_roll_it_causes() -> None:
    observed = outdated(healthy((1, 2, 3, 4, 5), replicas=3), 1, 2, 3, 4, 5)
    assert only(observed) == Action(ActionKind.REMOVE_VOTER, 5, "ScaleDown", DIRS[5])


def test_a_forgotten_member_leaves_the_voters_list() -> None:
    base = healthy(replicas=3)
    leftover = replace(base, members=updated(base.members, n5=member(5, role="observer")))
    assert configured_voter_ids(leftover, assess(leftover)) == (1, 2, 3)


def test_after_add_voter_on_a_new_claim_only_the_old_directory_is_lost() -> None:
    """The pass after AddVoter of a deleted claim's replacement: the status still records the
    old claim's uid, but the new directory is the one the node runs on the new claim: only the
    old directory is lost (not two voters of four, which would say QuorumLost), and it is
    removed."""
    observed = replaced(healthy(claims=updated(healthy().claims,
                                               n3=claim(3, uid="claim-3-new"))), 3)
    assert observed.quorum is not None
    both = replace(observed, quorum=replace(
        observed.quorum, voters=(*observed.quorum.voters, row(3, NEW[3])), observers=()))
    decided = plan(both)
    assert decided.assessment.lost == frozenset({(3, DIRS[3])})
    assert not decided.assessment.quorum_lost
    assert only(both) == Action(ActionKind.REMOVE_VOTER, 3, "Remediation", DIRS[3])


def test_an_observer_that_stopped_fetching_is_not_the_nodes_directory() -> None:
    """The leader still lists a replacement's first replica, which stopped long ago, as an
    observer; while the member's pod restarts (no metrics of its own) that row must not be
    taken for the node's directory: the volume was kept, nothing is lost."""
    base = healthy(pods=updated(healthy().pods, n3=None), nodes=updated(healthy().nodes, n3=None))
    assert base.quorum is not None
    stale = replace(row(3, NEW[3]), last_fetch_ms=NOW_MS - 60_000)
    observed = replace(base, quorum=replace(base.quorum, observers=(stale,)))
    decided = plan(observed)
    assert decided.assessment.lost == frozenset()
    assert [(a.kind, a.node_id) for a in decided.actions] == [("CreatePod", 3)]
    fresh = replace(base, quorum=replace(base.quorum, observers=(row(3, NEW[3]),)))
    assert plan(fresh).assessment.lost == frozenset({(3, DIRS[3])})


def test_scale_up_rolls_the_voters_while_the_new_member_cannot_be_ready() -> None:
    """The new member's pod, made with the longer voters list, cannot fetch (nor be ready)
    until the leader knows its id (a node refuses a fetch from an id not in
    controller.quorum.voters): its unreadiness must not hold back the roll that tells the
    leader, or scale-up waits forever."""
    base = healthy(replicas=4)
    observed = replace(base, pods={**{i: pod(i, config_hash="old") for i in (1, 2, 3)},
                                   4: pod(4, ready=False)},
                       claims={**base.claims, 4: claim(4)})
    decided = plan(observed)
    assert [(a.kind, a.node_id, a.reason) for a in decided.actions] == \
        [("DeletePod", 2, "RollingUpdate")], decided.waiting
    # An unready voter still holds the roll back.
    voter_down = replace(observed, pods={**observed.pods, 3: pod(3, ready=False,
                                                                  config_hash="old")})
    assert plan(voter_down).actions == () or \
        [a.node_id for a in plan(voter_down).actions] == [3]


def test_every_kind_of_action_has_a_handler() -> None:
    """The reconciler acts through one handler per kind (``reconcile._ACTS``): a kind the planner
    may choose and no handler takes would fail the pass that chose it."""
    assert set(_ACTS) == set(ActionKind)
