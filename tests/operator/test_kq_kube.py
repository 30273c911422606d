"""The operator's API calls (``kube.Kube`` over the official client) against the emulator: label
selectors, pagination, server-side apply, conditional writes, the retry policy; and the Lease's
leader election with controlled clocks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import aiohttp
import kmock
import pytest
from kafka_quorum_operator import MANAGER, kube
from kafka_quorum_operator import opmetrics as m
from kafka_quorum_operator.kube import Kube, KubeError, path
from kafka_quorum_operator.lease import LeaderElector
from kq_harness import NAMESPACE, K8s, declare_resources
from prometheus_client import REGISTRY, generate_latest

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def api() -> AsyncIterator[tuple[Kube, K8s]]:
    async with K8s() as emulator:
        declare_resources(emulator)
        async with kmock.Server(emulator) as server:
            client = Kube.connect(str(server.url).rstrip("/"))
            try:
                yield client, emulator
            finally:
                client.close()


def config_map(name: str, labels: dict[str, str] | None = None, **data: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels or {}},
            "data": data}


async def test_list_filters_by_label_on_the_server_and_paginates(
        api: tuple[Kube, K8s], monkeypatch: pytest.MonkeyPatch) -> None:
    client, emulator = api
    for i in range(7):
        await client.create(path("ConfigMap", NAMESPACE),
                            config_map(f"ours-{i}", {"app": "kq", "tier": "a" if i % 2 else "b"}))
    await client.create(path("ConfigMap", NAMESPACE), config_map("foreign", {"app": "other"}))
    monkeypatch.setattr(kube, "PAGE_SIZE", 3)
    found = await client.list(path("ConfigMap", NAMESPACE), {"app": "kq"})
    assert sorted(i["metadata"]["name"] for i in found) == [f"ours-{i}" for i in range(7)]
    lists = [r for r in emulator.seen if r.action == kmock.action.LIST]
    assert [r.params.get("limit") for r in lists] == ["3", "3", "3"]
    assert all(r.params.get("labelSelector") == "app=kq" for r in lists)
    assert [len(i) for i in [await client.list(path("ConfigMap", NAMESPACE),
                                               {"app": "kq", "tier": "a"})]] == [3]


async def test_a_watch_with_a_label_selector_streams_only_matching_objects(
        api: tuple[Kube, K8s]) -> None:
    client, _ = api
    await client.create(path("ConfigMap", NAMESPACE), config_map("before", {"app": "kq"}))
    await client.create(path("ConfigMap", NAMESPACE), config_map("foreign", {"app": "other"}))
    url = client.api.configuration.host + path("ConfigMap", NAMESPACE)
    names: list[str] = []
    async with aiohttp.ClientSession() as session, session.get(
            url, params={"watch": "true", "labelSelector": "app=kq"}) as response:

        async def read() -> None:
            async for line in response.content:
                if line.strip():
                    names.append(json.loads(line)["object"]["metadata"]["name"])

        reader = asyncio.get_running_loop().create_task(read())
        await client.create(path("ConfigMap", NAMESPACE), config_map("other-2", {"app": "x"}))
        await client.create(path("ConfigMap", NAMESPACE), config_map("after", {"app": "kq"}))
        await asyncio.sleep(0.5)
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
    assert names == ["before", "after"]


async def test_server_side_apply_owns_its_fields(api: tuple[Kube, K8s]) -> None:
    client, _ = api
    url = path("ConfigMap", NAMESPACE, "applied")
    created = await client.apply(config_map("applied", {"app": "kq"}, a="1", b="2"))
    assert created["data"] == {"a": "1", "b": "2"} and created["metadata"]["uid"]
    # Another writer's field survives the operator's apply; a field the operator no longer
    # applies goes; a field it applies wins.
    await client.patch(url, {"data": {"theirs": "x", "a": "changed"}})
    await client.apply(config_map("applied", {"app": "kq"}, a="1"))
    found = await client.get(url)
    assert found is not None and found["data"] == {"a": "1", "theirs": "x"}
    managers = [e["manager"] for e in found["metadata"]["managedFields"]]
    assert managers == [MANAGER]


async def test_a_write_naming_an_old_resource_version_conflicts(api: tuple[Kube, K8s]) -> None:
    client, _ = api
    created = await client.create(path("ConfigMap", NAMESPACE), config_map("cas"))
    version = created["metadata"]["resourceVersion"]
    url = path("ConfigMap", NAMESPACE, "cas")
    await client.patch(url, {"metadata": {"resourceVersion": version}, "data": {"a": "1"}})
    with pytest.raises(KubeError) as raised:
        await client.patch(url, {"metadata": {"resourceVersion": version}, "data": {"a": "2"}})
    assert raised.value.status == 409


async def test_an_eviction_deletes_the_pod(api: tuple[Kube, K8s]) -> None:
    client, emulator = api
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "kq-1", "namespace": NAMESPACE},
           "spec": {"containers": [{"name": "node", "image": "quorum-node"}]}}
    await client.create(path("Pod", NAMESPACE), pod)
    assert await client.evict(NAMESPACE, "kq-1") is True
    found = await client.get(path("Pod", NAMESPACE, "kq-1"))
    assert found is None or found["metadata"].get("deletionTimestamp"), found
    assert [r.subresource for r in emulator.seen if r.method == "POST"][-1] == "eviction"
    assert await client.evict(NAMESPACE, "gone") is True


async def test_an_eviction_the_budget_refuses_is_false(
        flaky: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """429 past the retries (the PodDisruptionBudget allows no disruption): False, no error."""
    monkeypatch.setattr(kube, "RETRY", kube.RETRY.new(backoff_factor=0.01))
    total = kube.RETRY.total
    assert isinstance(total, int)  # RETRY counts its tries
    _Flaky.answers = [429] * (total + 1)
    client = Kube.connect(flaky)
    try:
        assert await client.evict(NAMESPACE, "kq-1") is False
    finally:
        client.close()
    assert _Flaky.answers == []


class _Flaky(BaseHTTPRequestHandler):
    """Answers 429, then 503, then the object: the client's retry policy must get through."""

    answers: ClassVar[list[int]] = []

    def do_GET(self) -> None:
        status = self.answers.pop(0) if self.answers else 200
        body = b'{"kind": "ConfigMap", "metadata": {"name": "x"}}' if status == 200 else \
            b'{"message": "slow down"}'
        self.send_response(status)
        if status == 429:
            self.send_header("Retry-After", "0")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def flaky() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


async def test_429_and_5xx_are_retried(flaky: str) -> None:
    _Flaky.answers = [429, 503, 500]
    client = Kube.connect(flaky)
    try:
        found = await client.get(path("ConfigMap", NAMESPACE, "x"))
    finally:
        client.close()
    assert found is not None and found["metadata"]["name"] == "x"
    assert _Flaky.answers == []


async def test_a_dead_server_is_one_kube_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube, "RETRY", kube.RETRY.new(backoff_factor=0.01))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = Kube.connect(f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(KubeError) as raised:
            await client.get(path("ConfigMap", NAMESPACE, "x"))
    finally:
        client.close()
    assert raised.value.status == 0


# --- leader election ------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_lease_expiry_is_judged_on_the_local_clock(api: tuple[Kube, K8s]) -> None:
    client, _ = api
    clock_a, clock_b = Clock(), Clock()
    clock_b.now = -5e6  # another machine's monotonic clock: never compared with A's
    a = LeaderElector(client, NAMESPACE, "lease", "a", clock=clock_a)
    b = LeaderElector(client, NAMESPACE, "lease", "b", clock=clock_b, wall_clock=lambda: 0.0)
    assert await a.try_acquire_or_renew() and a.leading
    assert not await b.try_acquire_or_renew() and not b.leading
    # A renews on its own schedule; B sees each renewal as a change and keeps waiting.
    for _ in range(10):
        clock_a.now += 2
        clock_b.now += 2
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()
    # A stops (paused): it stops counting itself leader after the renew deadline (10 s) on its
    # own clock; B takes over only once the lease duration (15 s) passed on B's clock since it
    # last saw the lease change.
    clock_a.now += 10
    assert not a.leading
    for step in range(8):
        clock_b.now += 2
        acquired = await b.try_acquire_or_renew()
        assert acquired == (step == 7), step  # 14 s: not yet; 16 s: taken
    assert b.leading
    lease = await client.get(path("Lease", NAMESPACE, "lease"))
    assert lease is not None and lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1
    # A, resumed, finds the lease another's and stays a follower.
    assert not await a.try_acquire_or_renew() and not a.leading


async def test_two_acquirers_one_wins(api: tuple[Kube, K8s]) -> None:
    client, _ = api
    electors = [LeaderElector(client, NAMESPACE, "race", name) for name in "abcd"]
    won = await asyncio.gather(*(e.try_acquire_or_renew() for e in electors),
                               return_exceptions=True)
    assert [w for w in won if w is True] == [True], won


async def test_a_released_lease_is_taken_at_once(api: tuple[Kube, K8s]) -> None:
    """Released at shutdown (client-go's ReleaseOnCancel): the holder stops leading at once, and
    a standby that saw it renewed a moment ago acquires it on its next round, not a lease
    duration later; a replica that does not hold the lease releases nothing."""
    client, _ = api
    clock = Clock()
    a = LeaderElector(client, NAMESPACE, "lease", "a", clock=clock)
    b = LeaderElector(client, NAMESPACE, "lease", "b", clock=clock)
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    assert not await b.release()
    assert await a.release() and not a.leading
    lease = await client.get(path("Lease", NAMESPACE, "lease"))
    assert lease is not None and "holderIdentity" not in lease["spec"]
    assert lease["spec"]["leaseDurationSeconds"] == 1
    clock.now += 0.1
    assert await b.try_acquire_or_renew() and b.leading
    lease = await client.get(path("Lease", NAMESPACE, "lease"))
    assert lease is not None and lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1
    assert not await a.release(), "released a lease it no longer holds"
    assert await client.get(path("Lease", NAMESPACE, "lease")) == lease


def exported(name: str) -> str:
    """The lines of the operator's metric ``name`` its registry exports now."""
    return "\n".join(line for line in generate_latest(REGISTRY).decode().splitlines()
                     if line.startswith(name + "{"))


async def test_a_replica_that_loses_the_lease_stops_exporting_per_quorum_gauges(
        api: tuple[Kube, K8s]) -> None:
    """The holder exports each quorum's gauges; once another replica holds the lease, the
    former holder's elector (its own loop, no reconciliation pass asking) drops them, so that a
    scrape of both replicas shows each quorum's figures once, the holder's."""
    client, _ = api
    clock_a, clock_b = Clock(), Clock()
    a = LeaderElector(client, NAMESPACE, "gauges", "a", clock=clock_a, retry_period_s=0.05,
                      on_lost=m.forget_quorums)
    b = LeaderElector(client, NAMESPACE, "gauges", "b", clock=clock_b)
    assert await a.try_acquire_or_renew() and a.leading
    m.QUORUM_LOST.labels("team-a", "kq").set(1)
    m.LAST_BACKUP.labels("team-a", "kq").set(1_700_000_000)
    m.export_remediation("team-a", "kq", {"result": "InProgress"})
    assert 'name="kq",namespace="team-a"} 1.0' in exported("kafka_quorum_operator_quorum_lost")
    # A stops renewing (paused); B finds the lease expired on its own clock and takes it.
    assert not await b.try_acquire_or_renew()
    clock_b.now += 16
    assert await b.try_acquire_or_renew()
    task = asyncio.get_running_loop().create_task(a.run())  # A resumed
    try:
        for _ in range(200):
            if not exported("kafka_quorum_operator_quorum_lost"):
                break
            await asyncio.sleep(0.05)
        for gauge in ("quorum_lost", "remediation_in_progress", "last_backup_timestamp_seconds"):
            assert exported(f"kafka_quorum_operator_{gauge}") == "", gauge
        assert not a.leading
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        m.forget_quorums()
