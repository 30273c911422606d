"""The HTTP application of a node: health probes, metrics, the client and admin APIs, and the
binary client protocol's stream (the node's listeners add the peer RPCs where they share a
listener). Only ``quorum_node.node.main`` (and tests) build it."""

from __future__ import annotations

from aiohttp import web

from quorum_node.node.api.admin import admin_routes
from quorum_node.node.api.client import client_routes
from quorum_node.node.api.http import error_middleware
from quorum_node.node.api.metrics import metrics_routes, probe_routes
from quorum_node.node.api.openapi import openapi_routes
from quorum_node.node.api.stream import install_stream
from quorum_node.node.kv_service import KvService
from quorum_node.node.runtime import QuorumNode


def build_app(node: QuorumNode, service: KvService | None = None) -> web.Application:
    """The application serving ``node``; ``service``: the node's KvService, if other
    transports share it (and its bound on waiting calls)."""
    # The error middleware first: outermost, it answers every error of every route (the
    # security middlewares the listeners add answer refusals in the same body themselves).
    app = web.Application(client_max_size=16 * 1024 * 1024,
                          middlewares=[error_middleware(node)])
    kv_service = service if service is not None else KvService(node)
    app.add_routes(client_routes(kv_service))
    install_stream(app, kv_service)  # the binary client protocol, over the same service
    app.add_routes(probe_routes(node))
    app.add_routes(admin_routes(node))
    app.add_routes(metrics_routes(node))  # the node's metrics, measured from here on
    app.add_routes(openapi_routes())
    return app
