"""The KafkaQuorum's status: metav1-shaped conditions, members, the pending voter change and the
record of the last remediation. Pure functions of the plan and of what the status held before."""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping, Sequence
from typing import Any

from kafka_quorum_operator.observe import MemberRecord, Observed, foreign_claims
from kafka_quorum_operator.plan import (
    ADD_VOTER,
    REMEDIATION,
    REMOVE_VOTER,
    Action,
    Plan,
    wanted_ids,
)

CONDITION_TYPES = ("Ready", "Quorate", "AllMembersReady", "MemberReplacing", "QuorumLost",
                   "Paused", "ScalingBlocked", "Secured", "ClaimsRefused",
                   "VolumeResizeBlocked", "CreateRefused")
# metav1.Condition's reason: CamelCase (the API server's Status reasons are).
_CONDITION_REASON = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")


def iso(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.UTC).timestamp()
    except ValueError:
        return None


def conditions(observed: Observed, plan: Plan, previous: Sequence[Mapping[str, Any]]
               ) -> list[dict[str, Any]]:
    """All condition types, each True/False with a reason and message; lastTransitionTime moves
    only when the status does."""
    a = plan.assessment
    now = iso(observed.now)
    pods = observed.pods
    wanted = wanted_ids(observed, a)
    unready = sorted(pods[i].name if i in pods else f"node {i} (no pod)"
                     for i in wanted if i not in pods or not pods[i].ready)
    stale = sorted({node_id for node_id, _ in a.lost})
    found: dict[str, tuple[bool, str, str]] = {}
    found["Paused"] = (observed.spec.paused, "SpecPaused" if observed.spec.paused else
                       "Reconciling", "spec.paused is true: no changes are made"
                       if observed.spec.paused else "")
    if a.quorum_lost:
        survivors = ", ".join(
            f"node {i} (log end offset {observed.nodes[i].log_end_offset})"
            for i, _ in a.voters if (i, _) not in a.lost and i in observed.nodes) or "none"
        found["QuorumLost"] = (True, "MajorityOfVolumesLost", (
            f"voters {', '.join(str(i) for i in stale)} of {len(a.voters)} lost their volumes; "
            f"surviving voters: {survivors}. Nothing is changed automatically: follow the "
            "manual recovery in docs/operator.md"))
    else:
        found["QuorumLost"] = (False, "MajorityIntact", "")
    if a.leader_id is not None:
        quorum = observed.quorum
        epoch = quorum.epoch if quorum is not None else 0
        found["Quorate"] = (True, "LeaderElected", f"node {a.leader_id} leads epoch {epoch}")
    elif a.quorum_lost:
        found["Quorate"] = (False, "QuorumLost", "a majority of voters lost their volumes")
    elif a.untrusted_leader is not None:
        found["Quorate"] = (False, "UntrustedLeader", (
            f"node {a.untrusted_leader} claims leadership of a voter set that does not hold a "
            "majority of the recorded voters"))
    else:
        found["Quorate"] = (False, "NoLeader", "no leader could be reached")
    found["AllMembersReady"] = (not unready, "PodsReady" if not unready else "PodsNotReady",
                                f"not ready: {', '.join(unready)}" if unready else "")
    replacing = plan.blocked.get("MemberReplacing")
    in_progress = bool(stale) and not a.quorum_lost
    pending = plan.pending
    if pending is not None and pending.reason == REMEDIATION:
        in_progress = True
    found["MemberReplacing"] = (
        in_progress or replacing is not None,
        "VolumeReplaced" if in_progress else "NoReplacement",
        replacing or (plan.waiting if in_progress else ""))
    scaling = plan.blocked.get("ScalingBlocked")
    found["ScalingBlocked"] = (scaling is not None, "VoterChangeRefused" if scaling else
                               "NotBlocked", scaling or "")
    found["Secured"] = _secured(observed)
    voters = len(a.voters)
    outdated = [p.name for p in pods.values() if p.config_hash != observed.config_hash]
    ready = (a.leader_id is not None and not unready and not stale and not outdated
             and voters == observed.spec.replicas and not observed.spec.paused)
    found["Ready"] = (ready, "QuorumReady" if ready else "Reconciling",
                      f"{voters} voters, leader {a.leader_id}" if ready else
                      plan.waiting or _not_ready_reason(voters, observed.spec.replicas,
                                                        unready, outdated))
    foreign = foreign_claims(observed.claims, observed.cluster_id)
    found["ClaimsRefused"] = (bool(foreign), "ForeignClusterId" if foreign else "NoneRefused", (
        "; ".join(f"{c.name} belongs to cluster {c.cluster_id}, not {observed.cluster_id}"
                  for c in foreign.values()) +
        ": never mounted; delete the claim to have a new one made, or restore the "
        "KafkaQuorum it belongs to") if foreign else "")
    found["VolumeResizeBlocked"] = (observed.resize_problem is not None, "NotExpandable"
                                    if observed.resize_problem else "NotBlocked",
                                    observed.resize_problem or "")
    found["CreateRefused"] = _create_refused(observed)
    old = {c.get("type"): c for c in previous if isinstance(c, Mapping)}
    result = []
    for kind in CONDITION_TYPES:
        status, reason, message = found[kind]
        text = "True" if status else "False"
        before = old.get(kind)
        since = before.get("lastTransitionTime") if before and before.get("status") == text \
            else None
        result.append({"type": kind, "status": text, "reason": reason, "message": message,
                       "lastTransitionTime": since or now,
                       "observedGeneration": observed.generation})
    return result


def invalid_spec_conditions(previous: Sequence[Mapping[str, Any]], message: str,
                            generation: int, now: float) -> list[dict[str, Any]]:
    """The conditions of a KafkaQuorum whose spec or name the operator refuses (one an older
    CRD let through): Ready False, reason InvalidSpec, with the reason; the others as they were
    (nothing is observed while the spec cannot be read)."""
    ready = {"type": "Ready", "status": "False", "reason": "InvalidSpec", "message": message,
             "observedGeneration": generation}
    result = [dict(c) for c in previous if isinstance(c, Mapping) and c.get("type") != "Ready"]
    before = next((c for c in previous if isinstance(c, Mapping) and c.get("type") == "Ready"),
                  {})
    since = before.get("lastTransitionTime") if before.get("status") == "False" else None
    ready["lastTransitionTime"] = since or iso(now)
    return [ready, *result]


def _create_refused(observed: Observed) -> tuple[bool, str, str]:
    """The children the API server refused to create: its reason (of the first) and, for each,
    its message."""
    refused = sorted(observed.creates_refused.values(), key=lambda c: (c.kind, c.name))
    if not refused:
        return (False, "NoneRefused", "")
    reason = refused[0].reason
    return (True, reason if _CONDITION_REASON.fullmatch(reason) else "Refused", "; ".join(
        f"{c.kind} {c.name}: {c.message}" for c in refused) +
        " (tried again after a growing back-off, at once when the spec changes)")


def _secured(observed: Observed) -> tuple[bool, str, str]:
    security = observed.spec.security
    if not security.tls:
        return (False, "TLSDisabled", "spec.security.tls.enabled is false: plain HTTP, no "
                "credentials; anyone who can reach the port can read, write and change the "
                "voters (docs/security.md)")
    if observed.security_problem is not None:
        return (False, "CredentialsMissing", observed.security_problem)
    issuer = security.issuer
    source = f"cert-manager {issuer.kind} {issuer.name}" if issuer is not None else \
        "the operator's CA"
    return (True, "MutualTLS", f"TLS with certificates of {source}, mutual TLS between nodes, "
            "credentials required")


def _not_ready_reason(voters: int, replicas: int, unready: list[str], outdated: list[str]
                      ) -> str:
    if unready:
        return f"waiting for {', '.join(unready)}"
    if outdated:
        return f"pods to update: {', '.join(sorted(outdated))}"
    if voters != replicas:
        return f"{voters} voters, {replicas} wanted"
    return "no leader"


def member_status(observed: Observed, plan: Plan, record: MemberRecord) -> dict[str, Any]:
    node_id = record.node_id
    pod = observed.pods.get(node_id)
    claim = observed.claims.get(node_id)
    entry: dict[str, Any] = {
        "nodeId": node_id, "role": record.role,
        "pod": pod.name if pod is not None else f"{observed.name}-{node_id}",
        "pvc": claim.name if claim is not None else f"data-{observed.name}-{node_id}",
        "ready": pod is not None and pod.ready,
    }
    optional: dict[str, Any] = {
        "pvcUID": record.claim_uid, "directoryId": record.directory_id,
        "currentDirectoryId": plan.assessment.current_directories.get(node_id),
        "caughtUpSince": record.caught_up_since, "lastChange": record.last_change,
    }
    quorum = observed.quorum
    if quorum is not None and plan.assessment.leader_id is not None:
        current = plan.assessment.current_directories.get(node_id)
        row = next((r for r in quorum.voters + quorum.observers
                    if r.node_id == node_id and r.directory_id == current), None)
        if row is not None:
            optional["logEndOffset"] = row.log_end_offset
            optional["lag"] = row.lag
    elif node_id in observed.nodes:
        optional["logEndOffset"] = observed.nodes[node_id].log_end_offset
    entry.update({k: v for k, v in optional.items() if v is not None})
    return entry


def status_patch(observed: Observed, plan: Plan, previous: Mapping[str, Any], selector: str
                 ) -> dict[str, Any]:
    """The status after this pass (a merge patch: keys set to None are removed)."""
    a = plan.assessment
    quorum = observed.quorum if a.leader_id is not None else None
    return {
        "observedGeneration": observed.generation,
        "clusterId": observed.cluster_id,
        "bootstrapped": a.bootstrapped,
        "replicas": len(a.voters),
        "selector": selector,
        "voters": len(a.voters),
        "leaderId": a.leader_id,
        "leaderEpoch": quorum.epoch if quorum is not None else None,
        "highWatermark": quorum.high_watermark if quorum is not None else None,
        "members": [member_status(observed, plan, m) for m in plan.members],
        "pendingChange": plan.pending.to_status() if plan.pending is not None else None,
        "message": plan.waiting,
        "conditions": conditions(observed, plan, previous.get("conditions") or []),
    }


# Figures of the status that move with every write to the quorum (the log's offsets, the lag).
VOLATILE = ("highWatermark",)
VOLATILE_MEMBER = ("logEndOffset", "lag")


def without_volatile(status: Mapping[str, Any]) -> dict[str, Any]:
    """The status without its volatile figures: what, when it changes, is worth a write at once
    (a condition, a member, the pending change...)."""
    kept = {k: v for k, v in status.items() if k not in VOLATILE}
    members = status.get("members")
    if isinstance(members, list):
        kept["members"] = [{k: v for k, v in m.items() if k not in VOLATILE_MEMBER}
                           if isinstance(m, Mapping) else m for m in members]
    return kept


# --- the record of a remediation ---------------------------------------------------------------


def remediation_detected(last: Mapping[str, Any] | None, node_id: int, old_directory_id: str,
                         now: float) -> dict[str, Any] | None:
    """A new remediation record when a voter's replaced volume is first seen (None: the one in
    progress already covers it)."""
    if last and last.get("result") == "InProgress" and last.get("nodeId") == node_id:
        return None
    return {"nodeId": node_id, "oldDirectoryId": old_directory_id, "result": "InProgress",
            "started": iso(now),
            "steps": [{"name": "Detected", "completed": iso(now), "durationSeconds": 0.0,
                       "message": f"node {node_id}'s volume no longer holds directory "
                                  f"{old_directory_id}"}]}


def remediation_step(last: Mapping[str, Any] | None, action: Action, *, ok: bool,
                     message: str, started: float, now: float) -> dict[str, Any] | None:
    """The remediation record after one of its voter changes (None: not a remediation's)."""
    if action.reason != REMEDIATION or not action.is_voter_change:
        return None
    record: dict[str, Any] = dict(last) if last and last.get("nodeId") == action.node_id \
        else {"nodeId": action.node_id, "result": "InProgress", "started": iso(started)}
    steps: list[dict[str, Any]] = list(record.get("steps") or [])
    if action.kind == ADD_VOTER:
        record["newDirectoryId"] = action.directory_id
        if action.old_directory_id:
            record.setdefault("oldDirectoryId", action.old_directory_id)
        previous_end = parse_iso(steps[-1].get("completed")) if steps else None
        if previous_end is not None and ok:
            steps.append({"name": "CaughtUp", "completed": iso(started),
                          "durationSeconds": round(started - previous_end, 3),
                          "message": "the new replica caught up with the leader"})
    steps.append({"name": action.kind, "completed": iso(now),
                  "durationSeconds": round(now - started, 3),
                  "message": message if ok else f"failed: {message}"})
    record["steps"] = steps[-12:]
    if ok and action.kind == REMOVE_VOTER:
        record["result"] = "Succeeded"
        record["completed"] = iso(now)
        begun = parse_iso(record.get("started"))
        if begun is not None:
            record["durationSeconds"] = round(now - begun, 3)
    return record
