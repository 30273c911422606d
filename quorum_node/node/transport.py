"""Peer RPCs over HTTP: how the quorum's messages travel between nodes.

Each RPC is a POST to ``/raft/v1/<Name>`` (``/raft/v1/Vote``, ``/raft/v1/Fetch``, ...). Bodies,
both ways, are one frame::

    header_length  uint32 big-endian
    header         the message as JSON (the seeds' PascalCase field names), without Records
    records        the message's record batches, raw, in the log's own byte format

so a Fetch response carries batches exactly as they lie on disk, never re-encoded as JSON.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Awaitable, Callable, Mapping
from typing import Final, TypeVar

import aiohttp
from aiohttp import web
from pydantic import ValidationError

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
)

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
        fields = json.loads(data[_HEADER_LENGTH.size : end])
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise FrameError(f"frame header is not JSON: {error}") from None
    if not isinstance(fields, dict):
        raise FrameError("frame header is not a JSON object")
    records = data[end:]
    if records:
        if "records" not in cls.model_fields:
            raise FrameError(f"{cls.__name__} carries no records")
        fields["Records"] = records
    try:
        return cls.model_validate(fields)
    except ValidationError as error:
        raise FrameError(f"invalid {cls.__name__}: {error.errors()[0]['msg']}") from None


class PeerClient:
    """Sends RPCs to peers by node id. One aiohttp session, connections kept alive."""

    def __init__(self, endpoints: Mapping[int, tuple[str, int]], timeout_ms: int) -> None:
        self._endpoints = dict(endpoints)
        self._timeout = aiohttp.ClientTimeout(total=timeout_ms / 1000)
        self._session: aiohttp.ClientSession | None = None

    async def send(self, destination: int, request: RaftRequest) -> RaftResponse:
        """Deliver ``request``; raises ``PeerUnavailable`` when the peer cannot be reached or
        answers with something that is not a valid response."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit_per_host=8, enable_cleanup_closed=True),
            )
        endpoint = self._endpoints.get(destination)
        if endpoint is None:
            raise PeerUnavailable(f"no endpoint known for node {destination}")
        host, port = endpoint
        url = f"http://{_url_host(host)}:{port}{RPC_PREFIX}{_RPC_NAMES[type(request)]}"
        try:
            async with self._session.post(
                url, data=encode_frame(request), headers={"Content-Type": CONTENT_TYPE}
            ) as response:
                body = await response.read()
                if response.status != 200:
                    raise PeerUnavailable(f"node {destination} answered HTTP {response.status}")
        except (TimeoutError, aiohttp.ClientError, OSError) as error:
            raise PeerUnavailable(f"node {destination} unreachable: {error!r}") from None
        try:
            response_type = RESPONSE_TYPES[type(request)]
            return decode_frame(response_type, body)  # type: ignore[return-value]
        except FrameError as error:
            raise PeerUnavailable(f"node {destination} sent a bad response: {error}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class PeerUnavailable(Exception):
    pass


RequestHandler = Callable[[RaftRequest], Awaitable[RaftResponse]]


def peer_routes(handle: RequestHandler) -> list[web.RouteDef]:
    """The aiohttp routes of the peer RPCs, each decoding its frame and handing the request on."""

    def route(name: str, request_type: type[Message]) -> web.RouteDef:
        async def handler(http_request: web.Request) -> web.Response:
            body = await http_request.read()
            try:
                request = decode_frame(request_type, body)
            except FrameError as error:
                return web.Response(status=400, text=f"{error}\n")
            response = await handle(request)  # type: ignore[arg-type]
            return web.Response(body=encode_frame(response), content_type=CONTENT_TYPE)

        return web.post(f"{RPC_PREFIX}{name}", handler)

    return [route(name, cls) for name, cls in REQUEST_TYPES.items()]


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
