"""One reconciliation pass: observe (API objects, each node's ``GET /v1/node``, the leader's
DescribeQuorum), plan (``plan.plan``), act (at most one voter change or deletion), write the
status, and post a Kubernetes Event for every change made. ``Reconciler._reconcile`` lists the
pass's steps, each a method over one ``PassContext``."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kafka_quorum_operator import (
    ANNOTATION_REJECTIONS,
    GROUP,
    KIND,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_VOTER,
    MANAGER,
    PLURAL,
    VERSION,
)
from kafka_quorum_operator import opmetrics as m
from kafka_quorum_operator import resources as r
from kafka_quorum_operator.backups import (
    BackupJob,
    BackupScheduler,
    restore_init_container,
    restore_plan,
)
from kafka_quorum_operator.drills import Drills
from kafka_quorum_operator.events import EventRecorder
from kafka_quorum_operator.keeper import Keeper, SecretNotOwned, Secured
from kafka_quorum_operator.kube import Kube, KubeError, cluster_path, path, quantity
from kafka_quorum_operator.nodes import ChangeResult, NodeClient, Route
from kafka_quorum_operator.observe import (
    TLS_SWITCH_STAGES,
    ActionKind,
    CreateRefused,
    NodeView,
    Observed,
    PendingChange,
    PodView,
    QuorumView,
    TlsSwitch,
    claim_view,
    foreign_claims,
    members_from_status,
    pending_from_status,
    pod_view,
)
from kafka_quorum_operator.ondemand import OnDemandBackups
from kafka_quorum_operator.plan import (
    ADD_VOTER,
    REMOVE_VOTER,
    ROLLING_UPDATE,
    SCALE_DOWN,
    Action,
    Assessment,
    Plan,
    assess,
    configured_voter_ids,
    plan,
    tls_switch_after,
    tls_switch_started,
)
from kafka_quorum_operator.settings import REFUSAL_BACKOFF_S
from kafka_quorum_operator.spec import Spec, SpecError, check_name, parse_spec
from kafka_quorum_operator.status import (
    invalid_spec_conditions,
    iso,
    remediation_detected,
    remediation_step,
    status_patch,
    without_volatile,
)
from quorum_node.backup.manifest import BackupError
from quorum_node.storage.meta_properties import random_cluster_id

logger = logging.getLogger(__name__)
CR_API = (f"/apis/{GROUP}/{VERSION}", PLURAL)
# A refused voter change (Kafka's INVALID_REQUEST, or BAD_REQUEST: a request the node cannot
# parse) is not retried before this.
_REFUSED = frozenset({"INVALID_REQUEST", "BAD_REQUEST"})
# How often an owned object that should not have changed is read back (drift, deletion).
RECHECK_S = 30.0
# The digest _withdraw records for an object it deleted.
WITHDRAWN = ""
# A status whose only change is in volatile figures (offsets, lag) is written at most this often:
# under writes they move every pass, and each status write is an etcd write and an event to every
# watcher of KafkaQuorums (this operator's watch too). Figures for people, never decided on; any
# other change is written at once.
VOLATILE_STATUS_S = 30.0
# The answer of a voter change sent to a node that no longer leads.
NOT_LEADER = "NOT_LEADER"
# What an action other than a voter change answers when it was done.
DONE = ChangeResult(True, "NONE", "done")
# Conditions whose True is a warning (an Event of type Warning when they turn True).
_BAD_WHEN_TRUE = ("QuorumLost", "VolumeResizeBlocked", "ClaimsRefused")
# Answers after which a voter change is known to be in force.
_IN_FORCE = {ADD_VOTER: "DUPLICATE_VOTER", REMOVE_VOTER: "VOTER_NOT_FOUND"}
# A child's create the API server refused (a ResourceQuota, a policy webhook, an invalid object)
# is tried again after this, twice as long after each refusal up to the cap: what refuses it is
# changed by a person, and every attempt costs an admission round (webhook calls) and a Warning.
# The cap is the kubelet's crash-loop back-off cap; a new spec is tried at once.
CREATE_BACKOFF_S = 5.0
CREATE_BACKOFF_MAX_S = 300.0


@dataclass
class Memory:
    """What the operator keeps about one KafkaQuorum between passes (lost on restart, which
    costs at most a retried call)."""

    refused: dict[int, tuple[float, str]] = field(default_factory=dict)
    addresses: set[str] = field(default_factory=set)  # the nodes' addresses last observed
    restore: Mapping[str, Any] = field(default_factory=dict)  # status.restore, this pass
    creates_refused: dict[str, CreateRefused] = field(default_factory=dict)  # by "Kind/name"
    # Pods the kubelet rejected whose rejection is recorded in creates_refused: uid by
    # "Pod/name" (recorded once per pod, even after a new spec dropped the record).
    rejected: dict[str, str] = field(default_factory=dict)
    status_written: float = 0.0  # when this operator last wrote the pass's status (its clock)


@dataclass
class PassContext:
    """One pass over one KafkaQuorum: what it read once (the spec, the status, the observation,
    the plan) and what its steps decided so far. The fields without a default are set by the
    steps, in order (``_begin``, then ``_observe_and_plan``), before any later step reads them."""

    body: Mapping[str, Any]
    owner: r.Owner = field(init=False)
    spec: Spec = field(init=False)
    status: Mapping[str, Any] = field(init=False)
    memory: Memory = field(init=False)
    cluster_id: str = field(init=False)
    # The TLS switch status recorded; the operator's TLS context for the nodes (None: none).
    recorded: TlsSwitch | None = None
    tls: ssl.SSLContext | None = None
    not_owned: str | None = None  # why the operator's credentials Secret cannot be used
    observed: Observed = field(init=False)
    voter_ids: Sequence[int] = ()
    environment: dict[str, str] = field(default_factory=dict)  # the nodes' configuration
    decided: Plan = field(init=False)
    pending: PendingChange | None = None  # what status.pendingChange says after the pass
    last_remediation: dict[str, Any] | None = None
    ended: bool = False  # no further step runs

    @property
    def changing(self) -> bool:
        """Whether the pass may change anything (not paused, the quorum not lost)."""
        return not self.spec.paused and not self.decided.assessment.quorum_lost


@dataclass
class Reconciler:
    kube: Kube
    nodes: NodeClient
    clock: Callable[[], float] = time.time
    memories: dict[str, Memory] = field(default_factory=dict)
    # Owned objects as last applied: (their JSON, when), by API path.
    applied: dict[str, tuple[str, float]] = field(default_factory=dict)
    # Where the operator runs (the NetworkPolicy lets it in), and its quorums' credentials.
    operator_pods: r.OperatorPods = field(default_factory=lambda: r.OperatorPods(
        "default", {"app.kubernetes.io/name": MANAGER}))
    keeper: Keeper | None = None
    # Whether this operator may change anything now (it holds the Lease): asked immediately
    # before every voter change and deletion, and after each action, so that a replica that
    # lost the lease while a pass was under way (a slow call, a paused process) sends nothing.
    may_act: Callable[[], bool] = lambda: True
    # This operator's identity (its pod's name): who reports its Events.
    identity: str = MANAGER
    # Who the quorums' pods run as (resources.POD_IDS): the operator's KQ_OPERATOR_POD_IDS.
    pod_ids: str = "fixed"
    # How long a refused voter change waits (``_REFUSED``): KQ_OPERATOR_REFUSAL_BACKOFF.
    refusal_backoff_s: float = REFUSAL_BACKOFF_S
    backups: BackupScheduler = field(init=False)
    on_demand: OnDemandBackups = field(init=False)
    drills: Drills = field(init=False)
    events: EventRecorder = field(init=False)

    def __post_init__(self) -> None:
        if self.keeper is None:
            self.keeper = Keeper(self.kube, clock=self.clock)
        self.events = EventRecorder(self.kube, self.clock, self.identity)
        self.backups = BackupScheduler(self.kube, self.event, self.patch_status)
        self.on_demand = OnDemandBackups(self.kube, self.backups, self.event, self.clock)
        self.drills = Drills(self.kube, self.event, self.patch_status, self.clock)

    async def reconcile(self, body: Mapping[str, Any]) -> Plan:
        started = time.monotonic()
        try:
            result = await self._reconcile(body)
        except SpecError as error:
            m.RECONCILES.labels("error").inc()
            await self._refuse_spec(body, str(error))
            raise
        except Exception:
            m.RECONCILES.labels("error").inc()
            raise
        m.RECONCILES.labels("ok").inc()
        m.RECONCILE_SECONDS.observe(time.monotonic() - started)
        return result

    async def _reconcile(self, body: Mapping[str, Any]) -> Plan:
        """The pass's steps in order over one ``PassContext``; a step may end the pass (the
        lease lost, the leader changed under a voter change): what follows it is not done."""
        run = PassContext(body)
        for step in (self._begin, self._observe_and_plan, self._secure_and_keep_owned,
                     self._detect_remediations, self._settle_recorded_change,
                     self._act_on_plan, self._expand_and_collect, self._write_status,
                     self._maybe_back_up):
            await step(run)
            if run.ended:
                break
        return run.decided

    # --- the pass's steps -----------------------------------------------------------------

    async def _begin(self, run: PassContext) -> None:
        """Who the pass is for, its spec (parsed once), its memory, its cluster id (generated
        or recovered on the first pass), and the operator's TLS context for its nodes."""
        meta = run.body.get("metadata") or {}
        run.owner = owner = r.Owner(meta["name"], meta["namespace"], meta.get("uid", ""))
        check_name(owner.name)
        run.spec = r.with_pod_ids(parse_spec(run.body.get("spec")), self.pod_ids)
        run.status = status = run.body.get("status") or {}
        run.memory = self.memories.setdefault(owner.uid or owner.name, Memory())
        run.cluster_id = status.get("clusterId") or \
            await self._generate_cluster_id(owner, run.spec)
        # Kept from the pass that chose it: this pass's status was read before.
        run.memory.restore = status.get("restore") or run.memory.restore
        last = status.get("lastRemediation")
        run.last_remediation = dict(last) if isinstance(last, Mapping) else None
        run.recorded = TlsSwitch.from_status(status)
        assert self.keeper is not None
        try:
            # Also with TLS off while a switch runs, or pods still speak it.
            run.tls = await self.keeper.client_tls(owner, run.spec,
                                                   wanted=run.recorded is not None)
        except SecretNotOwned as error:
            run.tls, run.not_owned = None, str(error)

    async def _observe_and_plan(self, run: PassContext) -> None:
        """Observe once, assess once, settle the TLS switch's stage, and plan."""
        observed = await self._observe(run)
        if run.not_owned is not None:
            observed = replace(observed, security_problem=run.not_owned)
        run.observed = observed
        run.voter_ids = configured_voter_ids(observed, assess(observed))
        self._at_switch(run, tls_switch_started(observed, run.recorded))
        following = tls_switch_after(run.observed)
        if following != run.observed.tls_switch:
            self._at_switch(run, following)
        run.decided = plan(run.observed)
        run.pending = run.decided.pending

    def _at_switch(self, run: PassContext, switch: TlsSwitch | None) -> None:
        """The nodes' configuration (and its hash) at ``switch``'s stage."""
        run.environment = r.node_environment(run.owner, run.spec, run.cluster_id, run.voter_ids,
                                             switch)
        run.observed = replace(run.observed, tls_switch=switch,
                               config_hash=r.config_hash(run.spec, run.environment))

    async def _secure_and_keep_owned(self, run: PassContext) -> None:
        """Credentials before anything that mounts them (pods created below), then the owned
        objects as specified, and LABEL_VOTER on the voters' pods."""
        if not run.changing:
            return
        assert self.keeper is not None
        owner, a = run.owner, run.decided.assessment
        try:
            secured = await self.keeper.secure(owner, run.spec, run.voter_ids)
        except SecretNotOwned as error:  # nothing of it used: condition Secured
            secured = Secured()
            run.observed = replace(run.observed, security_problem=str(error))
        # The budget counts the voters there are (a scale-up's new members join it as they
        # become voters, one by one).
        await self._keep_owned(owner, run.spec, run.environment, len(a.voters), secured.objects)
        await self._label_voters(owner, run.observed, a.voter_ids)
        for change in secured.changes:
            await self.event(owner, "CredentialsChanged", change)

    async def _detect_remediations(self, run: PassContext) -> None:
        """A lost voter's volume replaced (its node back with a new directory): the remediation
        starts (status.lastRemediation, a Warning Event)."""
        owner, a = run.owner, run.decided.assessment
        if not run.changing or a.leader_id is None or not run.spec.remediation.enabled:
            return
        for node_id, directory_id in sorted(a.lost):
            if directory_id is None:
                continue
            detected = remediation_detected(run.last_remediation, node_id, directory_id,
                                            run.observed.now)
            if detected is not None:
                run.last_remediation = detected
                m.REMEDIATIONS.labels("started").inc()
                await self.event(owner, "VolumeReplaced", (
                    f"node {node_id}'s volume no longer holds voter directory "
                    f"{directory_id}; replacing it (AddVoter, then RemoveVoter)"), "Warning")

    async def _settle_recorded_change(self, run: PassContext) -> None:
        """The change recorded in status is in force, made by an operator that did not live to
        hear the answer: done, as if answered (its Event, the remediation's step)."""
        found = run.observed.pending
        if not run.changing or found is None or run.pending is not None or \
                run.decided.assessment.leader_id is None or not self.may_act():
            return
        made = Action(found.kind, found.node_id, found.reason, found.directory_id,
                      found.old_directory_id)
        await self._after_change(run, made, ChangeResult(
            True, "NONE", "in force (made before the operator restarted)"))

    async def _act_on_plan(self, run: PassContext) -> None:
        """The plan's actions; the pass ends when the lease is lost or the leader changed."""
        if not run.changing:
            return
        for action in run.decided.actions:
            if not self.may_act():
                run.ended = True  # the lease was lost during the pass: nothing more
                return
            outcome = await self._act(run, action)
            if outcome.code == NOT_LEADER or not self.may_act():
                # The lease may have run out during the call (a slow call, a paused process):
                # then the successor settles what status.pendingChange recorded, and says so.
                run.ended = True
                return
            if action.is_voter_change:
                await self._after_change(run, action, outcome)

    async def _expand_and_collect(self, run: PassContext) -> None:
        """Grow the claims to spec.storage.size, and delete past revisions' ConfigMaps."""
        if not run.changing or not self.may_act():
            return
        problem = await self._expand_claims(run.owner, run.observed)
        run.observed = replace(run.observed, resize_problem=problem)
        await self._collect_configs(run.owner, r.config_map_name(run.owner.name,
                                                                 run.observed.config_hash))

    async def _write_status(self, run: PassContext) -> None:
        """The status, the Events of its changes, and the quorum's gauges."""
        owner, memory, recorded = run.owner, run.memory, run.recorded
        run.observed = observed = replace(run.observed,
                                          creates_refused=dict(memory.creates_refused))
        patch = status_patch(observed, run.decided, run.status, r.selector(owner.name))
        patch["pendingChange"] = run.pending.to_status() if run.pending is not None else None
        switch = observed.tls_switch
        patch["tlsSwitch"] = switch.to_status() if switch is not None else None
        if switch != recorded:
            await self.event(owner, "TLSSwitch", _switch_message(recorded, switch))
        if run.last_remediation is not None:
            patch["lastRemediation"] = run.last_remediation
        await self._conditions_events(owner, run.status, patch)
        self._export(owner, run.decided.assessment.quorum_lost, run.last_remediation)
        if self._status_due(memory, patch, run.status) and self.may_act():
            await self.patch_status(owner, patch)
            memory.status_written = self.clock()

    async def _maybe_back_up(self, run: PassContext) -> None:
        """QuorumBackups, then the scheduled backup (a QuorumBackup asked for takes the free
        slot first), then the restore drill."""
        job = BackupJob(run.owner, run.spec, run.observed, run.cluster_id, run.tls)
        owner, spec, status = run.owner, run.spec, run.status
        waiting = _not_backed_up(spec, run.decided.assessment)
        if not self.may_act():
            return
        try:
            await self.on_demand.reconcile(job, waiting)
        except KubeError as error:  # a cluster without the QuorumBackup CRD or its RBAC yet
            logger.warning("QuorumBackups of %s/%s: %s", owner.namespace, owner.name, error)
        if waiting is None and self.may_act():
            self.backups.maybe_start(job, status)
        if not self.may_act():
            return
        try:
            await self.drills.reconcile(owner, spec, status, job.cluster_id,
                                        ready=waiting is None)
        except KubeError as error:  # a cluster without the chart's Job RBAC yet
            logger.warning("restore drill of %s/%s: %s", owner.namespace, owner.name, error)

    # --- observing ------------------------------------------------------------------------

    async def _observe(self, run: PassContext) -> Observed:
        owner, spec, status, memory, tls = run.owner, run.spec, run.status, run.memory, run.tls
        selector = {LABEL_INSTANCE: owner.name, LABEL_MANAGED_BY: MANAGER}
        pods_raw, claims_raw = await asyncio.gather(
            self.kube.list(path("Pod", owner.namespace), selector),
            self.kube.list(path("PersistentVolumeClaim", owner.namespace), selector))
        pods = {v.node_id: v for v in map(pod_view, pods_raw) if v is not None}
        claims = {v.node_id: v for v in map(claim_view, claims_raw) if v is not None}
        addresses = {i: address for i, p in pods.items()
                     if p.running and (address := p.address(spec.port)) is not None}
        problem = None
        # Each node in the protocol its pod serves (``observe.client_tls_of``): during a TLS
        # switch they differ.
        on_tls = {i: pods[i].tls if pods[i].tls is not None else spec.security.tls
                  for i in addresses}
        if any(on_tls.values()) and tls is None:
            # Not even tried without TLS: the node would refuse, or worse, not be ours.
            problem = f"the operator has no client certificate for the quorum yet (Secret " \
                      f"{r.operator_secret_name(owner.name)})"
        for i, address in addresses.items():
            if on_tls[i] and tls is None:
                continue
            self.nodes.route(address, Route(r.node_host(owner.name, owner.namespace, i),
                                            tls if on_tls[i] else None))
        self.nodes.forget(memory.addresses - set(addresses.values()))
        memory.addresses = set(addresses.values())
        views = await asyncio.gather(*(self.nodes.node(a) for a in addresses.values()))
        nodes = {i: v for i, v in zip(addresses, views, strict=True)
                 if v is not None and v.node_id == i}
        quorum = await self._describe(nodes, addresses)
        now = self.clock()
        memory.refused = {i: v for i, v in memory.refused.items() if v[0] > now}
        generation = int((run.body.get("metadata") or {}).get("generation") or 0)
        memory.creates_refused = {k: v for k, v in memory.creates_refused.items()
                                  if v.generation == generation}
        for rejection in note_rejections(memory, pods.values(), now, generation):
            await self.event(owner, "PodRejected", f"pod {rejection.name} rejected by the "
                             f"kubelet at admission ({rejection.reason}: {rejection.message});"
                             f" made again in {rejection.retry_at - now:.0f} s", "Warning")
        return Observed(
            name=owner.name, spec=spec, now=now,
            generation=generation,
            cluster_id=run.cluster_id, bootstrapped=bool(status.get("bootstrapped")),
            pods=pods, claims=claims, nodes=nodes, quorum=quorum,
            members=members_from_status(status), pending=pending_from_status(status),
            refused=dict(memory.refused), security_problem=problem,
            creates_refused=dict(memory.creates_refused))

    async def _describe(self, nodes: Mapping[int, NodeView], addresses: Mapping[int, str]
                        ) -> QuorumView | None:
        """DescribeQuorum from the node that leads the highest epoch any node reports."""
        claims: dict[int, int] = {}
        for view in nodes.values():
            if view.leader_id is not None:
                claims[view.leader_id] = max(claims.get(view.leader_id, -1), view.epoch)
        for leader in sorted(claims, key=lambda i: -claims[i]):
            if leader in addresses:
                described = await self.nodes.describe(addresses[leader])
                if described is not None:
                    return described
        return None

    # --- acting ---------------------------------------------------------------------------

    async def _generate_cluster_id(self, owner: r.Owner, spec: Spec) -> str:
        """Generated once, before anything is created, and kept in status (and on each claim).
        A KafkaQuorum made again over the claims of one of the same name (kept: no
        ``deleteClaims``) takes the cluster id written on them, so that its nodes start on
        their data; if the claims disagree, the id most of them hold (the others are refused,
        condition ClaimsRefused)."""
        claims = await self.kube.list(path("PersistentVolumeClaim", owner.namespace),
                                      {LABEL_INSTANCE: owner.name, LABEL_MANAGED_BY: MANAGER})
        found = Counter(v.cluster_id for v in map(claim_view, claims)
                        if v is not None and v.cluster_id and not v.terminating)
        if not found and spec.bootstrap is not None:
            return await self._cluster_from_backup(owner, spec)
        if found:
            cluster_id = found.most_common(1)[0][0]
            reason, message = "ClusterIdRecovered", f"cluster id {cluster_id}, as written on " \
                f"{found[cluster_id]} existing volume claim(s)"
        else:
            cluster_id = random_cluster_id()
            reason, message = "ClusterIdGenerated", f"cluster id {cluster_id}"
        await self.patch_status(owner, {"clusterId": cluster_id})
        await self.event(owner, reason, message)
        return cluster_id

    async def _cluster_from_backup(self, owner: r.Owner, spec: Spec) -> str:
        """spec.bootstrap.fromBackup: the backup's cluster id, and a directory id for every
        voter, kept in status before anything is created (docs/backup.md says why the id is
        kept). The pass fails (and is retried) while the backup cannot be read."""
        assert spec.bootstrap is not None
        try:
            cluster_id, restore = await restore_plan(self.kube, owner.namespace, spec.bootstrap,
                                                     range(1, spec.replicas + 1))
        except BackupError as error:
            await self.event(owner, "RestoreFailed", str(error), "Warning")
            raise
        await self.patch_status(owner, {"clusterId": cluster_id, "restore": restore})
        self.memories.setdefault(owner.uid or owner.name, Memory()).restore = restore
        await self.event(owner, "ClusterIdFromBackup", (
            f"cluster id {cluster_id}, from {spec.bootstrap.from_backup} (offsets below "
            f"{restore['endOffset']}); the pods restore it before they start"))
        return cluster_id

    async def _apply(self, obj: dict[str, Any]) -> None:
        """Server-side apply as the operator's field manager. Unchanged objects are applied
        again only now and then (drift, deletion): a pass stays cheap."""
        meta = obj["metadata"]
        key = path(obj["kind"], meta["namespace"], meta["name"])
        digest = json.dumps(obj, sort_keys=True)
        seen = self.applied.get(key)
        now = time.monotonic()
        if seen is not None and seen[0] == digest and now - seen[1] < RECHECK_S:
            return
        await self.kube.apply(obj)
        self.applied[key] = (digest, now)

    async def _refuse_spec(self, body: Mapping[str, Any], message: str) -> None:
        """A spec or name the operator cannot act on (an older CRD let it through): condition
        Ready False, reason InvalidSpec, and a Warning Event; nothing else is done."""
        meta = body.get("metadata") or {}
        owner = r.Owner(meta["name"], meta["namespace"], meta.get("uid", ""))
        status = body.get("status") or {}
        generation = int(meta.get("generation") or 0)
        found = invalid_spec_conditions(status.get("conditions") or [], message, generation,
                                        self.clock())
        if r.differs(found, status.get("conditions")) and self.may_act():
            await self.patch_status(owner, {"conditions": found,
                                            "observedGeneration": generation})
        await self.event(owner, "InvalidSpec", message, "Warning")

    async def _keep_owned(self, owner: r.Owner, spec: Spec, environment: Mapping[str, str],
                          voters: int, credentials: list[dict[str, Any]]) -> None:
        """The owned objects as specified, and those no longer wanted deleted."""
        for obj in [*r.owned_objects(owner, spec, environment, voters, self.operator_pods),
                    *credentials]:
            await self._apply(obj)
        for kind, name in r.withdrawn_objects(owner, voters):
            await self._withdraw(path(kind, owner.namespace, name))

    async def _label_voters(self, owner: r.Owner, observed: Observed,
                            voter_ids: Collection[int]) -> None:
        """LABEL_VOTER on the voters' pods, and off the others' (the budget selects by it)."""
        for node_id, pod in sorted(observed.pods.items()):
            wanted = node_id in voter_ids
            if pod.labelled_voter == wanted or pod.terminating:
                continue
            await self.kube.patch(path("Pod", owner.namespace, pod.name), {
                "metadata": {"labels": {LABEL_VOTER: "true" if wanted else None}}})

    async def _withdraw(self, url: str) -> None:
        """An object no longer wanted, deleted; checked again only now and then, like _apply."""
        seen = self.applied.get(url)
        now = time.monotonic()
        if seen is not None and seen[0] == WITHDRAWN and now - seen[1] < RECHECK_S:
            return
        await self.kube.delete(url)
        self.applied[url] = (WITHDRAWN, now)

    async def _expand_claims(self, owner: r.Owner, observed: Observed) -> str | None:
        """Grow claims smaller than spec.storage.size where their StorageClass allows volume
        expansion; why not, where it does not (condition VolumeResizeBlocked; an Event when
        the condition turns True)."""
        wanted = observed.spec.storage.size
        blocked = []
        foreign = foreign_claims(observed.claims, observed.cluster_id)
        for node_id, claim in sorted(observed.claims.items()):
            if node_id in foreign or claim.terminating or claim.size is None:
                continue
            try:
                if quantity(claim.size) >= quantity(wanted):
                    continue  # a claim never shrinks
            except ValueError:
                continue
            storage_class = await self.kube.get(cluster_path(
                "StorageClass", claim.storage_class)) if claim.storage_class else None
            if storage_class is None or not storage_class.get("allowVolumeExpansion"):
                blocked.append(f"{claim.name} ({claim.size})")
                continue
            await self.kube.patch(path("PersistentVolumeClaim", owner.namespace, claim.name),
                                  {"spec": {"resources": {"requests": {"storage": wanted}}}})
            await self.event(owner, "VolumeExpanding",
                             f"volume claim {claim.name}: {claim.size} -> {wanted}")
        if not blocked:
            return None
        return f"spec.storage.size is {wanted} but the StorageClass of " \
               f"{', '.join(blocked)} does not allow volume expansion " \
               f"(allowVolumeExpansion), or the claim names none; the claims keep their size"

    async def _collect_configs(self, owner: r.Owner, current: str) -> None:
        """Delete the configuration ConfigMaps of past revisions once no pod refers to them."""
        selector = {LABEL_INSTANCE: owner.name, LABEL_MANAGED_BY: MANAGER}
        maps = await self.kube.list(path("ConfigMap", owner.namespace),
                                    {**selector, LABEL_COMPONENT: "config"})
        if len(maps) <= 1:
            return
        pods = await self.kube.list(path("Pod", owner.namespace), selector)
        used = {source.get("configMapRef", {}).get("name")
                for pod in pods for container in (pod.get("spec") or {}).get("containers") or []
                for source in container.get("envFrom") or []}
        for config in maps:
            name = config["metadata"]["name"]
            if name != current and name not in used:
                await self.kube.delete(path("ConfigMap", owner.namespace, name))
                self.applied.pop(path("ConfigMap", owner.namespace, name), None)

    async def _create(self, run: PassContext, url: str, obj: dict[str, Any]) -> bool:
        """Create a child; whether it was made now. Not when it exists (made by an earlier pass
        whose answer was lost), nor when the API server refuses it (kept for condition
        CreateRefused, a Warning Event each time) or a refusal's back-off has not run out."""
        owner, memory = run.owner, run.memory
        key = f"{obj['kind']}/{obj['metadata']['name']}"
        before = memory.creates_refused.get(key)
        now = self.clock()
        if before is not None and now < before.retry_at:
            return False
        try:
            await self.kube.create(url, obj)
        except KubeError as error:
            if error.status == 409:
                memory.creates_refused.pop(key, None)
                return False  # made by an earlier pass whose answer was lost
            if not refused_create(error):
                raise
            memory.creates_refused[key] = refusal = create_refused(
                before, obj, error, now, run.observed.generation)
            await self.event(owner, "CreateRefused", f"{refusal.kind} {refusal.name}: "
                             f"{refusal.reason or error.status}: {refusal.message}", "Warning")
            return False
        memory.creates_refused.pop(key, None)
        return True

    async def _act(self, run: PassContext, action: Action) -> ChangeResult:
        result = await _ACTS[action.kind](self, run, action)
        m.ACTIONS.labels(action.kind, result.code).inc()
        return result

    async def _create_claim(self, run: PassContext, action: Action) -> ChangeResult:
        owner, node_id = run.owner, action.node_id
        if await self._create(run, path("PersistentVolumeClaim", owner.namespace),
                              r.claim(owner, run.spec, node_id, run.cluster_id)):
            await self.event(owner, "ClaimCreated",
                             f"volume claim {r.claim_name(owner.name, node_id)} created")
        return DONE

    async def _create_pod(self, run: PassContext, action: Action) -> ChangeResult:
        owner, node_id, observed, memory = run.owner, action.node_id, run.observed, run.memory
        # Until the quorum is bootstrapped, a quorum made from a backup restores it first.
        restore = None if run.decided.assessment.bootstrapped else \
            restore_init_container(run.spec, memory.restore, node_id)
        pod = r.pod(owner, run.spec, node_id, observed.config_hash, switch=observed.tls_switch,
                    init_containers=[restore] if restore else [])
        failed = memory.creates_refused.get(f"Pod/{pod['metadata']['name']}")
        if failed is not None:  # its predecessors' failures in a row, kept on the pod
            pod["metadata"]["annotations"][ANNOTATION_REJECTIONS] = str(failed.attempts)
        if await self._create(run, path("Pod", owner.namespace), pod):
            await self.event(owner, "PodCreated", f"pod {r.pod_name(owner.name, node_id)} created")
        return DONE

    async def _delete_pod(self, run: PassContext, action: Action) -> ChangeResult:
        owner = run.owner
        name = r.pod_name(owner.name, action.node_id)
        # A roll restarts a healthy member: a voluntary disruption, evicted so that the budget
        # counts it with a drain's, and neither takes a second voter meanwhile.
        if action.reason != ROLLING_UPDATE:
            await self.kube.delete(path("Pod", owner.namespace, name))
        elif not await self.kube.evict(owner.namespace, name):
            await self.event(owner, "EvictionRefused", f"pod {name} not restarted: its "
                             "disruption budget allows no disruption now (a drain, or a "
                             "member down); the rolling update waits")
            return ChangeResult(False, "REFUSED", "the disruption budget allows none now")
        await self.event(owner, "PodDeleted", f"pod {name} "
                         f"deleted ({action.reason}): {run.decided.waiting}")
        return DONE

    async def _delete_claim(self, run: PassContext, action: Action) -> ChangeResult:
        owner = run.owner
        name = r.claim_name(owner.name, action.node_id)
        await self.kube.delete(path("PersistentVolumeClaim", owner.namespace, name))
        await self.event(owner, "ClaimDeleted", f"volume claim {name} deleted ({action.reason})")
        return DONE

    async def _change_voters(self, run: PassContext, action: Action) -> ChangeResult:
        owner, observed = run.owner, run.observed
        leader = run.decided.assessment.leader_id
        pod = observed.pods.get(leader) if leader is not None else None
        address = pod.address(observed.spec.port) if pod is not None else None
        if address is None:
            return ChangeResult(False, "NO_LEADER", "the leader's pod has no address")
        # Persist the intent before acting: a restarted operator resumes it.
        await self.patch_status(owner, {"pendingChange": action.pending(
            iso(observed.now)).to_status()})
        assert action.directory_id is not None
        if not self.may_act():  # fencing, right before the call (see ``may_act``)
            return ChangeResult(False, NOT_LEADER, "this operator no longer holds the lease")
        if action.kind == ADD_VOTER:
            return await self.nodes.add_voter(address, action.node_id, action.directory_id)
        return await self.nodes.remove_voter(address, action.node_id, action.directory_id,
                                             decommission=action.reason == SCALE_DOWN)

    async def _after_change(self, run: PassContext, action: Action,
                            outcome: ChangeResult) -> None:
        """A voter change answered: the pending change, the remediation's step and the members'
        lastChange as they are after it, and its Event."""
        owner, observed, memory, decided = run.owner, run.observed, run.memory, run.decided
        last = run.last_remediation
        now = self.clock()
        done = outcome.ok or outcome.code == _IN_FORCE.get(action.kind)
        what = f"{action.kind} of node {action.node_id} (directory {action.directory_id}, " \
               f"{action.reason})"
        if done:
            pending = None
            members = tuple(replace(rec, last_change=iso(now))
                            if rec.node_id == action.node_id else rec for rec in decided.members)
            decided = replace(decided, members=members)
            verb = "VoterAdded" if action.kind == ADD_VOTER else "VoterRemoved"
            await self.event(owner, verb, f"{what}: committed")
        elif outcome.code in _REFUSED:
            pending = None
            memory.refused[action.node_id] = (now + self.refusal_backoff_s, outcome.message)
            await self.event(owner, "VoterChangeRefused", f"{what}: {outcome.message}",
                             "Warning")
        else:
            pending = action.pending(iso(observed.now))  # resumed on the next pass
            await self.event(owner, "VoterChangePending",
                             f"{what}: {outcome.code} {outcome.message}; will retry")
        step = remediation_step(last, action, ok=done, message=outcome.message,
                                started=observed.now, now=now)
        if step is not None:
            last = step
            if step.get("result") == "Succeeded":
                m.REMEDIATIONS.labels("succeeded").inc()
                m.REMEDIATION_SECONDS.observe(float(step.get("durationSeconds", 0.0)))
                await self.event(owner, "RemediationCompleted", (
                    f"node {action.node_id} replaced its voter directory "
                    f"{step.get('oldDirectoryId')} with {step.get('newDirectoryId')} in "
                    f"{step.get('durationSeconds')} s"))
        run.pending, run.last_remediation, run.decided = pending, last, decided

    async def _conditions_events(self, owner: r.Owner, before: Mapping[str, Any],
                                 after: Mapping[str, Any]) -> None:
        """An Event whenever QuorumLost, Quorate, Secured, VolumeResizeBlocked or ClaimsRefused
        changes (a quorum created without security is warned about at once)."""
        old = {c.get("type"): c.get("status") for c in before.get("conditions") or []}
        for condition in after["conditions"]:
            kind, value = condition["type"], condition["status"]
            unset = "True" if kind == "Secured" else "False"
            if kind not in ("Quorate", "Secured", *_BAD_WHEN_TRUE) or \
                    old.get(kind, unset) == value:
                continue
            warn = (kind in _BAD_WHEN_TRUE) == (value == "True")
            await self.event(owner, f"{kind}{value}", condition["message"] or condition["reason"],
                             "Warning" if warn else "Normal")

    def _export(self, owner: r.Owner, quorum_lost: bool,
                last_remediation: Mapping[str, Any] | None) -> None:
        """The quorum's gauges; not by a replica that lost the Lease during the pass (it
        dropped them: ``opmetrics.forget_quorums``)."""
        if self.may_act():
            m.QUORUM_LOST.labels(owner.namespace, owner.name).set(1 if quorum_lost else 0)
            m.export_remediation(owner.namespace, owner.name, last_remediation)

    def _status_due(self, memory: Memory, patch: Mapping[str, Any],
                    status: Mapping[str, Any]) -> bool:
        """Whether the pass's status is written: when anything but volatile figures changed,
        or they did and ``VOLATILE_STATUS_S`` has passed since the last write."""
        if not r.differs(patch, status):
            return False
        if r.differs(without_volatile(patch), without_volatile(status)):
            return True
        return self.clock() - memory.status_written >= VOLATILE_STATUS_S

    # --- API helpers ----------------------------------------------------------------------

    async def patch_status(self, owner: r.Owner, status: Mapping[str, Any]) -> None:
        url = path(KIND, owner.namespace, owner.name, api=CR_API) + "/status"
        await self.kube.patch(url, {"status": dict(status)})

    async def event(self, owner: r.Owner, reason: str, message: str,
                    kind: str = "Normal") -> None:
        await self.events.post(owner, reason, message, kind)


def _not_backed_up(spec: Spec, assessment: Assessment) -> str | None:
    """Why the quorum cannot be backed up now (None: it can)."""
    if spec.paused:
        return "the KafkaQuorum is paused"
    if assessment.quorum_lost:
        return "the quorum has lost its majority"
    if not assessment.bootstrapped:
        return "the quorum is not running yet"
    return None


def refused_create(error: KubeError) -> bool:
    """Whether the API server refused the object itself (admission, validation, permissions),
    rather than failed to answer: retrying at once would be refused again."""
    return 400 <= error.status < 500 and error.status not in (409, 429)


def create_refused(before: CreateRefused | None, obj: Mapping[str, Any], error: KubeError,
                   now: float, generation: int) -> CreateRefused:
    """A refused create, tried again after ``CREATE_BACKOFF_S`` doubled for each refusal in a
    row (``before``: the previous one), at most ``CREATE_BACKOFF_MAX_S``."""
    attempts = before.attempts + 1 if before is not None else 1
    return CreateRefused(obj["kind"], obj["metadata"]["name"], error.reason, error.message,
                         attempts, now + create_backoff(attempts), generation)


def create_backoff(attempts: int) -> float:
    """The wait after the ``attempts``-th failed create in a row."""
    return min(CREATE_BACKOFF_MAX_S, CREATE_BACKOFF_S * 2.0 ** min(attempts - 1, 30))


def note_rejections(memory: Memory, pods: Iterable[PodView], now: float,
                    generation: int) -> list[CreateRefused]:
    """Record each pod the kubelet rejected at admission (``PodView.rejected``), once per pod,
    as a refused create of its name: the planner replaces it once the create back-off has run
    out, condition CreateRefused says why meanwhile. The attempts count the rejections in a
    row: the pod's own ANNOTATION_REJECTIONS (what its predecessors had) plus one, so an
    operator restart goes on with the same back-off rather than none. A new spec drops the
    record (``_observe``) and the pod is replaced at once. The new records are returned."""
    rejected = {p.uid: p for p in pods if p.rejected}
    memory.rejected = {k: uid for k, uid in memory.rejected.items() if uid in rejected}
    new = []
    for uid, pod in rejected.items():
        key = f"Pod/{pod.name}"
        if memory.rejected.get(key) == uid:
            continue
        attempts = pod.rejections + 1
        memory.rejected[key] = uid
        memory.creates_refused[key] = record = CreateRefused(
            "Pod", pod.name, pod.reason or "Rejected",
            f"rejected by the kubelet at admission, {attempts} in a row: "
            f"{pod.message or pod.reason or 'no reason given'}",
            attempts, now + create_backoff(attempts), generation)
        new.append(record)
    return new


def _switch_message(before: TlsSwitch | None, after: TlsSwitch | None) -> str:
    """The Event of a TLS switch's step (docs/operator-design.md, Switching TLS)."""
    if after is None:
        assert before is not None
        return f"TLS switched {'on' if before.enabled else 'off'} on every node; rolling to " \
               "the steady configuration (the migration listener dropped)"
    direction = "on" if after.enabled else "off"
    return f"switching TLS {direction}: rolling every pod to stage {after.stage} of " \
           f"{TLS_SWITCH_STAGES}, one at a time"


# What each kind of action does (``Reconciler._act``).
_ACTS: Mapping[ActionKind, Callable[[Reconciler, PassContext, Action],
                                     Awaitable[ChangeResult]]] = {
    ActionKind.CREATE_CLAIM: Reconciler._create_claim,
    ActionKind.CREATE_POD: Reconciler._create_pod,
    ActionKind.DELETE_POD: Reconciler._delete_pod,
    ActionKind.DELETE_CLAIM: Reconciler._delete_claim,
    ActionKind.ADD_VOTER: Reconciler._change_voters,
    ActionKind.REMOVE_VOTER: Reconciler._change_voters,
}
