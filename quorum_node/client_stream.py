"""One binary-protocol stream (``quorum_node.wire``) from a synchronous client to one node.

Requests are sent as they are made and answered in any order: ``send`` returns the request's
correlation id at once, ``wait`` blocks until that answer has come (keeping, for their own
``wait``, the answers to other requests read on the way). The WebSocket protocol is the
``websockets`` library's, its Sans-I/O ``ClientProtocol`` (framing, masking, pings, the closing
handshake, the message size bound) driven on a plain socket by the callers' threads: no reader
thread per stream. Threads may share a stream, as calls share a gRPC channel: one waiting thread
at a time reads for all of them, hands each answer to its waiter, and passes the reading on when
its own answer has come.
"""

from __future__ import annotations

import contextlib
import itertools
import select
import socket
import ssl
import threading
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


class _Waiter:
    """A request in flight: its op, its answer once read, and the event its thread waits on
    (set when the answer came, the stream ended, or the reading is passed to it)."""

    __slots__ = ("answer", "blocked", "op", "woken")

    def __init__(self, op: wire.Op) -> None:
        self.op = op
        self.answer: bytes | None = None
        self.woken = threading.Event()
        self.blocked = False  # its thread waits on ``woken`` with nobody reading for it


class ClientStream:
    def __init__(self, sock: socket.socket, protocol: ClientProtocol, server: str) -> None:
        self.server = server
        self._socket = sock
        self._protocol = protocol
        # Lock order: _writing, then _state. _state guards the protocol and what is in flight;
        # _writing keeps frames whole and in the protocol's order on the socket.
        self._state = threading.Lock()
        self._writing = threading.Lock()
        # One TLS connection must not be read and written at once.
        self._socket_reads: contextlib.AbstractContextManager[Any] = (
            self._writing if isinstance(sock, ssl.SSLSocket) else contextlib.nullcontext())
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)
        self._correlations = itertools.count()
        self._pending: dict[int, _Waiter] = {}
        self._fragments: list[bytes] = []  # a message's frames so far (the node sends whole)
        self._reading = False  # a thread is reading for the others
        self._ended: str | None = None  # why no more answers will come
        self._closed = False

    @classmethod
    def open(cls, server: str, *, headers: Mapping[str, str],
             ssl_context: ssl.SSLContext | None, timeout_s: float) -> ClientStream:
        """A stream to ``server`` (``http://host:port`` or ``https://...``). ``timeout_s`` also
        bounds each write later on."""
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
            events = self._receive(deadline)
            if events is None:
                raise StreamBroken(f"{self.server}: no answer in time")
            for event in events:
                if isinstance(event, Response):
                    if self._protocol.handshake_exc is not None:
                        raise self._protocol.handshake_exc
                    return
            if self._ended is not None:
                raise StreamBroken(self._ended)

    @property
    def usable(self) -> bool:
        """Open as far as can be told without waiting: the node has not closed it (checked
        before a send, so that a stream the node closed while idle never leaves a write's
        outcome unknown)."""
        with self._state:
            if self._ended is not None:
                return False
            if self._reading:  # the reader will see a close as soon as it comes
                return True
            self._reading = True
        try:
            # Whatever came unasked: a close, a ping, or a late answer (kept if awaited).
            while self._ended is None and self._receive(0.0) is not None:
                pass
        finally:
            self._stop_reading()
        return self._ended is None

    @property
    def ended(self) -> bool:
        """No more answers will come on this stream (closed, cut, or broken by the node)."""
        return self._ended is not None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def send(self, op: wire.Op, timeout_ms: int, fields: Sequence[Any]) -> int:
        """Send a request; its correlation id. Raises StreamBroken if the stream failed while
        sending (the request may have gone out)."""
        correlation = next(self._correlations) & 0xFFFF_FFFF
        message = wire.encode_request(correlation, op, timeout_ms, fields)
        with self._writing:
            with self._state:
                if self._ended is None and self._protocol.state is not State.OPEN:
                    self._end(f"{self.server}: the stream was closed{self._close_reason()}")
                if self._ended is not None:
                    raise StreamBroken(self._ended)
                self._protocol.send_binary(message)
                self._pending[correlation] = _Waiter(op)
                chunks = self._protocol.data_to_send()
            try:
                self._write(chunks)
            except OSError as error:
                problem = f"{self.server}: {_describe(error)}"
                with self._state:
                    self._end(problem)
                raise StreamBroken(problem) from None
        return correlation

    def wait(self, correlation: int, timeout_s: float) -> tuple[Any, ...] | wire.ErrorAnswer:
        """The answer to request ``correlation``: its fields, or the node's error. Raises
        StreamBroken when the stream ended first (``ended``), or when no answer came in time:
        then the request is given up, and the stream goes on for the others."""
        deadline = time.monotonic() + timeout_s
        waiter = self._pending.get(correlation)
        if waiter is None:
            raise StreamBroken(f"{self.server}: the stream was closed before the answer came")
        try:
            data = self._answer(waiter, deadline)
        finally:
            with self._state:  # a late answer is dropped
                self._pending.pop(correlation, None)
        try:
            if data[wire.RESPONSE_HEAD.size - 1] == wire.STATUS_ERROR:
                return wire.decode_error(data)
            return wire.decode_response_fields(waiter.op, data)
        except wire.WireError as error:
            self.close()
            raise StreamBroken(f"{self.server} sent a malformed answer: {error}") from None

    def _answer(self, waiter: _Waiter, deadline: float) -> bytes:
        """Wait for ``waiter``'s answer: read for every waiter while no other thread does,
        otherwise until the reader hands the answer (or the reading) over."""
        while True:
            with self._state:
                if waiter.answer is not None:
                    return waiter.answer
                if self._ended is not None:
                    raise StreamBroken(self._ended)
                reads = not self._reading
                self._reading = True
                waiter.blocked = not reads
                waiter.woken.clear()
            if reads:
                try:
                    # Past the deadline, only what has already come is read.
                    while waiter.answer is None and self._ended is None \
                            and self._receive(deadline) is not None \
                            and time.monotonic() < deadline:
                        pass
                finally:
                    self._stop_reading()
                if waiter.answer is None and self._ended is None:
                    raise StreamBroken(f"{self.server}: no answer in time")
            elif not waiter.woken.wait(max(0.0, deadline - time.monotonic())):
                with self._state:
                    waiter.blocked = False
                    if waiter.answer is None and self._ended is None:
                        if not self._reading:  # the reading was passed to it as it gave up
                            self._wake_a_reader()
                        raise StreamBroken(f"{self.server}: no answer in time")

    def _stop_reading(self) -> None:
        """The reader stops reading: another waiting thread reads on (or, once the stream is
        closed, the socket that close() left to the reader is closed)."""
        with self._state:
            self._reading = False
            if self._closed:
                self._socket.close()
            else:
                self._wake_a_reader()

    def _wake_a_reader(self) -> None:
        """(Holding _state, nobody reading.) Wake one thread still waiting for its answer, to
        read for the others."""
        for waiter in self._pending.values():
            if waiter.blocked and waiter.answer is None:
                waiter.blocked = False
                waiter.woken.set()
                return

    def _receive(self, deadline: float) -> list[Any] | None:
        """As the one reader: read once, waiting until ``deadline`` for something (None if
        nothing came), hand the answers to their waiters, and return the protocol's events.
        A stream that ended says why in ``_ended`` (the answers that came with the end are
        handed over first), and is closed."""
        if not self._readable(max(0.0, deadline - time.monotonic())):
            return None
        try:
            with self._socket_reads:
                data = self._socket.recv(_READ_BYTES)
        except TimeoutError:  # part of a TLS record came: the rest is read on the next turn
            return []
        except OSError as error:
            with self._state:
                self._end(f"{self.server}: {_describe(error)}")
            self.close()
            return []
        with self._state:
            if self._closed:
                return []
            if data:
                self._protocol.receive_data(data)
            else:
                self._protocol.receive_eof()
            events = self._protocol.events_received()
            self._take(events)
            state = self._protocol.state
            if state is State.CONNECTING and not data:
                self._end(f"{self.server}: the connection closed during the handshake")
            elif state is not State.OPEN and state is not State.CONNECTING:
                self._end(f"{self.server}: the stream was closed{self._close_reason()}")
        with contextlib.suppress(OSError):
            self._flush()  # pongs, the closing handshake's answer
        if self._ended is not None:
            self.close()  # its socket too, as this reader stops reading
        return events

    def _take(self, events: list[Any]) -> None:
        """Hand the answers among ``events`` to the requests that wait for them."""
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
                self._end(f"{self.server} sent a malformed answer: {error}")
                return
            waiter = self._pending.get(answered)
            if waiter is not None:
                waiter.answer = data
                waiter.woken.set()

    def _end(self, reason: str) -> None:
        """(Holding _state.) No more answers will come: every waiter is told."""
        if self._ended is None:
            self._ended = reason
        for waiter in self._pending.values():
            waiter.woken.set()

    def _readable(self, timeout_s: float) -> bool:
        with self._socket_reads:
            if isinstance(self._socket, ssl.SSLSocket) and self._socket.pending():
                return True
        try:
            return bool(self._poll.poll(timeout_s * 1000))
        except (OSError, ValueError):
            return True  # a closed socket: the read says so

    def _flush(self) -> None:
        with self._writing:
            with self._state:
                chunks = self._protocol.data_to_send()
            self._write(chunks)

    def _write(self, chunks: list[bytes]) -> None:
        """(Holding _writing.) Put the protocol's output on the socket."""
        for data in chunks:
            if data:
                self._socket.sendall(data)
            else:  # the protocol is done with the connection: half-close it
                self._socket.shutdown(socket.SHUT_WR)

    def _close_reason(self) -> str:
        received = self._protocol.close_rcvd
        return f" ({received.reason})" if received is not None and received.reason else ""

    def close(self) -> None:
        """Close the stream; the requests still waiting end with StreamBroken."""
        with self._writing:
            with self._state:
                if self._closed:
                    return
                self._closed = True
                self._end(f"{self.server}: the stream was closed")
                # A thread reading closes the socket as it stops (in a poll of it, the number
                # must not be reused meanwhile); the shutdown below wakes it.
                read_on = self._reading
                chunks: list[bytes] = []
                if self._protocol.state is State.OPEN:
                    self._protocol.send_close()
                    chunks = self._protocol.data_to_send()
            with contextlib.suppress(OSError):
                self._write(chunks)
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_RDWR)
            if not read_on:
                self._socket.close()


def _describe(error: BaseException) -> str:
    if isinstance(error, TimeoutError | socket.timeout):
        return "no answer in time"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    return str(error) or type(error).__name__
