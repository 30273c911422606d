"""The HTTP application of a node: peer RPCs (added by the runtime), health probes, and the client
and admin APIs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from quorum_node.node.admin_api import admin_routes
from quorum_node.node.api.stream import install_stream
from quorum_node.node.client_api import install_client_api
from quorum_node.node.metrics import metrics_for, metrics_routes
from quorum_node.node.openapi import openapi_routes
from quorum_node.raft.state import RaftState

if TYPE_CHECKING:
    from quorum_node.node.runtime import QuorumNode


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
    core = node.core
    failure = failure_of(node)
    if failure is not None:
        return False, failure
    if core.high_watermark is None:
        return False, f"{core.state} in epoch {core.epoch}, no committed offset known yet"
    if core.leader_has_committed:
        return True, f"leader of epoch {core.epoch}"
    if core.state is RaftState.FOLLOWER:
        return True, f"following {core.leader_id} in epoch {core.epoch}"
    return False, f"{core.state} in epoch {core.epoch}"


def build_app(node: QuorumNode) -> web.Application:
    app = web.Application(client_max_size=16 * 1024 * 1024)
    install_stream(app, install_client_api(app, node).service)  # the binary client protocol

    async def healthz(_: web.Request) -> web.Response:
        failure = failure_of(node)
        if failure is not None:
            return web.Response(status=503, text=f"failed: {failure}\n")
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        ready, why = is_ready(node)
        return web.Response(status=200 if ready else 503, text=f"{why}\n")

    app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz)])
    app.add_routes(admin_routes(node))
    metrics = metrics_for(node)
    node.step_hooks.append(metrics.on_step)
    node.commit_hooks.append(metrics.observe_commit_latency)
    app.add_routes(metrics_routes(node))
    app.add_routes(openapi_routes())
    return app
