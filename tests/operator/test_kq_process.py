"""The operator as its image runs it: the ``kafka-quorum-operator`` command in its own process
against an emulated API server, with kopf's liveness endpoint and the Prometheus metrics."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import kmock
import pytest
from kafka_quorum_operator import KIND
from kafka_quorum_operator.kube import Kube, path
from kafka_quorum_operator.reconcile import CR_API
from kq_harness import NAMESPACE, K8s, cr_path, declare_resources, quorum_object, wait_for

pytestmark = pytest.mark.timeout(120)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode()
    except OSError as error:
        return 0, str(error)


async def test_the_operator_command(tmp_path: Path) -> None:
    async with K8s() as emulator:
        declare_resources(emulator)
        async with kmock.Server(emulator) as server:
            url = str(server.url).rstrip("/")
            liveness, metrics = free_port(), free_port()
            log = (tmp_path / "operator.log").open("wb")
            process = subprocess.Popen(
                [sys.executable, "-m", "kafka_quorum_operator", "--namespace", NAMESPACE,
                 f"--liveness=http://127.0.0.1:{liveness}/healthz"],
                stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "KQ_OPERATOR_API_SERVER": url, "KQ_OPERATOR_INTERVAL": "0.3",
                     "KQ_OPERATOR_METRICS_PORT": str(metrics),
                     "KQ_OPERATOR_NAMESPACE": NAMESPACE})
            kube = Kube.connect(url)
            try:
                await kube.create(path(KIND, NAMESPACE, api=CR_API), quorum_object("kq", 3))

                async def claims() -> int:
                    found = await kube.list(path("PersistentVolumeClaim", NAMESPACE), {})
                    return len(found) == 3

                await wait_for("the operator to create 3 claims", claims, 60,
                               (tmp_path / "operator.log").read_text)
                body = await kube.get(cr_path("kq"))
                assert body is not None and body["status"]["clusterId"]
                lease = await kube.get(path("Lease", NAMESPACE, "kafka-quorum-operator"))
                assert lease is not None and lease["spec"]["holderIdentity"]

                status, text = await asyncio.to_thread(
                    fetch, f"http://127.0.0.1:{liveness}/healthz")
                assert status == 200 and "lastReconcile" in text
                status, text = await asyncio.to_thread(
                    fetch, f"http://127.0.0.1:{metrics}/metrics")
                assert status == 200
                assert 'kafka_quorum_operator_reconciles_total{result="ok"}' in text
                assert 'kafka_quorum_operator_actions_total{kind="CreateClaim",result="NONE"}' \
                    in text
            finally:
                process.send_signal(signal.SIGINT)
                try:
                    await asyncio.to_thread(process.wait, 20)
                except subprocess.TimeoutExpired:
                    process.kill()
                log.close()
                kube.close()
            lines = (tmp_path / "operator.log").read_text().splitlines()
            assert any(line.startswith("{") and '"message"' in line for line in lines)
