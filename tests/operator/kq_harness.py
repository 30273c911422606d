"""The operator's integration harness: the real kopf operator (in its own thread) against kmock's
Kubernetes emulator, with a test-only kubelet that runs each pod's quorum node as a real local
process, its volume claim a directory.

- ``K8s``: kmock 0.8's emulator with the fixes it needs (spikes.md): uid, resourceVersion,
  generation, creationTimestamp and generateName on create; 201 for a create; 422 for a failed
  JSON-patch test; and the finalizers the real cluster has, so that a deleted pod stays
  Terminating until its process has stopped and a claim in use stays until its pod is gone. And
  what the operator relies on from a real API server: label selectors on lists and watches,
  ``limit``/``continue``, server-side apply with per-manager field ownership, 409 for a
  write naming a stale resourceVersion, and ResourceQuota's object counts (403 beyond them).
  kmock matches each request against its reactions by scanning every request before it, so a
  long test became quadratic (passes of the operator that took 0.3 s took 8 s after a few
  minutes): its own log is kept short, and the requests are in ``seen`` for the tests.
- ``Kubelet``: starts a node process for every pod (environment from the pod's env and
  envFrom ConfigMap), mounts its Secret volumes as directories (a pod whose Secret is missing
  stays Pending, as ContainerCreating does) and updates their files when the Secrets change (a
  new inode, as the kubelet's symlink swap), reports phase, IP and readiness (``/readyz``, over
  HTTPS when the probe says so, unverified as the kubelet's) in the pod's status, restarts
  crashed processes, stops a deleted pod's process with SIGTERM (so a leader resigns), and
  removes a deleted claim's directory. As on a real cluster: every new pod gets a new IP (a
  loopback address of its own), and a replaced pod starts only a few seconds after it was made
  (``start_delay_s``: image start, volume attach). The names in the configuration stay cluster
  DNS names: each node runs in a mount namespace of its own (``unshare --mount``) whose
  ``/etc/hosts`` is bound to the harness's hosts file, which the kubelet rewrites in place as
  pods come and go (the headless service's records: every pod with an IP); peers find each
  other by name (through the node's own DNS cache) and verify each other's certificate names.
  The test process resolves the same names (``socket.getaddrinfo`` consults the same records
  while a kubelet runs), so clients verify them too.
- ``OperatorThread``: ``kopf.operator`` on its own event loop and thread (spikes.md: never in
  the test's loop).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import copy
import datetime
import itertools
import os
import random
import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import aiohttp.web
import jsonpatch
import kmock
import kopf
import pytest
from hosts_file import rewrite_in_place
from kafka_quorum_operator import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    QB_KIND,
    QB_PLURAL,
    VERSION,
    handlers,
)
from kafka_quorum_operator.drills import JOB_NAME_LABEL
from kafka_quorum_operator.kube import Kube, KubeError, path
from kafka_quorum_operator.reconcile import CR_API
from kafka_quorum_operator.resources import node_host
from kafka_quorum_operator.spec import DATA_MOUNT

POD_FINALIZER = "kmock.test/kubelet"
CLAIM_FINALIZER = "kubernetes.io/pvc-protection"
NAMESPACE = "default"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class K8s(kmock.KubernetesEmulator):
    """kmock's emulator with the fixes the operator and kopf need (see the module doc), and the
    API server's behaviour the operator relies on: label selectors on lists and watches,
    ``limit``/``continue`` pagination, server-side apply (a merge with a lite ``managedFields``:
    the fields a manager applied before and leaves out now are removed), and 409 for a patch whose
    ``metadata.resourceVersion`` is not the object's."""

    _versions = itertools.count(1)
    # kmock's own request log is trimmed to its newer half when it holds more.
    REQUEST_LOG_MAX = 64

    @property
    def seen(self) -> collections.deque[Any]:
        """The requests served (the newest, oldest first)."""
        found: collections.deque[Any] = self.__dict__.setdefault(
            "_seen", collections.deque(maxlen=20_000))
        return found

    @property
    def applied(self) -> dict[tuple[Any, str | None, str | None, str], dict[str, Any]]:
        """Per-manager applied configurations: (resource, namespace, name, manager) -> the
        last applied."""
        found: dict[tuple[Any, str | None, str | None, str], dict[str, Any]] = \
            self.__dict__.setdefault("_applied_by_manager", {})
        return found

    async def _handle(self, request: Any) -> aiohttp.web.StreamResponse:
        self.seen.append(request)
        if len(self._requests) > self.REQUEST_LOG_MAX:
            del self._requests[:-self.REQUEST_LOG_MAX // 2]
        if request.subresource == "eviction" and request.method == "POST":
            return await self._evict(request)
        action = request.action
        data = request.data
        if action == kmock.action.UPDATE and isinstance(data, dict):
            stale = self._stale(request)
            if stale is not None:
                return await self._render_error(stale)
            content_type = str(request.headers.get("Content-Type", ""))
            if content_type.startswith("application/apply-patch"):
                return await self._apply(request)
        if action == kmock.action.CREATE and isinstance(data, dict):
            exceeded = self._quota_exceeded(request)
            if exceeded is not None:
                return await self._render_error(exceeded)
            self._admit(request, data)
        elif action == kmock.action.UPDATE:
            self._next_version(request, data)
        response: aiohttp.web.StreamResponse = await super()._handle(request)
        if action == kmock.action.CREATE and response.status == 200:
            response.set_status(201)
        return response

    def _admit(self, request: Any, data: dict[str, Any]) -> None:
        """A created object as the API server stores it: its generated name and namespace, and
        the finalizers and first status a kubelet and the claim protection would give it."""
        meta = data.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        meta.setdefault("namespace", request.namespace)
        self._created(meta)
        plural = request.resource.plural if request.resource is not None else None
        if plural == "pods":
            meta.setdefault("finalizers", []).append(POD_FINALIZER)
            data.setdefault("status", {"phase": "Pending"})
        elif plural == "persistentvolumeclaims":
            meta.setdefault("finalizers", []).append(CLAIM_FINALIZER)
            data.setdefault("status", {"phase": "Bound"})

    def _next_version(self, request: Any, data: Any) -> None:
        """An update (a merge patch, or a JSON patch: a list) takes a new resourceVersion, and a
        new generation where it changes the spec."""
        if isinstance(data, list):
            data.append({"op": "replace", "path": "/metadata/resourceVersion",
                         "value": str(next(self._versions))})
            return
        if not isinstance(data, dict):
            return
        meta = data.setdefault("metadata", {}) if data.get("metadata") is not None else None
        if meta is not None:
            meta["resourceVersion"] = str(next(self._versions))
        if "spec" in data and request.subresource is None:
            current = self._current(request)
            if current is not None and meta is not None:
                meta["generation"] = int(current.get("metadata", {}).get("generation", 1)) + 1

    def _quota_exceeded(self, request: Any) -> Exception | None:
        """The ResourceQuota admission of object counts (``spec.hard`` ``pods``,
        ``persistentvolumeclaims``): a create beyond one is refused, 403 with the API server's
        message."""
        plural = request.resource.plural if request.resource is not None else None
        counted = [obj.raw for (resource, namespace, _), obj in self.objects.items()
                   if namespace == request.namespace and not obj.deleted and
                   getattr(resource, "plural", None) in (plural, "resourcequotas")]
        for quota in counted:
            limit = ((quota.get("spec") or {}).get("hard") or {}).get(plural)
            if quota.get("kind") != "ResourceQuota" or limit is None:
                continue
            used = sum(1 for obj in counted if obj.get("kind") != "ResourceQuota")
            if used + 1 > int(limit):
                name = (request.data.get("metadata") or {}).get("name")
                return kmock.KubernetesError(status=403, reason="Forbidden", message=(
                    f'{plural} "{name}" is forbidden: exceeded quota: '
                    f'{quota["metadata"]["name"]}, requested: {plural}=1, used: '
                    f'{plural}={used}, limited: {plural}={limit}'))
        return None

    async def _evict(self, request: Any) -> aiohttp.web.StreamResponse:
        """The Eviction API without a disruption controller: refused (429) while a budget
        selecting the pod has ``status.disruptionsAllowed`` 0 (a test writes it, as the
        controller would during a drain), else the pod deleted (a DELETE served as any)."""
        pod_url = request.url.parent
        budgets_url = pod_url.with_path(
            f"/apis/policy/v1/namespaces/{request.namespace}/poddisruptionbudgets")
        async with aiohttp.ClientSession() as session:
            async with session.get(pod_url) as found:
                pod = await found.json() if found.status == 200 else {}
            async with session.get(budgets_url) as found:
                budgets = (await found.json()).get("items") or [] if found.status == 200 else []
            labels = (pod.get("metadata") or {}).get("labels") or {}
            for budget in budgets:
                wanted = ((budget.get("spec") or {}).get("selector") or {}).get("matchLabels")
                allowed = (budget.get("status") or {}).get("disruptionsAllowed")
                if wanted and wanted.items() <= labels.items() and allowed == 0:
                    return aiohttp.web.json_response(status=429, data={
                        "kind": "Status", "status": "Failure", "code": 429,
                        "reason": "TooManyRequests", "message": "Cannot evict pod as it would "
                        "violate the pod's disruption budget."})
            async with session.delete(pod_url) as deleted:
                return aiohttp.web.Response(
                    status=201 if deleted.status == 200 else deleted.status,
                    body=await deleted.read(), content_type="application/json")

    def _created(self, meta: dict[str, Any]) -> None:
        meta.update(uid=str(uuid.uuid4()), resourceVersion=str(next(self._versions)),
                    creationTimestamp=_now(), generation=1)

    def _stale(self, request: Any) -> Exception | None:
        """A conflict when the patch names a resourceVersion that is not the object's."""
        wanted = (request.data.get("metadata") or {}).get("resourceVersion")
        current = self._current(request)
        if wanted is None or current is None:
            return None
        actual = (current.get("metadata") or {}).get("resourceVersion")
        if str(wanted) == str(actual):
            return None
        return kmock.KubernetesError(status=409, reason="Conflict", message=(
            f"Operation cannot be fulfilled on {request.name}: the object has been modified; "
            f"please apply your changes to the latest version and try again"))

    async def _apply(self, request: Any) -> aiohttp.web.StreamResponse:
        manager = request.params.get("fieldManager")
        if not manager:
            return await self._render_error(kmock.KubernetesError(
                status=400, reason="BadRequest", message="fieldManager is required for apply"))
        applied = copy.deepcopy(request.data)
        key = (request.resource, request.namespace, request.name, manager)
        current = self._current(request)
        desired = copy.deepcopy(dict(current)) if current is not None else {}
        _remove_unapplied(desired, self.applied.get(key) or {}, applied)
        _deep_merge(desired, applied)
        meta = desired.setdefault("metadata", {})
        meta["managedFields"] = [
            entry for entry in meta.get("managedFields") or [] if entry.get("manager") != manager
        ] + [{"manager": manager, "operation": "Apply", "apiVersion": applied.get("apiVersion"),
              "fieldsType": "FieldsV1", "fieldsV1": _field_set(applied), "time": _now()}]
        self.applied[key] = applied
        async with self._lock:
            bus = self._buses[request.resource]
            if current is None:
                meta.setdefault("namespace", request.namespace)
                self._created(meta)
                object_key = (request.resource, request.namespace, request.name)
                self._objects[object_key] = desired
                raw = self._objects[object_key].raw
                await bus.put({"type": "ADDED", "object": raw})
                return aiohttp.web.json_response(raw, status=201)
            if desired.get("spec") != current.get("spec"):
                meta["generation"] = int((current.get("metadata") or {}).get("generation", 1)) + 1
            meta["resourceVersion"] = str(next(self._versions))
            obj = self._objects[(request.resource, request.namespace, request.name)]
            obj.patch(_merge_patch(dict(current), desired))
            await bus.put({"type": "MODIFIED", "object": obj.raw})
            return aiohttp.web.json_response(obj.raw)

    async def _serve_list(self, request: Any) -> Any:
        # kmock's list is a dict (typed as any payload it can render).
        answer = cast(dict[str, Any], await super()._serve_list(request))
        selector = _parse_selector(request.params.get("labelSelector", ""))
        items = sorted((i for i in answer["items"] if _matches(selector, i)),
                       key=lambda i: (i["metadata"].get("namespace") or "", i["metadata"]["name"]))
        start = int(request.params.get("continue") or 0)
        limit = int(request.params.get("limit") or 0)
        end = start + limit if limit else len(items)
        answer["items"] = items[start:end]
        if end < len(items):
            answer["metadata"] = {**answer["metadata"], "continue": str(end)}
        return answer

    async def _serve_watch(self, request: Any) -> Any:
        selector = _parse_selector(request.params.get("labelSelector", ""))
        async for event in super()._serve_watch(request):
            if not isinstance(event, dict) or _matches(selector, event.get("object") or {}):
                yield event

    def _current(self, request: Any) -> Mapping[str, Any] | None:
        for (resource, namespace, name), obj in self.objects.items():
            if resource == request.resource and namespace == request.namespace and \
                    name == request.name and not obj.deleted:
                return obj.raw
        return None

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if isinstance(exc, jsonpatch.JsonPatchTestFailed | jsonpatch.JsonPatchConflict):
            exc = kmock.KubernetesError(status=422, reason="Invalid", message=str(exc))
        response: aiohttp.web.StreamResponse = await super()._render_error(exc)
        return response


Requirement = tuple[str, str, frozenset[str]]  # key, operator (in, notin, exists, !), values
_REQUIREMENT = re.compile(r"^\s*(!?)\s*([\w./-]+)\s*(?:(==|=|!=)\s*([\w./-]*)|"
                          r"\s+(in|notin)\s*\(([^)]*)\))?\s*$")


def _parse_selector(text: str) -> list[Requirement]:
    """A label selector (equality and set-based), as the API server parses it."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    requirements: list[Requirement] = []
    for part in filter(str.strip, parts):
        match = _REQUIREMENT.match(part)
        if match is None:
            raise kmock.KubernetesError(status=400, reason="BadRequest",
                                        message=f"unable to parse requirement: {part!r}")
        negated, key, equality, value, set_op, values = match.groups()
        if negated:
            requirements.append((key, "!", frozenset()))
        elif equality:
            requirements.append((key, "notin" if equality == "!=" else "in",
                                 frozenset([value])))
        elif set_op:
            requirements.append((key, set_op, frozenset(
                v.strip() for v in values.split(",") if v.strip())))
        else:
            requirements.append((key, "exists", frozenset()))
    return requirements


def _matches(requirements: list[Requirement], obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for key, op, values in requirements:
        present = key in labels
        if (op == "exists" and not present) or (op == "!" and present) or \
                (op == "in" and labels.get(key) not in values) or \
                (op == "notin" and present and labels[key] in values):
            return False
    return True


def _deep_merge(target: dict[str, Any], source: Mapping[str, Any]) -> None:
    for key, value in source.items():
        if isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _deep_merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def _remove_unapplied(target: dict[str, Any], before: Mapping[str, Any],
                      now: Mapping[str, Any]) -> None:
    """Remove the fields a manager applied before and no longer applies."""
    for key, value in before.items():
        if key not in now:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(now[key], Mapping) and \
                isinstance(target.get(key), dict):
            _remove_unapplied(target[key], value, now[key])


def _field_set(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {f"f:{k}": _field_set(v) if isinstance(v, Mapping) else {} for k, v in obj.items()}


def _merge_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch that turns ``current`` into ``desired``."""
    patch: dict[str, Any] = {k: None for k in current if k not in desired}
    for key, value in desired.items():
        old = current.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            inner = _merge_patch(old, value)
            if inner:
                patch[key] = inner
        elif value != old or key not in current:
            patch[key] = copy.deepcopy(value)
    return patch


def declare_resources(emulator: Any) -> None:
    emulator.resources.load_bundled()
    emulator.resources[f"{GROUP}/{VERSION}/{PLURAL}"] = kmock.ResourceInfo(
        kind=KIND, singular="kafkaquorum", namespaced=True, shortnames={"kq"},
        verbs={"list", "watch", "get", "create", "patch", "update", "delete"},
        subresources={"status", "scale"})
    emulator.resources[f"{GROUP}/{VERSION}/{QB_PLURAL}"] = kmock.ResourceInfo(
        kind=QB_KIND, singular="quorumbackup", namespaced=True, shortnames={"qbk"},
        verbs={"list", "watch", "get", "create", "patch", "update", "delete"},
        subresources={"status"})


# --- the kubelet --------------------------------------------------------------------------------

SECRET_REFRESH_S = 2.0
# Readiness is probed this often (each HTTPS probe is a full TLS handshake for the node: more
# often costs the nodes CPU the tests need).
PROBE_S = 0.5


@dataclass
class Mount:
    """A Secret volume as a directory: its files, as the Secret held them last."""

    secret: str
    directory: Path
    items: Mapping[str, str] | None  # key -> file name; None: every key
    mode: int
    files: dict[str, bytes] = field(default_factory=dict)

    def write(self, data: Mapping[str, bytes]) -> bool:
        """Write the files when they changed; False when the Secret lacks an item."""
        items = self.items if self.items is not None else {k: k for k in data}
        if any(key not in data for key in items):
            return False
        files = {name: data[key] for key, name in items.items()}
        if files == self.files:
            return True
        self.directory.mkdir(parents=True, exist_ok=True)
        for name, content in files.items():
            temporary = self.directory / f".{name}.new"
            temporary.write_bytes(content)
            temporary.chmod(self.mode)
            os.replace(temporary, self.directory / name)  # a new inode, like the symlink swap
        self.files = files
        return True


@dataclass
class Process:
    pod: str
    uid: str
    popen: subprocess.Popen[bytes]
    log: Path
    address: str
    scheme: str = "http"
    mounts: list[Mount] = field(default_factory=list)
    refreshed: float = 0.0
    probed: float = 0.0
    ready: bool = False
    stopping: bool = False


@dataclass
class Kubelet:
    kube: Kube
    root: Path
    # Pod IPs: loopback addresses under this prefix, a new one for every new pod.
    prefix: str = field(default_factory=lambda: f"127.{random.randint(20, 250)}."
                                                f"{random.randint(1, 250)}")
    ips: dict[str, str] = field(default_factory=dict)  # pod name -> its current pod's IP
    # A pod made again under a name seen before starts this long after it was made.
    start_delay_s: float = 3.0
    # What runs a pod's container: the node.
    command: list[str] = field(default_factory=lambda: [sys.executable, "-m",
                                                        "quorum_node.cli.node"])
    processes: dict[str, Process] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    # Pods (uid) the kubelet ends for good, with the reason their status gives (``evict``).
    evicted: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    # The cluster DNS: name -> IP, and which pod (uid) each record is for.
    records: dict[str, tuple[str, str]] = field(default_factory=dict)
    _next_ip: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _made: dict[str, float] = field(default_factory=dict)  # pod uid -> when first seen
    _started_names: set[str] = field(default_factory=set)
    # Jobs' pods run to their end, each in a task of its own (by pod uid).
    _job_pods: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None

    @property
    def hosts_file(self) -> Path:
        return self.root / "hosts"

    @property
    def resolv_file(self) -> Path:
        return self.root / "resolv.conf"

    def ip(self, pod_name: str) -> str:
        """The IP of the pod of that name (the last one started)."""
        if pod_name not in self.ips:
            self.ips[pod_name] = self._new_ip()
        return self.ips[pod_name]

    def _new_ip(self) -> str:
        number = next(self._next_ip)
        assert number < 255, "out of pod IPs"
        return f"{self.prefix}.{number}"

    def claim_dir(self, claim_uid: str) -> Path:
        return self.root / "volumes" / claim_uid

    def start(self) -> None:
        if not MOUNT_NAMESPACES:
            pytest.skip("the harness runs each node in a mount namespace of its own "
                        "(unshare --mount, as root); not available here")
        self.root.mkdir(parents=True, exist_ok=True)
        self._write_hosts()
        self.resolv_file.write_text(RESOLV_CONF)
        _RESOLVERS.append(self)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self in _RESOLVERS:
            _RESOLVERS.remove(self)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for job_pod in self._job_pods.values():
            job_pod.cancel()
        await asyncio.gather(*self._job_pods.values(), return_exceptions=True)
        for process in self.processes.values():
            if process.popen.poll() is None:
                process.popen.kill()  # the end of the test: no need to resign gracefully
            await asyncio.to_thread(process.popen.wait, 10)

    async def _run(self) -> None:
        while True:
            try:
                await self._sync()
            except KubeError as error:
                print(f"kubelet: {error}")
            except Exception:  # a kubelet bug must show, not silently stop every pod's status
                self.errors.append(traceback.format_exc())
                print(f"kubelet: {self.errors[-1]}")
            await asyncio.sleep(0.1)

    async def _sync(self) -> None:
        await self._jobs()
        pods = [pod for pod in await self.kube.list(path("Pod", NAMESPACE), {})
                if not self._job_pod(pod)]
        claims = {c["metadata"]["name"]: c
                  for c in await self.kube.list(path("PersistentVolumeClaim", NAMESPACE), {})}
        seen = set()
        for pod in pods:
            meta = pod["metadata"]
            name, uid = meta["name"], meta["uid"]
            seen.add(uid)
            process = self.processes.get(uid)
            if meta.get("deletionTimestamp"):
                await self._terminate(pod, process)
            elif uid in self.evicted:
                await self._fail(pod, process, self.evicted[uid])
            elif process is None:
                await self._launch(pod, claims)
            else:
                await self._watch(pod, process)
            del name
        for uid, process in list(self.processes.items()):
            if uid not in seen and process.popen.poll() is None:
                process.popen.kill()  # deleted without a grace period
        self._forget_pods(seen)
        in_use = {v["persistentVolumeClaim"]["claimName"] for p in pods
                  if not p["metadata"].get("deletionTimestamp") or
                  p["metadata"]["uid"] in self.processes
                  for v in p["spec"].get("volumes") or [] if "persistentVolumeClaim" in v}
        for claim_name, claim in claims.items():
            cmeta = claim["metadata"]
            if cmeta.get("deletionTimestamp") and claim_name not in in_use:
                shutil.rmtree(self.claim_dir(cmeta["uid"]), ignore_errors=True)
                await self._drop_finalizer("PersistentVolumeClaim", claim, CLAIM_FINALIZER)

    # --- Jobs: the Job controller's part and the kubelet's, for a Job of one pod run once ------

    @staticmethod
    def _job_pod(pod: Mapping[str, Any]) -> bool:
        return JOB_NAME_LABEL in (pod["metadata"].get("labels") or {})

    async def _jobs(self) -> None:
        """A pod for each Job without one; each pod run once to its end; the Job's status
        (succeeded or failed, and its condition) from its pod's phase."""
        jobs = await self.kube.list(path("Job", NAMESPACE), {})
        pods = [pod for pod in await self.kube.list(path("Pod", NAMESPACE), {})
                if self._job_pod(pod)]
        for job in jobs:
            name = job["metadata"]["name"]
            mine = [pod for pod in pods if pod["metadata"]["labels"][JOB_NAME_LABEL] == name]
            if (job.get("status") or {}).get("conditions"):
                continue
            if not mine:
                template = job["spec"]["template"]
                await self.kube.create(path("Pod", NAMESPACE), {
                    "apiVersion": "v1", "kind": "Pod", "metadata": {
                        "generateName": f"{name}-", "namespace": NAMESPACE,
                        "labels": {**template["metadata"].get("labels", {}),
                                   JOB_NAME_LABEL: name},
                        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                             "name": name, "uid": job["metadata"]["uid"],
                                             "controller": True}]},
                    "spec": template["spec"]})
                continue
            pod = mine[0]
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                done = "Complete" if phase == "Succeeded" else "Failed"
                await self.kube.patch(path("Job", NAMESPACE, name) + "/status", {"status": {
                    "succeeded" if done == "Complete" else "failed": 1,
                    "conditions": [{"type": done, "status": "True",
                                    "reason": "BackoffLimitExceeded" if done == "Failed"
                                    else "Completed"}]}})
            elif pod["metadata"]["uid"] not in self._job_pods:
                self._job_pods[pod["metadata"]["uid"]] = asyncio.get_running_loop().create_task(
                    self._run_job_pod(pod))

    async def _run_job_pod(self, pod: Mapping[str, Any]) -> None:
        """The pod's container to its end, its emptyDirs and termination message file local
        directories; its phase and termination message in its status."""
        meta, spec = pod["metadata"], pod["spec"]
        container = spec["containers"][0]
        root = self.root / "jobs" / meta["uid"]
        volumes = {v["name"] for v in spec.get("volumes") or [] if "emptyDir" in v}
        paths = {m["mountPath"]: root / m["name"] for m in container.get("volumeMounts") or []
                 if m["name"] in volumes}
        report = root / "termination-log"
        paths[container.get("terminationMessagePath") or "/dev/termination-log"] = report
        for directory in paths.values():
            if directory != report:
                directory.mkdir(parents=True, exist_ok=True)
        await self._status(pod, {"phase": "Running"})
        base = {k: v for k, v in os.environ.items() if not k.startswith("QUORUM_")}
        ok = await self._run_init(container, paths, base, root / "output.log")
        message = report.read_text()[:4096] if report.exists() else ""
        await self._status(pod, {"phase": "Succeeded" if ok else "Failed",
                                 "containerStatuses": [{
                                     "name": container["name"], "ready": False,
                                     "restartCount": 0, "image": container["image"],
                                     "imageID": "", "state": {"terminated": {
                                         "exitCode": 0 if ok else 1, "message": message}}}]})

    async def _launch(self, pod: Mapping[str, Any], claims: Mapping[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        container = spec["containers"][0]
        claim_name = next(v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"]
                          if "persistentVolumeClaim" in v)
        claim = claims.get(claim_name)
        if claim is None or claim["metadata"].get("deletionTimestamp"):
            return  # Pending, as a pod whose claim is missing is
        made = self._made.setdefault(meta["uid"], time.monotonic())
        if meta["name"] in self._started_names and \
                time.monotonic() - made < self.start_delay_s:
            return  # a replaced pod: the image starts, the volume attaches
        env: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            config_map = await self.kube.get(path("ConfigMap", NAMESPACE,
                                                  source["configMapRef"]["name"]))
            if config_map is None:
                return  # CreateContainerConfigError: retried
            env.update(config_map.get("data") or {})
        env.update({e["name"]: e["value"] for e in container.get("env") or []})
        mounts = await self._mount(meta, spec, container)
        if mounts is None:
            return  # a Secret is missing: ContainerCreating, retried
        ip = self.ips[meta["name"]] = self._new_ip()  # a new pod, a new IP
        self._started_names.add(meta["name"])
        port = int(container["ports"][0]["containerPort"])  # the client port
        volume = self.claim_dir(claim["metadata"]["uid"])
        volume.mkdir(parents=True, exist_ok=True)
        paths = {DATA_MOUNT: volume, **{path: m.directory for path, m in mounts.items()}}
        env = {k: self._localize(v, paths) for k, v in env.items()}
        # Every listener on the pod's own IP, with the ports and names the operator gave it.
        env["QUORUM_LISTENERS"] = env.get("QUORUM_LISTENERS", "").replace("://:", f"://{ip}:")
        hostname = f"{spec['hostname']}.{spec['subdomain']}.{meta['namespace']}.svc"
        for name in (hostname, f"{hostname}.cluster.local"):
            self.records[name] = (ip, meta["uid"])
        self._write_hosts()
        probe = (container.get("readinessProbe") or {}).get("httpGet") or {}
        scheme = str(probe.get("scheme") or "HTTP").lower()
        base = {k: v for k, v in os.environ.items() if not k.startswith("QUORUM_")}
        log = self.root / "logs" / f"{meta['name']}-{meta['uid'][:8]}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        for init in spec.get("initContainers") or []:
            if not await self._run_init(init, paths, base, log):
                return  # Init:Error: tried again on the next sync
        with log.open("ab") as out:
            popen = subprocess.Popen(
                [*_IN_OWN_MOUNT_NAMESPACE, str(self.hosts_file), str(self.resolv_file),
                 *self.command, "run"],
                stdout=out, stderr=subprocess.STDOUT,
                env={**base, **env, "PYTHONUNBUFFERED": "1"})
        self.processes[meta["uid"]] = Process(meta["name"], meta["uid"], popen, log,
                                              f"{ip}:{port}", scheme, list(mounts.values()),
                                              time.monotonic())
        await self._status(pod, {"phase": "Running", "podIP": ip, "conditions": [
            {"type": "Ready", "status": "False"}]})

    async def _run_init(self, init: Mapping[str, Any], paths: Mapping[str, Path],
                        base: Mapping[str, str], log: Path) -> bool:
        """Run an init container to its end (its command's ``quorum-node`` is the node's
        command; env and envFrom Secrets as the kubelet gives them); whether it succeeded."""
        env = dict(base)
        for source in init.get("envFrom") or []:
            data = await self._secret(source["secretRef"]["name"]) if "secretRef" in source \
                else None
            if data is None:
                return False
            env.update({k: v.decode() for k, v in data.items()})
        env.update({e["name"]: e["value"] for e in init.get("env") or []})
        command = [self._localize(part, paths) for part in init["command"]]
        if command[0] == "quorum-node":
            command = [*self.command, *command[1:]]
        with log.open("ab") as out:
            done = await asyncio.to_thread(subprocess.run, command, stdout=out,
                                           stderr=subprocess.STDOUT, env=env, timeout=120,
                                           check=False)
        return done.returncode == 0

    async def _mount(self, meta: Mapping[str, Any], spec: Mapping[str, Any],
                     container: Mapping[str, Any]) -> dict[str, Mount] | None:
        """The container's Secret volumes, by mount path, written; None if a Secret or one of
        its items is missing."""
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        mounts = {}
        for mount in container.get("volumeMounts") or []:
            source = volumes[mount["name"]].get("secret")
            if source is None:
                continue
            assert mount.get("readOnly") is True, f"{mount['name']} must be mounted read-only"
            assert "subPath" not in mount, "a subPath mount is never updated"
            items = {i["key"]: i["path"] for i in source["items"]} if source.get("items") \
                else None
            target = Mount(source["secretName"], self.root / "mounts" / meta["uid"] /
                           mount["name"], items, int(source.get("defaultMode", 0o644)))
            data = await self._secret(target.secret)
            if data is None or not target.write(data):
                return None
            mounts[mount["mountPath"]] = target
        return mounts

    async def _secret(self, name: str) -> dict[str, bytes] | None:
        secret = await self.kube.get(path("Secret", NAMESPACE, name))
        if secret is None:
            return None
        return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}

    def _write_hosts(self) -> None:
        """The cluster DNS records as a hosts file, rewritten in place: each node's
        ``/etc/hosts`` is bound to this inode."""
        lines = ["127.0.0.1 localhost", "::1 localhost"]
        lines += [f"{ip} {name}" for name, (ip, _) in sorted(self.records.items())]
        rewrite_in_place(self.hosts_file, "\n".join(lines) + "\n")

    def _forget_pods(self, present: set[str]) -> None:
        """Drop the records of pods that are gone (the endpoints controller's part)."""
        gone = [name for name, (_, uid) in self.records.items() if uid not in present]
        for name in gone:
            del self.records[name]
        if gone:
            self._write_hosts()

    def resolve(self, host: str) -> str | None:
        record = self.records.get(host.rstrip("."))
        return record[0] if record is not None else None

    def _localize(self, value: str, paths: Mapping[str, Path]) -> str:
        """Mount paths -> their directories (names stay names: the pods resolve them)."""
        for mount_path, directory in paths.items():
            value = value.replace(mount_path, str(directory))
        return value

    async def _watch(self, pod: Mapping[str, Any], process: Process) -> None:
        if process.popen.poll() is not None:
            # restartPolicy: Always (without the back-off).
            self.processes.pop(process.uid)
            self.restarts[process.pod] = self.restarts.get(process.pod, 0) + 1
            await self._status(pod, {"conditions": [{"type": "Ready", "status": "False"}]})
            return
        if time.monotonic() - process.refreshed > SECRET_REFRESH_S:
            process.refreshed = time.monotonic()
            for mount in process.mounts:
                data = await self._secret(mount.secret)
                if data is not None:
                    mount.write(data)
        if time.monotonic() - process.probed < PROBE_S:
            return
        process.probed = time.monotonic()
        ready = await asyncio.to_thread(_probe, f"{process.scheme}://{process.address}/readyz")
        if ready != process.ready:
            process.ready = ready
            await self._status(pod, {"conditions": [
                {"type": "Ready", "status": "True" if ready else "False"}]})

    async def _terminate(self, pod: Mapping[str, Any], process: Process | None) -> None:
        if process is not None and process.popen.poll() is None:
            if not process.stopping:
                process.stopping = True
                process.popen.terminate()  # SIGTERM: a leader resigns
            if process.popen.poll() is None:
                return
        self.processes.pop(pod["metadata"]["uid"], None)
        await self._drop_finalizer("Pod", pod, POD_FINALIZER)

    def evict(self, uid: str, reason: str) -> None:
        """End the pod for good, as a kubelet evicting it under node pressure (``Evicted``) or
        a graceful node shutdown (``Terminated``) does: its container is stopped and it stays,
        in phase Failed, until someone deletes it."""
        self.evicted[uid] = reason

    async def _fail(self, pod: Mapping[str, Any], process: Process | None, reason: str) -> None:
        if process is not None:
            if process.popen.poll() is None:
                if not process.stopping:
                    process.stopping = True
                    process.popen.terminate()
                return
            self.processes.pop(process.uid)
        if (pod.get("status") or {}).get("phase") == "Failed":
            return
        # A terminal pod is no endpoint of its service any more.
        uid = pod["metadata"]["uid"]
        for name in [n for n, (_, owner) in self.records.items() if owner == uid]:
            del self.records[name]
        self._write_hosts()
        # The container ran (the operator tells a pod ended so from one rejected at admission).
        ran = [{"name": "node", "state": {"terminated": {
            "exitCode": 143, "startedAt": pod["metadata"].get("creationTimestamp") or _now(),
            "finishedAt": _now()}}}] if process is not None else []
        await self._status(pod, {"phase": "Failed", "reason": reason,
                                 "message": f"the test kubelet ended the pod ({reason})",
                                 "conditions": [{"type": "Ready", "status": "False"}],
                                 "containerStatuses": ran})

    async def _status(self, pod: Mapping[str, Any], status: dict[str, Any]) -> None:
        await self.kube.patch(path("Pod", NAMESPACE, pod["metadata"]["name"]) + "/status",
                              {"status": status})

    async def _drop_finalizer(self, kind: str, obj: Mapping[str, Any], finalizer: str) -> None:
        left = [f for f in obj["metadata"].get("finalizers") or [] if f != finalizer]
        await self.kube.patch(path(kind, NAMESPACE, obj["metadata"]["name"]),
                              {"metadata": {"finalizers": left or None}})

    def logs(self) -> str:
        parts = [f"--- kubelet errors\n{e}" for e in self.errors]
        for log in sorted((self.root / "logs").glob("*.log")):
            parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-2500:]}")
        return "\n".join(parts)

    def address(self, node_id: int, name: str = "kq") -> str:
        """The client address of the node's current pod, by IP."""
        return f"{self.ip(f'{name}-{node_id}')}:9093"

    @staticmethod
    def server(node_id: int, name: str = "kq") -> str:
        """The client address of the node by its DNS name (as clients in the cluster use)."""
        return f"{node_host(name, NAMESPACE, node_id)}.cluster.local:9093"


def _mount_namespaces() -> bool:
    """Whether this process may give a child a mount namespace of its own (root, unshare)."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"],
                          capture_output=True, check=False)
    return done.returncode == 0


MOUNT_NAMESPACES = _mount_namespaces()
# The node's command line follows the paths of the hosts file and of a resolv.conf: in a mount
# namespace of its own, with those files bound over /etc/hosts and /etc/resolv.conf.
_IN_OWN_MOUNT_NAMESPACE = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           'mount --bind "$0" /etc/hosts && mount --bind "$1" /etc/resolv.conf'
                           ' && shift && exec "$@"']
# A name the hosts file lacks gets no answer from the machine's resolver: nothing is asked
# beyond the machine (loopback port 53 refuses at once).
RESOLV_CONF = "nameserver 127.0.0.1\noptions attempts:1 timeout:1\n"
# The kubelets running now: the test process resolves their pods' names too.
_RESOLVERS: list[Kubelet] = []
_getaddrinfo = socket.getaddrinfo


def _cluster_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    if isinstance(host, str):
        for kubelet in _RESOLVERS:
            found = kubelet.resolve(host)
            if found is not None:
                return _getaddrinfo(found, *args, **kwargs)
        if _RESOLVERS and host.rstrip(".").endswith((".svc", ".svc.cluster.local")):
            # A cluster name with no record: NXDOMAIN, never a query to the machine's resolver.
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    return _getaddrinfo(host, *args, **kwargs)


socket.getaddrinfo = _cluster_getaddrinfo  # cluster names only while a kubelet runs


_UNVERIFIED = ssl._create_unverified_context()  # the kubelet does not verify probes


def _probe(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1, context=_UNVERIFIED) as response:
            return bool(response.status == 200)
    except OSError:
        return False


# --- the operator -----------------------------------------------------------------------------


class OperatorThread:
    """The real operator (the ``handlers`` module's kopf handlers) on its own loop and thread."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self) -> None:

        assert handlers.STATE is not None

        def run() -> None:
            try:
                asyncio.run(kopf.operator(standalone=True, namespaces=[NAMESPACE],
                                          clusterwide=False, stop_flag=self._stop))
            except BaseException as error:  # reported by the test
                self.error = error

        self._thread = threading.Thread(target=run, name="kopf", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(20)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


def quorum_object(name: str, replicas: int, **spec: Any) -> dict[str, Any]:
    config = {"electionTimeoutMs": 500, "fetchTimeoutMs": 1500, "requestTimeoutMs": 1000,
              "retryBackoffMs": 20}
    return {"apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"replicas": replicas, "config": config,
                     "remediation": {"enabled": True, "minCaughtUpSeconds": 1}, **spec}}


def cr_path(name: str) -> str:
    return path(KIND, NAMESPACE, name, api=CR_API)


async def wait_for(what: str, check: Callable[[], Awaitable[Any]], timeout_s: float,
                   describe: Callable[[], str] = lambda: "", interval_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = await check()
        except (KubeError, OSError) as error:
            last = error
        if last and not isinstance(last, Exception):
            return last
        await asyncio.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} "
                         f"(last: {last!r})\n{describe()}")


def condition(obj: Mapping[str, Any] | None, kind: str) -> str | None:
    for entry in ((obj or {}).get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind:
            return str(entry.get("status"))
    return None


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
