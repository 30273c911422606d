"""A listener: the listening socket that serves a runner's web server, with the bounds aiohttp's
TCPSite does not offer.

- The TLS handshake must finish within a timeout (asyncio's default is a minute): a client that
  connects and never speaks TLS is disconnected after the read timeout.
- At most ``max_connections`` connections are open at once; one accepted beyond them is closed at
  once. On an SSL listener a connection counts from the end of its handshake (a handshake is
  bounded by its timeout).
- ``close_connections`` closes every open connection, keep-alive requests and WebSocket streams
  alike: after the TLS files change, nothing verified against the old ones stays open.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

logger = logging.getLogger(__name__)


class _Closed(asyncio.Protocol):
    """What a connection beyond the cap gets: it is closed as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class BoundedSite(web.TCPSite):
    """A TCPSite with a TLS handshake timeout and a connection cap."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *,
                 ssl_context: ssl.SSLContext | None, handshake_timeout_s: float,
                 max_connections: int) -> None:
        # The kernel's most (as Go's listeners, so etcd's, take): aiohttp's 128 made many
        # clients connecting at once wait a second or more for a SYN retry.
        super().__init__(runner, host, port, ssl_context=ssl_context, reuse_address=True,
                         backlog=socket.SOMAXCONN)
        self.handshake_timeout_s = handshake_timeout_s
        self.max_connections = max_connections
        # Every accepted connection's handler, with when it was accepted. A handler has a
        # transport from the moment its connection is made (after the TLS handshake) until it is
        # lost; one whose handshake failed is never told, so those without a transport are
        # forgotten once older than the handshake timeout.
        self._handlers: dict[RequestHandler, float] = {}
        self.refused_connections = 0

    @property
    def open_connections(self) -> int:
        return sum(1 for handler in self._handlers if handler.transport is not None)

    def _forget_closed(self) -> None:
        oldest = time.monotonic() - self.handshake_timeout_s - 1.0
        for handler, accepted in list(self._handlers.items()):
            if handler.transport is None and accepted < oldest:
                del self._handlers[handler]

    async def start(self) -> None:
        # TCPSite.start, with the handshake timeout and this site's protocol factory; BaseSite's
        # registers the site with its runner, which stops it at cleanup.
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._accept, self._host, self._port, ssl=self._ssl_context, backlog=self._backlog,
            reuse_address=self._reuse_address, reuse_port=self._reuse_port,
            ssl_handshake_timeout=(self.handshake_timeout_s if self._ssl_context is not None
                                   else None))
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port

    def _accept(self) -> asyncio.BaseProtocol:
        self._forget_closed()
        if self.open_connections >= self.max_connections:
            self.refused_connections += 1
            if self.refused_connections == 1 or self.refused_connections % 1000 == 0:
                logger.warning("%s: %d connections open (max.connections): closing new ones "
                               "(%d so far)", self.name, self.max_connections,
                               self.refused_connections)
            return _Closed()
        server = self._runner.server
        assert server is not None
        handler = server()
        self._handlers[handler] = time.monotonic()
        return handler

    def close_connections(self) -> int:
        """Close every open connection at once; how many there were."""
        closed = 0
        for handler in list(self._handlers):
            if handler.transport is not None:
                handler.force_close()
                closed += 1
        return closed


async def start_site(runner: web.BaseRunner, host: str, port: int,
                     ssl_context: ssl.SSLContext | None, *, handshake_timeout_s: float,
                     max_connections: int) -> BoundedSite:
    """Listen on ``host:port`` for ``runner``'s server (set up already) until its cleanup."""
    site = BoundedSite(runner, host, port, ssl_context=ssl_context,
                       handshake_timeout_s=handshake_timeout_s, max_connections=max_connections)
    await site.start()
    return site
