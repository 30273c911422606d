"""``kubectl kq report``: a support bundle of one quorum, a zip file.

What it holds: the KafkaQuorum, its QuorumBackups, its pods, volume claims, ConfigMaps,
Services and PodDisruptionBudget, the Events about any of them, each pod's logs (and the
previous container's, after a restart), the operator's pods and logs (found by the chart's
label); a README that says what is in it and what could not be read. Secrets are never read, so
none can be in it: the pods name their Secrets only. ``metadata.managedFields`` is left out (it
says who wrote which field, is long, and is not needed to understand a quorum).
"""

from __future__ import annotations

import asyncio
import datetime
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kafka_quorum_operator import GROUP, VERSION
from kafka_quorum_operator.kube import Kube, KubeError, path
from kafka_quorum_operator.resources import labels
from kubernetes import client
from urllib3.exceptions import HTTPError

from kubectl_kq import BACKUP_PLURAL, OPERATOR_SELECTOR, PROG
from kubectl_kq.views import backups_of

JSON = dict[str, Any]
# A container's log is cut to its last bytes past this (a bundle should stay mailable).
LOG_LIMIT_BYTES = 8 * 1024 * 1024
Logs = Callable[[str, str, str, bool], str]

README = """\
Support bundle of KafkaQuorum {name} (namespace {namespace}), made by {prog} report at {when}.

Contents:
  kafkaquorum.yaml      the KafkaQuorum, its spec and status
  quorumbackups.yaml    its QuorumBackups
  pods.yaml, pvcs.yaml, configmaps.yaml, services.yaml, poddisruptionbudgets.yaml
                        the quorum's objects (selected by its labels)
  events.yaml           Events about any of these
  logs/POD/CONTAINER.log           each container's log (at most {limit} MiB, the end)
  logs/POD/CONTAINER.previous.log  the container's before its last restart
  operator/pods.yaml, operator/logs/...  the operator's pods (label {operator})

Secrets are never included: the bundle is made without reading a single Secret (pods and the
KafkaQuorum only name theirs). Logs and ConfigMaps are included as they are: the nodes'
configuration holds no credential, but read them before sending the bundle on.
{missing}"""


def default_file(name: str, now: datetime.datetime) -> Path:
    return Path(f"report-kq-{name}-{now.strftime('%Y%m%dT%H%M%SZ')}.zip")


def without_managed_fields(obj: Mapping[str, Any]) -> JSON:
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return {**obj, "metadata": meta}


def as_yaml(objects: Sequence[Mapping[str, Any]]) -> str:
    """A YAML list (``kind: List``) of ``objects``, as kubectl get -o yaml prints several."""
    return yaml.safe_dump({"apiVersion": "v1", "kind": "List",
                           "items": [without_managed_fields(o) for o in objects]},
                          sort_keys=False)


@dataclass
class Bundle:
    """The files of a bundle, in memory until written, and what could not be read."""

    files: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    def readme(self, name: str, namespace: str, now: datetime.datetime) -> str:
        gaps = "".join(f"  - {m}\n" for m in self.missing)
        return README.format(
            name=name, namespace=namespace, prog=PROG, when=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            limit=LOG_LIMIT_BYTES // (1024 * 1024),
            operator=",".join(f"{k}={v}" for k, v in OPERATOR_SELECTOR.items()),
            missing=f"\nNot collected:\n{gaps}" if gaps else "")

    def write(self, target: Path, name: str, namespace: str, now: datetime.datetime) -> None:
        """The zip, under a top directory named after the file; never over an existing file
        (FileExistsError)."""
        top = target.name.removesuffix(".zip")
        with target.open("xb") as out, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as bundle:
            bundle.writestr(f"{top}/README.txt", self.readme(name, namespace, now))
            for member, text in sorted(self.files.items()):
                bundle.writestr(f"{top}/{member}", text)


def pod_logs(api: client.ApiClient) -> Logs:
    core = client.CoreV1Api(api)

    def read(namespace: str, pod: str, container: str, previous: bool) -> str:
        text: str = core.read_namespaced_pod_log(
            pod, namespace, container=container, previous=previous,
            limit_bytes=LOG_LIMIT_BYTES, _request_timeout=(5.0, 60.0))
        return text

    return read


async def collect(kube: Kube, logs: Logs, name: str, namespace: str, quorum: JSON) -> Bundle:
    """Read what the bundle holds; what cannot be read (forbidden, gone) is noted, not fatal."""
    bundle = Bundle()
    bundle.files["kafkaquorum.yaml"] = yaml.safe_dump(without_managed_fields(quorum),
                                                      sort_keys=False)
    selected = labels(name)
    found: dict[str, list[JSON]] = {}
    for file, url in (("pods", path("Pod", namespace)),
                      ("pvcs", path("PersistentVolumeClaim", namespace)),
                      ("configmaps", path("ConfigMap", namespace)),
                      ("services", path("Service", namespace)),
                      ("poddisruptionbudgets", path("PodDisruptionBudget", namespace))):
        found[file] = await _listed(kube, bundle, file, url, selected)
    backups = await _listed(kube, bundle, "quorumbackups", path(
        "", namespace, api=(f"/apis/{GROUP}/{VERSION}", BACKUP_PLURAL)), {})
    found["quorumbackups"] = [dict(b) for b in backups_of(backups, name)]
    for file, objects in found.items():
        bundle.files[f"{file}.yaml"] = as_yaml(objects)
    about = {(kind, str(o["metadata"]["name"])) for kind, key in (
        ("Pod", "pods"), ("PersistentVolumeClaim", "pvcs"), ("QuorumBackup", "quorumbackups"),
        ("PodDisruptionBudget", "poddisruptionbudgets"), ("Service", "services"))
        for o in found[key]} | {("KafkaQuorum", name)}
    events = await _listed(kube, bundle, "events", path("Event", namespace), {})
    bundle.files["events.yaml"] = as_yaml(sorted(
        (e for e in events if (e.get("involvedObject", {}).get("kind"),
                               e.get("involvedObject", {}).get("name")) in about),
        key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or "")))
    await _logs(bundle, logs, found["pods"], "logs")
    operators = await _operator_pods(kube, bundle, namespace)
    bundle.files["operator/pods.yaml"] = as_yaml(operators)
    await _logs(bundle, logs, operators, "operator/logs")
    return bundle


async def _listed(kube: Kube, bundle: Bundle, what: str, url: str, selected: Mapping[str, str]
                  ) -> list[JSON]:
    try:
        return await kube.list(url, selected)
    except KubeError as error:
        bundle.missing.append(f"{what}: {error}")
        return []


async def _operator_pods(kube: Kube, bundle: Bundle, namespace: str) -> list[JSON]:
    """The operator's pods in every namespace; in the quorum's only when listing every
    namespace's pods is forbidden (a namespaced role)."""
    try:
        return await kube.list("/api/v1/pods", OPERATOR_SELECTOR)
    except KubeError as error:
        bundle.missing.append(f"the operator's pods in other namespaces than {namespace}: "
                              f"{error}")
    return await _listed(kube, bundle, "the operator's pods", path("Pod", namespace),
                         OPERATOR_SELECTOR)


async def _logs(bundle: Bundle, logs: Logs, pods: Sequence[Mapping[str, Any]], under: str
                ) -> None:
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status") or {}
        restarted = {s["name"] for s in (status.get("containerStatuses") or [])
                     + (status.get("initContainerStatuses") or []) if s.get("restartCount")}
        containers = [c["name"] for c in (pod["spec"].get("initContainers") or [])
                      + pod["spec"]["containers"]]
        for container in containers:
            for previous in (False, True) if container in restarted else (False,):
                suffix = ".previous.log" if previous else ".log"
                member = f"{under}/{meta['name']}/{container}{suffix}"
                try:
                    bundle.files[member] = await asyncio.to_thread(
                        logs, meta["namespace"], meta["name"], container, previous)
                except client.ApiException as error:
                    bundle.missing.append(f"{member}: HTTP {error.status} {error.reason}")
                except HTTPError as error:
                    bundle.missing.append(f"{member}: {error}")

