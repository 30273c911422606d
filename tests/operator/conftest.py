"""The fixtures of the operator's integration tests: ``cluster`` (kq_cluster.py), and ``kube``,
a client of the emulated API server alone (no kubelet, no operator)."""

from collections.abc import AsyncIterator

import kmock
import pytest
from kafka_quorum_operator.kube import Kube
from kq_cluster import cluster
from kq_harness import K8s, declare_resources

__all__ = ["cluster", "kube"]


@pytest.fixture
async def kube() -> AsyncIterator[Kube]:
    async with K8s() as emulator:
        declare_resources(emulator)
        async with kmock.Server(emulator) as server:
            client = Kube.connect(str(server.url).rstrip("/"))
            try:
                yield client
            finally:
                client.close()
