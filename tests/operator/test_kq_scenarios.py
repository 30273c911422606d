"""The operator's scenarios (``kq_scenarios``) on the emulated cluster (``kq_harness``: new pod
IPs, names resolved by the nodes, peer names verified, replaced pods slow to start): the same
functions ``tests/kube/test_kube_scenarios.py`` runs on a real control plane built from source and
``e2e/test_kind.py`` on kind (e2e/README.md says what each backend shows). The lifecycle runs with
the operator's default timings (a pass every 5 s, and at once on a pod or claim event; a
replacement caught up for 10 s before AddVoter). Timings are printed (``-s``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kq_cluster import running_cluster
from kq_emulated import EmulatedQuorum
from kq_scenarios import Timings, create_and_ready, heal_evicted, lifecycle, scaling

pytestmark = pytest.mark.timeout(1800)


@pytest.mark.slow
async def test_lifecycle(tmp_path: Path) -> None:
    """The heals (and everything else here) with the operator's default timings (minutes: CI's
    step of the operator's slow scenarios)."""
    async with running_cluster(tmp_path) as cluster:
        await lifecycle(EmulatedQuorum(cluster, {}), Timings("emulated"), hold_s=6)
        assert cluster.operator.alive and cluster.operator.error is None


async def test_scaling(tmp_path: Path) -> None:
    """Scaling with a pass every second and a new member caught up for 1 s before it is
    added: the order of the steps is the point here, not the operator's waits (CI's time)."""
    async with running_cluster(tmp_path, KQ_OPERATOR_INTERVAL="1") as cluster:
        quorum = EmulatedQuorum(cluster, {"remediation": {"enabled": True,
                                                          "minCaughtUpSeconds": 1}})
        await scaling(quorum, Timings("emulated"))


@pytest.mark.slow
async def test_evicted_pods(tmp_path: Path) -> None:
    """Pods ended by their kubelet (phase Failed) are deleted and made again, with the
    operator's default timings."""
    async with running_cluster(tmp_path) as cluster:
        quorum = EmulatedQuorum(cluster, {})
        timings = Timings("emulated")
        await create_and_ready(quorum, timings)
        await heal_evicted(quorum, timings)
