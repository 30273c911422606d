"""A listener: the listening socket that serves a runner's web server, with the bounds aiohttp's
TCPSite does not offer. A connection counts from its accept until it is gone, TLS handshake
included, so every bound below holds for connections that never complete one.

- At most ``limits.total`` connections at once, at most ``limits.per_address`` of them from one
  client address, and at most ``limits.per_principal`` of one principal (the identity of a
  connection's first authenticated request: a token's, a certificate's). A connection beyond a
  bound is closed at once (one over the principal's bound at its first authenticated request,
  unanswered), so one client cannot take a listener from the others.
- The probes' reserve, on a listener that serves the probes: a connection beyond the first two
  bounds is kept, up to ``PROBE_RESERVE`` of them (``PROBE_RESERVE_PER_ADDRESS`` from one
  address), for one probe (``GET`` of ``PROBE_PATHS``): it is answered, then closed; any other
  request on such a connection closes it unanswered. So the kubelet's probes are served while
  clients fill the listener, and one client cannot fill the reserve as well.
- The TLS handshake starts once the connection is counted and must finish within a timeout
  (asyncio's default is a minute); ``admits`` may then refuse the connection at once (a
  controller listener refuses one without a node's certificate).
- ``close_connections`` closes every connection, keep-alive requests and WebSocket streams
  alike: after the TLS files or the peer secret change, nothing admitted under the old ones
  stays open.
- A second protocol on the same port (``second_protocol``: the controller listener's Kafka
  protocol): once admitted, a connection waits for its first byte, which tells the two apart (a
  Kafka request starts with its size, a big-endian int32 under 16 MiB, so a zero byte; an HTTP
  request with a method's letter). The wait is bounded by the handshake timeout; ``admits`` is
  asked of HTTP connections only (the second protocol authenticates each request itself), and
  ``admits_either`` of every connection before its first byte.

``NodeListeners`` is a node's set of them and their lifecycle: the peer RPCs on the controller
listener(s), the client application on the client listeners, the connections closed when a TLS
file or the peer secret changes, and all of it stopped at shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, cast

from aiohttp import web
from aiohttp.typedefs import Middleware

from quorum_node.addresses import address_url, every_interface_socket
from quorum_node.node.config import Listener, NodeConfig
from quorum_node.node.limits import READ_TIMEOUT_KEY
from quorum_node.node.transport import (
    PeerClient,
    PeerServer,
    refusals_close_connections,
    start_now,
    wrong_listener_middleware,
)
from quorum_node.security.node_security import NodeSecurity

logger = logging.getLogger(__name__)

# What a connection of the probes' reserve may ask for: the node's liveness and readiness probes.
PROBE_PATHS: Final = frozenset({"/healthz", "/readyz"})
# A kubelet probes with a new connection each time, closed after the answer: a couple at once.
PROBE_RESERVE: Final = 16
PROBE_RESERVE_PER_ADDRESS: Final = 2
_LOG_REPEAT_S: Final = 10.0

# Why a connection is refused after its TLS handshake (None: it is not).
Admits = Callable[[asyncio.Transport], "str | None"]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# The first byte of every connection of the second protocol (the high byte of a Kafka request's
# size, which is far below 16 MiB); never the first byte of an HTTP request.
SECOND_PROTOCOL_FIRST_BYTE: Final = 0


class ConnectionHandler(Protocol):
    """What serves an admitted connection: aiohttp's RequestHandler, or the second protocol's."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None: ...
    def data_received(self, data: bytes) -> None: ...
    def eof_received(self) -> bool | None: ...
    def pause_writing(self) -> None: ...
    def resume_writing(self) -> None: ...
    def connection_lost(self, exc: Exception | None) -> None: ...
    def force_close(self) -> None: ...


# Makes the handler of one connection of the second protocol, given the connection's claim: a
# principal's (at its first authenticated request), False when that principal holds its bound.
SecondProtocol = Callable[[Callable[[str], bool]], ConnectionHandler]


@dataclass(frozen=True)
class ConnectionLimits:
    """The bounds of one listener (``max.connections`` and the per-client ones)."""

    total: int
    per_address: int
    per_principal: int


class _Connection(asyncio.Protocol):
    """One accepted connection, counted from its accept. Its transport's protocol throughout:
    the server's handler takes its data once it is admitted (after the TLS handshake)."""

    def __init__(self, site: BoundedSite) -> None:
        self.site = site
        self.address = ""
        self.reserved = False  # one of the probes' reserve
        self.counted = False
        self.principal: str | None = None
        self.raw: asyncio.Transport | None = None  # the TCP connection, until the handler's
        self.handler: ConnectionHandler | None = None
        self._early: list[bytes] = []  # data a TLS handshake let through before the handler
        self._paused = False
        # Admitted, waiting for its first byte to tell which protocol serves it.
        self.undecided: asyncio.Transport | None = None
        self._undecided_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream = cast(asyncio.Transport, transport)  # uvloop's transports are no subclasses
        self.raw = stream
        self.site._arrived(self, stream)

    def decide_later(self, transport: asyncio.Transport, timeout_s: float) -> None:
        """Wait for the first byte (at most ``timeout_s``) before choosing the handler."""
        self.undecided = transport
        self._undecided_timer = asyncio.get_running_loop().call_later(timeout_s, self.close)
        if self._early:
            self._decide()

    def _decide(self) -> None:
        transport, self.undecided = self.undecided, None
        if self._undecided_timer is not None:
            self._undecided_timer.cancel()
            self._undecided_timer = None
        assert transport is not None
        first = self._early[0][0]
        self.site._chosen(self, transport, second=first == SECOND_PROTOCOL_FIRST_BYTE)

    def attach(self, handler: ConnectionHandler, transport: asyncio.Transport) -> None:
        self.handler = handler
        self.raw = None
        handler.connection_made(transport)
        if self._paused:
            handler.pause_writing()
        early, self._early = self._early, []
        for data in early:
            handler.data_received(data)

    def data_received(self, data: bytes) -> None:
        handler = self.handler
        if handler is not None:
            handler.data_received(data)
        elif data:
            self._early.append(data)
            if self.undecided is not None:
                self._decide()

    def eof_received(self) -> None:
        if self.handler is not None:
            self.handler.eof_received()

    def pause_writing(self) -> None:
        self._paused = True
        if self.handler is not None:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        self._paused = False
        if self.handler is not None:
            self.handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._undecided_timer is not None:
            self._undecided_timer.cancel()
            self._undecided_timer = None
        self.site._left(self)
        if self.handler is not None:
            self.handler.connection_lost(exc)

    def close(self) -> None:
        """Close the connection now, whatever it is doing."""
        if self.handler is not None:
            self.handler.force_close()
        elif self.undecided is not None:
            self.undecided.abort()
            self.site._left(self)
        elif self.raw is not None:
            self.raw.abort()
            self.site._left(self)  # a transport aborted mid-handshake may never say so


class BoundedSite(web.TCPSite):
    """A TCPSite with connection bounds, the probes' reserve and a TLS handshake timeout."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *,
                 ssl_context: ssl.SSLContext | None, handshake_timeout_s: float,
                 limits: ConnectionLimits, serves_probes: bool = False,
                 admits: Admits | None = None,
                 second_protocol: SecondProtocol | None = None,
                 admits_either: Admits | None = None) -> None:
        # The kernel's most (as Go's listeners, so etcd's, take): aiohttp's 128 made many
        # clients connecting at once wait a second or more for a SYN retry.
        super().__init__(runner, host, port, ssl_context=ssl_context, reuse_address=True,
                         backlog=socket.SOMAXCONN)
        self.handshake_timeout_s = handshake_timeout_s
        self.limits = limits
        self.serves_probes = serves_probes
        self._admits = admits
        self._second_protocol = second_protocol
        self._admits_either = admits_either
        self._connections: set[_Connection] = set()
        self._regular = 0
        self._by_address: Counter[str] = Counter()
        self._reserved = 0
        self._reserved_by_address: Counter[str] = Counter()
        self._by_principal: Counter[str] = Counter()
        self.refused_connections = 0
        self._refusals_logged: dict[str, tuple[float, int]] = {}

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    async def start(self) -> None:
        # TCPSite.start without TLS (each connection's handshake starts once it is counted);
        # BaseSite's registers the site with its runner, which stops it at cleanup.
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        if not self._host:  # every interface (a listener NAME://:port)
            self._server = await loop.create_server(
                lambda: _Connection(self),
                sock=every_interface_socket(self._port, backlog=self._backlog),
                backlog=self._backlog)
        else:
            self._server = await loop.create_server(
                lambda: _Connection(self), self._host, self._port, backlog=self._backlog,
                reuse_address=self._reuse_address, reuse_port=self._reuse_port)
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port

    async def stop(self) -> None:
        await super().stop()
        for connection in list(self._connections):
            if connection.handler is None:  # mid-handshake: no server would close it
                connection.close()

    def _arrived(self, connection: _Connection, transport: asyncio.Transport) -> None:
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else "-"
        connection.address = address
        per_address = min(self.limits.per_address, self.limits.total)
        if self._regular < self.limits.total and self._by_address[address] < per_address:
            self._regular += 1
            self._by_address[address] += 1
        else:
            full = self._regular >= self.limits.total
            bound, detail = (("max.connections", f"{self.limits.total} open") if full else
                             ("max.connections.per.ip", f"{per_address} open from {address}"))
            if not (self.serves_probes and self._reserved < PROBE_RESERVE
                    and self._reserved_by_address[address] < PROBE_RESERVE_PER_ADDRESS):
                self._refuse(bound, detail)
                transport.close()
                return
            self._note(bound, "keeping a connection for one probe only", detail)
            connection.reserved = True
            self._reserved += 1
            self._reserved_by_address[address] += 1
        connection.counted = True
        self._connections.add(connection)
        if self._ssl_context is None:
            self._open(connection, transport)
        else:
            start_now(self._handshake(connection, transport, self._ssl_context), _ignore)

    async def _handshake(self, connection: _Connection, raw: asyncio.Transport,
                         context: ssl.SSLContext) -> None:
        transport: asyncio.Transport | None = None
        try:
            transport = await asyncio.get_running_loop().start_tls(
                raw, connection, context, server_side=True,
                ssl_handshake_timeout=self.handshake_timeout_s)
        except (OSError, TimeoutError, RuntimeError):
            pass  # a failed or slow handshake, or a connection gone meanwhile
        finally:
            if transport is None:  # whatever ended it (a loop shutting down too): not counted
                raw.abort()
                self._left(connection)
        if transport is None:
            return
        if not connection.counted:
            transport.abort()  # closed while it shook hands
        else:
            self._open(connection, transport)

    def _open(self, connection: _Connection, transport: asyncio.Transport) -> None:
        """Hand an admitted connection to the server's handler (or, with a second protocol,
        to the one its first byte names)."""
        if self._second_protocol is not None:
            refusal = self._admits_either(transport) if self._admits_either is not None else None
            if refusal is not None:
                self._refuse("admission", f"{refusal} ({connection.address})")
                transport.abort()
                self._left(connection)
                return
            connection.decide_later(transport, self.handshake_timeout_s)
            return
        self._chosen(connection, transport, second=False)

    def _chosen(self, connection: _Connection, transport: asyncio.Transport, *,
                second: bool) -> None:
        if second:
            assert self._second_protocol is not None
            connection.attach(
                self._second_protocol(lambda principal: self.claim(connection, principal)),
                transport)
            return
        refusal = self._admits(transport) if self._admits is not None else None
        server = self._runner.server
        if refusal is not None or server is None:
            if refusal is not None:
                self._refuse("admission", f"{refusal} ({connection.address})")
            transport.abort()
            self._left(connection)
            return
        connection.attach(cast(ConnectionHandler, server()), transport)

    def _left(self, connection: _Connection) -> None:
        if not connection.counted:
            return
        connection.counted = False
        self._connections.discard(connection)
        address = connection.address
        if connection.reserved:
            self._reserved -= 1
            _decrement(self._reserved_by_address, address)
        else:
            self._regular -= 1
            _decrement(self._by_address, address)
        if connection.principal is not None:
            _decrement(self._by_principal, connection.principal)

    def claim(self, connection: _Connection, principal: str) -> bool:
        """Count ``connection`` as ``principal``'s (its first authenticated request's); False
        when the principal holds its bound already (the caller closes the connection)."""
        if self._by_principal[principal] >= self.limits.per_principal:
            self._refuse("max.connections.per.principal",
                         f"{self.limits.per_principal} open of {principal} "
                         f"({connection.address})")
            return False
        connection.principal = principal
        self._by_principal[principal] += 1
        return True

    def _refuse(self, bound: str, detail: str) -> None:
        self.refused_connections += 1
        self._note(bound, "closing a connection", detail)

    def _note(self, bound: str, action: str, detail: str) -> None:
        """Say what a bound made the listener do, at most every few seconds a bound and an
        action (a client hitting it again and again is counted, not logged)."""
        now = time.monotonic()
        key = f"{action} ({bound})"
        last, left_out = self._refusals_logged.get(key, (-_LOG_REPEAT_S, 0))
        if now - last < _LOG_REPEAT_S:
            self._refusals_logged[key] = (last, left_out + 1)
            return
        self._refusals_logged[key] = (now, 0)
        more = f" ({left_out} more since the last line)" if left_out else ""
        logger.warning("%s: %s: %s%s", self.name, key, detail, more)

    def close_connections(self) -> int:
        """Close every connection at once; how many there were."""
        connections = list(self._connections)
        for connection in connections:
            connection.close()
        return len(connections)


def _decrement(counter: Counter[str], key: str) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


def _ignore(_: BaseException) -> None:
    pass


def connection_of(request: web.BaseRequest) -> _Connection | None:
    """The listener's record of the request's connection (None outside a BoundedSite)."""
    transport = request.transport
    protocol = transport.get_protocol() if transport is not None else None
    return protocol if isinstance(protocol, _Connection) else None


def probes_reserve_middleware() -> Middleware:
    """Outermost on a listener that serves the probes: a connection of the probes' reserve is
    answered one probe, then closed; any other request closes it unanswered."""

    @web.middleware
    async def serve_probes_only(request: web.Request, handler: Handler) -> web.StreamResponse:
        connection = connection_of(request)
        if connection is None or not connection.reserved:
            return await handler(request)
        if request.method in ("GET", "HEAD") and request.path in PROBE_PATHS:
            request.protocol.close()  # after this answer; nothing more is read
            return await handler(request)
        request.protocol.force_close()
        return web.Response(status=503)  # never written: the connection is gone

    return serve_probes_only


def principals_middleware(principal_of: Callable[[web.Request], str | None]) -> Middleware:
    """After the authorization: a connection counts as the principal of its first authenticated
    request (``principal_of``); one beyond that principal's bound is closed unanswered."""

    @web.middleware
    async def count_principals(request: web.Request, handler: Handler) -> web.StreamResponse:
        principal = principal_of(request)
        if principal is not None:
            connection = connection_of(request)
            if connection is not None and connection.principal is None \
                    and not connection.site.claim(connection, principal):
                request.protocol.force_close()
                return web.Response(status=503)  # never written: the connection is gone
        return await handler(request)

    return count_principals


async def start_site(runner: web.BaseRunner, host: str, port: int,
                     ssl_context: ssl.SSLContext | None, *, handshake_timeout_s: float,
                     limits: ConnectionLimits, serves_probes: bool = False,
                     admits: Admits | None = None,
                     second_protocol: SecondProtocol | None = None,
                     admits_either: Admits | None = None) -> BoundedSite:
    """Listen on ``host:port`` for ``runner``'s server (set up already) until its cleanup;
    ``second_protocol``: the handler of connections whose first byte is zero;
    ``admits_either``: as ``admits``, asked before that byte (of any connection)."""
    site = BoundedSite(runner, host, port, ssl_context=ssl_context,
                       handshake_timeout_s=handshake_timeout_s, limits=limits,
                       serves_probes=serves_probes, admits=admits,
                       second_protocol=second_protocol, admits_either=admits_either)
    await site.start()
    return site


class NodeListeners:
    """A node's listeners and their lifecycle: the peer RPCs (``peer_servers``, one per
    controller listener) on the controller listener(s), the client application on the client
    listeners (or everything on one listener), each kind with its own runner; and, after the TLS
    files or the peer secret change, the connections made under the old ones closed, both
    ways (``peers``: the streams this node opened)."""

    def __init__(self, config: NodeConfig, security: NodeSecurity,
                 peer_servers: list[PeerServer], peers: PeerClient,
                 client_endpoints: dict[int, tuple[str, int]]) -> None:
        self.config = config
        self.security = security
        self.peer_servers = peer_servers
        self.peers = peers
        self.client_endpoints = client_endpoints
        self._sites: list[BoundedSite] = []
        self._secret_sites: list[BoundedSite] = []  # the PLAINTEXT ones serving peers
        self._runners: list[web.AppRunner] = []  # one per kind of listener, as start() made
        self._kafka_protocol: Callable[[Listener], SecondProtocol] | None = None

    async def start(self, app: web.Application,
                    kafka_protocol: Callable[[Listener], SecondProtocol] | None) -> None:
        """Serve the peer RPCs on the controller listener(s), ``app`` on the client listeners
        (with one listener for everything, ``app`` gets the peer routes too), and close the
        connections of a rotated TLS file or peer secret from now on."""
        config = self.config
        self._kafka_protocol = kafka_protocol
        controllers = config.controller_listeners
        if config.combined_listener:
            app.add_routes(self.peer_servers[0].routes())
            await self._serve(app, controllers, serves_peers=True, serves_clients=True)
        else:
            for controller, peer_server in zip(controllers, self.peer_servers, strict=True):
                peer_app = web.Application()
                peer_app.add_routes(peer_server.routes())
                await self._serve(peer_app, (controller,), serves_peers=True,
                                  serves_clients=False)
            await self._serve(app, config.client_listeners, serves_peers=False,
                              serves_clients=True)
        if self.security.tls is not None:
            self.security.tls.on_reload.append(self._close_connections)
        self.security.on_peer_secret_change.append(self._close_secret_connections)

    async def close_peer_servers(self) -> None:
        """End the peers' streams served here (the node stops answering them)."""
        for peer_server in self.peer_servers:
            await peer_server.close()

    async def close(self) -> None:
        """Stop listening, waiting for the requests in flight (a second at most)."""
        for runner in self._runners:
            await runner.cleanup()

    async def _serve(self, app: web.Application, listeners: Sequence[Listener], *,
                     serves_peers: bool, serves_clients: bool) -> None:
        """Serve ``app`` on ``listeners`` (all of one protocol), with its own runner."""
        config, security, listener = self.config, self.security, listeners[0]
        kafka_protocol = self._kafka_protocol if serves_peers else None
        # Outermost: the probes' reserve answers probes only; on a listener of the peers alone,
        # a refused request closes its connection, and a client's is told where to go.
        app.middlewares.insert(0, probes_reserve_middleware() if serves_clients
                               else refusals_close_connections)
        if not serves_clients:
            app.middlewares.insert(1, wrong_listener_middleware(self._where_clients_go()))
        # Refusals happen before any handler runs: a refused request changes nothing.
        app.middlewares.extend(security.middlewares(listener, serves_peers=serves_peers))
        if security.authenticates(listener):
            app.middlewares.append(principals_middleware(security.principal_of))
        app[READ_TIMEOUT_KEY] = config.http_read_timeout_ms / 1000
        # In-flight requests get a second to finish at shutdown (a long poll ends within
        # fetch_max_wait_ms anyway), not aiohttp's default minute. The keep-alive timeout also
        # runs from the start of a connection: one that never completes a request head (a
        # slow-loris client) is closed after it.
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0,
                               keepalive_timeout=self.config.http_read_timeout_ms / 1000)
        await runner.setup()
        self._runners.append(runner)
        tls = security.tls
        limits = ConnectionLimits(config.max_connections, config.max_connections_per_ip,
                                  config.max_connections_per_principal)
        # A listener of the peers alone over SSL holds no connection without a node's
        # certificate: none of its requests could be served.
        admits = security.admits_peer if listener.tls and not serves_clients else None
        for each in listeners:
            site = await start_site(
                runner, each.host, each.port, tls.listening if tls and each.tls else None,
                handshake_timeout_s=config.http_read_timeout_ms / 1000, limits=limits,
                serves_probes=serves_clients, admits=admits,
                second_protocol=kafka_protocol(each) if kafka_protocol is not None else None,
                # Kafka's admin tools may come without a node's certificate.
                admits_either=security.admits_peer_or_admin if admits is not None else None)
            self._sites.append(site)
            if serves_peers and not each.tls:
                self._secret_sites.append(site)

    def _where_clients_go(self) -> str:
        """Where this node serves clients and the admin API, for a client that came to the
        controller listener."""
        config = self.config
        own = self.client_endpoints.get(config.node_id)
        listeners = ", ".join(str(listener) for listener in config.client_listeners)
        url = f" ({address_url(config.url_scheme, *own)})" if own is not None else ""
        return f"clients and the admin API are served on {listeners}{url}"

    def _close_connections(self) -> None:
        """The TLS files changed: close every connection made under the old ones, both ways,
        so that each is made again and verified against the current CA."""
        closed = sum(site.close_connections() for site in self._sites)
        self.peers.close_streams()
        logger.info("node %d: TLS files reloaded; closed %d connection(s) made under the "
                    "previous ones, and the streams to peers", self.config.node_id, closed)

    def _close_secret_connections(self) -> None:
        """The peer secret changed: close the connections of the PLAINTEXT listeners serving
        peers (each was let in with the old secret, or with none) and the streams this node
        opened with it, so that a secret taken away takes its streams with it."""
        closed = sum(site.close_connections() for site in self._secret_sites)
        if self.security.current_peer_secret() is not None:
            self.peers.close_streams()
        logger.info("node %d: peer secret changed; closed %d connection(s) of the PLAINTEXT "
                    "listeners serving peers, and the streams to peers opened with the old "
                    "secret", self.config.node_id, closed)
