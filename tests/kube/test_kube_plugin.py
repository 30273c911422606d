"""``kubectl kq`` against the real control plane, run by the real ``kubectl`` (which finds
``kubectl-kq`` on PATH), on a real quorum whose pods run without the fixed user, group and
fsGroup ids (``spec.template.securityContext`` without them, the pods the operator makes under
``KQ_OPERATOR_POD_IDS=platform``): the image's uid with gid 0, the Secrets root's 0440.

- ``status`` (text and ``-o json``): the leader and every member Ready, as the API server has
  them;
- ``pause``: spec.paused set, the operator's Paused condition True; ``restart`` then refused (the
  operator would not bring the pod back) with exit 3 and nothing evicted; ``resume``;
- ``restart --wait``: the pod evicted through the Eviction API, a new pod of the same name
  Ready again, the quorum still led;
- ``backup``: a QuorumBackup of the right shape created (its controller is not needed here; a
  stand-in CRD is applied when the chart has none, and removed after);
- ``report``: a zip with the KafkaQuorum, pods, claims, events, each pod's log and the
  operator's, and no Secret's value anywhere in it.

And the chart with ``openshift.adaptSecurityContext=force``: the operator's pod and the pods of
the quorums it makes without the ids, a quorum Ready.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
from cluster import Cluster
from kq_real import CHART, NAMESPACE, RealQuorum, create_namespace
from kq_scenarios import Timings, condition, create_and_ready, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
PLUGIN = Path(sys.executable).parent / "kubectl-kq"
BACKUP_CRD = "quorumbackups.kraft.quorum.dev"
# As OpenShift's restricted SCC leaves them to the platform: no runAsUser, runAsGroup, fsGroup.
WITHOUT_IDS = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
IDS = ("runAsUser", "runAsGroup", "fsGroup")


def kq(cluster: Cluster, *args: str, cwd: Path | None = None,
       timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """``kubectl kq ARGS -n quorum`` through the real kubectl, its kubeconfig from
    $KUBECONFIG, the plugin found on PATH."""
    env = {**os.environ, "KUBECONFIG": str(cluster.control_plane.admin),
           "PATH": f"{PLUGIN.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([str(cluster.control_plane.binaries / "kubectl"), "kq", *args,
                           "-n", NAMESPACE], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=timeout_s, check=False)


def stand_in_backup_crd(cluster: Cluster) -> bool:
    """A QuorumBackup CRD of the agreed names when none is installed (True: applied here)."""
    if cluster.control_plane.kubectl("get", "crd", BACKUP_CRD, check=False).returncode == 0:
        return False
    loose = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": BACKUP_CRD},
        "spec": {"group": "kraft.quorum.dev", "scope": "Namespaced",
                 "names": {"kind": "QuorumBackup", "plural": "quorumbackups",
                           "singular": "quorumbackup", "listKind": "QuorumBackupList"},
                 "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                               "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": {
                                   "type": "object",
                                   "properties": {"spec": loose, "status": loose}}}}]}}))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{BACKUP_CRD}",
                    "--timeout=60s")
    return True


def secret_values(cluster: Cluster) -> set[bytes]:
    """Every value of every Secret of the namespace (decoded), long enough to be telling."""
    secrets = json.loads(cluster.kubectl("--namespace", NAMESPACE, "get", "secrets", "-o",
                                         "json"))["items"]
    return {base64.b64decode(v) for s in secrets for v in (s.get("data") or {}).values()
            if len(base64.b64decode(v)) >= 16}


async def test_kubectl_kq_on_a_quorum_without_fixed_ids(
        kube_cluster: Cluster, operator_installed: None, tmp_path: Path) -> None:
    timings = Timings("real")
    quorum = RealQuorum.named(kube_cluster, "plugin", template={"securityContext": WITHOUT_IDS})
    await create_and_ready(quorum, timings)
    for pod in await quorum.pods():
        assert pod["spec"]["securityContext"] == WITHOUT_IDS, pod["spec"]["securityContext"]

    # status
    started = time.monotonic()
    done = kq(kube_cluster, "status", quorum.name, "-o", "json")
    timings.record("kubectl kq status", time.monotonic() - started)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    body = await quorum.quorum()
    assert shown["leader"]["nodeId"] == body["status"]["leaderId"]
    assert [(m["nodeId"], m["role"], m["ready"]) for m in shown["members"]] == [
        (i, "voter", True) for i in (1, 2, 3)]
    started = time.monotonic()
    text = kq(kube_cluster, "status", quorum.name)
    timings.record("kubectl kq status, again", time.monotonic() - started)
    print(f"\n$ kubectl kq status {quorum.name}\n{text.stdout}")
    assert text.returncode == 0 and f"Leader:     node {shown['leader']['nodeId']}, epoch" in \
        text.stdout, text

    # pause, a restart refused while paused, resume
    assert kq(kube_cluster, "pause", quorum.name).stdout.strip() == \
        f"kafkaquorum.kraft.quorum.dev/{quorum.name} paused"

    async def paused() -> bool:
        return condition(await quorum.quorum(), "Paused") == "True"

    await wait_for(quorum, "condition Paused True", paused)
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in await quorum.pods()}
    refused = kq(kube_cluster, "restart", quorum.name, "1")
    assert refused.returncode == 3, refused
    assert refused.stderr.strip().startswith("kubectl kq: refused: spec.paused is true"), refused
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in await quorum.pods()} == uids
    assert kq(kube_cluster, "resume", quorum.name).returncode == 0
    assert (await quorum.quorum())["spec"]["paused"] is False

    async def resumed_ready() -> bool:
        body = await quorum.quorum()
        return condition(body, "Paused") == "False" and condition(body, "Ready") == "True" \
            and all(m.get("caughtUpSince") is not None for m in body["status"]["members"])

    await wait_for(quorum, "Ready, resumed, every voter caught up", resumed_ready)

    # restart through the Eviction API
    started = time.monotonic()
    done = kq(kube_cluster, "restart", quorum.name, "1", "--wait", "--timeout", "10m",
              timeout_s=700)
    timings.record("kubectl kq restart --wait", time.monotonic() - started)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"pod/{quorum.name}-1 evicted", done.stdout
    print(f"\n$ kubectl kq restart {quorum.name} 1 --wait\n{done.stdout}")
    after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in await quorum.pods()}
    assert after[f"{quorum.name}-1"] != uids[f"{quorum.name}-1"]
    assert all(after[n] == uids[n] for n in (f"{quorum.name}-2", f"{quorum.name}-3"))
    reasons = [e["reason"] for e in json.loads(kube_cluster.kubectl(
        "--namespace", NAMESPACE, "get", "events", "-o", "json", "--field-selector",
        f"involvedObject.name={quorum.name}-1"))["items"]]
    assert "Killing" in reasons, reasons

    # backup: the object, its shape
    applied = await asyncio.to_thread(stand_in_backup_crd, kube_cluster)
    try:
        done = kq(kube_cluster, "backup", quorum.name)
        assert done.returncode == 0, done.stderr
        name = done.stdout.strip()
        assert name.startswith(f"{quorum.name}-") and len(name) > len(quorum.name) + 1, name
        made = json.loads(kube_cluster.kubectl("--namespace", NAMESPACE, "get",
                                               f"quorumbackups.kraft.quorum.dev/{name}",
                                               "-o", "json"))
        assert made["apiVersion"] == "kraft.quorum.dev/v1alpha1"
        assert made["kind"] == "QuorumBackup"
        assert made["metadata"]["generateName"] == f"{quorum.name}-"
        assert made["spec"] == {"quorum": quorum.name}

        # report
        started = time.monotonic()
        done = kq(kube_cluster, "report", quorum.name, cwd=tmp_path)
        timings.record("kubectl kq report", time.monotonic() - started)
        assert done.returncode == 0, done.stderr
        bundle = tmp_path / done.stdout.strip()
        with zipfile.ZipFile(bundle) as written:
            files = {n.split("/", 1)[1]: written.read(n) for n in written.namelist()}
        print(f"\n$ kubectl kq report {quorum.name}\n{done.stdout}" +
              "\n".join(f"  {f}" for f in sorted(files)))
    finally:
        if applied:
            kube_cluster.kubectl("delete", "crd", BACKUP_CRD, "--timeout=120s")
    check_report(files, quorum.name, secret_values(kube_cluster))
    await asyncio.to_thread(kube_cluster.kubectl, "--namespace", NAMESPACE, "delete",
                            "kafkaquorum", quorum.name, "--wait=false")
    print(f"\n[scenario real] kubectl kq: {timings.summary()}")


def check_report(files: dict[str, bytes], name: str, secrets: set[bytes]) -> None:
    assert {"README.txt", "kafkaquorum.yaml", "quorumbackups.yaml", "pods.yaml", "pvcs.yaml",
            "events.yaml", "operator/pods.yaml"} <= set(files), sorted(files)
    for node_id in (1, 2, 3):
        assert files[f"logs/{name}-{node_id}/node.log"], sorted(files)
    assert any(f.startswith("operator/logs/") and f.endswith("/operator.log") and files[f]
               for f in files), sorted(files)
    assert b"kind: QuorumBackup" in files["quorumbackups.yaml"]
    assert b"Secrets are never included" in files["README.txt"]
    leaked: list[Any] = [(f, s[:8]) for f, content in files.items() for s in secrets
                         if s in content]
    assert not leaked, leaked
    assert secrets, "the quorum's Secrets (TLS keys, tokens) were found to compare with"


async def test_operator_and_quorum_without_fixed_ids(kube_cluster: Cluster,
                                                     operator_installed: None) -> None:
    """The chart with ``openshift.adaptSecurityContext=force`` (what ``auto`` does on OpenShift):
    the operator's pod without the ids (the image's uid, gid 0) and a quorum it makes
    (``KQ_OPERATOR_POD_IDS=platform``) without them either, Ready."""
    operator_namespace, release, team = "platform-operator", "kqo-platform", "platform"
    for namespace in (operator_namespace, team):
        create_namespace(kube_cluster, namespace)
    kube_cluster.helm("install", release, str(CHART), "--namespace", operator_namespace,
                      "--set", "crds.install=false", "--set", f"watchNamespaces={{{team}}}",
                      "--set", "openshift.adaptSecurityContext=force", "--wait",
                      "--timeout", "5m")
    try:
        [operator] = json.loads(kube_cluster.kubectl(
            "--namespace", operator_namespace, "get", "pods", "-l",
            f"app.kubernetes.io/instance={release}", "-o", "json"))["items"]
        assert not set(IDS) & set(operator["spec"]["securityContext"]), operator["spec"]
        env = {e["name"]: e.get("value") for e in operator["spec"]["containers"][0]["env"]}
        assert env["KQ_OPERATOR_POD_IDS"] == "platform"
        quorum = RealQuorum.named(kube_cluster, "platform", team)
        await create_and_ready(quorum, Timings("real"), replicas=1)
        [pod] = await quorum.pods()
        assert pod["spec"]["securityContext"] == WITHOUT_IDS, pod["spec"]["securityContext"]
    finally:
        kube_cluster.helm("uninstall", release, "--namespace", operator_namespace, "--wait")
        for namespace in (team, operator_namespace):
            kube_cluster.kubectl("delete", "namespace", namespace, "--timeout=300s",
                                 timeout_s=330)
