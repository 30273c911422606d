"""kopf handlers, kept thin: one loop per KafkaQuorum runs the level-based reconciliation
(``reconcile.Reconciler``) every few seconds, and at once when one of its pods or claims, or its
spec, changes. Only the holder of the operator's Lease acts.

The loops are the operator's own tasks, started and stopped by kopf's watch events, not kopf
daemons: a daemon makes kopf put a finalizer on every KafkaQuorum, and nothing else needs one
(what a quorum owns goes with it by its owner references). A finalizer kept a KafkaQuorum, and
with it its namespace, from being deleted whenever the operator could not remove it: when the
operator was gone, and when the namespace's deletion took the operator's Role in it first.

Settings: ``settings.OperatorSettings``, read from the environment once (by ``__main__``, else at
start-up); docs/operator.md lists them.

The operator's own calls go through the official ``kubernetes`` client (``kube.Kube``, built once
at start-up); kopf logs in with ``kopf.login_via_client``, from the same client configuration, so
both use the same credentials (the client re-reads a rotated service account token itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from aiohttp import web

from kafka_quorum_operator import (
    GROUP,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    MANAGER,
    PLURAL,
    QB_PLURAL,
    VERSION,
)
from kafka_quorum_operator import opmetrics as m
from kafka_quorum_operator.keeper import Keeper
from kafka_quorum_operator.kube import Kube, KubeError, path
from kafka_quorum_operator.lease import RENEW_DEADLINE_S, LeaderElector
from kafka_quorum_operator.nodes import VOTER_CHANGE_TIMEOUT_MS, NodeClient
from kafka_quorum_operator.ondemand import fail_orphan
from kafka_quorum_operator.reconcile import CR_API, Reconciler
from kafka_quorum_operator.resources import OperatorPods
from kafka_quorum_operator.serving import metrics, parse_endpoint, serve
from kafka_quorum_operator.settings import OperatorSettings
from kafka_quorum_operator.status import iso

LEASE_NAME = "kafka-quorum-operator"
OWNED_WATCHED = ("pods", "persistentvolumeclaims")
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
# At shutdown, how long the passes under way may take to end: one may be waiting for a voter
# change's answer (the node's timeout, and the client's margin over it). Within the pod's
# termination grace period (the chart's 30 s), leaving time to release the Lease.
STOP_GRACE_S = VOTER_CHANGE_TIMEOUT_MS / 1000 + 5
logger = logging.getLogger(__name__)


@dataclass
class _State:
    """The operator process's clients, and each KafkaQuorum's loop and wake-up event."""

    reconciler: Reconciler | None = None
    elector: LeaderElector | None = None
    electing: asyncio.Task[None] | None = None
    wakers: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    loops: dict[tuple[str, str], asyncio.Task[None]] = field(default_factory=dict)
    generations: dict[tuple[str, str], int | None] = field(default_factory=dict)
    last_pass: float | None = None
    # Set at shutdown: nothing more is changed, and the loops end after their pass.
    stopping: bool = False
    # The health endpoint (``--liveness``; None: none), and the HTTP servers running.
    health_url: str | None = None
    servers: list[web.AppRunner] = field(default_factory=list)
    # The operator's settings (``configured``), read from the environment once.
    settings: OperatorSettings | None = None

    def configured(self) -> OperatorSettings:
        """The operator's settings: those ``__main__`` read, else the environment's, read now
        (an operator run in-process). Raises SettingsError."""
        if self.settings is None:
            self.settings = OperatorSettings.from_environment()
        return self.settings

    def connect(self, kube: Kube, default_namespace: str = "default") -> None:
        settings = self.configured()
        namespace = settings.namespace or default_namespace
        pods = OperatorPods(namespace, dict(settings.pod_selector))
        keeper = Keeper(kube, settings.cluster_domain)
        identity = settings.identity or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        # A replica that no longer leads stops exporting the figures of the quorums it ran:
        # the holder's are the current ones, and a scrape of both must not show stale ones.
        elector = LeaderElector(kube, namespace, LEASE_NAME, identity,
                                on_lost=m.forget_quorums)
        self.elector = elector
        # Fencing: every voter change and deletion asks the elector right before it is sent.
        self.reconciler = Reconciler(kube, NodeClient(), operator_pods=pods, keeper=keeper,
                                     may_act=lambda: elector.leading and not self.stopping,
                                     identity=identity, pod_ids=settings.pod_ids,
                                     refusal_backoff_s=settings.refusal_backoff_s)
        self.electing = asyncio.get_running_loop().create_task(elector.run())

    async def close(self) -> None:
        """At the operator's exit: stop acting, let the passes under way end (a voter change
        sent is answered, not abandoned; the lease is still renewed meanwhile), stop the
        elector, release the Lease so that a standby takes over at once, close the clients."""
        self.stopping = True
        for waker in self.wakers.values():
            waker.set()
        running = [task for task in self.loops.values() if not task.done()]
        if running:
            await asyncio.wait(running, timeout=STOP_GRACE_S)
        for key in list(self.loops):
            await self.stop_loop(key)
        if self.electing is not None:
            self.electing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.electing
            self.electing = None
        if self.elector is not None:
            try:
                await asyncio.wait_for(self.elector.release(), RENEW_DEADLINE_S)
            except (KubeError, OSError, TimeoutError) as error:  # it expires by itself
                logger.warning("could not release the lease: %s", error)
        if self.reconciler is not None:
            await self.reconciler.backups.close()
            await self.reconciler.nodes.close()
            self.reconciler.kube.close()
        while self.servers:
            await self.servers.pop().cleanup()

    def start_loop(self, namespace: str, name: str,
                   logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        key = (namespace, name)
        running = self.loops.get(key)
        if running is None or running.done():
            self.loops[key] = asyncio.get_running_loop().create_task(
                run_quorum(namespace, name, logger), name=f"reconcile {namespace}/{name}")

    async def stop_loop(self, key: tuple[str, str]) -> None:
        task = self.loops.pop(key, None)
        m.forget_quorum(*key)
        self.wakers.pop(key, None)
        self.generations.pop(key, None)
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def waker(self, namespace: str, name: str) -> asyncio.Event:
        return self.wakers.setdefault((namespace, name), asyncio.Event())

    def wake(self, namespace: str | None, name: str | None) -> None:
        if namespace and name and (namespace, name) in self.wakers:
            self.wakers[namespace, name].set()


STATE = _State()


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    # No handler needs a finalizer; kopf removes this one (an earlier version's) where found.
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    # Pods and claims are watched with a server-side label selector: only the quorums' own
    # reach the operator (kopf's ``labels=`` filters only after receiving every pod).
    for plural in OWNED_WATCHED:
        settings.watching.label_selectors["", "v1", plural] = f"{LABEL_MANAGED_BY}={MANAGER}"
    # The reconciler posts an Event for every change itself (``events.EventRecorder``, which
    # counts repeats); kopf's poster only warnings and errors (``kopf.warn`` of a handler).
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = MANAGER
    # No cluster-wide list of namespaces or CRDs: least privilege.
    settings.scanning.disabled = True
    configured = STATE.configured()
    if configured.metrics_port:
        STATE.servers.append(await serve([("/metrics", metrics)], configured.metrics_port))
    kube = await asyncio.to_thread(Kube.connect, configured.api_server)
    STATE.connect(kube, _own_namespace())
    assert STATE.reconciler is not None
    settings.posting.reporting_instance = STATE.reconciler.identity
    # Last: the probes pass once the operator is started.
    if STATE.health_url:
        host, port, url_path = parse_endpoint(STATE.health_url)
        STATE.servers.append(await serve([(url_path, health)], port, host))


def _own_namespace() -> str:
    """The namespace of the operator's pod (its service account's), else ``default``."""
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as file:
            return file.read().strip() or "default"
    except OSError:
        return "default"


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    await STATE.close()


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's credentials: those of the ``kubernetes`` client's configuration (in-cluster,
    else kubeconfig), read again whenever kopf meets a 401."""
    server = STATE.configured().api_server
    if server:
        return kopf.ConnectionInfo(server=server, insecure=True)
    return kopf.login_via_client(**kwargs)


async def health(_: web.Request) -> web.Response:
    """The liveness and readiness probes' endpoint: 200 while the operator's loop runs, with
    whether this replica holds the Lease (``leading``; the readiness probe passes on a standby
    too: the chart's deployment.yaml says why) and when its last pass ended."""
    return web.json_response({
        "leading": STATE.elector is not None and STATE.elector.leading,
        "lastReconcile": iso(STATE.last_pass) if STATE.last_pass is not None else None})


@kopf.on.event(GROUP, VERSION, PLURAL)
async def quorum_event(event: Mapping[str, Any], meta: Mapping[str, Any],
                       namespace: str | None, name: str,
                       logger: logging.Logger | logging.LoggerAdapter[Any], **_: Any) -> None:
    """Every KafkaQuorum listed or changed has its loop; one deleted, none. A new generation
    (the spec changed) wakes its loop at once; the operator's own status patches do not."""
    assert namespace is not None  # the resource is namespaced
    key = (namespace, name)
    if event.get("type") == "DELETED" or meta.get("deletionTimestamp"):
        await STATE.stop_loop(key)
        return
    STATE.start_loop(namespace, name, logger)
    generation = meta.get("generation")
    if STATE.generations.get(key, generation) != generation:
        STATE.wake(namespace, name)
    STATE.generations[key] = generation


async def run_quorum(namespace: str, name: str,
                     logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
    interval = STATE.configured().interval_s
    waker = STATE.waker(namespace, name)
    url = path("KafkaQuorum", namespace, name, api=CR_API)
    while not STATE.stopping:
        waker.clear()
        reconciler, elector = STATE.reconciler, STATE.elector
        if reconciler is not None and elector is not None and elector.leading:
            try:
                # Read afresh: the event's body may not yet show the last pass's own status.
                body = await reconciler.kube.get(url)
                if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
                    return  # being deleted: its children go with it (owner references)
                started = time.monotonic()
                decided = await reconciler.reconcile(body)
                STATE.last_pass = time.time()
                logger.debug("pass of %s/%s in %.2f s: %s; %s", namespace, name,
                             time.monotonic() - started,
                             [f"{a.kind} {a.node_id}" for a in decided.actions] or "no change",
                             decided.waiting or "nothing to wait for")
            except Exception:  # a failed pass is retried on the next one
                logger.exception("reconciliation of %s/%s failed", namespace, name)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waker.wait(), timeout=interval)


def _wake_owner(meta: Mapping[str, Any]) -> None:
    labels = meta.get("labels") or {}
    STATE.wake(meta.get("namespace"), labels.get(LABEL_INSTANCE))


@kopf.on.event("", "v1", "pods", labels={LABEL_MANAGED_BY: MANAGER})
def pod_changed(meta: Mapping[str, Any], **_: Any) -> None:
    _wake_owner(meta)


@kopf.on.event("", "v1", "persistentvolumeclaims", labels={LABEL_MANAGED_BY: MANAGER})
def claim_changed(meta: Mapping[str, Any], **_: Any) -> None:
    _wake_owner(meta)


@kopf.on.event(GROUP, VERSION, QB_PLURAL)
async def quorum_backup_event(body: kopf.Body, namespace: str | None,
                              **_: Any) -> None:
    """A QuorumBackup is taken by its KafkaQuorum's pass (``ondemand``): wake that loop; one
    naming no KafkaQuorum of the namespace is Failed here, as no pass will ever see it."""
    quorum = (body.get("spec") or {}).get("quorum")
    if namespace is None or not isinstance(quorum, str):
        return
    if (namespace, quorum) in STATE.loops:
        STATE.wake(namespace, quorum)
        return
    reconciler, elector = STATE.reconciler, STATE.elector
    if reconciler is not None and elector is not None and elector.leading \
            and not STATE.stopping:
        try:
            failed = await fail_orphan(reconciler.kube, body, reconciler.clock)
        except KubeError as error:
            logger.warning("QuorumBackup %s/%s: %s", namespace,
                           (body.get("metadata") or {}).get("name"), error)
            return
        if failed is not None:
            # On the QuorumBackup itself (there is no KafkaQuorum to post it on), through
            # kopf's own Event poster: a handler's body is what kopf.warn takes.
            kopf.warn(body, reason="BackupFailed", message=failed)
