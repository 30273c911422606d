"""The binary client protocol (``quorum_node.wire``) on a node's client listeners: ``GET
/v1/stream``, upgraded to a WebSocket, serves the client API's operations through the node's
KvService, many requests in flight per stream, each answered as soon as it completes.

TLS, tokens and client certificates are the HTTP API's: the upgrade request passes the same
authorization (the route needs the read role), and a write on the stream needs the write role
of the identity that opened it.

Bounds: a message larger than ``wire.MAX_REQUEST_BYTES`` closes the stream (1009); at most
``MAX_IN_FLIGHT`` requests of a stream are served at once, each until its answer is written, and
the next message is not read before one ends (the client's writes wait in TCP's buffers); a
stream with nothing in flight that stays silent for the read timeout (``http.read.timeout.ms``)
is closed (1001); the reads of a stream that closes (a watch or a read waiting, a read waiting
for its ReadIndex) are cancelled with it, its writes finish (they are committed or not whoever
waits). A message that is not a request of this protocol (text, a cut head, fields that do not
decode) closes the stream with 1002 or 1003 and the reason; an unknown op is answered
BAD_REQUEST and the stream goes on.

Back-pressure: answers the client has not read count against ``http.stream.max.unsent.bytes``
(the connection's write buffer limit). Over it, the stream reads no request, and an answer is
encoded and written only once the client has read the earlier ones down; a read's answer is not
even held meanwhile, but served again (without waiting) once there is room. So a stream holds
at most that bound and one answer unsent, however many requests its client sends without
reading. A client that leaves it over the bound for ``http.stream.write.timeout.ms`` has its
stream cut (no close frame could reach it past the unread answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import aiohttp
from aiohttp import web
from websockets.frames import Frame, Opcode

from quorum_node import wire
from quorum_node.kv.ops import KvOpError, txn_from_document
from quorum_node.node.api.http import bad_request, not_leader
from quorum_node.node.errors import ErrorCode, ServiceError
from quorum_node.node.idle_watch import IdleWatch
from quorum_node.node.kv_service import (
    DEFAULT_TIMEOUT_MS,
    MAX_LIST_LIMIT,
    MAX_READ_RECORDS,
    MAX_TIMEOUT_MS,
    MAX_WAIT_MS,
    MAX_WATCH_EVENTS,
    KvService,
    refused_op,
)
from quorum_node.node.limits import READ_TIMEOUT_KEY
from quorum_node.raft.types import NotLeaderError
from quorum_node.security.authorization import IDENTITY_KEY, audit_log
from quorum_node.security.roles import Role
from quorum_node.wire import ErrorAnswer, Op

logger = logging.getLogger(__name__)

MAX_IN_FLIGHT: Final = 256
# A WebSocket close reason fits in a control frame (125 bytes, 2 of them the code).
_MAX_REASON_BYTES: Final = 123
# Answers held for one write at the end of a turn of the loop, at most (then written at once).
_MAX_HELD_ANSWER_BYTES: Final = 64 * 1024
_WRITES: Final = frozenset({Op.PUT, Op.DELETE, Op.CAS, Op.APPEND, Op.TXN})
_READS: Final = frozenset(Op) - _WRITES
_OPS: Final = {op.value: op for op in Op}

Serve = Callable[[tuple[Any, ...], float], Awaitable[tuple[Any, ...]]]


def install_stream(app: web.Application, service: KvService) -> StreamServer:
    """Serve the stream on ``app`` (the client listeners' application) with ``service`` (the
    HTTP API's own, so that bounds such as the long polls hold across both); its streams are
    closed when the app shuts down (an idle one would hold the shutdown)."""
    server = StreamServer(service)
    app.add_routes([web.get(wire.PATH, server.handle)])

    async def on_shutdown(_: web.Application) -> None:
        await server.close()

    app.on_shutdown.append(on_shutdown)
    return server


class StreamServer:
    """Serves every stream of one application: reads each stream's requests in order and
    answers each (a task of its own) when the service has and the client has room for it."""

    def __init__(self, service: KvService, *, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self.service = service
        self.max_in_flight = max_in_flight
        config = service.node.config
        self.max_unsent_bytes = config.http_stream_max_unsent_bytes
        self.write_timeout_s = config.http_stream_write_timeout_ms / 1000
        self._streams: set[_Stream] = set()
        self._serve: dict[Op, Serve] = {
            Op.PUT: self._put, Op.GET: self._get, Op.DELETE: self._delete, Op.CAS: self._cas,
            Op.APPEND: self._append, Op.READ: self._read, Op.LIST: self._list,
            Op.WATCH: self._watch, Op.TXN: self._txn,
        }
        # Each read again at once, served when its first answer could not be written and was
        # let go: stale, without waiting for records or changes.
        self._serve_now: dict[Op, Serve] = {
            Op.GET: self._get_now, Op.READ: self._read_now, Op.LIST: self._list_now,
            Op.WATCH: self._watch_now,
        }

    async def handle(self, request: web.Request) -> web.StreamResponse:
        offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        if wire.SUBPROTOCOL not in offered:
            bad_request(f"a stream speaks the subprotocol {wire.SUBPROTOCOL!r}: offer it in "
                        f"Sec-WebSocket-Protocol")
        identity = request.get(IDENTITY_KEY)
        idle_s = request.config_dict.get(READ_TIMEOUT_KEY)
        socket = web.WebSocketResponse(protocols=(wire.SUBPROTOCOL,),
                                       max_msg_size=wire.MAX_REQUEST_BYTES, compress=False)
        await socket.prepare(request)
        stream = _Stream(request, socket,
                         may_write=identity is None or Role.WRITE in identity.roles,
                         max_in_flight=self.max_in_flight,
                         max_unsent_bytes=self.max_unsent_bytes,
                         write_timeout_s=self.write_timeout_s)
        self._streams.add(stream)
        # Idle: waiting for a request with none in flight but the read's own slot.
        idle = IdleWatch(idle_s, busy=lambda: stream.in_flight > 1, close=lambda: stream.close(
            aiohttp.WSCloseCode.GOING_AWAY, f"idle for {idle_s:g} s"))
        try:
            while not socket.closed:
                await stream.slots.acquire()  # the next read waits for a free slot
                stream.in_flight += 1
                if not (stream.has_room() or await stream.room()):  # and for the client
                    stream.finished()  # to read its answers; it read none in time
                    break
                # No timeout of receive()'s own: the idle watch closes an idle stream (then
                # CLOSING is received).
                idle.receiving()
                message = await socket.receive()
                idle.received()
                if message.type is aiohttp.WSMsgType.BINARY:
                    refusal = self._start(stream, message.data)
                    if refusal is not None:
                        await stream.close(aiohttp.WSCloseCode.PROTOCOL_ERROR, refusal)
                        break
                    continue
                stream.finished()
                if message.type is aiohttp.WSMsgType.TEXT:
                    await stream.close(aiohttp.WSCloseCode.UNSUPPORTED_DATA,
                                       "binary messages only (quorum_node.wire)")
                break  # closed, closing, or an error aiohttp closed the stream for
        finally:
            self._streams.discard(stream)
            stream.cancel_reads()
            await idle.stop()
        return socket

    def _start(self, stream: _Stream, data: bytes) -> str | None:
        """Start serving one request (its slot taken); why the stream must close instead, if
        it must."""
        try:
            correlation, number, timeout_ms = wire.decode_request_head(data)
        except wire.WireError as error:
            stream.finished()
            return f"malformed request: {error}"
        op = _OPS.get(number)
        if op is None:
            stream.finished()
            stream.send_now(wire.encode_error(correlation, ErrorAnswer(
                ErrorCode.BAD_REQUEST.value, f"unknown op {number} (known: "
                f"{', '.join(f'{o.value} {o.name}' for o in Op)})")))
            return None
        try:
            fields = wire.decode_request_fields(op, data)
        except wire.WireError as error:
            stream.finished()
            return f"malformed {op.name} request: {error}"
        if op in _WRITES and not stream.may_write:
            stream.finished()
            message = (f"this stream's credential may not {op.name}: it needs the "
                       f"{Role.WRITE.value} role")
            if op not in stream.refused:  # audited once per stream and op, not per request
                stream.refused.add(op)
                audit_log.warning("denied status=403 method=%s path=%s remote=%s reason=%r",
                                  op.name, wire.PATH, stream.request.remote or "-", message)
            stream.send_now(wire.encode_error(correlation, ErrorAnswer(
                ErrorCode.FORBIDDEN.value, message)))
            return None
        timeout_s = min(timeout_ms or DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS) / 1000
        # A task of its own, not run inline as transport.start_now does: the service's waits
        # (asyncio.timeout) cancel the task they run in, which must not be the stream's.
        stream.track(asyncio.get_running_loop().create_task(
            self._answer(stream, correlation, op, fields, timeout_s)), read=op in _READS)
        return None

    async def _answer(self, stream: _Stream, correlation: int, op: Op,
                      fields: tuple[Any, ...], timeout_s: float) -> None:
        """Serve one request and write its answer once the client has room for it; the
        request's slot is held until then (or until the stream is gone)."""
        try:
            reply = await self._reply(stream, correlation, op, fields, timeout_s)
            if reply is not None:
                stream.send_now(reply)
        finally:
            stream.finished()

    async def _reply(self, stream: _Stream, correlation: int, op: Op,
                     fields: tuple[Any, ...], timeout_s: float) -> bytes | None:
        """The encoded answer, once the client has room for it; None if the stream is closed
        first."""
        try:
            answer: tuple[Any, ...] | None = await self._serve[op](fields, timeout_s)
            if not stream.has_room():
                serve_now = self._serve_now.get(op)
                if serve_now is not None:
                    answer = None  # a read's answer is not held while the client reads none
                if not await stream.room():
                    return None
                if serve_now is not None:
                    answer = await serve_now(fields, timeout_s)
            assert answer is not None
            return wire.encode_response(correlation, op, answer)
        except ServiceError as error:
            refusal = ErrorAnswer(error.code.value, error.message)
        except NotLeaderError as error:
            refusal = self._not_leader(stream, error)
        except Exception as error:
            logger.exception("node %d: a stream's %s failed", self.service.node.config.node_id,
                             op.name)
            refusal = ErrorAnswer(ErrorCode.INTERNAL.value,
                                  f"{op.name} failed on the node: {error!r}")
        if not (stream.has_room() or await stream.room()):
            return None
        return wire.encode_error(correlation, refusal)

    def _not_leader(self, stream: _Stream, error: NotLeaderError) -> ErrorAnswer:
        """NOT_LEADER with the leader's id and URL (the HTTP API's redirect, without its
        Location), or NO_LEADER."""
        refusal = not_leader(self.service.node, stream.request, error.leader_id)
        leader = refusal.leader
        return ErrorAnswer(refusal.code.value, refusal.message,
                           leader=(leader.id, leader.url) if leader is not None else None)

    async def close(self) -> None:
        """Close every stream (at shutdown: they would hold the server open)."""
        for stream in list(self._streams):
            await stream.close(aiohttp.WSCloseCode.GOING_AWAY, "the node is shutting down")

    # --- the operations: the wire's fields to the service's arguments and back -----------------

    async def _put(self, fields: tuple[Any, ...], timeout_s: float) -> tuple[Any, ...]:
        key, value = fields
        written = await self.service.put(key, value, timeout_s)
        return written.offset, written.epoch, written.applied

    async def _delete(self, fields: tuple[Any, ...], timeout_s: float) -> tuple[Any, ...]:
        (key,) = fields
        written = await self.service.delete(key, timeout_s)
        return written.offset, written.epoch, written.applied

    async def _cas(self, fields: tuple[Any, ...], timeout_s: float) -> tuple[Any, ...]:
        key, expected, value = fields
        written = await self.service.cas(key, expected, value, timeout_s)
        return written.offset, written.epoch, written.applied

    async def _txn(self, fields: tuple[Any, ...], timeout_s: float) -> tuple[Any, ...]:
        try:
            txn = txn_from_document(txn_document_of_fields(fields))
        except KvOpError as error:
            raise refused_op(error) from None
        result = await self.service.txn(txn, timeout_s)
        return result.offset, result.epoch, result.succeeded, [
            (r.op, r.key, r.found, r.value, r.version, r.mod_offset) for r in result.responses]

    async def _get(self, fields: tuple[Any, ...], timeout_s: float) -> tuple[Any, ...]:
        key, stale = fields
        found = await self.service.get(key, stale=stale, timeout_s=timeout_s)
        return found.value, found.applied_offset

    async def _get_now(self, fields: tuple[Any, ...], timeout_s: float) -> tuple[Any, ...]:
        key, _ = fields
        return await self._get((key, True), timeout_s)  # its first answer confirmed the read

    async def _append(self, fields: tuple[Any, ...], timeout_s: float) -> tuple[Any, ...]:
        (values,) = fields
        appended = await self.service.append(values, timeout_s)
        return appended.first_offset, appended.last_offset, appended.epoch

    async def _read(self, fields: tuple[Any, ...], _: float) -> tuple[Any, ...]:
        offset, max_records, wait_ms = fields
        _check_range("max_records", max_records, 1, MAX_READ_RECORDS)
        _check_range("wait_ms", wait_ms, 0, MAX_WAIT_MS)
        page = await self.service.read(_checked_offset(offset), max_records, wait_ms / 1000)
        return page.high_watermark, page.next_offset, [
            (record.offset, record.timestamp_ms, record.key, record.value)
            for record in page.records]

    async def _read_now(self, fields: tuple[Any, ...], timeout_s: float) -> tuple[Any, ...]:
        offset, max_records, _ = fields
        return await self._read((offset, max_records, 0), timeout_s)

    async def _list(self, fields: tuple[Any, ...], timeout_s: float) -> tuple[Any, ...]:
        prefix, start_after, limit, stale = fields
        _check_range("limit", limit, 1, MAX_LIST_LIMIT)
        page = await self.service.list_keys(prefix, start_after, limit, stale=stale,
                                            timeout_s=timeout_s)
        return page.entries, page.next_start_after, page.applied_offset

    async def _list_now(self, fields: tuple[Any, ...], timeout_s: float) -> tuple[Any, ...]:
        prefix, start_after, limit, _ = fields
        return await self._list((prefix, start_after, limit, True), timeout_s)

    async def _watch_now(self, fields: tuple[Any, ...], timeout_s: float) -> tuple[Any, ...]:
        exact, watched, offset, _, max_events = fields
        return await self._watch((exact, watched, offset, 0, max_events), timeout_s)

    async def _watch(self, fields: tuple[Any, ...], _: float) -> tuple[Any, ...]:
        exact, watched, offset, wait_ms, max_events = fields
        _check_range("wait_ms", wait_ms, 0, MAX_WAIT_MS)
        _check_range("max_events", max_events, 1, MAX_WATCH_EVENTS)
        changes = await self.service.watch(
            _checked_offset(offset), **({"key": watched} if exact else {"prefix": watched}),
            wait_s=wait_ms / 1000, max_events=max_events)
        return ([(event.offset, event.key, event.value) for event in changes.events],
                changes.next_offset, changes.applied_offset)


def _check_range(name: str, value: int, minimum: int, maximum: int) -> None:
    if not minimum <= value <= maximum:
        raise ServiceError(ErrorCode.BAD_REQUEST,
                           f"{name} must be between {minimum} and {maximum}, got {value}")


def _checked_offset(offset: int) -> int:
    _check_range("offset", offset, 0, 2**63 - 1)
    return offset


class _Stream:
    """One client's stream: its upgrade request and socket, what its credential may do, its
    requests in flight, and whether its client has room for more answers."""

    def __init__(self, request: web.Request, socket: web.WebSocketResponse, *, may_write: bool,
                 max_in_flight: int, max_unsent_bytes: int, write_timeout_s: float) -> None:
        self.request = request
        self.socket = socket
        self.may_write = may_write
        self.slots = asyncio.Semaphore(max_in_flight)
        self.in_flight = 0
        self.refused: set[Op] = set()  # the writes refused so far (audited once each)
        self._tasks: set[asyncio.Task[None]] = set()  # held until done (the loop holds weakly)
        self._reads: set[asyncio.Task[None]] = set()
        self._protocol = request.protocol
        self._write_timeout_s = write_timeout_s
        self._max_unsent_bytes = max_unsent_bytes
        self._unsent: list[bytes] = []  # answers to write at the end of this turn of the loop
        self._unsent_bytes = 0
        transport = request.transport
        if transport is not None:
            # Writing pauses past the bound, and resumes once a quarter of it is left unread.
            transport.set_write_buffer_limits(high=max_unsent_bytes)

    def track(self, task: asyncio.Task[None], *, read: bool) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if read:
            self._reads.add(task)
            task.add_done_callback(self._reads.discard)

    def cancel_reads(self) -> None:
        """The stream is closed: nobody waits for its reads' answers."""
        for task in self._reads:
            task.cancel("the stream closed")

    def finished(self) -> None:
        """A request (or a read that brought none) is over: its slot is free."""
        self.in_flight -= 1
        self.slots.release()

    def has_room(self) -> bool:
        """Whether the client has read its answers down to within the bound."""
        return not self._protocol.writing_paused

    async def room(self) -> bool:
        """Wait until the client has room for another answer: True then, False if the stream
        is closed first. A client that reads nothing for the write timeout has its stream cut:
        a close frame would wait behind the answers it does not read."""
        if self.socket.closed:
            return False
        if self.has_room():
            return True
        try:
            async with asyncio.timeout(self._write_timeout_s):
                while not self.has_room():
                    if self._protocol.transport is None:
                        return False  # the connection is gone (it stays paused)
                    # Shielded: the protocol's one drain waiter is every waiting answer's, and a
                    # timed-out wait must not cancel it for the others.
                    await asyncio.shield(self.request.writer.drain())
        except TimeoutError:
            self._cut()
            return False
        except ConnectionError:
            return False
        return not self.socket.closed

    def _cut(self) -> None:
        transport = self.request.transport
        if transport is None or transport.is_closing():
            return
        logger.info("closing a stream of %s: more than %d bytes of its answers unread for "
                    "%g s (http.stream.write.timeout.ms)", self.request.remote or "-",
                    self._max_unsent_bytes, self._write_timeout_s)
        transport.abort()

    def send_now(self, reply: bytes) -> None:
        """Write an answer at the end of this turn of the loop, with the others written in it:
        the answers to one commit go out in one write, not a system call each. It is written
        at once when no other request is in flight (nothing to wait for), or past a few
        answers' worth of bytes, so that the transport's buffer (and has_room) keeps counting
        what the client has not read."""
        if self.socket.closed:
            return
        self._unsent.append(reply)
        self._unsent_bytes += len(reply)
        # In flight: this request, and the slot of the reader waiting for the next one.
        if self.in_flight <= 2 or self._unsent_bytes >= _MAX_HELD_ANSWER_BYTES:
            self.flush()
        elif len(self._unsent) == 1:
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write the answers not yet written (before a close frame, which must come last)."""
        replies, self._unsent, self._unsent_bytes = self._unsent, [], 0
        transport = self.request.transport
        if not replies or self.socket.closed or transport is None or transport.is_closing():
            return
        transport.write(b"".join([Frame(Opcode.BINARY, reply).serialize(mask=False)
                                  for reply in replies]))

    async def close(self, code: int, reason: str) -> None:
        self.flush()
        await _close(self.socket, code, reason)


async def _close(socket: web.WebSocketResponse, code: int, reason: str) -> None:
    encoded = reason.encode("utf-8")[:_MAX_REASON_BYTES]
    with contextlib.suppress(ConnectionError, RuntimeError):
        await socket.close(code=code, message=encoded.decode("utf-8", "ignore").encode())


def txn_document_of_fields(fields: tuple[Any, ...]) -> dict[str, Any]:
    """A TXN request's fields as the txn's JSON document (``kv.txn_from_document`` checks it,
    as it does the HTTP API's body): a compare's operand is its value or its number, as its
    target says; an operation's value is given for a put only."""
    compares, success, failure = fields
    return {
        "compare": [{"key": key, "target": target, "result": result,
                     target: value if target == "value" else number}
                    for key, target, result, value, number in compares],
        "success": [_txn_op_document(op) for op in success],
        "failure": [_txn_op_document(op) for op in failure],
    }


def _txn_op_document(op: tuple[str, str, str | None]) -> dict[str, Any]:
    kind, key, value = op
    return {"op": kind, "key": key} if value is None else {"op": kind, "key": key, "value": value}
