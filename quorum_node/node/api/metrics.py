"""``GET /metrics`` (Prometheus' text format, ``quorum_node.node.metrics``) and the probes:
``GET /healthz`` (the node can serve: neither it nor its state machine stopped on a failure) and
``GET /readyz`` (it serves now: a leader that knows its high watermark, or a follower that has
learned it). A probe answers ``ok``/why in text when it passes, and the one error body (503
``NODE_FAILED`` / ``NOT_READY``) when it does not."""

from __future__ import annotations

from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from quorum_node.node.api.http import ApiError
from quorum_node.node.errors import ErrorCode
from quorum_node.node.metrics import metrics_for
from quorum_node.node.runtime import QuorumNode
from quorum_node.raft.state import RaftState


def failure_of(node: QuorumNode) -> str | None:
    """Why the node cannot serve any more, if it cannot: the core stopped, or the KV applier did
    (every KV read and write would then fail or go stale)."""
    if node.failure is not None:
        return f"stopped after a failure: {node.failure}"
    if node.state_machine.failure is not None:
        return f"the KV state machine stopped: {node.state_machine.failure}"
    return None


def is_ready(node: QuorumNode) -> tuple[bool, str]:
    """Ready means able to serve: the leader once its high watermark is known (its LeaderChange
    is committed), or a follower that has learned the committed offset from its leader."""
    failure = failure_of(node)
    if failure is not None:
        return False, failure
    status = node.status()
    if node.log_dir.log.full:
        return False, (f"the log's disk is full: appends are refused until space comes back "
                       f"({status.state} in epoch {status.epoch})")
    if status.high_watermark is None:
        return False, f"{status.state} in epoch {status.epoch}, no committed offset known yet"
    if status.leader_has_committed:
        return True, f"leader of epoch {status.epoch}"
    if status.state is RaftState.FOLLOWER:
        return True, f"following {status.leader_id} in epoch {status.epoch}"
    return False, f"{status.state} in epoch {status.epoch}"


def metrics_routes(node: QuorumNode) -> list[web.RouteDef]:
    metrics = metrics_for(node)

    async def scrape(_: web.Request) -> web.Response:
        return web.Response(body=metrics.exposition(),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    return [web.get("/metrics", scrape)]


def probe_routes(node: QuorumNode) -> list[web.RouteDef]:
    async def healthz(_: web.Request) -> web.Response:
        failure = failure_of(node)
        if failure is not None:
            raise ApiError.of(ErrorCode.NODE_FAILED, failure)
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        ready, why = is_ready(node)
        if not ready:
            raise ApiError.of(ErrorCode.NOT_READY, why)
        return web.Response(text=f"{why}\n")

    return [web.get("/healthz", healthz), web.get("/readyz", readyz)]
