"""One binary-protocol stream (``quorum_node.wire``) from a synchronous client to one node.

Requests are sent as they are made and answered in any order: ``send`` returns the request's
correlation id at once, ``wait`` blocks until that answer has come (keeping, for their own
``wait``, the answers to other requests read on the way). The WebSocket protocol is the
``websockets`` library's, its Sans-I/O ``ClientProtocol`` (framing, masking, pings, the closing
handshake, the message size bound) driven on a plain socket in the caller's thread: no reader
thread per stream, and an answer is read by the thread waiting for it. Not thread-safe: one
stream per thread.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from websockets.client import ClientProtocol
from websockets.exceptions import InvalidHandshake, InvalidStatus
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from quorum_node import wire

_READ_BYTES = 256 * 1024


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
    def __init__(self, sock: socket.socket, protocol: ClientProtocol, server: str) -> None:
        self.server = server
        self._socket = sock
        self._protocol = protocol
        self._next_correlation = 0
        self._pending: dict[int, wire.Op] = {}
        self._ready: dict[int, bytes] = {}
        self._fragments: list[bytes] = []  # a message's frames so far (the node sends whole)

    @classmethod
    def open(cls, server: str, *, headers: Mapping[str, str],
             ssl_context: ssl.SSLContext | None, timeout_s: float) -> ClientStream:
        """A stream to ``server`` (``http://host:port`` or ``https://...``)."""
        parts = urllib.parse.urlsplit(server)
        secure = parts.scheme == "https"
        host, port = parts.hostname or "", parts.port or (443 if secure else 80)
        try:
            sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as error:
            raise StreamNotOpened(f"{server}: {_describe(error)}",
                                  unreachable=not isinstance(error, TimeoutError)) from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if secure:
                assert ssl_context is not None
                sock = ssl_context.wrap_socket(sock, server_hostname=host)
            protocol = ClientProtocol(
                parse_uri(f"{'wss' if secure else 'ws'}://{parts.netloc}{wire.PATH}"),
                subprotocols=[Subprotocol(wire.SUBPROTOCOL)], max_size=wire.MAX_RESPONSE_BYTES)
            request = protocol.connect()
            for name, value in headers.items():
                request.headers[name] = value
            protocol.send_request(request)
            stream = cls(sock, protocol, server)
            stream._flush()
            stream._handshake(time.monotonic() + timeout_s)
        except ssl.SSLCertVerificationError:
            sock.close()
            raise
        except InvalidStatus as refused:
            sock.close()
            raise StreamNotOpened(f"{server} refused the stream: HTTP "
                                  f"{refused.response.status_code}",
                                  status=refused.response.status_code,
                                  body=bytes(refused.response.body or b"")) from None
        except (OSError, InvalidHandshake, StreamBroken) as error:
            sock.close()
            raise StreamNotOpened(f"{server}: {_describe(error)}") from None
        return stream

    def _handshake(self, deadline: float) -> None:
        while True:
            for event in self._read(deadline):
                if isinstance(event, Response):
                    if self._protocol.handshake_exc is not None:
                        raise self._protocol.handshake_exc
                    return

    @property
    def usable(self) -> bool:
        """Open as far as can be told without waiting: the node has not closed it (checked
        before a send, so that a stream the node closed while idle never leaves a write's
        outcome unknown)."""
        if self._protocol.state is not State.OPEN:
            return False
        try:
            while self._readable():
                # Whatever came unasked: a close, a ping, or a late answer (kept if awaited).
                self._read(time.monotonic())
        except StreamBroken:
            return False
        return self._protocol.state is State.OPEN

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def send(self, op: wire.Op, timeout_ms: int, fields: Sequence[Any]) -> int:
        """Send a request; its correlation id. Raises StreamBroken if the stream failed while
        sending (the request may have gone out)."""
        correlation = self._next_correlation
        self._next_correlation = (correlation + 1) & 0xFFFF_FFFF
        message = wire.encode_request(correlation, op, timeout_ms, fields)
        if self._protocol.state is not State.OPEN:
            raise StreamBroken(f"{self.server}: the stream was closed{self._close_reason()}")
        self._protocol.send_binary(message)
        try:
            self._flush()
        except OSError as error:
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
        try:
            while correlation not in self._ready:
                self._read(deadline)
        except StreamBroken:
            if correlation not in self._ready:  # it may have come with the stream's end
                self._pending.pop(correlation, None)  # a late answer is dropped
                raise
        del self._pending[correlation]
        data = self._ready.pop(correlation)
        try:
            if data[wire.RESPONSE_HEAD.size - 1] == wire.STATUS_ERROR:
                return wire.decode_error(data)
            return wire.decode_response_fields(op, data)
        except wire.WireError as error:
            self.close()
            raise StreamBroken(f"{self.server} sent a malformed answer: {error}") from None

    def _take(self, events: list[Any]) -> None:
        """Keep the answers among ``events`` that a request waits for."""
        for event in events:
            if not isinstance(event, Frame) or event.opcode not in (Opcode.BINARY, Opcode.CONT):
                continue  # pings and closes: the protocol answers them itself
            self._fragments.append(bytes(event.data))
            if not event.fin:
                continue
            data = b"".join(self._fragments)
            self._fragments.clear()
            try:
                answered, _ = wire.decode_response_head(data)
            except wire.WireError as error:
                self.close()
                raise StreamBroken(f"{self.server} sent a malformed answer: {error}") from None
            if answered in self._pending:
                self._ready[answered] = data

    def _read(self, deadline: float) -> list[Any]:
        """Read once (waiting until ``deadline`` for something), keep the answers awaited, and
        return the protocol's events. Raises StreamBroken when the time is up or the stream
        ended (after keeping what came with its end)."""
        remaining = deadline - time.monotonic()
        if remaining <= 0 and not self._readable():
            raise StreamBroken(f"{self.server}: no answer in time")
        try:
            self._socket.settimeout(max(remaining, 0.001))
            data = self._socket.recv(_READ_BYTES)
        except TimeoutError:
            raise StreamBroken(f"{self.server}: no answer in time") from None
        except OSError as error:
            self.close()
            raise StreamBroken(f"{self.server}: {_describe(error)}") from None
        if data:
            self._protocol.receive_data(data)
        else:
            self._protocol.receive_eof()
        events = self._protocol.events_received()
        with contextlib.suppress(OSError):
            self._flush()  # pongs, the closing handshake's answer
        self._take(events)
        state = self._protocol.state
        if state is State.CONNECTING and not data:
            raise StreamBroken(f"{self.server}: the connection closed during the handshake")
        if state is not State.OPEN and state is not State.CONNECTING:
            reason = self._close_reason()
            self._socket.close()  # the answers that came with the end stay for their waits
            raise StreamBroken(f"{self.server}: the stream was closed{reason}")
        return events

    def _readable(self) -> bool:
        if isinstance(self._socket, ssl.SSLSocket) and self._socket.pending():
            return True
        try:
            readable, _, _ = select.select([self._socket], [], [], 0)
        except (OSError, ValueError):
            return True  # a closed socket: the read says so
        return bool(readable)

    def _flush(self) -> None:
        for data in self._protocol.data_to_send():
            if data:
                self._socket.sendall(data)
            else:  # the protocol is done with the connection: half-close it
                self._socket.close()
                return

    def _close_reason(self) -> str:
        received = self._protocol.close_rcvd
        return f" ({received.reason})" if received is not None and received.reason else ""

    def close(self) -> None:
        if self._protocol.state is State.OPEN:
            self._protocol.send_close()
            with contextlib.suppress(OSError):
                self._flush()
        self._socket.close()
        self._pending.clear()
        self._ready.clear()


def _describe(error: BaseException) -> str:
    if isinstance(error, TimeoutError | socket.timeout):
        return "no answer in time"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    return str(error) or type(error).__name__
