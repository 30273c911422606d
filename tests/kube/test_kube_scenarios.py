"""The operator's scenarios (``tests/operator/kq_scenarios.py``, the same functions the default
suite runs on the emulated API server and ``e2e/test_kind.py`` on kind) on the real control plane:
the operator installed by ``helm install`` as the chart's Deployment, under the chart's RBAC, the
quorum's namespace under the restricted Pod Security Standard, volumes from the dynamic provisioner,
pods on the process kubelets. Every node setting and operator timing is its default. Timings are
printed (``-s``)."""

from __future__ import annotations

import pytest
from cluster import Cluster
from kq_real import RealQuorum
from kq_scenarios import Timings, lifecycle, scaling

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]


async def test_lifecycle(kube_cluster: Cluster, operator_installed: None) -> None:
    quorum = RealQuorum.named(kube_cluster, "lifecycle")
    try:
        await lifecycle(quorum, Timings("real"), hold_s=20)
    finally:
        print(f"\n[kube] RSS MiB: {kube_cluster.rss_mib()}")
        kube_cluster.kubectl("--namespace", quorum.namespace, "delete", "kafkaquorum",
                             quorum.name, "--wait=false", check=False)


async def test_scaling(kube_cluster: Cluster, operator_installed: None) -> None:
    quorum = RealQuorum.named(kube_cluster, "scaling")
    try:
        await scaling(quorum, Timings("real"))
    finally:
        print(f"\n[kube] RSS MiB: {kube_cluster.rss_mib()}")
        kube_cluster.kubectl("--namespace", quorum.namespace, "delete", "kafkaquorum",
                             quorum.name, "--wait=false", check=False)
