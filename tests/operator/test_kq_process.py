"""The operator as its image runs it: the ``kafka-quorum-operator`` command in its own process
against an emulated API server, with its health endpoint and the Prometheus metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import kmock
import pytest
from kafka_quorum_operator import KIND
from kafka_quorum_operator.kube import Kube, path
from kafka_quorum_operator.reconcile import CR_API
from kq_harness import NAMESPACE, K8s, cr_path, declare_resources, quorum_object, wait_for

pytestmark = pytest.mark.timeout(120)
# The loopback of each family the host has.
LOOPBACKS = ("127.0.0.1", "[::1]") if socket.has_dualstack_ipv6() else ("127.0.0.1",)


def free_port() -> int:
    """A port free on IPv4 and IPv6 loopback alike (where the host has IPv6)."""
    for _ in range(20):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if not socket.has_dualstack_ipv6():
            return port
        with socket.socket(socket.AF_INET6) as sock6:
            try:
                sock6.bind(("::1", port))
            except OSError:
                continue
        return port
    raise OSError("no port free on both loopbacks")


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode()
    except OSError as error:
        return 0, str(error)


def start_operator(api_server: str, liveness: int, log_path: Path, host: str = "127.0.0.1",
                   **env: str) -> subprocess.Popen[bytes]:
    """The operator's command for ``NAMESPACE``, logging to ``log_path``, its health endpoint on
    ``host`` (empty: every interface, as the chart runs it); ``env`` adds KQ_OPERATOR_*
    settings."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "kafka_quorum_operator", "--namespace", NAMESPACE,
             f"--liveness=http://{host}:{liveness}/healthz"],
            stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "KQ_OPERATOR_API_SERVER": api_server,
                 "KQ_OPERATOR_INTERVAL": "0.3", "KQ_OPERATOR_NAMESPACE": NAMESPACE, **env})


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGINT (kopf's graceful stop), then SIGKILL after 20 s."""
    process.send_signal(signal.SIGINT)
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


async def test_the_operator_command(tmp_path: Path) -> None:
    async with K8s() as emulator:
        declare_resources(emulator)
        async with kmock.Server(emulator) as server:
            url = str(server.url).rstrip("/")
            liveness, metrics = free_port(), free_port()
            process = start_operator(url, liveness, tmp_path / "operator.log", host="",
                                     KQ_OPERATOR_METRICS_PORT=str(metrics))
            kube = Kube.connect(url)
            try:
                await kube.create(path(KIND, NAMESPACE, api=CR_API), quorum_object("kq", 3))

                async def claims() -> int:
                    found = await kube.list(path("PersistentVolumeClaim", NAMESPACE), {})
                    return len(found) == 3

                await wait_for("the operator to create 3 claims", claims, 60,
                               (tmp_path / "operator.log").read_text)

                async def reconciled() -> bool:
                    _, text = await asyncio.to_thread(fetch, f"http://127.0.0.1:{metrics}/metrics")
                    return 'kafka_quorum_operator_reconciles_total{result="ok"}' in text

                # The pass that created the claims may still be under way: its count comes when
                # it ends.
                await wait_for("a pass to end ok", reconciled, 60,
                               (tmp_path / "operator.log").read_text)
                body = await kube.get(cr_path("kq"))
                assert body is not None and body["status"]["clusterId"]
                lease = await kube.get(path("Lease", NAMESPACE, "kafka-quorum-operator"))
                assert lease is not None and lease["spec"]["holderIdentity"]

                # Both endpoints on every interface: an IPv4-only cluster probes and scrapes the
                # pod's IPv4 address, an IPv6-only one its IPv6 address.
                for host in LOOPBACKS:
                    status, text = await asyncio.to_thread(
                        fetch, f"http://{host}:{liveness}/healthz")
                    assert status == 200 and "lastReconcile" in text, (host, text)
                    assert json.loads(text)["leading"] is True
                    status, text = await asyncio.to_thread(
                        fetch, f"http://{host}:{metrics}/metrics")
                    assert status == 200, (host, text)
                    assert 'kafka_quorum_operator_reconciles_total{result="ok"}' in text
                    assert 'kafka_quorum_operator_actions_total{kind="CreateClaim",' \
                        'result="NONE"}' in text
            finally:
                await asyncio.to_thread(stop, process)
                kube.close()
            lines = (tmp_path / "operator.log").read_text().splitlines()
            assert any(line.startswith("{") and '"message"' in line for line in lines)


@contextlib.contextmanager
def operators(api_server: str, directory: Path,
              identities: tuple[str, ...]) -> Iterator[dict[str, int]]:
    """One operator process per identity; yields each one's liveness port."""
    ports = {identity: free_port() for identity in identities}
    processes = []
    try:
        for identity, port in ports.items():
            processes.append(start_operator(api_server, port, directory / f"{identity}.log",
                                            KQ_OPERATOR_IDENTITY=identity))
        yield ports
    finally:
        for process in processes:
            stop(process)


@pytest.mark.slow  # tens of seconds: CI's slow operator step
async def test_the_readiness_probe_passes_on_the_leader_and_on_a_standby(
        tmp_path: Path) -> None:
    """The chart's readiness probe asks the operator's health endpoint: it answers once the
    operator has started, whether it holds the Lease or stands by; its body says which
    (``leading``)."""
    async with K8s() as emulator:
        declare_resources(emulator)
        async with kmock.Server(emulator) as server:
            url = str(server.url).rstrip("/")
            kube = Kube.connect(url)

            def logs() -> str:
                return "\n".join(f.read_text()[-2000:] for f in tmp_path.glob("*.log"))

            async def holder() -> str | None:
                lease = await kube.get(path("Lease", NAMESPACE, "kafka-quorum-operator"))
                return None if lease is None else lease["spec"].get("holderIdentity")

            async def probe(port: int) -> dict[str, object] | None:
                status, text = await asyncio.to_thread(
                    fetch, f"http://127.0.0.1:{port}/healthz")
                return json.loads(text) if status == 200 else None

            try:
                with operators(url, tmp_path, ("first",)) as first:
                    await wait_for("the first operator to take the lease", holder, 60, logs)
                    with operators(url, tmp_path, ("second",)) as second:
                        answered = await wait_for("the standby to be ready",
                                                  lambda: probe(second["second"]), 60, logs)
                        assert answered["leading"] is False, answered
                        assert await holder() == "first"

                        async def leader_says_so() -> bool:
                            answered = await probe(first["first"])
                            return answered is not None and answered["leading"] is True

                        await wait_for("the leader to be ready and leading", leader_says_so,
                                       30, logs)
            finally:
                kube.close()
