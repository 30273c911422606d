"""What ``kubectl kq`` shows and decides, as pure functions of API objects (plain dicts, as the
API server sends them): a quorum's summary (its status as the operator wrote it, with its pods as
they are), its text form, and whether restarting a member is safe now.

The status is the operator's (``kafka_quorum_operator.status``): members carry ``caughtUpSince``
while the leader reports them caught up and drop it otherwise, ``leaderId`` is absent without a
leader. Readiness is the pod's own (its Ready condition), newer than the status."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kafka_quorum_operator import LABEL_NODE_ID

JSON = dict[str, Any]
BACKUP_DONE = ("Completed", "Failed")


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def pod_ready(pod: Mapping[str, Any]) -> bool:
    if _mapping(pod.get("metadata")).get("deletionTimestamp"):
        return False
    conditions = _mapping(pod.get("status")).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pod_node_id(pod: Mapping[str, Any]) -> int | None:
    label = _mapping(_mapping(pod.get("metadata")).get("labels")).get(LABEL_NODE_ID)
    try:
        return int(label) if label is not None else None
    except ValueError:
        return None


def restarts(pod: Mapping[str, Any]) -> int:
    statuses = _mapping(pod.get("status")).get("containerStatuses") or []
    return sum(int(s.get("restartCount") or 0) for s in statuses)


def condition(quorum: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    found = (c for c in _mapping(quorum.get("status")).get("conditions") or []
             if isinstance(c, Mapping) and c.get("type") == kind)
    return next(found, {})


def created(obj: Mapping[str, Any]) -> str:
    return str(_mapping(obj.get("metadata")).get("creationTimestamp") or "")


def backups_of(backups: Iterable[Mapping[str, Any]], quorum: str) -> list[Mapping[str, Any]]:
    """The QuorumBackups of ``quorum``, oldest first (their creation time, then name)."""
    return sorted((b for b in backups if _mapping(b.get("spec")).get("quorum") == quorum),
                  key=lambda b: (created(b), str(_mapping(b.get("metadata")).get("name"))))


def backup_summary(backup: Mapping[str, Any]) -> JSON:
    status = _mapping(backup.get("status"))
    found: JSON = {"name": _mapping(backup.get("metadata")).get("name"),
                   "created": created(backup) or None, "phase": status.get("phase") or "Pending"}
    for key in ("location", "sizeBytes", "endOffset", "node", "durationSeconds", "message"):
        if status.get(key) is not None:
            found[key] = status[key]
    return found


def members(quorum: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> list[JSON]:
    """One row per member on record, and per pod of a node id the status does not list yet."""
    by_id = {i: p for p in pods if (i := pod_node_id(p)) is not None}
    recorded = [m for m in _mapping(quorum.get("status")).get("members") or []
                if isinstance(m, Mapping) and isinstance(m.get("nodeId"), int)]
    rows: list[JSON] = []
    for node_id in sorted({m["nodeId"] for m in recorded} | set(by_id)):
        member = next((m for m in recorded if m["nodeId"] == node_id), {})
        pod = by_id.get(node_id)
        row: JSON = {"nodeId": node_id, "role": member.get("role") or "unknown",
                     "directoryId": member.get("directoryId"),
                     "pod": _mapping(pod.get("metadata")).get("name") if pod else None,
                     "ready": pod is not None and pod_ready(pod),
                     "restarts": restarts(pod) if pod else 0,
                     "caughtUp": member.get("caughtUpSince") is not None}
        current = member.get("currentDirectoryId")
        if current and current != row["directoryId"]:
            row["currentDirectoryId"] = current
        for key in ("logEndOffset", "lag", "pvc"):
            if member.get(key) is not None:
                row[key] = member[key]
        rows.append(row)
    return rows


def summary(quorum: Mapping[str, Any], pods: Sequence[Mapping[str, Any]],
            backups: Iterable[Mapping[str, Any]]) -> JSON:
    """What ``kubectl kq status`` shows (``-o json|yaml`` prints this as it is)."""
    meta, spec = _mapping(quorum.get("metadata")), _mapping(quorum.get("spec"))
    status = _mapping(quorum.get("status"))
    leader = None
    if status.get("leaderId") is not None:
        leader = {"nodeId": status["leaderId"], "epoch": status.get("leaderEpoch"),
                  "highWatermark": status.get("highWatermark")}
    ready = condition(quorum, "Ready")
    own = backups_of(backups, str(meta.get("name")))
    return {
        "name": meta.get("name"), "namespace": meta.get("namespace"),
        "clusterId": status.get("clusterId"), "replicas": spec.get("replicas"),
        "paused": bool(spec.get("paused")),
        "ready": {k: ready.get(k) for k in ("status", "reason", "message")} if ready else None,
        "leader": leader, "message": status.get("message") or None,
        "pendingChange": status.get("pendingChange"),
        "members": members(quorum, pods),
        "conditions": [{k: c.get(k) for k in ("type", "status", "reason", "message",
                                              "lastTransitionTime")}
                       for c in status.get("conditions") or [] if isinstance(c, Mapping)],
        "lastRemediation": status.get("lastRemediation"),
        "scheduledBackup": status.get("backup"),
        "lastBackup": backup_summary(own[-1]) if own else None,
    }


def restart_refusal(quorum: Mapping[str, Any], pods: Sequence[Mapping[str, Any]],
                    node_id: int) -> str | None:
    """Why restarting member ``node_id`` now is not safe, in one line (None: safe). Safe means:
    not paused (the operator would not bring the pod back), no voter change in progress, a
    leader, and every other voter's pod Ready and caught up with the leader per the status; so
    the quorum keeps its majority while the pod is away."""
    spec, status = _mapping(quorum.get("spec")), _mapping(quorum.get("status"))
    rows = {r["nodeId"]: r for r in members(quorum, pods)}
    target = rows.get(node_id)
    if target is None or target["pod"] is None:
        known = ", ".join(str(i) for i in sorted(rows)) or "none"
        return f"node {node_id} has no pod in this quorum (members: {known})"
    if spec.get("paused"):
        return "spec.paused is true: the operator would not bring the pod back (resume first)"
    pending = _mapping(status.get("pendingChange"))
    if pending:
        return (f"a voter change is in progress ({pending.get('kind')} of node "
                f"{pending.get('nodeId')}); wait for it to finish")
    if status.get("leaderId") is None:
        return "the quorum has no leader (condition Quorate is not True)"
    behind = [f"node {r['nodeId']} ({_why_behind(r)})" for i, r in sorted(rows.items())
              if i != node_id and r["role"] == "voter" and (not r["ready"] or not r["caughtUp"])]
    if behind:
        return f"other voters are not ready or not caught up: {', '.join(behind)}"
    return None


def _why_behind(row: Mapping[str, Any]) -> str:
    if row["pod"] is None:
        return "no pod"
    if not row["ready"]:
        return "pod not Ready"
    return f"lag {row['lag']}" if row.get("lag") is not None else "not caught up"


# --- text ---------------------------------------------------------------------------------------


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """Left-aligned columns, two spaces apart (kubectl get's layout); None is shown as '-'."""
    cells = [list(header), *([("-" if v is None else str(v)) for v in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in cells]


def _age(stamp: object, now: datetime.datetime) -> str:
    try:
        then = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return "-"
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def render(found: Mapping[str, Any], now: datetime.datetime | None = None) -> str:
    """The text of ``kubectl kq status``."""
    now = now or datetime.datetime.now(datetime.UTC)
    ready = _mapping(found.get("ready"))
    leader = _mapping(found.get("leader"))
    lines = [f"Quorum:     {found['name']} (namespace {found['namespace']})",
             f"Cluster id: {found.get('clusterId') or '-'}",
             "Ready:      " + (f"{ready.get('status')} ({ready.get('reason')}"
                               f"{': ' + ready['message'] if ready.get('message') else ''})"
                               if ready else "- (no status yet: is the operator running?)"),
             "Leader:     " + (f"node {leader['nodeId']}, epoch {leader.get('epoch')}, "
                               f"high watermark {leader.get('highWatermark')}"
                               if leader else "none"),
             f"Paused:     {'yes (spec.paused)' if found.get('paused') else 'no'}"]
    pending = _mapping(found.get("pendingChange"))
    if pending:
        lines.append(f"Changing:   {pending.get('kind')} of node {pending.get('nodeId')} "
                     f"({pending.get('reason')}, since {pending.get('started')})")
    if found.get("message"):
        lines.append(f"Waiting:    {found['message']}")
    lines += ["", "Members:"]
    lines += ["  " + line for line in table(
        ("NODE", "ROLE", "DIRECTORY ID", "POD", "READY", "RESTARTS", "LOG END", "LAG",
         "CAUGHT UP"),
        ((m["nodeId"], m["role"], m.get("directoryId"), m.get("pod"),
          "yes" if m["ready"] else "no", m["restarts"], m.get("logEndOffset"), m.get("lag"),
          "yes" if m["caughtUp"] else "no") for m in found["members"]))]
    lines += ["", "Conditions:"]
    lines += ["  " + line for line in table(
        ("TYPE", "STATUS", "REASON", "AGE", "MESSAGE"),
        ((c["type"], c["status"], c["reason"], _age(c.get("lastTransitionTime"), now),
          c.get("message") or None) for c in found["conditions"]))]
    lines += ["", f"Last remediation: {remediation_line(found.get('lastRemediation'))}",
              f"Last backup:      {backup_line(found.get('lastBackup'))}",
              f"Scheduled backup: {scheduled_line(found.get('scheduledBackup'))}"]
    return "\n".join(lines)


def remediation_line(last: object) -> str:
    record = _mapping(last)
    if not record:
        return "none"
    line = f"node {record.get('nodeId')} {record.get('result')}, started {record.get('started')}"
    if record.get("durationSeconds") is not None:
        line += f", took {record['durationSeconds']} s"
    steps = [s.get("name") for s in record.get("steps") or [] if isinstance(s, Mapping)]
    return f"{line} (steps: {', '.join(str(s) for s in steps)})" if steps else line


def backup_line(backup: object) -> str:
    found = _mapping(backup)
    if not found:
        return "none"
    line = f"{found.get('name')} {found.get('phase')}"
    details = [f"{k} {found[k]}" for k in ("location", "endOffset", "sizeBytes", "node",
                                           "durationSeconds") if found.get(k) is not None]
    if found.get("message"):
        details.append(str(found["message"]))
    return f"{line} ({', '.join(details)})" if details else line


def scheduled_line(backup: object) -> str:
    found = _mapping(backup)
    if not found:
        return "none"
    line = (f"{found.get('lastTime')} at {found.get('lastLocation')}"
            if found.get("lastTime") else "never completed")
    failure = _mapping(found.get("lastFailure"))
    if failure:
        line += f"; last failure {failure.get('time')}: {failure.get('message')}"
    return line
