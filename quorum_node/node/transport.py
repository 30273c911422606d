"""Peer RPCs over HTTP: how the quorum's messages travel between nodes.

Every message is one frame::

    header_length  uint32 big-endian
    header         the message as JSON (the seeds' PascalCase field names), without Records
    records        the message's record batches, raw, in the log's own byte format

so a Fetch response carries batches exactly as they lie on disk, never re-encoded as JSON.

Nodes talk over one WebSocket per peer (``GET /raft/v1/stream``), each binary message a request
or response tagged with a correlation id::

    request   correlation uint32 | rpc index uint8 (REQUEST_TYPES order) | frame
    response  correlation uint32 | status uint8 (0: frame follows, 1: UTF-8 error) | frame

A commit waits for two peer messages (the Fetch answer, the next Fetch), and a WebSocket message
costs a tenth of an HTTP request/response on the same connection. Requests are answered
concurrently (a Fetch may be parked for its long poll). Each RPC is also served as a plain POST to
``/raft/v1/<Name>`` (``/raft/v1/Vote``, ``/raft/v1/Fetch``, ...), one frame each way, for tools
and tests.

What a peer may send is bounded: a request carries no records, so a message or POST body larger
than the largest request header is refused (the stream is closed), and a response larger than a
fetch's bytes and a header likewise; a stream that stays silent (no message, no answer to a ping)
for the read timeout is closed. What a peer may hold of a node is bounded too: at most
``MAX_PARKED_PER_STREAM`` of a stream's requests wait for their answers (the next message is read
once one is answered), an answer ready while the peer has a whole answer unread is dropped (the
peer times it out, as a lost message), and a stream whose peer reads no answer for the read
timeout is cut. Over SSL a request must name as its sender the node the
connection's certificate speaks for (``quorum_node.security.peer_identity``); one naming another
node is refused before the node sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import ssl
import struct
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Final, TypeVar

import aiohttp
import pydantic_core
from aiohttp import web
from aiohttp.typedefs import Middleware
from pydantic import ValidationError

from quorum_node.addresses import address_url
from quorum_node.node.errors import ErrorCode
from quorum_node.node.idle_watch import IdleWatch
from quorum_node.node.limits import BodyRefused, read_body
from quorum_node.raft.config import QuorumConfig
from quorum_node.raft.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    RaftRequest,
    RaftResponse,
    VoteRequest,
    VoteResponse,
    check_received_epochs,
)
from quorum_node.raft.requests import RequestFailure
from quorum_node.security.authorization import Authorizer, Refused
from quorum_node.security.peer_secret import PEER_SECRET_HEADER
from quorum_node.security.tls import ReloadingTls

CONTENT_TYPE: Final = "application/x-quorum-rpc"
RPC_PREFIX: Final = "/raft/v1/"
_HEADER_LENGTH = struct.Struct(">I")
# A frame's JSON header is small; anything larger is refused before it is parsed.
MAX_HEADER_BYTES: Final = 64 * 1024

RESPONSE_TYPES: Final[Mapping[type[Message], type[Message]]] = {
    VoteRequest: VoteResponse,
    BeginQuorumEpochRequest: BeginQuorumEpochResponse,
    EndQuorumEpochRequest: EndQuorumEpochResponse,
    FetchRequest: FetchResponse,
    FetchSnapshotRequest: FetchSnapshotResponse,
}
REQUEST_TYPES: Final[Mapping[str, type[Message]]] = {
    "Vote": VoteRequest,
    "BeginQuorumEpoch": BeginQuorumEpochRequest,
    "EndQuorumEpoch": EndQuorumEpochRequest,
    "Fetch": FetchRequest,
    "FetchSnapshot": FetchSnapshotRequest,
}
_RPC_NAMES: Final = {cls: name for name, cls in REQUEST_TYPES.items()}
_RPC_INDEX: Final = {cls: index for index, cls in enumerate(REQUEST_TYPES.values())}
_RPC_BY_INDEX: Final = tuple(REQUEST_TYPES.values())
STREAM_PATH: Final = RPC_PREFIX + "stream"
# A follower has one Fetch (or FetchSnapshot) waiting for records at a time, and now and then a
# Vote or an epoch's announcement beside it; a stream with more waiting floods the node.
MAX_PARKED_PER_STREAM: Final = 8
_TAG = struct.Struct(">IB")
_OK, _ERROR = 0, 1
# The largest request a peer can send: requests carry no records, only a header. Anything larger
# is refused before it is buffered (a stream message, or a POST body). aiohttp's max_msg_size is
# exclusive, hence the + 1 where it is given.
MAX_REQUEST_BYTES: Final = _TAG.size + _HEADER_LENGTH.size + MAX_HEADER_BYTES


def max_response_bytes(quorum: QuorumConfig) -> int:
    """The largest answer a peer can send: a Fetch or FetchSnapshot holds up to fetch_max_bytes
    of records, or one batch (up to max_batch_bytes) when the first is larger, and a header."""
    return max(quorum.fetch_max_bytes, quorum.max_batch_bytes) + MAX_REQUEST_BYTES


def claimed_node_id(request: Message) -> int:
    """The node a request says it comes from."""
    if isinstance(request, FetchRequest | FetchSnapshotRequest | VoteRequest):
        return request.replica_id
    if isinstance(request, BeginQuorumEpochRequest | EndQuorumEpochRequest):
        return request.leader_id
    raise TypeError(type(request))


logger = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)


class FrameError(ValueError):
    """A body that is not a valid frame of the expected message."""


def encode_frame(message: Message) -> bytes:
    records: bytes = getattr(message, "records", b"")
    header = message.model_dump_json(by_alias=True, exclude={"records"}).encode()
    return _HEADER_LENGTH.pack(len(header)) + header + records


def decode_frame(cls: type[M], data: bytes) -> M:
    if len(data) < _HEADER_LENGTH.size:
        raise FrameError("frame shorter than its header length")
    (length,) = _HEADER_LENGTH.unpack_from(data)
    end = _HEADER_LENGTH.size + length
    if length > MAX_HEADER_BYTES or end > len(data):
        raise FrameError(f"invalid frame header length {length}")
    try:
        # pydantic-core's JSON parser: faster than json.loads on every frame header.
        fields = pydantic_core.from_json(data[_HEADER_LENGTH.size : end])
    except ValueError as error:
        raise FrameError(f"frame header is not JSON: {error}") from None
    if not isinstance(fields, dict):
        raise FrameError("frame header is not a JSON object")
    records = data[end:]
    if records:
        if "records" not in cls.model_fields:
            raise FrameError(f"{cls.__name__} carries no records")
        fields["Records"] = records
    try:
        message = cls.model_validate(fields)
        check_received_epochs(message)
    except ValidationError as error:
        raise FrameError(f"invalid {cls.__name__}: {error.errors()[0]['msg']}") from None
    except ValueError as error:
        raise FrameError(f"invalid {cls.__name__}: {error}") from None
    return message


# What a call's caller is told, once: the response, or why there is none.
OnAnswer = Callable[["RaftResponse | PeerUnavailable"], None]


class PeerClient:
    """Sends RPCs to peers by node id, over one WebSocket per peer, opened on first use and again
    after it fails."""

    def __init__(self, endpoints: Mapping[int, tuple[str, int]], timeout_ms: int, *,
                 tls: ReloadingTls | None = None,
                 peer_secret: Callable[[], str | None] | None = None,
                 on_peer_lost: Callable[[int], None] | None = None,
                 max_response_bytes: int = max_response_bytes(QuorumConfig()),
                 idle_timeout_s: float | None = None) -> None:
        self._endpoints = dict(endpoints)
        self._tls = tls
        self._max_response_bytes = max_response_bytes
        # A stream silent for this long (no answer to a ping sent halfway) is closed.
        self._heartbeat_s = idle_timeout_s / 2 if idle_timeout_s is not None else None
        # The quorum's shared secret, sent with each stream's handshake on PLAINTEXT; read at
        # each connection, so that a reloaded secret is used from then on.
        self._peer_secret = peer_secret
        # Told the node id whenever an open stream to a peer ends (the peer closed it, or it
        # broke): the peer may be gone even though no call of ours is waiting to find out.
        self._on_peer_lost = on_peer_lost
        self._timeout_s = timeout_ms / 1000
        self._session: aiohttp.ClientSession | None = None
        self._streams: dict[int, _PeerStream] = {}
        self._connecting: dict[int, asyncio.Future[_PeerStream]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def start_call(self, destination: int, request: RaftRequest, on_answer: OnAnswer) -> None:
        """Send ``request``, now if the peer's stream is open, else once it is. ``on_answer`` is
        called once, never from within this call: with the response, or with PeerUnavailable
        when the peer cannot be reached, does not answer within the request timeout, or answers
        with something invalid."""
        stream = self._streams.get(destination)
        if stream is not None and not stream.closed:
            stream.start_call(request, self._timeout_s, on_answer)
            return
        task = asyncio.ensure_future(self._connect_and_call(destination, request, on_answer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def send(self, destination: int, request: RaftRequest) -> RaftResponse:
        """``start_call``, awaited: the response; raises PeerUnavailable."""
        answered: asyncio.Future[RaftResponse | PeerUnavailable] = (
            asyncio.get_running_loop().create_future())
        self.start_call(destination, request, answered.set_result)
        answer = await answered
        if isinstance(answer, PeerUnavailable):
            raise answer
        return answer

    async def _connect_and_call(self, destination: int, request: RaftRequest,
                                on_answer: OnAnswer) -> None:
        try:
            stream = await self._stream(destination)
        except PeerUnavailable as error:
            on_answer(error)
            return
        stream.start_call(request, self._timeout_s, on_answer)

    async def _stream(self, destination: int) -> _PeerStream:
        stream = self._streams.get(destination)
        if stream is not None and not stream.closed:
            return stream
        # One connection attempt at a time per peer; concurrent senders share it.
        pending = self._connecting.get(destination)
        if pending is None:
            pending = asyncio.ensure_future(self._connect(destination))
            self._connecting[destination] = pending
            pending.add_done_callback(functools.partial(self._connected, destination))
        return await asyncio.shield(pending)

    def _connected(self, destination: int, attempt: asyncio.Future[_PeerStream]) -> None:
        self._connecting.pop(destination, None)
        # Retrieved here: when every sender waiting for it was cancelled (a node shutting
        # down), asyncio would log the failure as an unhandled exception.
        if not attempt.cancelled():
            attempt.exception()

    async def _connect(self, destination: int) -> _PeerStream:
        endpoint = self._endpoints.get(destination)
        if endpoint is None:
            raise PeerUnavailable(f"no endpoint known for node {destination}")
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(enable_cleanup_closed=True))
        host, port = endpoint
        scheme = "https" if self._tls is not None else "http"
        url = address_url(scheme, host, port, STREAM_PATH)
        secret = self._peer_secret() if self._peer_secret is not None else None
        headers = {PEER_SECRET_HEADER: secret} if secret is not None else None
        try:
            # The handshake is bounded by the request timeout, like any RPC. The client context
            # is taken at each connection, so a reloaded certificate is used from then on.
            socket = await asyncio.wait_for(
                self._session.ws_connect(
                    url, max_msg_size=self._max_response_bytes + 1, compress=0,
                    heartbeat=self._heartbeat_s, headers=headers,
                    ssl=self._tls.client if self._tls is not None else True),
                self._timeout_s)
        except (TimeoutError, aiohttp.ClientError, OSError, ssl.SSLError) as error:
            # str, not repr: the operator reads it in the log ("Cannot connect to host ...").
            reason = str(error) or type(error).__name__
            raise PeerUnavailable(f"node {destination} unreachable: {reason}",
                                  connection_failure(error)) from None
        # A timed-out or broken call may mean a silently dead connection: start afresh.
        stream = _PeerStream(destination, socket, on_unavailable=self._drop,
                             on_ended=self._stream_ended)
        self._streams[destination] = stream
        return stream

    def _stream_ended(self, stream: _PeerStream) -> None:
        if self._on_peer_lost is not None and self._streams.get(stream.destination) in (
                stream, None):
            self._on_peer_lost(stream.destination)

    def close_streams(self) -> None:
        """Close every open stream (the TLS files changed: each is made again, and verified
        against the current CA, at its next call)."""
        for stream in list(self._streams.values()):
            self._drop(stream)

    def _drop(self, stream: _PeerStream) -> None:
        if self._streams.get(stream.destination) is stream:
            del self._streams[stream.destination]
        task = asyncio.ensure_future(stream.close())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        streams = list(self._streams.values())
        self._streams.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for stream in streams:
            await stream.close()
        if self._session is not None:
            await self._session.close()
            self._session = None


class _PeerStream:
    """One WebSocket to a peer: requests go out tagged and are written at once; the reader task
    hands each answer to its caller's callback."""

    def __init__(self, destination: int, socket: aiohttp.ClientWebSocketResponse, *,
                 on_unavailable: Callable[[_PeerStream], None],
                 on_ended: Callable[[_PeerStream], None]) -> None:
        self.destination = destination
        self._socket = socket
        self._on_unavailable = on_unavailable  # told when a call ends in PeerUnavailable
        self._on_ended = on_ended  # told once the stream has ended
        # correlation id -> (the response type expected, the caller's callback, its timeout)
        self._pending: dict[int, tuple[type[Message], OnAnswer, asyncio.TimerHandle]] = {}
        self._next_correlation = 0
        self._ended = False
        self._reader = asyncio.ensure_future(self._read())

    @property
    def closed(self) -> bool:
        return self._ended or self._socket.closed or self._reader.done()

    def start_call(self, request: RaftRequest, timeout_s: float, on_answer: OnAnswer) -> None:
        self._next_correlation = (self._next_correlation + 1) % 2**32
        correlation = self._next_correlation
        loop = asyncio.get_running_loop()
        timer = loop.call_later(timeout_s, self._settle, correlation, PeerUnavailable(
            f"node {self.destination} did not answer in {timeout_s:g} s"))
        self._pending[correlation] = (RESPONSE_TYPES[type(request)], on_answer, timer)

        def failed(error: BaseException) -> None:
            # Told later, as promised: never from within start_call.
            loop.call_soon(self._settle, correlation, PeerUnavailable(
                f"node {self.destination} unreachable: {error!r}"))

        frame = _TAG.pack(correlation, _RPC_INDEX[type(request)]) + encode_frame(request)
        start_now(self._socket.send_bytes(frame), failed)

    def _settle(self, correlation: int, answer: RaftResponse | PeerUnavailable) -> None:
        pending = self._pending.pop(correlation, None)
        if pending is None:
            return  # settled already (answered, timed out, or the stream ended)
        _, on_answer, timer = pending
        timer.cancel()
        if isinstance(answer, PeerUnavailable):
            self._on_unavailable(self)
        on_answer(answer)

    async def _read(self) -> None:
        # Until the peer ends the stream (below), an end is ours: closed on a timeout, or on
        # a TLS reload (``close_streams``).
        reason, failure = "stream closed", RequestFailure.UNANSWERED
        try:
            async for message in self._socket:
                if message.type is not aiohttp.WSMsgType.BINARY:
                    reason, failure = stream_error(message)
                    break
                self._answer(message.data)
            else:
                reason, failure = "connection closed", RequestFailure.CLOSED
        except (aiohttp.ClientError, OSError) as error:
            reason, failure = repr(error), ended_by(error)
        finally:
            self._ended = True  # no new calls on this stream from the callbacks below
            for correlation in list(self._pending):
                self._settle(correlation, PeerUnavailable(
                    f"node {self.destination} unreachable: {reason}", failure))
            self._on_ended(self)

    def _answer(self, data: bytes) -> None:
        if len(data) < _TAG.size:
            return
        correlation, status = _TAG.unpack_from(data)
        pending = self._pending.get(correlation)
        if pending is None:
            return  # answered after its caller gave up
        response_type = pending[0]
        body = data[_TAG.size:]
        if status != _OK:
            self._settle(correlation, PeerUnavailable(
                f"node {self.destination} refused: {body.decode(errors='replace')}"))
            return
        try:
            response = decode_frame(response_type, body)
        except FrameError as error:
            self._settle(correlation, PeerUnavailable(
                f"node {self.destination} sent a bad response: {error}"))
            return
        self._settle(correlation, response)  # type: ignore[arg-type]

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self._socket.close()


_FINISHING: set[asyncio.Task[None]] = set()


def start_now(coroutine: Coroutine[Any, Any, None],
              on_error: Callable[[BaseException], None]) -> None:
    """Run ``coroutine`` here and now until it first has to wait; a task finishes it from there
    (what Python 3.12's eager tasks do). A WebSocket write is done at once unless the socket's
    buffer is full: a task per message would cost more than the message. ``on_error`` gets what
    it raises."""
    try:
        awaited = coroutine.send(None)
    except StopIteration:
        return
    except Exception as error:
        coroutine.close()
        on_error(error)
        return
    loop = asyncio.get_running_loop()

    def finish(_: object = None) -> None:
        # The wait it stopped at is over: a task takes the coroutine on from there.
        task = loop.create_task(coroutine)
        _FINISHING.add(task)
        task.add_done_callback(finished)

    def finished(task: asyncio.Task[None]) -> None:
        _FINISHING.discard(task)
        if not task.cancelled() and task.exception() is not None:
            on_error(task.exception())  # type: ignore[arg-type]

    if isinstance(awaited, asyncio.Future):
        # What a task does with a future its coroutine yields: the future is marked as waited
        # on. Left marked, the next coroutine to await it (a future shared by several waiters,
        # such as a connection's drain) would fail with "await wasn't used with future".
        awaited._asyncio_future_blocking = False
        awaited.add_done_callback(finish)
    else:
        loop.call_soon(finish)


class PeerUnavailable(Exception):
    """No answer from a peer. ``failure`` says why, for the core: ``REFUSED`` when the connection
    was refused (nothing listens at the peer's address: its process is gone), ``CLOSED`` when
    the peer ended the stream the request was on, else ``UNANSWERED`` (a timeout, a failed
    handshake or an unusable answer, all of which a live peer behind a partition, paused or
    overloaded can give)."""

    def __init__(self, message: str,
                 failure: RequestFailure = RequestFailure.UNANSWERED) -> None:
        super().__init__(message)
        self.failure = failure


def ended_by(error: BaseException) -> RequestFailure:
    """What a stream's error tells of the peer: a reset is the peer's end of the connection (a
    killed process's kernel resets what it held unread); anything else says nothing."""
    reset = isinstance(error, ConnectionResetError) or (
        isinstance(error, OSError) and error.errno == errno.ECONNRESET)
    return RequestFailure.CLOSED if reset else RequestFailure.UNANSWERED


def stream_error(message: aiohttp.WSMessage) -> tuple[str, RequestFailure]:
    """Why a stream gave something other than a response (an ERROR carries the exception: a
    reset, or a heartbeat that got no pong), and what it tells of the peer."""
    if message.type is aiohttp.WSMsgType.ERROR and isinstance(message.data, BaseException):
        return repr(message.data), ended_by(message.data)
    return f"unexpected {message.type.name} message", RequestFailure.UNANSWERED


def connection_failure(error: BaseException) -> RequestFailure:
    """What a failed connection attempt tells of the peer: only a refusal (the peer's host
    answered the connection with a reset: no socket listens on the port) says its process is
    gone; a timeout, an unreachable host or a failed TLS or WebSocket handshake says nothing."""
    cause = error.os_error if isinstance(error, aiohttp.ClientConnectorError) else error
    return (RequestFailure.REFUSED if isinstance(cause, ConnectionRefusedError)
            else RequestFailure.UNANSWERED)


# A parked request's answer, given later; None when there will be none (the node is stopping,
# or gave no answer within the request timeout).
Reply = Callable[["RaftResponse | None"], None]
# The node's answer to a request: at once, or None and the answer later through ``reply``,
# called exactly once. Raises web.HTTPException to refuse the request.
RequestHandler = Callable[[RaftRequest, Reply], "RaftResponse | None"]
NO_ANSWER: Final = "no response from the quorum core"


class PeerServer:
    """Serves the peer RPCs: the WebSocket stream, and each RPC as a POST. With an
    ``authorizer`` over SSL, a request naming another sender than the node of the connection's
    certificate is refused (403, or the stream's error frame)."""

    def __init__(self, handle: RequestHandler, *, authorizer: Authorizer | None = None,
                 idle_timeout_s: float | None = None,
                 max_unsent_bytes: int = max_response_bytes(QuorumConfig())) -> None:
        self._handle = handle
        self._authorizer = authorizer
        self._idle_timeout_s = idle_timeout_s
        self._max_unsent_bytes = max_unsent_bytes  # a whole answer, the largest there is
        self._sockets: set[web.WebSocketResponse] = set()

    def _peer_node_id(self, http_request: web.Request) -> int | None:
        """The node the connection speaks for; None when peers are not identified by
        certificates. Raises Refused."""
        if self._authorizer is None:
            return None
        return self._authorizer.peer_node_id(http_request)

    def _refuse_claim(self, http_request: web.Request, peer_node_id: int | None,
                      request: Message) -> Refused | None:
        if self._authorizer is None:
            return None
        return self._authorizer.check_peer_claim(http_request, peer_node_id,
                                                 claimed_node_id(request))

    def routes(self) -> list[web.RouteDef]:
        posts = [self._post_route(name, cls) for name, cls in REQUEST_TYPES.items()]
        return [web.get(STREAM_PATH, self._stream), *posts]

    def _post_route(self, name: str, request_type: type[Message]) -> web.RouteDef:
        async def handler(http_request: web.Request) -> web.Response:
            try:
                peer_node_id = self._peer_node_id(http_request)
            except Refused as refusal:
                return web.Response(status=refusal.status, text=f"{refusal.message}\n")
            try:
                body = await read_body(http_request, MAX_REQUEST_BYTES - _TAG.size)
            except BodyRefused as refusal:
                refused = web.Response(status=refusal.status, text=f"{refusal.message}\n")
                refused.force_close()
                return refused
            try:
                request = decode_frame(request_type, body)
            except FrameError as error:
                return web.Response(status=400, text=f"{error}\n")
            mismatch = self._refuse_claim(http_request, peer_node_id, request)
            if mismatch is not None:
                return web.Response(status=mismatch.status, text=f"{mismatch.message}\n")
            later: asyncio.Future[RaftResponse | None] = (
                asyncio.get_running_loop().create_future())
            answer = self._handle(request, later.set_result)  # type: ignore[arg-type]
            if answer is None:
                answer = await later
                if answer is None:
                    raise web.HTTPServiceUnavailable(text=f"{NO_ANSWER}\n")
            return web.Response(body=encode_frame(answer), content_type=CONTENT_TYPE)

        return web.post(f"{RPC_PREFIX}{name}", handler)

    async def _stream(self, http_request: web.Request) -> web.StreamResponse:
        try:
            # The connection's identity, once: each message on it is checked against it.
            peer_node_id = self._peer_node_id(http_request)
        except Refused as refusal:
            return web.Response(status=refusal.status, text=f"{refusal.message}\n")
        idle_s = self._idle_timeout_s
        socket = web.WebSocketResponse(
            max_msg_size=MAX_REQUEST_BYTES + 1, compress=False,
            heartbeat=idle_s / 2 if idle_s is not None else None)
        await socket.prepare(http_request)
        stream = _ServedStream(socket, http_request, max_unsent_bytes=self._max_unsent_bytes,
                               write_timeout_s=idle_s)
        self._sockets.add(socket)
        # Not receive()'s own timeout, one per message: a stream that sends nothing while none
        # of its requests is parked is closed by the idle watch (then CLOSING is received).
        idle = IdleWatch(idle_s, busy=lambda: stream.parked > 0, close=lambda: socket.close(
            code=aiohttp.WSCloseCode.GOING_AWAY, message=f"idle for {idle_s:g} s".encode()))
        try:
            while True:
                idle.receiving()
                message = await socket.receive()
                idle.received()
                if message.type is not aiohttp.WSMsgType.BINARY:
                    break
                # Answered here and now, or (a parked Fetch) written by the reply callback the
                # moment the node has the answer: no task per request.
                reply = self._answer(stream, message.data, http_request, peer_node_id)
                if reply is not None and not await stream.send(reply):
                    break
                await stream.fewer_parked_than(MAX_PARKED_PER_STREAM)
        finally:
            self._sockets.discard(socket)
            await idle.stop()
        return socket

    def _answer(self, stream: _ServedStream, data: bytes, http_request: web.Request,
                peer_node_id: int | None) -> bytes | None:
        """The reply to a tagged request, or None if there is none yet (or none at all)."""
        if len(data) < _TAG.size:
            return None
        correlation, index = _TAG.unpack_from(data)
        try:
            if index >= len(_RPC_BY_INDEX):
                raise FrameError(f"unknown rpc {index}")
            request = decode_frame(_RPC_BY_INDEX[index], data[_TAG.size:])
            if peer_node_id is not None:
                refusal = self._refuse_claim(http_request, peer_node_id, request)
                if refusal is not None:
                    return _TAG.pack(correlation, _ERROR) + refusal.message.encode()
            answer = self._handle(request, functools.partial(stream.reply_later, correlation))
        except (FrameError, web.HTTPException) as error:
            return _TAG.pack(correlation, _ERROR) + str(error).encode()
        if answer is None:
            stream.parked += 1
            return None
        return _TAG.pack(correlation, _OK) + encode_frame(answer)

    async def close(self) -> None:
        """Close the peers' streams (at shutdown: they would hold the server open)."""
        for socket in list(self._sockets):
            await socket.close()


@web.middleware
async def refusals_close_connections(
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Outermost on a listener that serves peers only: a request refused for any reason (no
    secret, no node's certificate, a route that is no peer RPC) closes its connection after the
    answer, so a connection is held only by a caller with a peer's credential."""
    try:
        response = await handler(request)
    except web.HTTPException as error:
        if error.status >= 400:
            request.protocol.close()  # once this answer is written; nothing more is read
        raise
    if response.status >= 400:
        request.protocol.close()
    return response


def wrong_listener_middleware(where_clients_go: str) -> Middleware:
    """On a listener that serves peers only: a request for anything but a peer RPC (a client
    or an admin tool pointed at the controller listener) is answered with the one error body,
    421 ``WRONG_LISTENER``, saying where clients are served (``where_clients_go``)."""

    @web.middleware
    async def wrong_listener(request: web.Request,
                             handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                             ) -> web.StreamResponse:
        problem = request.match_info.http_exception
        if problem is None or problem.status not in (404, 405) \
                or request.path.startswith(RPC_PREFIX):
            return await handler(request)
        return web.json_response(
            {"code": ErrorCode.WRONG_LISTENER.value,
             "message": f"{request.method} {request.path}: this is a controller listener, which "
                        f"serves the peers (and Kafka's admin protocol, as "
                        f"--bootstrap-controller); {where_clients_go}"},
            status=421)

    return wrong_listener


class _ServedStream:
    """A peer's stream as this node serves it: its requests waiting for their answers (parked),
    and whether the peer reads its answers."""

    def __init__(self, socket: web.WebSocketResponse, http_request: web.Request, *,
                 max_unsent_bytes: int, write_timeout_s: float | None) -> None:
        self.socket = socket
        self.parked = 0
        self._request = http_request
        self._write_timeout_s = write_timeout_s
        self._unparked = asyncio.Event()
        transport = http_request.transport
        if transport is not None:
            # Writing pauses once more than a whole answer is unread.
            transport.set_write_buffer_limits(high=max_unsent_bytes)

    def reply_later(self, correlation: int, answer: RaftResponse | None) -> None:
        """The answer of a parked request (None: there is none), written now unless the peer
        has left a whole answer unread: then it is dropped, and the peer times the request out
        as it would a lost message."""
        self.parked -= 1
        self._unparked.set()
        if self.socket.closed or self._request.protocol.writing_paused:
            return
        if answer is None:
            reply = _TAG.pack(correlation, _ERROR) + NO_ANSWER.encode()
        else:
            reply = _TAG.pack(correlation, _OK) + encode_frame(answer)
        start_now(self.socket.send_bytes(reply), _ignore)  # the peer may be gone meanwhile

    async def fewer_parked_than(self, most: int) -> None:
        """Wait until fewer than ``most`` requests of the stream are parked (each is answered
        within the request timeout, or at shutdown)."""
        while self.parked >= most:
            self._unparked.clear()
            await self._unparked.wait()

    async def send(self, reply: bytes) -> bool:
        """Write ``reply`` once the peer has read its earlier answers; False (the stream cut)
        if it reads none for the write timeout, or the stream is gone."""
        try:
            async with asyncio.timeout(self._write_timeout_s):
                await self.socket.send_bytes(reply)
        except TimeoutError:
            transport = self._request.transport
            if transport is not None:
                transport.abort()  # a close frame would wait behind the unread answers
            return False
        except (ConnectionError, RuntimeError):
            return False  # the peer is gone; it times out its request
        return True


def _ignore(_: BaseException) -> None:
    pass


