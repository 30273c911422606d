"""A kubelet made of processes, one per Node, as close to a kubelet as processes allow:

    python kubelet.py CONFIG.json     # started by the cluster fixture (cluster.py)

- **Node.** Registers its Node (zone and hostname labels, capacity, an InternalIP on the bridge),
  renews its Lease in ``kube-node-lease`` and reports its conditions; everything with the
  node's own credentials (``system:node:NAME``), so the Node authorizer and NodeRestriction
  limit it as they limit a kubelet.
- **Pods bound to the node** (``spec.nodeName``), each in a network namespace of its own
  (``netns.PodSandbox``) with a new private IP, every container in a mount and UTS namespace of
  its own (``container.py``): the image's command (``images.py``) as the pod's user, the pod's
  volumes at their paths. Volumes: a PersistentVolumeClaim's bound hostPath or local volume,
  Secrets and ConfigMaps (written as the kubelet writes them: a ``..data`` symlink swapped
  atomically, refreshed while the pod runs), projected volumes with a ServiceAccount token from
  the TokenRequest API (bound to the pod, refreshed before it expires), downward API files,
  emptyDir. Environment: ``value``, ``fieldRef``, ``secretKeyRef``, ``configMapKeyRef``,
  ``envFrom``, and ``KUBERNETES_SERVICE_HOST``/``PORT`` (the API server's own address: there is no
  kube-proxy).
- **Lifecycle.** Init containers in order, then the containers; readiness, liveness and startup
  probes (httpGet, tcpSocket); restarts by ``restartPolicy`` with the kubelet's back-off (10 s,
  doubling, at most 5 min); a full status (phase, conditions with times, podIP(s), hostIP(s),
  container statuses with restart counts, states and last states); the graceful deletion
  (SIGTERM, the grace period, SIGKILL, the terminal status, then the final delete with the pod's
  uid as precondition); Events (Started, Killing, Unhealthy, BackOff, FailedMount).

- **The kubelet API** on the node's address, port 10250, for the API server (its client
  certificate): container logs (``kubectl logs``, with ``tailLines``, ``limitBytes``,
  ``follow``).

What it does not do: pull images, enforce cgroup limits, ``exec``, ``attach`` or
``port-forward``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import images
from aiohttp import web
from kafka_quorum_operator.kube import Kube, KubeError
from kubernetes import client, config
from netns import PodSandbox, pod_addresses

logger = logging.getLogger("kubelet")

SYNC_S = 0.5
LEASE_S = 5.0
LEASE_DURATION_S = 40
STATUS_S = 30.0
VOLUME_REFRESH_S = 5.0
BACKOFF_S = 10.0
BACKOFF_MAX_S = 300.0
BACKOFF_RESET_S = 600.0
SHIM = Path(__file__).resolve().parent / "container.py"
REPOSITORY = SHIM.parents[2]  # the images' software: the project, installed in the venv
KUBELET_PORT = 10250
LOG_POLL_S = 0.2
STRATEGIC = "application/strategic-merge-patch+json"
_UNVERIFIED = ssl._create_unverified_context()  # the kubelet does not verify probes


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class NodeConfig:
    node: str
    zone: str
    index: int
    host_ip: str
    kubeconfig: str
    root: str
    api_host: str
    api_port: int
    hosts_file: str
    venv: str
    serving_cert: str
    serving_key: str
    client_ca: str

    @classmethod
    def load(cls, path: str) -> NodeConfig:
        return cls(**json.loads(Path(path).read_text()))


class NodeApi(Kube):
    """The node's calls to the API server, as ``system:node:NAME``."""

    @classmethod
    def for_node(cls, kubeconfig: str) -> NodeApi:
        configured = client.Configuration()
        config.load_kube_config(config_file=kubeconfig,  # type: ignore[no-untyped-call]
                                client_configuration=configured)
        return cls(client.ApiClient(configured), field_manager="kubelet")

    async def pods_on(self, node: str) -> list[dict[str, Any]]:
        answer = await self._request("GET", "/api/v1/pods", query=[
            ("fieldSelector", f"spec.nodeName={node}")]) or {}
        return list(answer.get("items") or [])

    async def patch_status(self, url_path: str, status: Mapping[str, Any]) -> None:
        await self._request("PATCH", f"{url_path}/status", body={"status": dict(status)},
                            content_type=STRATEGIC)

    async def delete_final(self, pod: Mapping[str, Any]) -> None:
        """The kubelet's last word on a pod it has stopped: delete it now, if it is still the
        pod it stopped (its uid)."""
        meta = pod["metadata"]
        await self._request("DELETE", _pod_path(pod), body={
            "kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
            "preconditions": {"uid": meta["uid"]}})

    async def token(self, pod: Mapping[str, Any], audience: str | None, seconds: int
                    ) -> tuple[str, float]:
        """A ServiceAccount token bound to ``pod`` (TokenRequest), and when to renew it."""
        meta, spec = pod["metadata"], pod["spec"]
        account = spec.get("serviceAccountName") or "default"
        body: dict[str, Any] = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                "spec": {"expirationSeconds": seconds, "boundObjectRef": {
                                    "kind": "Pod", "apiVersion": "v1", "name": meta["name"],
                                    "uid": meta["uid"]}}}
        if audience:
            body["spec"]["audiences"] = [audience]
        answer = await self._request(
            "POST", f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{account}/token",
            body=body)
        if answer is None:
            raise KubeError(404, f"no ServiceAccount {account}")
        # Renewed at 80 % of its life, as the kubelet's token manager does.
        return str(answer["status"]["token"]), time.time() + 0.8 * seconds

    async def event(self, pod: Mapping[str, Any], kind: str, reason: str, message: str,
                    node: str) -> None:
        meta = pod["metadata"]
        with contextlib.suppress(KubeError):
            await self.create(f"/api/v1/namespaces/{meta['namespace']}/events", {
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                "involvedObject": {"kind": "Pod", "apiVersion": "v1", "name": meta["name"],
                                   "namespace": meta["namespace"], "uid": meta["uid"]},
                "type": kind, "reason": reason, "message": message, "count": 1,
                "firstTimestamp": now(), "lastTimestamp": now(),
                "source": {"component": "kubelet", "host": node}})


def _pod_path(pod: Mapping[str, Any]) -> str:
    meta = pod["metadata"]
    return f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"


# --- volumes -------------------------------------------------------------------------------------


class VolumeMissing(Exception):
    """What a volume needs is not there yet (the pod waits: ContainerCreating)."""


def write_atomically(directory: Path, files: Mapping[str, bytes], mode: int, gid: int | None
                     ) -> None:
    """The kubelet's AtomicWriter: the files in a new hidden directory, ``..data`` pointing at it
    (swapped by one rename), each file a symlink through ``..data``. Unchanged files: nothing
    written."""
    data = directory / "..data"
    if data.is_symlink() and _read_all(data) == dict(files):
        return
    directory.mkdir(parents=True, exist_ok=True)
    stamp = directory / f"..{time.time_ns()}"
    for name, content in files.items():
        target = stamp / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        target.chmod(mode)
        if gid is not None:
            os.chown(target, 0, gid)
    stamp.mkdir(exist_ok=True)
    stamp.chmod(0o755)
    swap = directory / "..data_tmp"
    with contextlib.suppress(FileNotFoundError):
        swap.unlink()
    swap.symlink_to(stamp.name)
    old = os.readlink(data) if data.is_symlink() else None
    os.replace(swap, data)
    for name in files:
        top = name.split("/", 1)[0]
        link = directory / top
        if not link.is_symlink():
            link.symlink_to(f"..data/{top}")
    for entry in directory.iterdir():
        if entry.is_symlink() and not entry.name.startswith("..") and not entry.exists():
            entry.unlink()  # a key no longer there
    if old is not None and old != stamp.name:
        shutil.rmtree(directory / old, ignore_errors=True)


def _read_all(data: Path) -> dict[str, bytes]:
    found = {}
    for path in data.rglob("*"):
        if path.is_file():
            found[str(path.relative_to(data))] = path.read_bytes()
    return found


def _items(data: Mapping[str, bytes], items: list[dict[str, Any]] | None, what: str,
           optional: bool) -> dict[str, bytes]:
    if not items:
        return dict(data)
    found = {}
    for item in items:
        if item["key"] in data:
            found[item["path"]] = data[item["key"]]
        elif not optional:
            raise VolumeMissing(f"{what} has no key {item['key']!r}")
    return found


def _field(pod: Mapping[str, Any], path: str) -> str:
    """A downward API field (``metadata.name``, ``metadata.labels['x']``, ``status.podIP``...)."""
    if path.startswith(("metadata.labels['", "metadata.annotations['")):
        kind, key = path.split("['", 1)
        return str((pod["metadata"].get(kind.split(".")[1]) or {}).get(key.rstrip("']"), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        values = pod["metadata"].get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(values.items()))
    value: Any = pod
    for part in path.split("."):
        value = (value or {}).get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


# --- containers ----------------------------------------------------------------------------------


@dataclass
class Container:
    """One container of a pod: its process and what the status says of it."""

    spec: dict[str, Any]
    init: bool = False
    popen: subprocess.Popen[bytes] | None = None
    started_at: str | None = None
    started_mono: float = 0.0
    restarts: int = 0
    last_terminated: dict[str, Any] | None = None
    terminated: dict[str, Any] | None = None  # the current state, once it ended for good
    waiting: tuple[str, str] | None = ("ContainerCreating", "")
    backoff_until: float = 0.0
    backoff_s: float = 0.0
    ready: bool = False
    started: bool = False  # startupProbe passed (or none)
    probe_due: dict[str, float] = field(default_factory=dict)
    probe_failures: dict[str, int] = field(default_factory=dict)
    probe_successes: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def state(self) -> dict[str, Any]:
        if self.running:
            return {"running": {"startedAt": self.started_at}}
        if self.terminated is not None:
            return {"terminated": self.terminated}
        reason, message = self.waiting or ("ContainerCreating", "")
        return {"waiting": {"reason": reason, **({"message": message} if message else {})}}

    def status(self, pod_uid: str) -> dict[str, Any]:
        image = str(self.spec.get("image", ""))
        found: dict[str, Any] = {
            "name": self.name, "image": image, "imageID": f"process://{image}",
            "ready": self.ready and self.running, "restartCount": self.restarts,
            "started": self.running and self.started, "state": self.state(),
            "lastState": {"terminated": self.last_terminated} if self.last_terminated else {}}
        if self.popen is not None:
            found["containerID"] = f"process://{pod_uid[:8]}-{self.name}-{self.popen.pid}"
        return found


class PodWorker:
    """Runs one pod from its start to its final delete; ``step`` is called every sync."""

    def __init__(self, kubelet: Kubelet, pod: dict[str, Any]) -> None:
        self.kubelet = kubelet
        self.pod = pod
        self.uid: str = pod["metadata"]["uid"]
        self.dir = Path(kubelet.config.root) / "pods" / self.uid
        self.sandbox: PodSandbox | None = None
        self.volumes: dict[str, Path] | None = None
        self.tokens: dict[str, float] = {}  # volume/path -> when to renew
        self.refreshed = 0.0
        spec = pod["spec"]
        self.init = [Container(c, init=True) for c in spec.get("initContainers") or []]
        self.containers = [Container(c) for c in spec.get("containers") or []]
        self.start_time: str | None = None
        self.conditions: dict[str, dict[str, Any]] = {}
        self.posted: dict[str, Any] | None = None
        self.phase = "Pending"
        self.killing_since: float | None = None
        self.finished = False  # deleted (the final delete sent) or force-deleted

    @property
    def name(self) -> str:
        return f"{self.pod['metadata']['namespace']}/{self.pod['metadata']['name']}"

    @property
    def api(self) -> NodeApi:
        return self.kubelet.api

    async def step(self) -> None:
        if self.pod["metadata"].get("deletionTimestamp"):
            await self.terminate()
            return
        if self.phase in ("Succeeded", "Failed"):
            await self.post_status()
            return
        if self.volumes is None:
            await self.prepare_volumes()
            if self.volumes is None:
                await self.post_status()
                return
        if self.sandbox is None:
            address = next(self.kubelet.addresses)
            self.sandbox = await asyncio.to_thread(PodSandbox.create, self.uid, address)
            self.start_time = self.start_time or now()
        await self.refresh_volumes()
        if await self.run_init_containers():
            await self.run_containers()
        await self.post_status()

    # -- volumes --

    async def prepare_volumes(self) -> None:
        try:
            self.volumes = await self.write_volumes()
        except VolumeMissing as missing:
            if self.kubelet.once(self.uid, f"mount {missing}"):
                await self.api.event(self.pod, "Warning", "FailedMount", str(missing),
                                     self.kubelet.config.node)
            for container in [*self.init, *self.containers]:
                container.waiting = ("ContainerCreating", "")

    async def refresh_volumes(self) -> None:
        if time.monotonic() - self.refreshed < VOLUME_REFRESH_S:
            return
        self.refreshed = time.monotonic()
        with contextlib.suppress(VolumeMissing, KubeError):
            await self.write_volumes()

    async def write_volumes(self) -> dict[str, Path]:
        """Every volume of the pod, by name, as a directory (or file) on the node."""
        found: dict[str, Path] = {}
        fs_group = (self.pod["spec"].get("securityContext") or {}).get("fsGroup")
        for volume in self.pod["spec"].get("volumes") or []:
            name = volume["name"]
            target = self.dir / "volumes" / name
            if "persistentVolumeClaim" in volume:
                found[name] = await self.claimed_volume(volume["persistentVolumeClaim"])
            elif "hostPath" in volume:
                found[name] = Path(volume["hostPath"]["path"])
            elif "emptyDir" in volume:
                target.mkdir(parents=True, exist_ok=True)
                if fs_group is not None:
                    os.chown(target, 0, int(fs_group))
                target.chmod(0o2777 if fs_group is not None else 0o777)
                found[name] = target
            else:
                files, mode = await self.projected_files(volume)
                write_atomically(target, files, mode, fs_group)
                found[name] = target
        return found

    async def claimed_volume(self, source: Mapping[str, Any]) -> Path:
        namespace = self.pod["metadata"]["namespace"]
        claim = await self.api.get(
            f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{source['claimName']}")
        if claim is None:
            raise VolumeMissing(f'persistentvolumeclaim "{source["claimName"]}" not found')
        volume_name = (claim.get("spec") or {}).get("volumeName")
        if (claim.get("status") or {}).get("phase") != "Bound" or not volume_name:
            raise VolumeMissing(f'persistentvolumeclaim "{source["claimName"]}" is not bound')
        volume = await self.api.get(f"/api/v1/persistentvolumes/{volume_name}")
        if volume is None:
            raise VolumeMissing(f'persistentvolume "{volume_name}" not found')
        spec = volume["spec"]
        path = Path((spec.get("hostPath") or spec.get("local") or {}).get("path", ""))
        if not path.is_absolute():
            raise VolumeMissing(f"persistentvolume {volume_name} is neither hostPath nor local")
        path.mkdir(parents=True, exist_ok=True)  # hostPath type DirectoryOrCreate
        return path

    async def projected_files(self, volume: Mapping[str, Any]) -> tuple[dict[str, bytes], int]:
        """The files of a secret, configMap, downwardAPI or projected volume, and their mode."""
        if "projected" in volume:
            projected = volume["projected"]
            files: dict[str, bytes] = {}
            for source in projected.get("sources") or []:
                files.update(await self.source_files(volume["name"], source))
            return files, int(projected.get("defaultMode", 0o644))
        kind = next(k for k in ("secret", "configMap", "downwardAPI") if k in volume)
        return (await self.source_files(volume["name"], {kind: volume[kind]}),
                int(volume[kind].get("defaultMode", 0o644)))

    async def source_files(self, volume: str, source: Mapping[str, Any]) -> dict[str, bytes]:
        namespace = self.pod["metadata"]["namespace"]
        if "secret" in source or "configMap" in source:
            secret = "secret" in source
            spec = source["secret" if secret else "configMap"]
            name = spec.get("secretName") or spec.get("name")
            kind = "secrets" if secret else "configmaps"
            body = await self.api.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
            what = f'{"secret" if secret else "configmap"} "{name}"'
            if body is None:
                if spec.get("optional"):
                    return {}
                raise VolumeMissing(f"{what} not found")
            data = {k: base64.b64decode(v) for k, v in (body.get("data") or {}).items()} \
                if secret else {k: v.encode() for k, v in (body.get("data") or {}).items()}
            if not secret:
                data.update({k: base64.b64decode(v)
                             for k, v in (body.get("binaryData") or {}).items()})
            return _items(data, spec.get("items"), what, bool(spec.get("optional")))
        if "downwardAPI" in source:
            return {item["path"]: _field(self.pod, item["fieldRef"]["fieldPath"]).encode()
                    for item in source["downwardAPI"].get("items") or [] if "fieldRef" in item}
        if "serviceAccountToken" in source:
            return {source["serviceAccountToken"]["path"]:
                    (await self.token(volume, source["serviceAccountToken"])).encode()}
        return {}

    async def token(self, volume: str, spec: Mapping[str, Any]) -> str:
        key = f"{volume}/{spec['path']}"
        path: Path = self.dir / "volumes" / volume / str(spec["path"])
        if key in self.tokens and time.time() < self.tokens[key] and path.exists():
            return path.read_text()
        token, renew_at = await self.api.token(self.pod, spec.get("audience"),
                                               int(spec.get("expirationSeconds", 3607)))
        self.tokens[key] = renew_at
        return token

    # -- containers --

    async def run_init_containers(self) -> bool:
        """Whether every init container has completed (the next one started otherwise)."""
        for container in self.init:
            if container.terminated is not None and container.terminated["exitCode"] == 0:
                continue
            if container.running:
                return False
            if container.popen is not None:
                self.ended(container)
                if container.terminated is not None and container.terminated["exitCode"] == 0:
                    continue
                if self.restart_policy() == "Never":
                    self.phase = "Failed"
                    return False
            await self.start(container)
            return False
        return True

    async def run_containers(self) -> None:
        for container in self.containers:
            if container.running:
                await self.probe(container)
                continue
            if container.popen is not None and container.terminated is None:
                self.ended(container)
            exit_code = (container.terminated or {}).get("exitCode")
            policy = self.restart_policy()
            if container.terminated is not None and (
                    policy == "Never" or (policy == "OnFailure" and exit_code == 0)):
                continue
            await self.start(container)
        if any(c.running for c in self.containers):
            self.phase = "Running"
        elif all(c.terminated is not None for c in self.containers) and \
                self.restart_policy() != "Always":
            failed = any(c.terminated and c.terminated["exitCode"] != 0 for c in self.containers)
            if self.restart_policy() == "Never" or not failed:
                self.phase = "Failed" if failed else "Succeeded"

    def restart_policy(self) -> str:
        return str(self.pod["spec"].get("restartPolicy") or "Always")

    def ended(self, container: Container) -> None:
        """Record the exit of ``container``'s process; set its back-off."""
        assert container.popen is not None
        code = container.popen.returncode
        reason = "Completed" if code == 0 else "Error"
        exit_code = 128 - code if code < 0 else code
        container.terminated = {"exitCode": exit_code, "reason": reason,
                                "startedAt": container.started_at, "finishedAt": now(),
                                "containerID": container.status(self.uid).get("containerID")}
        container.ready = False
        ran = time.monotonic() - container.started_mono
        container.backoff_s = BACKOFF_S if ran > BACKOFF_RESET_S or not container.backoff_s \
            else min(container.backoff_s * 2, BACKOFF_MAX_S)
        container.backoff_until = time.monotonic() + container.backoff_s
        self.kubelet.log_line(f"{self.name} {container.name}: exited {exit_code}")

    async def start(self, container: Container) -> None:
        if time.monotonic() < container.backoff_until:
            message = (f"back-off {container.backoff_s:.0f}s restarting failed container="
                       f"{container.name} pod={self.pod['metadata']['name']}")
            if container.waiting is None or container.waiting[0] != "CrashLoopBackOff":
                await self.api.event(self.pod, "Warning", "BackOff", message,
                                     self.kubelet.config.node)
            container.waiting = ("CrashLoopBackOff", message)
            return
        image = images.find(str(container.spec.get("image", "")))
        if image is None:
            container.waiting = ("ErrImagePull", f"image {container.spec.get('image')!r} is not "
                                                 "one this cluster has")
            return
        try:
            env = await self.environment(container.spec, image)
        except VolumeMissing as missing:
            container.waiting = ("CreateContainerConfigError", str(missing))
            return
        if container.terminated is not None or container.popen is not None:
            container.restarts += 1
            container.last_terminated = container.terminated
        container.terminated = None
        container.waiting = None
        container.popen = await asyncio.to_thread(self.spawn, container, image, env)
        container.started_at = now()
        container.started_mono = time.monotonic()
        container.started = not container.spec.get("startupProbe")
        container.ready = False
        container.probe_failures.clear()
        container.probe_successes.clear()
        container.probe_due.clear()
        await self.api.event(self.pod, "Normal", "Started",
                             f"Started container {container.name}", self.kubelet.config.node)

    def spawn(self, container: Container, image: images.Image, env: dict[str, str]
              ) -> subprocess.Popen[bytes]:
        assert self.sandbox is not None and self.volumes is not None
        spec = container.spec
        pod_spec = self.pod["spec"]
        context = {**(pod_spec.get("securityContext") or {}),
                   **(spec.get("securityContext") or {})}
        user = int(context.get("runAsUser", image.user))
        # The image's group for its own user; gid 0 for a uid its passwd does not list, as
        # container runtimes do (OpenShift's arbitrary uids).
        group = int(context.get("runAsGroup", image.group if user == image.user else 0))
        groups = [group, *(int(g) for g in context.get("supplementalGroups") or [])]
        if context.get("fsGroup") is not None:
            groups.append(int(context["fsGroup"]))
        mounts = [{"source": str(self.volumes[m["name"]] / m["subPath"]) if m.get("subPath")
                   else str(self.volumes[m["name"]]), "target": m["mountPath"],
                   "readOnly": bool(m.get("readOnly"))} for m in spec.get("volumeMounts") or []]
        mounts.append({"source": self.kubelet.config.hosts_file, "target": "/etc/hosts",
                       "readOnly": True})
        mounts.append({"source": str(self.resolv_conf()), "target": "/etc/resolv.conf",
                       "readOnly": True})
        scratch = self.dir / "containers" / f"{container.name}-{time.time_ns()}"
        scratch.mkdir(parents=True)
        hostname = str(pod_spec.get("hostname") or self.pod["metadata"]["name"])
        shim = {"hostname": hostname[:63], "scratch": str(scratch),
                "directories": {d: [uid, image.group] for d, uid in image.directories.items()},
                "passwd": [image.passwd_line()],
                "venv": self.kubelet.config.venv,
                "software": [str(Path(self.kubelet.config.venv).resolve()), str(REPOSITORY)],
                "venv_target": images.VENV, "mounts": mounts,
                "readOnlyRoot": bool(context.get("readOnlyRootFilesystem")),
                "workingDir": spec.get("workingDir") or "/", "user": user, "group": group,
                "groups": sorted(set(groups)),
                "argv": images.command_line(image, spec.get("command"), spec.get("args")),
                "env": env}
        spec_file = scratch.with_suffix(".json")
        spec_file.write_text(json.dumps(shim))
        log = self.dir / f"{container.name}.log"
        with log.open("ab") as out:
            return subprocess.Popen(
                ["nsenter", f"--net={self.sandbox.path}", "--", "unshare", "--mount", "--uts",
                 "--propagation", "private", "--", sys.executable, str(SHIM), str(spec_file)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def resolv_conf(self) -> Path:
        """The pod's resolv.conf: the cluster's search path; its names are in /etc/hosts (the
        add-ons' records), and a name not there gets no answer from any resolver (loopback
        port 53 in the pod's own namespace refuses at once)."""
        path: Path = self.dir / "resolv.conf"
        namespace = self.pod["metadata"]["namespace"]
        path.write_text(f"search {namespace}.svc.cluster.local svc.cluster.local cluster.local\n"
                        "nameserver 127.0.0.1\noptions ndots:5 attempts:1 timeout:1\n")
        return path

    async def environment(self, spec: Mapping[str, Any], image: images.Image) -> dict[str, str]:
        config_ = self.kubelet.config
        env = {**image.env, "HOSTNAME": str(self.pod["spec"].get("hostname") or
                                            self.pod["metadata"]["name"]),
               "HOME": image.home, "KUBERNETES_SERVICE_HOST": config_.api_host,
               "KUBERNETES_SERVICE_PORT": str(config_.api_port),
               "KUBERNETES_SERVICE_PORT_HTTPS": str(config_.api_port)}
        namespace = self.pod["metadata"]["namespace"]
        for source in spec.get("envFrom") or []:
            secret = "secretRef" in source
            ref = source["secretRef" if secret else "configMapRef"]
            data = await self.named_data(namespace, secret, ref["name"], bool(ref.get("optional")))
            env.update({f"{source.get('prefix', '')}{k}": v for k, v in data.items()})
        for var in spec.get("env") or []:
            if "value" in var or "valueFrom" not in var:
                env[var["name"]] = str(var.get("value", ""))
                continue
            value_from = var["valueFrom"]
            if "fieldRef" in value_from:
                env[var["name"]] = _field(self.pod_with_status(),
                                          value_from["fieldRef"]["fieldPath"])
                continue
            secret = "secretKeyRef" in value_from
            ref = value_from["secretKeyRef" if secret else "configMapKeyRef"]
            data = await self.named_data(namespace, secret, ref["name"], bool(ref.get("optional")))
            if ref["key"] in data:
                env[var["name"]] = data[ref["key"]]
            elif not ref.get("optional"):
                raise VolumeMissing(f"couldn't find key {ref['key']} in {ref['name']}")
        return env

    def pod_with_status(self) -> dict[str, Any]:
        status = {"podIP": self.sandbox.address if self.sandbox else "",
                  "hostIP": self.kubelet.config.host_ip}
        return {**self.pod, "status": {**(self.pod.get("status") or {}), **status}}

    async def named_data(self, namespace: str, secret: bool, name: str, optional: bool
                         ) -> dict[str, str]:
        kind = "secrets" if secret else "configmaps"
        body = await self.api.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        if body is None:
            if optional:
                return {}
            raise VolumeMissing(f'{kind[:-1]} "{name}" not found')
        data = body.get("data") or {}
        return {k: base64.b64decode(v).decode() if secret else v for k, v in data.items()}

    # -- probes --

    async def probe(self, container: Container) -> None:
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container.spec.get(kind)
            if probe is None or (kind != "startupProbe" and not container.started) or \
                    (kind == "startupProbe" and container.started):
                continue
            period = float(probe.get("periodSeconds", 10))
            due = container.probe_due.get(kind)
            if due is None:
                due = container.started_mono + float(probe.get("initialDelaySeconds", 0))
            if time.monotonic() < due:
                continue
            container.probe_due[kind] = time.monotonic() + period
            ok = await asyncio.to_thread(self.check, probe)
            await self.probed(container, kind, probe, ok)
        if not container.spec.get("readinessProbe") and container.started:
            container.ready = True

    async def probed(self, container: Container, kind: str, probe: Mapping[str, Any],
                     ok: bool) -> None:
        failures = container.probe_failures
        successes = container.probe_successes
        failures[kind] = 0 if ok else failures.get(kind, 0) + 1
        successes[kind] = successes.get(kind, 0) + 1 if ok else 0
        if kind == "startupProbe" and ok:
            container.started = True
        elif kind == "readinessProbe":
            if ok and successes[kind] >= int(probe.get("successThreshold", 1)):
                container.ready = True
            elif not ok and failures[kind] >= int(probe.get("failureThreshold", 3)):
                container.ready = False
        if not ok and failures[kind] in (1, int(probe.get("failureThreshold", 3))):
            await self.api.event(self.pod, "Warning", "Unhealthy",
                                 f"{kind[:-5].capitalize()} probe failed",
                                 self.kubelet.config.node)
        if kind != "readinessProbe" and not ok and \
                failures[kind] >= int(probe.get("failureThreshold", 3)):
            await self.api.event(self.pod, "Normal", "Killing",
                                 f"Container {container.name} failed {kind[:-5]} probe, will be "
                                 "restarted", self.kubelet.config.node)
            await asyncio.to_thread(self.stop_container, container, 30)
            container.backoff_until = 0.0

    def check(self, probe: Mapping[str, Any]) -> bool:
        assert self.sandbox is not None
        timeout = float(probe.get("timeoutSeconds", 1))
        if "httpGet" in probe:
            get = probe["httpGet"]
            scheme = str(get.get("scheme") or "HTTP").lower()
            port = self.port(get["port"])
            url = f"{scheme}://{self.sandbox.address}:{port}{get.get('path', '/')}"
            try:
                with urllib.request.urlopen(url, timeout=timeout, context=_UNVERIFIED) as answer:
                    return 200 <= int(answer.status) < 400
            except urllib.error.HTTPError as error:
                return 200 <= error.code < 400
            except OSError:
                return False
        if "tcpSocket" in probe:
            try:
                with socket.create_connection(
                        (self.sandbox.address, self.port(probe["tcpSocket"]["port"])), timeout):
                    return True
            except OSError:
                return False
        return True  # exec probes: no exec here

    def port(self, port: int | str) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for container in self.pod["spec"].get("containers") or []:
            for declared in container.get("ports") or []:
                if declared.get("name") == port:
                    return int(declared["containerPort"])
        raise ValueError(f"no port named {port}")

    # -- termination --

    async def terminate(self) -> None:
        """SIGTERM, the grace period, SIGKILL; the terminal status; the final delete."""
        if self.killing_since is None:
            self.killing_since = time.monotonic()
            for container in [*self.init, *self.containers]:
                if container.running:
                    await self.api.event(self.pod, "Normal", "Killing",
                                         f"Stopping container {container.name}",
                                         self.kubelet.config.node)
                    assert container.popen is not None
                    with contextlib.suppress(ProcessLookupError):
                        container.popen.send_signal(signal.SIGTERM)
        grace = self.pod["metadata"].get("deletionGracePeriodSeconds")
        grace_s = float(grace if grace is not None else
                        self.pod["spec"].get("terminationGracePeriodSeconds", 30))
        running = [c for c in [*self.init, *self.containers] if c.running]
        if running and time.monotonic() - self.killing_since < grace_s:
            return
        for container in running:
            await asyncio.to_thread(self.stop_container, container, 0)
        for container in [*self.init, *self.containers]:
            if container.popen is not None and container.terminated is None:
                self.ended(container)
        await asyncio.to_thread(self.release)
        self.phase = "Failed" if any(
            (c.terminated or {}).get("exitCode") for c in self.containers) else "Succeeded"
        with contextlib.suppress(KubeError):
            await self.post_status()
        with contextlib.suppress(KubeError):
            await self.api.delete_final(self.pod)
        self.finished = True

    def stop_container(self, container: Container, grace_s: float) -> None:
        popen = container.popen
        if popen is None or popen.poll() is not None:
            return
        if grace_s:
            with contextlib.suppress(ProcessLookupError):
                popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(grace_s)
        if popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(10)

    def release(self) -> None:
        """The pod's network namespace and its node-local volumes (emptyDir, Secrets); a
        claim's volume stays."""
        for container in [*self.init, *self.containers]:
            self.stop_container(container, 0)
        if self.sandbox is not None:
            self.sandbox.delete()
        shutil.rmtree(self.dir / "volumes", ignore_errors=True)
        shutil.rmtree(self.dir / "containers", ignore_errors=True)

    # -- status --

    def status(self) -> dict[str, Any]:
        initialized = all(c.terminated is not None and c.terminated["exitCode"] == 0
                          for c in self.init)
        ready = initialized and bool(self.containers) and all(
            c.ready and c.running for c in self.containers) and \
            not self.pod["metadata"].get("deletionTimestamp")
        self.condition("PodReadyToStartContainers", self.sandbox is not None)
        self.condition("Initialized", initialized)
        self.condition("ContainersReady", ready)
        self.condition("Ready", ready)
        status: dict[str, Any] = {
            "phase": self.phase,
            "conditions": list(self.conditions.values()),
            "hostIP": self.kubelet.config.host_ip,
            "hostIPs": [{"ip": self.kubelet.config.host_ip}],
            "containerStatuses": [c.status(self.uid) for c in self.containers],
        }
        if self.init:
            status["initContainerStatuses"] = [c.status(self.uid) for c in self.init]
        if self.sandbox is not None:
            status["podIP"] = self.sandbox.address
            status["podIPs"] = [{"ip": self.sandbox.address}]
        if self.start_time:
            status["startTime"] = self.start_time
        return status

    def condition(self, kind: str, true: bool) -> None:
        value = "True" if true else "False"
        current = self.conditions.get(kind)
        if current is None or current["status"] != value:
            self.conditions[kind] = {"type": kind, "status": value,
                                     "lastProbeTime": None, "lastTransitionTime": now()}

    async def post_status(self) -> None:
        status = self.status()
        if status == self.posted:
            return
        await self.api.patch_status(_pod_path(self.pod), status)
        self.posted = status

    def kill_now(self) -> None:
        """The pod is gone from the API (force-deleted): stop it at once."""
        self.release()
        self.finished = True


# --- the node ----------------------------------------------------------------------------------


class Kubelet:
    def __init__(self, config_: NodeConfig) -> None:
        self.config = config_
        self.api = NodeApi.for_node(config_.kubeconfig)
        self.workers: dict[str, PodWorker] = {}
        self.addresses = pod_addresses(config_.index)
        self._said: set[tuple[str, str]] = set()
        self.log_file = Path(config_.root) / "kubelet.log"

    def log_line(self, text: str) -> None:
        with self.log_file.open("a") as log:
            log.write(f"{now()} {text}\n")

    def once(self, uid: str, what: str) -> bool:
        key = (uid, what)
        if key in self._said:
            return False
        self._said.add(key)
        return True

    def node_object(self) -> dict[str, Any]:
        config_ = self.config
        return {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": config_.node, "labels": {
                "kubernetes.io/hostname": config_.node, "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "topology.kubernetes.io/zone": config_.zone,
                "topology.kubernetes.io/region": "local"}},
            "spec": {},
        }

    def node_status(self) -> dict[str, Any]:
        stamp = now()
        capacity = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}
        conditions = [{"type": kind, "status": "False", "reason": f"Kubelet Has No {kind}",
                       "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}
                      for kind in ("MemoryPressure", "DiskPressure", "PIDPressure")]
        conditions.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                           "message": "kubelet is posting ready status",
                           "lastHeartbeatTime": stamp, "lastTransitionTime": stamp})
        return {"capacity": capacity, "allocatable": capacity, "conditions": conditions,
                "addresses": [{"type": "InternalIP", "address": self.config.host_ip},
                              {"type": "Hostname", "address": self.config.node}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {"kubeletVersion": "v1.37.2-process", "operatingSystem": "linux",
                             "architecture": "amd64", "containerRuntimeVersion": "process://1",
                             "kernelVersion": os.uname().release, "osImage": "process kubelet",
                             "machineID": self.config.node, "systemUUID": self.config.node,
                             "bootID": str(os.getpid()), "kubeProxyVersion": ""}}

    async def register(self) -> None:
        path = f"/api/v1/nodes/{self.config.node}"
        if await self.api.get(path) is None:
            await self.api.create("/api/v1/nodes", self.node_object())
        await self.api.patch_status(path, self.node_status())

    async def heartbeat(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.config.node}"
        last_status = time.monotonic()
        while True:
            spec = {"holderIdentity": self.config.node, "leaseDurationSeconds": LEASE_DURATION_S,
                    "renewTime": datetime.datetime.now(datetime.UTC).strftime(
                        "%Y-%m-%dT%H:%M:%S.%fZ")}
            try:
                if await self.api.get(path) is None:
                    await self.api.create(path.rsplit("/", 1)[0], {
                        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": self.config.node, "namespace": "kube-node-lease"},
                        "spec": spec})
                else:
                    await self.api.patch(path, {"spec": spec})
                if time.monotonic() - last_status > STATUS_S:
                    await self.api.patch_status(f"/api/v1/nodes/{self.config.node}",
                                                self.node_status())
                    last_status = time.monotonic()
            except KubeError as error:
                self.log_line(f"heartbeat: {error}")
            await asyncio.sleep(LEASE_S)

    async def sync(self) -> None:
        while True:
            try:
                pods = await self.api.pods_on(self.config.node)
            except KubeError as error:
                self.log_line(f"list pods: {error}")
                await asyncio.sleep(SYNC_S)
                continue
            listed = {p["metadata"]["uid"]: p for p in pods}
            for uid, pod in listed.items():
                worker = self.workers.get(uid)
                if worker is None:
                    worker = self.workers[uid] = PodWorker(self, pod)
                worker.pod = pod
            for uid, worker in list(self.workers.items()):
                if uid not in listed or worker.finished:
                    if not worker.finished:
                        await asyncio.to_thread(worker.kill_now)
                    if uid not in listed:
                        del self.workers[uid]
            await asyncio.gather(*(self.step(w) for w in self.workers.values()
                                   if not w.finished))
            await asyncio.sleep(SYNC_S)

    async def step(self, worker: PodWorker) -> None:
        try:
            await worker.step()
        except Exception as error:  # one pod's trouble stops no other pod
            self.log_line(f"{worker.name}: {type(error).__name__}: {error}")
            logger.exception("pod %s", worker.name)

    # -- the kubelet API: container logs (kubectl logs, helm test --logs) --

    async def serve(self) -> web.AppRunner:
        """HTTPS on the node's address, for the API server only (its client certificate)."""
        app = web.Application()
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self.container_logs)
        app.router.add_get("/healthz", self.healthz)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=self.config.client_ca)
        context.load_cert_chain(self.config.serving_cert, self.config.serving_key)
        context.verify_mode = ssl.CERT_REQUIRED
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, self.config.host_ip, KUBELET_PORT, ssl_context=context).start()
        return runner

    async def healthz(self, _: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    async def container_logs(self, request: web.Request) -> web.StreamResponse:
        info = request.match_info
        worker = next((w for w in self.workers.values()
                       if w.pod["metadata"]["namespace"] == info["namespace"] and
                       w.pod["metadata"]["name"] == info["pod"]), None)
        log = worker.dir / f"{info['container']}.log" if worker is not None else None
        if log is None or not log.exists():
            raise web.HTTPNotFound(text=f"no container {info['container']} in pod "
                                        f"{info['namespace']}/{info['pod']}")
        data = log.read_bytes()
        if "tailLines" in request.query:
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-int(request.query["tailLines"]):])
        if "limitBytes" in request.query:
            data = data[:int(request.query["limitBytes"])]
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        await response.write(data)
        offset = log.stat().st_size
        while request.query.get("follow") == "true" and not worker.finished:  # type: ignore[union-attr]
            await asyncio.sleep(LOG_POLL_S)
            with log.open("rb") as file:
                file.seek(offset)
                more = file.read()
            offset += len(more)
            if more:
                await response.write(more)
        await response.write_eof()
        return response

    async def run(self) -> None:
        await self.register()
        server = await self.serve()
        running = asyncio.gather(self.heartbeat(), self.sync())
        # SIGTERM: the node shuts down, its pods' processes with it (their API objects stay,
        # as a node's do when it goes away).
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, running.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await running
        for worker in self.workers.values():
            await asyncio.to_thread(worker.release)
        await server.cleanup()


def main() -> None:
    config_ = NodeConfig.load(sys.argv[1])
    logging.basicConfig(filename=str(Path(config_.root) / "kubelet.log"), level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(Kubelet(config_).run())


if __name__ == "__main__":
    main()
