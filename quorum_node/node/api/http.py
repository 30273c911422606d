"""The one HTTP convention of every endpoint of a node (client API, admin API, backup, probes).

- Every error answer is JSON ``{"code": "UPPER_SNAKE_CODE", "message": "one human line"}``
  (``quorum_node.node.errors.ErrorCode``), plus, on a NOT_LEADER redirect (307, ``Location`` the
  same request at the leader) or NO_LEADER (503), ``"leader": {"id": int|null, "url":
  str|null}``. Nothing else: details a client needs go in the message.
- Handlers raise ``ApiError`` (an HTTP status of its own), ``ServiceError`` (the status is the
  code's, ``STATUS``) or ``NotLeaderError`` (307 to the leader, or 503 NO_LEADER); the one
  middleware, ``error_middleware``, turns each into the error body, and so does it for aiohttp's
  own refusals (404, 405, 413).
- One body reader (``read_body``, ``read_json``: bounded, timed), one query-parameter parser
  (``Query``: known names only, each at most once, integers in bounds, booleans ``true`` or
  ``false``).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from aiohttp import web
from aiohttp.typedefs import Middleware
from multidict import MultiMapping

from quorum_node.addresses import address_url
from quorum_node.node.errors import ErrorCode, ServiceError
from quorum_node.node.limits import BodyRefused, JsonRefused, parse_json
from quorum_node.node.limits import read_body as read_limited_body
from quorum_node.node.runtime import QuorumNode
from quorum_node.node.story import no_writes_yet
from quorum_node.node.transport import RPC_PREFIX, STREAM_PATH
from quorum_node.raft.types import NotLeaderError

# The HTTP status of each code.
STATUS: Mapping[ErrorCode, int] = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.WRONG_LISTENER: 421,
    ErrorCode.KEY_NOT_FOUND: 404,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.REQUEST_TIMEOUT: 408,
    ErrorCode.DUPLICATE_VOTER: 409,
    ErrorCode.VOTER_NOT_FOUND: 409,
    ErrorCode.COMPACTED: 410,
    ErrorCode.TOO_LARGE: 413,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorCode.OFFSET_OUT_OF_RANGE: 416,
    ErrorCode.TOO_MANY_LONG_POLLS: 429,
    ErrorCode.INTERNAL: 500,
    ErrorCode.UNSUPPORTED_VERSION: 500,
    ErrorCode.NO_LEADER: 503,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: 503,
    ErrorCode.OUTCOME_UNKNOWN: 503,
    ErrorCode.APPEND_LOST: 503,
    ErrorCode.SHUTTING_DOWN: 503,
    ErrorCode.NODE_FAILED: 503,
    ErrorCode.NOT_READY: 503,
    ErrorCode.BACKUP_UNAVAILABLE: 503,
    ErrorCode.DISK_FULL: 507,  # Insufficient Storage
    ErrorCode.TIMEOUT: 504,
    ErrorCode.REQUEST_TIMED_OUT: 504,
    ErrorCode.NOT_LEADER: 307,
}

# aiohttp's own refusals (no route, wrong method, a body over client_max_size) -> their code.
_HTTP_CODES: Mapping[int, ErrorCode] = {
    400: ErrorCode.BAD_REQUEST, 404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED,
    408: ErrorCode.REQUEST_TIMEOUT, 413: ErrorCode.TOO_LARGE,
    415: ErrorCode.UNSUPPORTED_MEDIA_TYPE, 503: ErrorCode.SHUTTING_DOWN,
}
_INTEGER = re.compile(r"-?[0-9]+")


@dataclass(frozen=True, slots=True)
class Leader:
    """Who leads, as a redirect names it (either may be unknown)."""

    id: int | None
    url: str | None


class ApiError(Exception):
    """An error answer: an HTTP status, a code, a message (and the leader, on NOT_LEADER or
    NO_LEADER)."""

    def __init__(self, status: int, code: ErrorCode, message: str, *,
                 leader: Leader | None = None, headers: Mapping[str, str] | None = None,
                 close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.leader = leader
        self.headers = dict(headers or {})
        self.close = close  # the body was not read whole: the connection cannot be reused

    @classmethod
    def of(cls, code: ErrorCode, message: str, **options: Any) -> ApiError:
        """The error with the status of its code."""
        return cls(STATUS[code], code, message, **options)

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": str(self.code), "message": self.message}
        if self.leader is not None:
            body["leader"] = {"id": self.leader.id, "url": self.leader.url}
        return body

    def response(self) -> web.Response:
        response = web.json_response(self.body(), status=self.status, headers=self.headers)
        if self.close:
            response.force_close()
        return response


def bad_request(message: str) -> NoReturn:
    raise ApiError.of(ErrorCode.BAD_REQUEST, message)


def from_service(error: ServiceError) -> ApiError:
    headers = {"Retry-After": "1"} if error.code is ErrorCode.TOO_MANY_LONG_POLLS else None
    return ApiError.of(error.code, error.message, headers=headers)


def endpoint_url(endpoint: tuple[str, int] | None, scheme: str) -> str | None:
    return None if endpoint is None else address_url(scheme, *endpoint)


def not_leader(node: QuorumNode, request: web.Request, leader_id: int | None) -> ApiError:
    """307 to the leader's client listener, the same method, path, query and body; or 503
    NO_LEADER while no leader (or no address of it) is known. ``leader_id``: the leader as the
    refusal named it (None: none known)."""
    if leader_id == node.config.node_id:
        leader_id = None  # a resigning leader still names itself: no successor known yet
    url = None if leader_id is None else endpoint_url(node.client_endpoints.get(leader_id),
                                                      node.config.url_scheme)
    if leader_id is None or url is None:
        unheard = node.voters_unheard  # a new quorum's leader, before it takes writes
        node_id = node.config.node_id
        why = (f"node {node_id} {no_writes_yet(node_id, node.epoch, unheard)}" if unheard
               else f"no leader is known in epoch {node.epoch}")
        return ApiError.of(ErrorCode.NO_LEADER, f"{why}; retry shortly",
                           leader=Leader(leader_id, None))
    return ApiError.of(
        ErrorCode.NOT_LEADER,
        f"node {node.config.node_id} is not the leader; node {leader_id} is",
        leader=Leader(leader_id, url), headers={"Location": url + request.raw_path})


def node_failed(node: QuorumNode) -> None:
    """Raise NODE_FAILED if the node stopped after a failure."""
    if node.failure is not None:
        raise ApiError.of(ErrorCode.NODE_FAILED,
                          f"the node stopped after a failure: {node.failure}")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_middleware(node: QuorumNode) -> Middleware:
    """The one place errors become answers, for every route of the application (the peer
    RPCs, which speak their own protocol, aside)."""

    @web.middleware
    async def answer_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as error:
            return error.response()
        except ServiceError as error:
            return from_service(error).response()
        except NotLeaderError as error:
            return not_leader(node, request, error.leader_id).response()
        except web.HTTPException as error:
            if error.status < 400 or _is_peer_path(request.path):
                raise
            code = _HTTP_CODES.get(error.status, ErrorCode.BAD_REQUEST
                                   if error.status < 500 else ErrorCode.INTERNAL)
            default = f"{error.status}: {error.reason}"  # aiohttp's text when given none
            message = error.text if error.text and error.text != default else (
                f"{request.method} {request.path}: {error.reason}")
            return ApiError(error.status, code, message.strip().splitlines()[0],
                            headers={k: v for k, v in error.headers.items()
                                     if k.lower() == "allow"}).response()

    return answer_errors


def _is_peer_path(path: str) -> bool:
    return path.startswith(RPC_PREFIX) or path == STREAM_PATH


# --- request bodies ------------------------------------------------------------------------------

async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole body, at most ``limit`` bytes, within the node's read timeout; else 413
    TOO_LARGE or 408 REQUEST_TIMEOUT (closing the connection: the body was not read whole)."""
    try:
        return await read_limited_body(request, limit)
    except BodyRefused as refusal:
        code = ErrorCode.TOO_LARGE if refusal.status == 413 else ErrorCode.REQUEST_TIMEOUT
        raise ApiError(refusal.status, code, refusal.message, close=True) from None


def parse_json_body(body: bytes, expected: str = "") -> Any:
    """The JSON document of ``body``; 400 BAD_REQUEST (saying ``expected``) if it is not one."""
    try:
        return parse_json(body)
    except JsonRefused as error:
        bad_request(f"{error}{': expected ' + expected if expected else ''}")


async def read_json(request: web.Request, limit: int, expected: str = "") -> Any:
    return parse_json_body(await read_body(request, limit), expected)


# --- query parameters ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Query:
    """A request's query parameters, each given at most once, none unknown."""

    values: Mapping[str, str]

    @classmethod
    def of(cls, request: web.Request, allowed: frozenset[str]) -> Query:
        query: MultiMapping[str] = request.query
        unknown = sorted(set(query) - allowed)
        if unknown:
            known = ", ".join(sorted(allowed)) or "none"
            bad_request(f"unknown query parameter {unknown[0]!r} (allowed: {known})")
        for name in query:
            if len(query.getall(name)) > 1:
                bad_request(f"query parameter {name!r} is given more than once")
        return cls(dict(query))

    def string(self, name: str) -> str | None:
        return self.values.get(name)

    def integer(self, name: str, *, default: int | None, minimum: int, maximum: int) -> int:
        raw = self.values.get(name)
        if raw is None:
            if default is None:
                bad_request(f"query parameter {name!r} is required")
            return default
        return parse_integer(name, raw, minimum=minimum, maximum=maximum)

    def boolean(self, name: str) -> bool:
        """``true`` or ``false`` (absent: false); anything else is refused."""
        raw = self.values.get(name)
        if raw is None or raw == "false":
            return False
        if raw == "true":
            return True
        bad_request(f"{name} must be true or false, got {raw!r}")


def parse_integer(name: str, raw: str, *, minimum: int, maximum: int) -> int:
    if not _INTEGER.fullmatch(raw):
        bad_request(f"{name} must be an integer, got {raw!r}")
    value = int(raw)
    if value < minimum:
        bad_request(f"{name} must be at least {minimum}, got {value}")
    if value > maximum:
        bad_request(f"{name} must be at most {maximum}, got {value}")
    return value
