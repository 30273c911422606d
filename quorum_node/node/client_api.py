"""The client API of a node: the record log and the key-value store over HTTP.

Endpoints (JSON answers; errors are ``{"error": message, "code": CODE}``, plus ``"leader":
{"id", "url"}`` on a redirect):

- ``POST /v1/records``: append records as one proposal. The body is a JSON list of strings
  (stored as UTF-8) or of ``{"base64": "..."}`` objects, or, with ``Content-Type:
  application/octet-stream``, records back to back, each a big-endian uint32 length and its
  bytes. Answers ``{"first_offset", "last_offset", "epoch"}`` once they are committed.
- ``GET /v1/records?offset=N&max_records=M&wait_ms=W``: committed records from offset N
  (control records are skipped), waiting up to W ms when nothing is committed at N yet. Any
  node answers (committed records never change).
- ``PUT``/``GET``/``DELETE /v1/kv/{key}`` and ``POST /v1/kv/{key}/cas``: the key-value store
  (``quorum_node.node.kv``). A write answers once its operation is committed and applied here.
  A read is linearizable (a ReadIndex confirmed by a majority, then this node's store caught up
  to it) unless ``?stale=true``, which reads this node's store as it is, on any node.

A request that needs the leader is redirected to it (307, same method, body and query) or, with
no leader known, refused with 503 ``NO_LEADER``; both are for the client to retry.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from aiohttp import web
from multidict import MultiMapping

from quorum_node.node.config import format_address
from quorum_node.node.errors import ErrorCode, ServiceError
from quorum_node.node.kv import MAX_VALUE_BYTES, KvOpError, check_key
from quorum_node.node.kv_service import (
    DEFAULT_LIST_LIMIT,
    DEFAULT_READ_RECORDS,
    DEFAULT_TIMEOUT_MS,
    DEFAULT_WATCH_EVENTS,
    MAX_LIST_LIMIT,
    MAX_READ_RECORDS,
    MAX_RECORD_BYTES,
    MAX_TIMEOUT_MS,
    MAX_WAIT_MS,
    MAX_WATCH_EVENTS,
    CommittedRecord,
    KvService,
    Written,
    check_record_size,
)
from quorum_node.node.limits import BodyRefused, JsonRefused, parse_json, read_body
from quorum_node.node.runtime import QuorumNode
from quorum_node.raft.types import NotLeaderError

# Body size read at most for an append (base64 and JSON quoting inflate the records).
MAX_APPEND_BODY_BYTES = 8 * 1024 * 1024
# A cas carries two values, which JSON escapes may inflate.
MAX_CAS_BODY_BYTES = 4 * MAX_VALUE_BYTES

_INTEGER = re.compile(r"-?[0-9]+")
_FRAME_LENGTH = struct.Struct(">I")

# The HTTP status of each code a KvService raises.
_STATUS: dict[ErrorCode, int] = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.TOO_LARGE: 413,
    ErrorCode.TIMEOUT: 504,
    ErrorCode.OUTCOME_UNKNOWN: 503,
    ErrorCode.APPEND_LOST: 503,
    ErrorCode.SHUTTING_DOWN: 503,
    ErrorCode.NODE_FAILED: 503,
    ErrorCode.OFFSET_OUT_OF_RANGE: 416,
    ErrorCode.COMPACTED: 410,
    ErrorCode.TOO_MANY_LONG_POLLS: 429,
}


class ApiError(Exception):
    """An answer other than success: an HTTP status, a machine-readable code, a message."""

    def __init__(self, status: int, code: str, message: str, *,
                 extra: Mapping[str, Any] | None = None,
                 headers: Mapping[str, str] | None = None, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = dict(extra or {})
        self.headers = dict(headers or {})
        self.close = close  # the body was not read whole: the connection cannot be reused

    def response(self) -> web.Response:
        body = {"error": self.message, "code": self.code, **self.extra}
        response = web.json_response(body, status=self.status, headers=self.headers)
        if self.close:
            response.force_close()
        return response


def _bad_request(message: str) -> NoReturn:
    raise ApiError(400, "BAD_REQUEST", message)


def _too_large(message: str) -> NoReturn:
    raise ApiError(413, "TOO_LARGE", message)


def _kv_error(error: KvOpError) -> NoReturn:
    if error.too_large:
        _too_large(str(error))
    _bad_request(str(error))


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _answering_errors(handler: Handler, node: QuorumNode) -> Handler:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as error:
            return error.response()
        except ServiceError as error:
            headers = {"Retry-After": "1"} if error.code is ErrorCode.TOO_MANY_LONG_POLLS else {}
            return ApiError(_STATUS.get(error.code, 500), error.code, error.message,
                            headers=headers).response()
        except NotLeaderError as error:
            return _not_leader(node, request, error.leader_id).response()

    return wrapped


def _not_leader(node: QuorumNode, request: web.Request, leader_id: int | None) -> ApiError:
    endpoint = node.client_endpoints.get(leader_id) if leader_id is not None else None
    if leader_id is None or endpoint is None:
        return ApiError(503, "NO_LEADER",
                        f"no leader is known in epoch {node.core.epoch}; retry shortly")
    url = f"{node.config.url_scheme}://{format_address(*endpoint)}"
    return ApiError(
        307, "NOT_LEADER", f"node {node.config.node_id} is not the leader; node {leader_id} is",
        extra={"leader": {"id": leader_id, "url": url}},
        headers={"Location": url + request.raw_path},
    )


@dataclass(frozen=True)
class _Params:
    """A request's query parameters, each given at most once, none unknown."""

    values: Mapping[str, str]

    @classmethod
    def of(cls, request: web.Request, allowed: frozenset[str]) -> _Params:
        query: MultiMapping[str] = request.query
        unknown = sorted(set(query) - allowed)
        if unknown:
            known = ", ".join(sorted(allowed)) or "none"
            _bad_request(f"unknown query parameter {unknown[0]!r} (allowed: {known})")
        for name in query:
            if len(query.getall(name)) > 1:
                _bad_request(f"query parameter {name!r} is given more than once")
        return cls(dict(query))

    def integer(self, name: str, *, default: int | None, minimum: int, maximum: int) -> int:
        raw = self.values.get(name)
        if raw is None:
            if default is None:
                _bad_request(f"query parameter {name!r} is required")
            return default
        if not _INTEGER.fullmatch(raw):
            _bad_request(f"{name} must be an integer, got {raw!r}")
        value = int(raw)
        if value < minimum:
            _bad_request(f"{name} must be at least {minimum}, got {value}")
        if value > maximum:
            _bad_request(f"{name} must be at most {maximum}, got {value}")
        return value

    def boolean(self, name: str) -> bool:
        raw = self.values.get(name)
        if raw is None:
            return False
        lowered = raw.lower()
        if lowered in ("", "true", "1"):  # a bare ``?stale`` means true
            return True
        if lowered in ("false", "0"):
            return False
        _bad_request(f"{name} must be true or false, got {raw!r}")

    def timeout_s(self) -> float:
        return self.integer("timeout_ms", default=DEFAULT_TIMEOUT_MS, minimum=1,
                            maximum=MAX_TIMEOUT_MS) / 1000


_WRITE_PARAMS = frozenset({"timeout_ms"})
_KV_READ_PARAMS = frozenset({"stale", "timeout_ms"})
_RECORDS_READ_PARAMS = frozenset({"offset", "max_records", "wait_ms"})
_KV_LIST_PARAMS = frozenset({"prefix", "start_after", "limit", "stale", "timeout_ms"})
_WATCH_PARAMS = frozenset({"key", "prefix", "offset", "wait_ms", "max_events"})

CLIENT_API_KEY: web.AppKey[ClientApi] = web.AppKey("client_api")


def install_client_api(app: web.Application, node: QuorumNode,
                       service: KvService | None = None) -> ClientApi:
    """Add the client routes to ``app``. Idempotent: returns the API already installed in
    ``app`` if there is one."""
    existing = app.get(CLIENT_API_KEY)
    if existing is not None:
        return existing
    api = ClientApi(node, service)
    app[CLIENT_API_KEY] = api
    app.add_routes(api.routes())
    return api


class ClientApi:
    """The client routes: thin HTTP wrappers of the node's ``KvService``."""

    def __init__(self, node: QuorumNode, service: KvService | None = None) -> None:
        self.node = node
        self.service = service if service is not None else KvService(node)

    def _answering(self, handler: Handler) -> Handler:
        return _answering_errors(handler, self.node)

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/records", self._answering(self.append_records)),
            web.get("/v1/records", self._answering(self.read_records)),
            web.get("/v1/kv", self._answering(self.kv_list)),
            web.get("/v1/watch", self._answering(self.kv_watch)),
            web.put("/v1/kv/{key}", self._answering(self.kv_put)),
            web.get("/v1/kv/{key}", self._answering(self.kv_get)),
            web.delete("/v1/kv/{key}", self._answering(self.kv_delete)),
            web.post("/v1/kv/{key}/cas", self._answering(self.kv_cas)),
        ]

    # --- records -----------------------------------------------------------------------------

    async def append_records(self, request: web.Request) -> web.Response:
        timeout_s = _Params.of(request, _WRITE_PARAMS).timeout_s()
        body = await _read_body(request, MAX_APPEND_BODY_BYTES)
        content_type = request.headers.get("Content-Type")
        if content_type is None or request.content_type == "application/json":
            values = _json_records(body)
        elif request.content_type == "application/octet-stream":
            values = _framed_records(body)
        else:
            raise ApiError(415, "UNSUPPORTED_MEDIA_TYPE",
                           f"Content-Type {request.content_type!r}: send application/json (a list "
                           f"of strings or {{\"base64\": ...}} objects) or "
                           f"application/octet-stream (length-prefixed records)")
        appended = await self.service.append(values, timeout_s)
        return web.json_response({"first_offset": appended.first_offset,
                                  "last_offset": appended.last_offset, "epoch": appended.epoch})

    async def read_records(self, request: web.Request) -> web.Response:
        params = _Params.of(request, _RECORDS_READ_PARAMS)
        offset = params.integer("offset", default=None, minimum=0, maximum=2**63 - 1)
        max_records = params.integer("max_records", default=DEFAULT_READ_RECORDS, minimum=1,
                                     maximum=MAX_READ_RECORDS)
        wait_ms = params.integer("wait_ms", default=0, minimum=0, maximum=MAX_WAIT_MS)
        page = await self.service.read(offset, max_records, wait_ms / 1000)
        return web.json_response({"records": [_record_json(record) for record in page.records],
                                  "high_watermark": page.high_watermark,
                                  "next_offset": page.next_offset})

    # --- key-value store ---------------------------------------------------------------------

    async def kv_put(self, request: web.Request) -> web.Response:
        timeout_s = _Params.of(request, _WRITE_PARAMS).timeout_s()
        key = _key(request)
        body = await _read_body(request, MAX_VALUE_BYTES)
        try:
            value = body.decode("utf-8")
        except UnicodeDecodeError as error:
            _bad_request(f"the value must be UTF-8 text: {error}")
        return _written_json(await self.service.put(key, value, timeout_s), "applied")

    async def kv_delete(self, request: web.Request) -> web.Response:
        timeout_s = _Params.of(request, _WRITE_PARAMS).timeout_s()
        return _written_json(await self.service.delete(_key(request), timeout_s), "deleted")

    async def kv_cas(self, request: web.Request) -> web.Response:
        timeout_s = _Params.of(request, _WRITE_PARAMS).timeout_s()
        key = _key(request)
        document = _json_body(await _read_body(request, MAX_CAS_BODY_BYTES))
        if not isinstance(document, dict):
            _bad_request('expected a JSON object {"expected": ..., "value": ...}')
        missing = sorted({"expected", "value"} - set(document))
        unknown = sorted(set(document) - {"expected", "value"})
        if missing or unknown:
            what = f"missing {missing[0]!r}" if missing else f"unknown field {unknown[0]!r}"
            _bad_request(f'{what}: expected {{"expected": string or null, '
                         f'"value": string or null}}')
        for name in ("expected", "value"):
            if document[name] is not None and not isinstance(document[name], str):
                _bad_request(f"{name!r} must be a string or null")
        written = await self.service.cas(key, document["expected"], document["value"],
                                         timeout_s)
        return _written_json(written, "applied")

    async def kv_list(self, request: web.Request) -> web.Response:
        """A page of the keys starting with ``prefix``, in key order, after ``start_after``;
        linearizable unless ``stale``, as a get."""
        params = _Params.of(request, _KV_LIST_PARAMS)
        limit = params.integer("limit", default=DEFAULT_LIST_LIMIT, minimum=1,
                               maximum=MAX_LIST_LIMIT)
        page = await self.service.list_keys(params.values.get("prefix", ""),
                                       params.values.get("start_after"), limit,
                                       stale=params.boolean("stale"),
                                       timeout_s=params.timeout_s())
        return web.json_response({
            "entries": [{"key": key, "value": value} for key, value in page.entries],
            # Where the next page starts (start_after=...), null on the last page.
            "next_start_after": page.next_start_after,
            "applied_offset": page.applied_offset,
        })

    async def kv_watch(self, request: web.Request) -> web.Response:
        """The changes of a key (``key``) or of the keys under ``prefix`` committed at or after
        ``offset``, waiting up to ``wait_ms`` while there is none (a long-poll: the next one
        starts at ``next_offset``). Any node answers, from its own store."""
        params = _Params.of(request, _WATCH_PARAMS)
        key, prefix = params.values.get("key"), params.values.get("prefix")
        if (key is None) == (prefix is None):
            _bad_request("give exactly one of 'key' and 'prefix'")
        if key is not None:
            check_key_or_refuse(key)
        offset = params.integer("offset", default=None, minimum=0, maximum=2**63 - 1)
        wait_ms = params.integer("wait_ms", default=0, minimum=0, maximum=MAX_WAIT_MS)
        max_events = params.integer("max_events", default=DEFAULT_WATCH_EVENTS, minimum=1,
                                    maximum=MAX_WATCH_EVENTS)
        changes = await self.service.watch(offset, key=key, prefix=prefix,
                                           wait_s=wait_ms / 1000, max_events=max_events)
        return web.json_response({
            "events": [{"offset": e.offset, "key": e.key,
                        "type": "put" if e.value is not None else "delete", "value": e.value}
                       for e in changes.events],
            # Where the next watch continues: every change below it was answered.
            "next_offset": changes.next_offset,
            "applied_offset": changes.applied_offset,
        })

    async def kv_get(self, request: web.Request) -> web.Response:
        params = _Params.of(request, _KV_READ_PARAMS)
        stale = params.boolean("stale")
        timeout_s = params.timeout_s()
        found = await self.service.get(_key(request), stale=stale, timeout_s=timeout_s)
        if found.value is None:
            raise ApiError(404, "KEY_NOT_FOUND", f"key {found.key!r} not found",
                           extra={"key": found.key, "applied_offset": found.applied_offset})
        return web.json_response({"key": found.key, "value": found.value,
                                  "applied_offset": found.applied_offset})


def _written_json(written: Written, applied_name: str) -> web.Response:
    return web.json_response({"key": written.key, applied_name: written.applied,
                              "offset": written.offset, "epoch": written.epoch})


def _record_json(record: CommittedRecord) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "offset": record.offset,
        "value": base64.b64encode(record.value).decode("ascii"),
        "timestamp_ms": record.timestamp_ms,
    }
    if record.key is not None:
        entry["key"] = base64.b64encode(record.key).decode("ascii")
    return entry


# --- request parsing -------------------------------------------------------------------------

def check_key_or_refuse(key: str) -> None:
    try:
        check_key(key)
    except KvOpError as error:
        _kv_error(error)


def _key(request: web.Request) -> str:
    key = request.match_info["key"]
    try:
        check_key(key)
    except KvOpError as error:
        _kv_error(error)
    return key


async def _read_body(request: web.Request, limit: int) -> bytes:
    try:
        return await read_body(request, limit)
    except BodyRefused as refusal:
        code = "TOO_LARGE" if refusal.status == 413 else "REQUEST_TIMEOUT"
        raise ApiError(refusal.status, code, refusal.message, close=True) from None


def _json_body(body: bytes) -> Any:
    try:
        return parse_json(body)
    except JsonRefused as error:
        _bad_request(str(error))


def _json_records(body: bytes) -> list[bytes]:
    document = _json_body(body)
    if not isinstance(document, list):
        _bad_request('expected a JSON list of strings or {"base64": "..."} objects')
    values: list[bytes] = []
    for index, item in enumerate(document):
        if isinstance(item, str):
            try:
                value = item.encode("utf-8")
            except UnicodeEncodeError:
                _bad_request(f"record {index}: not valid Unicode text")
        elif isinstance(item, dict) and set(item) == {"base64"} \
                and isinstance(item["base64"], str):
            try:
                value = base64.b64decode(item["base64"], validate=True)
            except (binascii.Error, ValueError) as error:
                _bad_request(f"record {index}: invalid base64: {error}")
        else:
            _bad_request(f'record {index}: expected a string or {{"base64": "..."}}, '
                         f"got {json.dumps(item)[:60]}")
        check_record_size(index, len(value))
        values.append(value)
    return values


def _framed_records(body: bytes) -> list[bytes]:
    values: list[bytes] = []
    position = 0
    end = len(body)
    unpack_length = _FRAME_LENGTH.unpack_from  # the hot loop of batched appends
    while position < end:
        if end - position < 4:
            _bad_request(f"record {len(values)}: truncated length prefix at byte {position}")
        (length,) = unpack_length(body, position)
        position += 4
        if length > MAX_RECORD_BYTES:
            check_record_size(len(values), length)
        if position + length > end:
            _bad_request(f"record {len(values)}: length {length} runs past the end of the body "
                         f"({end - position} bytes left)")
        values.append(body[position:position + length])
        position += length
    return values
