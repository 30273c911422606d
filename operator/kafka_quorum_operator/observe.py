"""What the operator observes, as plain immutable values: its pods and volume claims, each node's
own view (from its ``GET /v1/node``), the leader's DescribeQuorum, and what the status recorded
earlier. Parsing is pure, so that the planner's tests build these directly."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, ValidationError

from kafka_quorum_operator import (
    ANNOTATION_CLIENT_TLS,
    ANNOTATION_CLUSTER_ID,
    ANNOTATION_CONFIG_HASH,
    ANNOTATION_REJECTIONS,
    LABEL_NODE_ID,
    LABEL_VOTER,
)
from kafka_quorum_operator.spec import Spec
from quorum_node.addresses import host_port


@dataclass(frozen=True)
class PodView:
    name: str
    node_id: int
    uid: str = ""
    ip: str | None = None
    ready: bool = False
    phase: str = "Pending"
    # Why the kubelet ended the pod (status.reason: Evicted, Terminated by a node shutdown).
    reason: str | None = None
    terminating: bool = False
    config_hash: str | None = None
    claim_name: str | None = None
    # Whether the pod's client listener serves TLS (``client_tls_of``); None: unknown.
    tls: bool | None = None
    # Whether the pod carries LABEL_VOTER.
    labelled_voter: bool = False
    # Whether any of its containers ever started (status.containerStatuses).
    started: bool = True
    message: str = ""  # status.message: the kubelet's words for ``reason``
    # Pods of this name the kubelet rejected at admission, in a row, before this one
    # (ANNOTATION_REJECTIONS).
    rejections: int = 0

    @property
    def running(self) -> bool:
        return self.phase == "Running" and not self.terminating and self.ip is not None

    def address(self, port: int) -> str | None:
        """``host:port`` of the pod's IP (an IPv6 one in brackets); None: it has none yet."""
        return host_port(self.ip, port) if self.ip is not None else None

    @property
    def terminal(self) -> bool:
        """Every container stopped for good: phase Failed (kubelet eviction, a graceful node
        shutdown), or Succeeded (the same where the container exited 0 on SIGTERM, as some
        releases record a node shutdown). The kubelet never restarts such a pod and nothing
        deletes it soon (the pod garbage collector waits for thousands of terminated pods)."""
        return self.phase in ("Failed", "Succeeded") and not self.terminating

    @property
    def rejected(self) -> bool:
        """Failed before any container started: the kubelet refused it at admission (OutOfcpu,
        NodeAffinity, UnexpectedAdmissionError, Evicted under pressure, ...). A pod made again
        in its place may well be refused again (the scheduler's view of the node lags the
        kubelet's), so it is replaced after a growing back-off (``rejection``)."""
        return self.phase == "Failed" and not self.started and not self.terminating


# The stages of a TLS switch, each one ordinary one-pod-at-a-time roll (docs/operator-design.md):
# 1 serve the new protocol on a second controller listener too, 2 connect to the peers on it,
# 3 the first controller listener and the client listener take the new protocol, 4 connect on
# the first controller listener again; then the steady configuration drops the second one.
TLS_SWITCH_STAGES = 4


@dataclass(frozen=True)
class TlsSwitch:
    """A TLS switch in progress (status.tlsSwitch): the protocol the quorum moves to (``enabled``:
    SSL) and the stage the pods are rolled to."""

    enabled: bool
    stage: int

    def to_status(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "stage": self.stage}

    @classmethod
    def from_status(cls, status: Mapping[str, Any]) -> TlsSwitch | None:
        raw = status.get("tlsSwitch")
        if not isinstance(raw, Mapping):
            return None
        enabled, stage = raw.get("enabled"), raw.get("stage")
        if not isinstance(enabled, bool) or not isinstance(stage, int) or \
                not 1 <= stage <= TLS_SWITCH_STAGES:
            return None
        return cls(enabled, stage)


@dataclass(frozen=True)
class ClaimView:
    name: str
    node_id: int
    uid: str
    terminating: bool = False
    # The cluster id the claim was made for (its annotation); None on claims without one.
    cluster_id: str | None = None
    size: str | None = None  # spec.resources.requests.storage
    storage_class: str | None = None


@dataclass(frozen=True)
class NodeView:
    """A node's own view of itself (its ``GET /v1/node``): who it is and whom it follows."""

    node_id: int
    directory_id: str | None
    state: str  # its Raft state: leader, follower, candidate, prospective, unattached, resigned
    leader_id: int | None
    epoch: int
    log_end_offset: int
    high_watermark: int | None
    is_observer: bool


@dataclass(frozen=True)
class ReplicaRow:
    """One replica as the leader describes it (DescribeQuorum)."""

    node_id: int
    directory_id: str | None
    log_end_offset: int = -1
    lag: int = -1
    last_fetch_ms: int = -1
    last_caught_up_ms: int = -1

    @property
    def key(self) -> tuple[int, str | None]:
        return self.node_id, self.directory_id


@dataclass(frozen=True)
class QuorumView:
    """The leader's DescribeQuorum."""

    leader_id: int
    epoch: int
    high_watermark: int
    voters: tuple[ReplicaRow, ...]
    observers: tuple[ReplicaRow, ...] = ()

    @property
    def now_ms(self) -> int:
        """The leader's clock: its own row carries "now" as its timestamps."""
        for row in self.voters + self.observers:
            if row.node_id == self.leader_id and row.last_caught_up_ms >= 0:
                return row.last_caught_up_ms
        return max((row.last_fetch_ms for row in self.voters + self.observers), default=0)

    def voter(self, node_id: int) -> tuple[ReplicaRow, ...]:
        return tuple(row for row in self.voters if row.node_id == node_id)

    def observer(self, node_id: int) -> tuple[ReplicaRow, ...]:
        return tuple(row for row in self.observers if row.node_id == node_id)


@dataclass(frozen=True)
class MemberRecord:
    """What the status recorded about a member while the quorum was healthy: the identity of
    its volume (claim UID) and of its voter (directory id)."""

    node_id: int
    claim_uid: str | None = None
    directory_id: str | None = None
    role: str = "observer"  # voter | observer
    caught_up_since: float | None = None  # operator clock, for replacements and new voters
    last_change: str | None = None  # when a voter change of this member last completed


class ActionKind(enum.StrEnum):
    """What an action of the plan does (``plan.Action``); its value is the name the status
    (pendingChange.kind), the Events and the operator's metrics use."""

    CREATE_CLAIM = "CreateClaim"
    CREATE_POD = "CreatePod"
    DELETE_POD = "DeletePod"
    DELETE_CLAIM = "DeleteClaim"
    ADD_VOTER = "AddVoter"
    REMOVE_VOTER = "RemoveVoter"


VOTER_CHANGES = frozenset({ActionKind.ADD_VOTER, ActionKind.REMOVE_VOTER})


@dataclass(frozen=True)
class PendingChange:
    """A voter change the operator recorded before making it (resumed after a restart)."""

    kind: ActionKind  # one of VOTER_CHANGES
    node_id: int
    directory_id: str
    reason: str  # Remediation | ScaleUp | ScaleDown
    started: str = ""
    old_directory_id: str | None = None

    def to_status(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"kind": self.kind, "nodeId": self.node_id,
                                 "directoryId": self.directory_id, "reason": self.reason,
                                 "started": self.started}
        if self.old_directory_id is not None:
            entry["oldDirectoryId"] = self.old_directory_id
        return entry


@dataclass(frozen=True)
class CreateRefused:
    """A child object (pod, claim) whose create the API server refused: admission (a
    ResourceQuota, a policy webhook) or validation. Tried again at ``retry_at`` (the operator's
    clock), or at once when the spec changes (another ``generation``)."""

    kind: str
    name: str
    reason: str  # the API server's (Forbidden, Invalid, ...)
    message: str
    attempts: int
    retry_at: float
    generation: int


@dataclass(frozen=True)
class Observed:
    """Everything one reconciliation decides from."""

    name: str
    spec: Spec
    now: float  # the operator's clock, seconds
    generation: int = 0
    cluster_id: str | None = None
    bootstrapped: bool = False
    config_hash: str = ""  # what every pod's configuration should hash to
    pods: Mapping[int, PodView] = field(default_factory=dict)
    claims: Mapping[int, ClaimView] = field(default_factory=dict)
    nodes: Mapping[int, NodeView] = field(default_factory=dict)
    quorum: QuorumView | None = None
    members: Mapping[int, MemberRecord] = field(default_factory=dict)
    pending: PendingChange | None = None
    # Voter changes the leader refused, by node id: (retry after, operator clock; why).
    refused: Mapping[int, tuple[float, str]] = field(default_factory=dict)
    # Why the quorum's nodes cannot be reached securely (TLS on, the operator's credentials
    # missing); None when they can, or TLS is off.
    security_problem: str | None = None
    # Why claims cannot grow to spec.storage.size (condition VolumeResizeBlocked).
    resize_problem: str | None = None
    # Creates the API server refused, by "Kind/name" (condition CreateRefused).
    creates_refused: Mapping[str, CreateRefused] = field(default_factory=dict)
    # The TLS switch whose stage the pods are rolled to (config_hash is that stage's); None:
    # the steady configuration of spec.security.tls.
    tls_switch: TlsSwitch | None = None


# --- Kubernetes objects ------------------------------------------------------------------------


def node_id_of(obj: Mapping[str, Any]) -> int | None:
    labels = obj.get("metadata", {}).get("labels") or {}
    value = labels.get(LABEL_NODE_ID)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def pod_view(pod: Mapping[str, Any]) -> PodView | None:
    node_id = node_id_of(pod)
    if node_id is None:
        return None
    meta = pod.get("metadata", {})
    status = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or [])
    claim = next((v["persistentVolumeClaim"].get("claimName")
                  for v in pod.get("spec", {}).get("volumes") or []
                  if isinstance(v.get("persistentVolumeClaim"), Mapping)), None)
    return PodView(
        name=meta.get("name", ""), node_id=node_id, uid=meta.get("uid", ""),
        ip=status.get("podIP") or None, ready=ready, phase=status.get("phase") or "Pending",
        reason=status.get("reason") or None, terminating=bool(meta.get("deletionTimestamp")),
        config_hash=(meta.get("annotations") or {}).get(ANNOTATION_CONFIG_HASH),
        claim_name=claim, tls=client_tls_of(pod),
        labelled_voter=(meta.get("labels") or {}).get(LABEL_VOTER) == "true",
        started=_ever_started(status), message=status.get("message") or "",
        rejections=_count((meta.get("annotations") or {}).get(ANNOTATION_REJECTIONS)),
    )


def _ever_started(status: Mapping[str, Any]) -> bool:
    """Whether a container of the pod ever started: running, or terminated after a start (a
    pod the kubelet rejects at admission gets no status, or a terminated one without
    ``startedAt``)."""
    for container in [*(status.get("initContainerStatuses") or []),
                      *(status.get("containerStatuses") or [])]:
        state, last = container.get("state") or {}, container.get("lastState") or {}
        if state.get("running") or any((s.get("terminated") or {}).get("startedAt")
                                       for s in (state, last)):
            return True
    return False


def _count(text: str | None) -> int:
    return int(text) if text is not None and text.isdigit() else 0


def client_tls_of(pod: Mapping[str, Any]) -> bool | None:
    """Whether a pod's client listener speaks TLS: its ANNOTATION_CLIENT_TLS, else (a pod an
    older operator created) its readiness probe's scheme; None: unknown. The annotation comes
    first because a service mesh may rewrite the probe (Istio's points it at its agent, over
    HTTP), and a scheme read from that would start TLS switches without end."""
    annotation = (pod.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_CLIENT_TLS)
    if annotation in ("true", "false"):
        return bool(annotation == "true")
    containers = pod.get("spec", {}).get("containers") or [{}]
    scheme = ((containers[0].get("readinessProbe") or {}).get("httpGet") or {}).get("scheme")
    return None if scheme is None else scheme == "HTTPS"


def claim_view(claim: Mapping[str, Any]) -> ClaimView | None:
    node_id = node_id_of(claim)
    if node_id is None:
        return None
    meta = claim.get("metadata", {})
    return ClaimView(name=meta.get("name", ""), node_id=node_id, uid=meta.get("uid", ""),
                     terminating=bool(meta.get("deletionTimestamp")),
                     cluster_id=(meta.get("annotations") or {}).get(ANNOTATION_CLUSTER_ID),
                     size=((claim.get("spec") or {}).get("resources") or {}).get(
                         "requests", {}).get("storage"),
                     storage_class=(claim.get("spec") or {}).get("storageClassName"))


def foreign_claims(claims: Mapping[int, ClaimView], cluster_id: str | None
                   ) -> dict[int, ClaimView]:
    """Claims made for another cluster id (a quorum of the same name before): never mounted,
    so that no node of this cluster formats or reads them."""
    return {i: c for i, c in claims.items()
            if cluster_id and c.cluster_id and c.cluster_id != cluster_id}


# --- the node's admin API ------------------------------------------------------------------------


class _NodeStatus(BaseModel):
    """What the operator reads of a node's ``GET /v1/node`` (``quorum_node.node.api.admin``'s
    ``node_status_json``; the rest of it is ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    node_id: StrictInt
    directory_id: str | None = None
    state: str
    leader_id: StrictInt | None = None
    epoch: StrictInt
    is_voter: StrictBool
    high_watermark: StrictInt = -1  # -1: not known here
    log_end_offset: StrictInt


def parse_node_status(body: Any) -> NodeView | None:
    """A node's view of itself from its ``GET /v1/node`` answer; None if it is not one."""
    try:
        found = _NodeStatus.model_validate(body)
    except ValidationError:
        return None
    return NodeView(
        node_id=found.node_id, directory_id=found.directory_id or None, state=found.state,
        leader_id=found.leader_id, epoch=found.epoch, log_end_offset=found.log_end_offset,
        high_watermark=None if found.high_watermark < 0 else found.high_watermark,
        is_observer=not found.is_voter)


def parse_describe_quorum(body: Mapping[str, Any]) -> QuorumView:
    """The admin API's ``GET /v1/quorum`` answer. Raises ValueError on a malformed one."""

    def rows(key: str) -> tuple[ReplicaRow, ...]:
        entries = body.get(key)
        if not isinstance(entries, list):
            raise ValueError(f"DescribeQuorum: {key!r} is not a list")
        return tuple(ReplicaRow(
            node_id=int(entry["id"]), directory_id=entry.get("directory_id") or None,
            log_end_offset=int(entry.get("log_end_offset", -1)), lag=int(entry.get("lag", -1)),
            last_fetch_ms=int(entry.get("last_fetch_timestamp", -1)),
            last_caught_up_ms=int(entry.get("last_caught_up_timestamp", -1)),
        ) for entry in entries)

    try:
        return QuorumView(leader_id=int(body["leader_id"]), epoch=int(body["leader_epoch"]),
                          high_watermark=int(body.get("high_watermark", -1)),
                          voters=rows("voters"), observers=rows("observers"))
    except (KeyError, TypeError) as error:
        raise ValueError(f"DescribeQuorum: malformed answer ({error!r})") from None


# --- the status written earlier ----------------------------------------------------------------


def members_from_status(status: Mapping[str, Any]) -> dict[int, MemberRecord]:
    members: dict[int, MemberRecord] = {}
    for entry in status.get("members") or []:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("nodeId"), int):
            continue
        since = entry.get("caughtUpSince")
        members[entry["nodeId"]] = MemberRecord(
            node_id=entry["nodeId"], claim_uid=entry.get("pvcUID") or None,
            directory_id=entry.get("directoryId") or None, role=entry.get("role") or "observer",
            caught_up_since=float(since) if isinstance(since, int | float) else None,
            last_change=entry.get("lastChange") or None,
        )
    return members


def pending_from_status(status: Mapping[str, Any]) -> PendingChange | None:
    raw = status.get("pendingChange")
    if not isinstance(raw, Mapping):
        return None
    try:
        kind = ActionKind(raw["kind"])
        if kind not in VOTER_CHANGES:
            return None
        return PendingChange(kind=kind, node_id=int(raw["nodeId"]),
                             directory_id=str(raw["directoryId"]), reason=str(raw["reason"]),
                             started=str(raw.get("started", "")),
                             old_directory_id=raw.get("oldDirectoryId"))
    except (KeyError, TypeError, ValueError):
        return None
