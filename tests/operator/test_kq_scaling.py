"""Scaling 3 -> 5 -> 3 and a rolling upgrade, with the real operator, under writes.

3 -> 5: the voters list of every node grows first (a rolling update: followers first, the
leader last, which resigns on SIGTERM), then nodes 4 and 5 join as observers and are added as
voters one at a time. 5 -> 3: RemoveVoter (decommissioning the node id), then the pod, then the
claim, one node at a time, then one rolling update of the voters list.

Marked slow (about 1.5 minutes on an idle machine): ``python -m pytest -m slow tests/operator``.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from kq_cluster import NAME, Cluster, Writer, create_ready
from kq_harness import condition, cr_path

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


async def scale(cluster: Cluster, **spec: object) -> None:
    await cluster.kube.patch(cr_path(NAME), {"spec": spec})


async def rolled_pods(cluster: Cluster, since: int) -> list[str]:
    events = (await cluster.events())[since:]
    return [message.split()[1] for reason, message in events
            if reason == "PodDeleted" and "(RollingUpdate)" in message]


async def test_scale_up_roll_and_scale_down(cluster: Cluster) -> None:
    await create_ready(cluster)
    writer = Writer(cluster.addresses(range(1, 6)))
    writer.start()
    timings: dict[str, float] = {}
    try:
        # 3 -> 5
        leader = await cluster.leader()
        events = len(await cluster.events())
        started = time.monotonic()
        await scale(cluster, replicas=5)
        await cluster.ready_with(5, timeout_s=300)
        timings["3 -> 5"] = time.monotonic() - started
        rolled = await rolled_pods(cluster, events)
        assert sorted(rolled) == ["kq-1", "kq-2", "kq-3"] and rolled[-1] == f"kq-{leader}"
        configs = await cluster.configs()
        assert [c["QUORUM_CONTROLLER_QUORUM_VOTERS"].count("@") for c in configs.values()] \
            == [5] * 5

        # 5 -> 3: RemoveVoter with decommission, then the pod, then the claim, one node at a
        # time, then one rolling update of the voters list.
        started = time.monotonic()
        await scale(cluster, replicas=3)
        await cluster.ready_with(3, timeout_s=300)

        async def done() -> bool:
            pods, claims = await cluster.objects()
            voters = {c["QUORUM_CONTROLLER_QUORUM_VOTERS"].count("@")
                      for c in (await cluster.configs()).values()}
            return len(pods) == 3 and len(claims) == 3 and voters == {3} and \
                condition(await cluster.get(), "Ready") == "True"

        await cluster.wait("nodes 4 and 5 gone, every node configured with 3", done, 300)
        timings["5 -> 3"] = time.monotonic() - started
        await asyncio.sleep(1)
    finally:
        writer.stop()
    lost = await asyncio.to_thread(writer.lost)
    reasons = [reason for reason, _ in await cluster.events()]
    print(f"\n[operator] {', '.join(f'{k} {v:.1f} s' for k, v in timings.items())}; "
          f"{len(writer.acknowledged)} acknowledged writes, {writer.failures} failed tries, "
          f"{len(lost)} lost")
    assert lost == [] and len(writer.acknowledged) > 100
    assert {"VoterAdded", "VoterRemoved", "ClaimDeleted"} <= set(reasons)
    assert "VoterChangeRefused" not in reasons
    members = sorted(m["nodeId"] for m in (await cluster.status())["members"])
    assert members == [1, 2, 3]
