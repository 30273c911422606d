"""The production example (``manifests/examples/kafkaquorum-production.yaml``) placed by the real
scheduler over three zones: its PriorityClass, its storage class, its zone spread (maxSkew 1,
DoNotSchedule) and its required anti-affinity per host. Five voters one per host need five
nodes: the test adds ``node-4`` (zone-a) and ``node-5`` (zone-b) for its own time, so the voters
can only land 2, 2 and 1 over the zones, and removes them after, with everything it made."""

from __future__ import annotations

import collections
import json
import time
from pathlib import Path

import pytest
from cluster import Cluster
from test_kube_install import kubectl, owned_names, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "manifests" / "examples" / "kafkaquorum-production.yaml"
NAME = "metadata-prod"  # the example's
PRIORITY_CLASS = "metadata-quorum"  # the example's
ZONE_KEY = "topology.kubernetes.io/zone"
# The example's storage class, on the test's hostPath provisioner.
FAST_SSD = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": "fast-ssd"}, "provisioner": "quorum.test/hostpath",
            "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer"}


def placement(cluster: Cluster) -> dict[str, str]:
    """Each voter's node, by pod name."""
    pods = json.loads(kubectl(cluster, "get", "pods", "-l",
                              f"app.kubernetes.io/instance={NAME}", "-o", "json"))["items"]
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods}


def node_names(cluster: Cluster) -> list[str]:
    return sorted(n.split("/", 1)[1] for n in cluster.kubectl("get", "nodes", "-o",
                                                               "name").split())


def millicores(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def cpu_requested(cluster: Cluster) -> dict[str, int]:
    """The CPU (millicores) that the running pods request, by node, every namespace's."""
    pods = json.loads(cluster.kubectl("get", "pods", "--all-namespaces", "-o", "json"))["items"]
    requested: dict[str, int] = collections.Counter()
    for pod in pods:
        if pod["spec"].get("nodeName") and pod["status"].get("phase") in ("Pending", "Running"):
            requested[pod["spec"]["nodeName"]] += sum(
                millicores(((c.get("resources") or {}).get("requests") or {}).get("cpu", "0"))
                for c in pod["spec"]["containers"])
    return dict(sorted(requested.items()))


def test_production_example_spreads_over_zones(kube_cluster: Cluster,
                                               operator_installed: None) -> None:
    nodes_before = node_names(kube_cluster)
    kube_cluster.kubectl("apply", "-f", "-", stdin=json.dumps(FAST_SSD))
    try:
        with kube_cluster.more_nodes("zone-a", "zone-b") as added:
            assert added == ["node-4", "node-5"], added
            try:
                started = time.monotonic()
                kubectl(kube_cluster, "apply", "-f", str(EXAMPLE))
                kubectl(kube_cluster, "wait", "--for=condition=Ready", f"kafkaquorum/{NAME}",
                        "--timeout=600s")
                print(f"\n[kube] production example Ready in {time.monotonic() - started:.1f} s")
                row = kubectl(kube_cluster, "get", "kafkaquorum", NAME).splitlines()[1].split()
                assert row[:4] == [NAME, "True", "True", "5"], row
                nodes = json.loads(kube_cluster.kubectl("get", "nodes", "-o", "json"))["items"]
                zone_of = {n["metadata"]["name"]: n["metadata"]["labels"][ZONE_KEY]
                           for n in nodes}
                voters = placement(kube_cluster)
                zones = collections.Counter(zone_of[node] for node in voters.values())
                print(f"[kube] voters: {dict(sorted(voters.items()))}; per zone: "
                      f"{dict(sorted(zones.items()))}")
                print(f"[kube] CPU requested by node (m, of "
                      f"{nodes[0]['status']['allocatable']['cpu']} cores each): "
                      f"{cpu_requested(kube_cluster)}")
                assert len(voters) == 5 and len(set(voters.values())) == 5, voters
                assert sorted(zones.values()) == [1, 2, 2], zones
                for pod in voters:
                    spec = json.loads(kubectl(kube_cluster, "get", "pod", pod, "-o",
                                              "json"))["spec"]
                    assert spec["priorityClassName"] == PRIORITY_CLASS, spec
                    assert spec["priority"] == 1000000, spec
            finally:
                remove_quorum(kube_cluster)
        # The tests after see the cluster this one found.
        assert node_names(kube_cluster) == nodes_before
        leases = kube_cluster.kubectl("--namespace", "kube-node-lease", "get", "leases", "-o",
                                      "name").split()
        assert sorted(lease.split("/", 1)[1] for lease in leases) == nodes_before, leases
    finally:
        kube_cluster.kubectl("delete", "priorityclass", PRIORITY_CLASS, "--ignore-not-found")
        kube_cluster.kubectl("delete", "storageclass", "fast-ssd", "--ignore-not-found")


def remove_quorum(cluster: Cluster) -> None:
    """The quorum, its claims and their volumes deleted, before its nodes go."""
    claims = owned_names(cluster, NAME, "persistentvolumeclaims")
    volumes = {json.loads(kubectl(cluster, "get", claim, "-o", "json"))["spec"].get(
        "volumeName") for claim in claims} - {None, ""}
    kubectl(cluster, "delete", "kafkaquorum", NAME, "--ignore-not-found", "--timeout=120s")
    wait_for("the quorum's objects collected", lambda: not owned_names(cluster, NAME), 180)
    if claims:
        kubectl(cluster, "delete", *claims, "--ignore-not-found", "--timeout=120s")

    def reclaimed() -> bool:
        left = {n.split("/", 1)[1] for n in cluster.kubectl("get", "pv", "-o", "name").split()}
        return not volumes & left

    wait_for("the released volumes deleted", reclaimed, 120)
