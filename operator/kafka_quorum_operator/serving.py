"""The operator's own HTTP endpoints: health (the chart's liveness and readiness probes) and
Prometheus metrics.

Each listens on every interface, IPv6 and IPv4 alike (``every_interface_socket``, as the nodes'
listeners do), unless an address is given: the kubelet probes, and Prometheus scrapes, the
pod's IP of the cluster's family, which on an IPv6-only cluster is an IPv6 address. kopf's own
liveness endpoint and prometheus_client's ``start_http_server`` bind one address of one family
(kopf's asyncio socket on ``::`` is IPv6-only), so neither serves both.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from quorum_node.addresses import every_interface_socket

BACKLOG = 64
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def parse_endpoint(url: str) -> tuple[str | None, int, str]:
    """``http://HOST:PORT/PATH`` as (host, port, path); no host (``http://:8080/healthz``):
    every interface (None). A one-line error for anything else."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError as error:
        raise ValueError(f"{url!r}: {error}") from None
    if parts.scheme != "http" or port is None:
        raise ValueError(f"expected http://[HOST]:PORT/PATH, got {url!r}")
    return parts.hostname or None, port, parts.path or "/"


async def serve(routes: Iterable[tuple[str, Handler]], port: int,
                host: str | None = None) -> web.AppRunner:
    """GET ``routes`` (path, handler) on ``port``: of every interface, or of ``host``. Stopped
    by the runner's ``cleanup``."""
    app = web.Application()
    app.add_routes([web.get(path, handler) for path, handler in routes])
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site: web.BaseSite = (web.TCPSite(runner, host, port, backlog=BACKLOG) if host else
                          web.SockSite(runner, every_interface_socket(port, backlog=BACKLOG)))
    await site.start()
    return runner


async def metrics(_: web.Request) -> web.Response:
    """The process's Prometheus registry, in the text exposition format."""
    return web.Response(body=generate_latest(REGISTRY),
                        headers={"Content-Type": CONTENT_TYPE_LATEST})
