"""One binary-protocol stream (``quorum_node.wire``) from a synchronous client to one node.

Requests are sent as they are made and answered in any order: ``send`` returns the request's
correlation id at once, ``wait`` blocks until that answer has come (keeping, for their own
``wait``, the answers to other requests read on the way). WebSocket framing is the
``websockets`` library's (its threaded sync client); not thread-safe: one stream per thread.
"""

from __future__ import annotations

import socket
import ssl
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.protocol import State
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Subprotocol

from quorum_node import wire


class StreamNotOpened(Exception):
    """No stream could be opened: nothing was sent. ``status`` and ``body``: the node answered
    the upgrade with an HTTP error (a refused credential: 401, 403; no such route: 404)."""

    def __init__(self, message: str, *, unreachable: bool = False, status: int | None = None,
                 body: bytes = b"") -> None:
        super().__init__(message)
        self.unreachable = unreachable  # no connection could be made at all
        self.status = status
        self.body = body


class StreamBroken(Exception):
    """A request was sent but its answer did not come (the stream closed, the time ran out, or
    the node sent something that is not this protocol): its outcome is unknown."""


class ClientStream:
    def __init__(self, connection: ClientConnection, server: str) -> None:
        self.server = server
        self._connection = connection
        self._next_correlation = 0
        self._pending: dict[int, wire.Op] = {}
        self._ready: dict[int, bytes] = {}

    @classmethod
    def open(cls, server: str, *, headers: Mapping[str, str],
             ssl_context: ssl.SSLContext | None, timeout_s: float) -> ClientStream:
        """A stream to ``server`` (``http://host:port`` or ``https://...``)."""
        parts = urllib.parse.urlsplit(server)
        scheme = "wss" if parts.scheme == "https" else "ws"
        try:
            connection = connect(
                f"{scheme}://{parts.netloc}{wire.PATH}", ssl=ssl_context if scheme == "wss"
                else None, additional_headers=dict(headers),
                subprotocols=[Subprotocol(wire.SUBPROTOCOL)], compression=None, proxy=None,
                open_timeout=timeout_s, max_size=wire.MAX_RESPONSE_BYTES,
                # The node closes a stream idle for its read timeout; the next call opens
                # another. Pings would keep idle streams open for nothing.
                ping_interval=None, close_timeout=1, max_queue=None,
                legacy=True)  # the connection itself, closed by close()
        except InvalidStatus as refused:
            response = refused.response
            raise StreamNotOpened(f"{server} refused the stream: HTTP {response.status_code}",
                                  status=response.status_code, body=bytes(response.body or b"")) \
                from None
        except ssl.SSLCertVerificationError:
            raise
        except (OSError, InvalidHandshake) as error:
            unreachable = isinstance(error, OSError) and not isinstance(error, TimeoutError)
            raise StreamNotOpened(f"{server}: {_describe(error)}",
                                  unreachable=unreachable) from None
        assert isinstance(connection, ClientConnection)  # what legacy=True returns
        connection.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(connection, server)

    @property
    def usable(self) -> bool:
        """Open as far as this side knows: the node has not closed it (checked before a send,
        so that a stream the node closed while idle never leaves a write's outcome unknown)."""
        return self._connection.protocol.state is State.OPEN

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def send(self, op: wire.Op, timeout_ms: int, fields: Sequence[Any]) -> int:
        """Send a request; its correlation id. Raises StreamBroken if the stream failed while
        sending (the request may have gone out)."""
        correlation = self._next_correlation
        self._next_correlation = (correlation + 1) & 0xFFFF_FFFF
        message = wire.encode_request(correlation, op, timeout_ms, fields)
        try:
            self._connection.send(message)
        except (ConnectionClosed, OSError) as error:
            self.close()
            raise StreamBroken(f"{self.server}: {_describe(error)}") from None
        self._pending[correlation] = op
        return correlation

    def wait(self, correlation: int, timeout_s: float) -> tuple[Any, ...] | wire.ErrorAnswer:
        """The answer to request ``correlation``: its fields, or the node's error."""
        op = self._pending.get(correlation)
        if op is None:
            raise StreamBroken(f"{self.server}: the stream was closed before the answer came")
        deadline = time.monotonic() + timeout_s
        while correlation not in self._ready:
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise TimeoutError
                data = self._connection.recv(timeout=remaining, decode=False)
            except TimeoutError:
                del self._pending[correlation]  # its late answer is dropped
                raise StreamBroken(f"{self.server}: no answer in time") from None
            except (ConnectionClosed, OSError) as error:
                self.close()
                raise StreamBroken(f"{self.server}: {_describe(error)}") from None
            try:
                answered, _ = wire.decode_response_head(data)
            except wire.WireError as error:
                self.close()
                raise StreamBroken(f"{self.server} sent a malformed answer: {error}") from None
            if answered in self._pending:
                self._ready[answered] = data
        del self._pending[correlation]
        data = self._ready.pop(correlation)
        try:
            if data[wire.RESPONSE_HEAD.size - 1] == wire.STATUS_ERROR:
                return wire.decode_error(data)
            return wire.decode_response_fields(op, data)
        except wire.WireError as error:
            self.close()
            raise StreamBroken(f"{self.server} sent a malformed answer: {error}") from None

    def close(self) -> None:
        self._connection.close()
        self._pending.clear()
        self._ready.clear()


def _describe(error: BaseException) -> str:
    if isinstance(error, TimeoutError | socket.timeout):
        return "no answer in time"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, ConnectionClosed):
        reason = f" ({error.rcvd.reason})" if error.rcvd is not None and error.rcvd.reason \
            else ""
        return f"the stream was closed{reason}"
    return str(error) or type(error).__name__
