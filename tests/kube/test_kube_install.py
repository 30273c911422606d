"""Installed as a user installs it: ``helm install`` of the chart (the ``operator_installed``
fixture), ``kubectl apply -f`` of the README's example KafkaQuorum, ``kubectl wait`` for Ready,
``kubectl get`` with the CRD's printer columns, ``kubectl scale`` through the scale subresource,
``helm test``; invalid specs refused by the API server with the CRD's own messages; and
``kubectl delete`` of the KafkaQuorum: the garbage collector removes every object it owns, in the
background and in the foreground, and its claims stay unless ``storage.deleteClaims``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cluster import Cluster
from kq_real import NAMESPACE, OPERATOR_RELEASE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "manifests" / "examples" / "kafkaquorum-minimal.yaml"
NAME = "metadata"  # the example's
CRD = ROOT / "crds" / "kafkaquorums.kraft.quorum.dev.yaml"
# What a quorum owns, for the garbage collector (claims are checked apart).
OWNED = "pods,configmaps,services,serviceaccounts,secrets,poddisruptionbudgets,networkpolicies"


def kubectl(cluster: Cluster, *args: str, stdin: str | None = None, check: bool = True
            ) -> str:
    return cluster.kubectl("--namespace", NAMESPACE, *args, stdin=stdin, check=check,
                           timeout_s=600)


def refusal(cluster: Cluster, manifest: dict[str, object]) -> str:
    done = cluster.control_plane.kubectl("--namespace", NAMESPACE, "apply", "-f", "-",
                                         stdin=json.dumps(manifest), check=False)
    assert done.returncode != 0, f"accepted: {manifest}"
    return done.stderr


def quorum(name: str, **spec: object) -> dict[str, object]:
    return {"apiVersion": "kraft.quorum.dev/v1alpha1", "kind": "KafkaQuorum",
            "metadata": {"name": name}, "spec": spec}


def wait_for(what: str, check: Callable[[], bool], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def owned_names(cluster: Cluster, name: str, kinds: str = OWNED) -> list[str]:
    out = kubectl(cluster, "get", kinds, "-o", "name", "-l",
                  f"app.kubernetes.io/instance={name}")
    return out.split()


def test_readme_example(kube_cluster: Cluster, operator_installed: None) -> None:
    started = time.monotonic()
    kubectl(kube_cluster, "apply", "-f", str(EXAMPLE))
    kubectl(kube_cluster, "wait", "--for=condition=Ready", f"kafkaquorum/{NAME}",
            "--timeout=300s")
    print(f"\n[kube] README example Ready in {time.monotonic() - started:.1f} s")
    table = kubectl(kube_cluster, "get", "kafkaquorum", NAME).splitlines()
    header, row = table[0].split(), table[1].split()
    assert header[:6] == ["NAME", "READY", "QUORATE", "VOTERS", "LEADER", "EPOCH"], table
    assert row[:4] == [NAME, "True", "True", "3"], table
    # helm test: quorum-admin describe --status from a pod of the chart, over TLS.
    done = kube_cluster.helm("test", OPERATOR_RELEASE, "--namespace", NAMESPACE, "--logs")
    assert "Phase:          Succeeded" in done.stdout, done.stdout


def test_scale_subresource(kube_cluster: Cluster, operator_installed: None) -> None:
    """``kubectl scale`` writes spec.replicas through the scale subresource (and its CRD
    validation: an even count is refused); ``kubectl get --subresource=scale`` reads it."""
    done = kube_cluster.control_plane.kubectl(
        "--namespace", NAMESPACE, "scale", "kafkaquorum", NAME, "--replicas=4", check=False)
    assert done.returncode != 0 and "replicas must be odd" in done.stderr, done.stderr
    kubectl(kube_cluster, "scale", "kafkaquorum", NAME, "--replicas=5")

    def voters(count: int) -> bool:
        body = json.loads(kubectl(kube_cluster, "get", "kafkaquorum", NAME, "-o", "json"))
        status = body.get("status") or {}
        return status.get("voters") == count and any(
            c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions")
            or [])

    wait_for("5 voters", lambda: voters(5))
    scale = json.loads(kubectl(kube_cluster, "get", "kafkaquorum", NAME, "--subresource=scale",
                               "-o", "json"))
    assert scale["spec"]["replicas"] == 5 and scale["status"]["replicas"] == 5, scale
    assert "app.kubernetes.io/instance=metadata" in scale["status"]["selector"], scale
    kubectl(kube_cluster, "scale", "kafkaquorum", NAME, "--replicas=3")
    wait_for("3 voters", lambda: voters(3))


@pytest.mark.parametrize(("spec", "message"), [
    ({"replicas": 4}, "replicas must be odd"),
    ({"replicas": "three"}, 'spec.replicas: Invalid value: "string": spec.replicas in body '
                            "must be of type integer"),
    ({"replicas": 3, "colour": "blue"}, 'unknown field "spec.colour"'),
    ({"replicas": 3, "config": {"requestTimeoutMs": 400}},
     "requestTimeoutMs must exceed the 500 ms fetch long-poll"),
])
def test_invalid_specs_refused(kube_cluster: Cluster, operator_installed: None,
                               spec: dict[str, object], message: str) -> None:
    stderr = refusal(kube_cluster, quorum("invalid", **spec))
    assert message in stderr, stderr
    assert kubectl(kube_cluster, "get", "kafkaquorum", "invalid", check=False) == ""


def test_storage_class_is_immutable(kube_cluster: Cluster, operator_installed: None) -> None:
    body = json.loads(kubectl(kube_cluster, "get", "kafkaquorum", NAME, "-o", "json"))
    spec = {**body["spec"], "storage": {**body["spec"].get("storage", {}),
                                        "storageClassName": "other"}}
    stderr = refusal(kube_cluster, {**quorum(NAME), "spec": spec})
    assert "storageClassName is immutable" in stderr, stderr


def test_operator_runs_as_any_uid(kube_cluster: Cluster, operator_installed: None) -> None:
    """The operator's pod as a uid its image does not list (OpenShift's restricted SCC assigns
    one from the namespace's range): it starts, takes the Lease and reconciles. kopf once
    crashed at start there, naming itself after a user it could not look up."""
    uid = "1000770000"
    kube_cluster.helm("upgrade", OPERATOR_RELEASE, str(ROOT / "helm" / "kafka-quorum-operator"),
                      "--namespace", NAMESPACE, "--reuse-values", "--wait", "--timeout", "5m",
                      "--set", f"podSecurityContext.runAsUser={uid}",
                      "--set", f"podSecurityContext.runAsGroup={uid}")
    pods = json.loads(kubectl(kube_cluster, "get", "pods", "-l",
                              "app.kubernetes.io/name=kafka-quorum-operator", "-o", "json"))
    running = [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
    assert [p["spec"]["securityContext"]["runAsUser"] for p in running] == [int(uid)]
    kubectl(kube_cluster, "patch", "kafkaquorum", NAME, "--type=merge", "-p",
            json.dumps({"spec": {"config": {"electionTimeoutMs": 1100}}}))

    def rolled() -> bool:
        body = json.loads(kubectl(kube_cluster, "get", "kafkaquorum", NAME, "-o", "json"))
        status = body.get("status") or {}
        return status.get("observedGeneration") == body["metadata"]["generation"] and any(
            c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions")
            or [])

    wait_for("the change reconciled by the operator running as another uid", rolled)
    kube_cluster.helm("rollback", OPERATOR_RELEASE, "--namespace", NAMESPACE, "--wait",
                      "--timeout", "5m")


def test_delete_collects_owned_objects(kube_cluster: Cluster, operator_installed: None) -> None:
    """Background deletion (kubectl's default): the KafkaQuorum goes at once, the garbage
    collector then removes what it owns; the claims, not owned by default, stay with their
    data until deleted, and their volumes are then reclaimed."""
    claims = owned_names(kube_cluster, NAME, "persistentvolumeclaims")
    assert len(claims) == 3, claims
    volumes = {json.loads(kubectl(kube_cluster, "get", claim, "-o", "json"))["spec"][
        "volumeName"] for claim in claims}
    kubectl(kube_cluster, "delete", "kafkaquorum", NAME, "--timeout=120s")
    wait_for("the owned objects collected", lambda: not owned_names(kube_cluster, NAME), 180)
    assert owned_names(kube_cluster, NAME, "persistentvolumeclaims") == claims
    kubectl(kube_cluster, "delete", *claims, "--timeout=120s")

    def reclaimed() -> bool:
        left = {n.split("/", 1)[1] for n in kube_cluster.kubectl("get", "pv", "-o",
                                                                  "name").split()}
        return not volumes & left

    wait_for("the released volumes deleted", reclaimed, 120)


def test_foreground_delete_with_claims(kube_cluster: Cluster, operator_installed: None) -> None:
    """``--cascade=foreground`` with ``storage.deleteClaims``: the KafkaQuorum stays until the
    garbage collector has deleted every dependent that blocks its deletion, the claims among
    them."""
    name = "disposable"
    kubectl(kube_cluster, "apply", "-f", "-", stdin=json.dumps(quorum(
        name, replicas=1, storage={"deleteClaims": True})))
    kubectl(kube_cluster, "wait", "--for=condition=Ready", f"kafkaquorum/{name}",
            "--timeout=300s")
    assert len(owned_names(kube_cluster, name, "persistentvolumeclaims")) == 1
    kubectl(kube_cluster, "delete", "kafkaquorum", name, "--cascade=foreground",
            "--timeout=180s")
    assert owned_names(kube_cluster, name, f"{OWNED},persistentvolumeclaims") == []
