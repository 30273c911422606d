"""The client API of a node: the record log and the key-value store over HTTP, thin handlers of
the node's ``KvService`` (``quorum_node.node.kv_service``) under the one HTTP convention
(``quorum_node.node.api.http``: errors ``{"code", "message"}``, plus ``"leader": {"id", "url"}``
on a redirect).

Endpoints (JSON answers):

- ``POST /v1/records``: append records as one proposal. The body is a JSON list of strings
  (stored as UTF-8) or of ``{"base64": "..."}`` objects, or, with ``Content-Type:
  application/octet-stream``, records back to back, each a big-endian uint32 length and its
  bytes. Answers ``{"first_offset", "last_offset", "epoch"}`` once they are committed.
- ``GET /v1/records?offset=N&max_records=M&wait_ms=W``: committed records from offset N
  (control records are skipped), waiting up to W ms when nothing is committed at N yet. Any
  node answers (committed records never change).
- ``PUT``/``GET``/``DELETE /v1/kv/{key}`` and ``POST /v1/kv/{key}/cas``: the key-value store
  (``quorum_node.kv.store``). A write answers once its operation is committed and applied here.
  A read is linearizable (a ReadIndex confirmed by a majority, then this node's store caught up
  to it) unless ``?stale=true``, which reads this node's store as it is, on any node.
- ``POST /v1/txn``: a multi-key transaction (etcd's Txn, ``kv.Txn``): the body is ``{"compare":
  [...], "success": [...], "failure": [...]}``; answers ``{"succeeded", "responses", "offset",
  "epoch"}`` once it is committed and applied here. A txn over its bounds (``kv.MAX_TXN_OPS``
  operations in a list, ``kv.MAX_TXN_BYTES`` of keys and values) is 413 TOO_LARGE, a malformed
  one 400 BAD_REQUEST; either changes nothing.
- ``GET /v1/kv?prefix=&start_after=&limit=``: a page of keys; ``GET /v1/watch``: changes.
  Either answer holds at most ``kv_service.MAX_ANSWER_BYTES`` of keys and values; its continuation
  (``next_start_after``, ``next_offset``) says where the next one starts.

Keys, prefixes and ``start_after`` must be UTF-8 once percent-decoded (400 otherwise: the router
would keep an undecodable ``%ff`` as those three characters, and the query parser would make it
U+FFFD, naming another key than the one sent). A long poll (a watch or a read with ``wait_ms``)
whose client closes its connection is cancelled within ``DISCONNECT_CHECK_S``, so that a client
gone frees its place among the ``http.max.long.polls`` at once rather than after its wait.

A request that needs the leader is redirected to it (307, same method, body and query) or, with
no leader known, refused with 503 ``NO_LEADER``; both are for the client to retry.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import struct
import urllib.parse
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from quorum_node.kv.ops import (
    MAX_TXN_RECORD_BYTES,
    MAX_VALUE_BYTES,
    KvOpError,
    TxnResponse,
    txn_from_document,
)
from quorum_node.node.api.http import ApiError, Query, bad_request, parse_json_body, read_body
from quorum_node.node.errors import ErrorCode
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
    TxnResult,
    Written,
    check_record_size,
    checked_key,
    refused_op,
)

# Body size read at most for an append (base64 and JSON quoting inflate the records).
MAX_APPEND_BODY_BYTES = 8 * 1024 * 1024
# A cas carries two values, which JSON escapes may inflate.
MAX_CAS_BODY_BYTES = 4 * MAX_VALUE_BYTES
# A txn's body is its record's JSON without "op" (escapes included): the record's bound.
MAX_TXN_BODY_BYTES = MAX_TXN_RECORD_BYTES

_FRAME_LENGTH = struct.Struct(">I")

_WRITE_PARAMS = frozenset({"timeout_ms"})
_KV_READ_PARAMS = frozenset({"stale", "timeout_ms"})
_RECORDS_READ_PARAMS = frozenset({"offset", "max_records", "wait_ms"})
_KV_LIST_PARAMS = frozenset({"prefix", "start_after", "limit", "stale", "timeout_ms"})
_WATCH_PARAMS = frozenset({"key", "prefix", "offset", "wait_ms", "max_events"})
# How often the connections of waiting long polls are looked at for a client gone: aiohttp 3
# tells a handler nothing when its connection is lost (short of cancelling every handler of the
# server), and looking costs nothing while no long poll waits.
DISCONNECT_CHECK_S = 0.1


def client_routes(service: KvService) -> list[web.RouteDef]:
    """The client API's routes, served by ``service``."""
    api = ClientApi(service)
    return [
        web.post("/v1/records", api.append_records),
        web.get("/v1/records", api.read_records),
        web.get("/v1/kv", api.kv_list),
        web.get("/v1/watch", api.kv_watch),
        web.put("/v1/kv/{key}", api.kv_put),
        web.get("/v1/kv/{key}", api.kv_get),
        web.delete("/v1/kv/{key}", api.kv_delete),
        web.post("/v1/kv/{key}/cas", api.kv_cas),
        web.post("/v1/txn", api.kv_txn),
    ]


def _timeout_s(query: Query) -> float:
    return query.integer("timeout_ms", default=DEFAULT_TIMEOUT_MS, minimum=1,
                         maximum=MAX_TIMEOUT_MS) / 1000


class ClientApi:
    """The handlers: each parses the request, calls the service and renders its answer."""

    def __init__(self, service: KvService) -> None:
        self.service = service
        self.long_polls = LongPollConnections()

    # --- records -----------------------------------------------------------------------------

    async def append_records(self, request: web.Request) -> web.Response:
        timeout_s = _timeout_s(Query.of(request, _WRITE_PARAMS))
        body = await read_body(request, MAX_APPEND_BODY_BYTES)
        content_type = request.headers.get("Content-Type")
        if content_type is None or request.content_type == "application/json":
            values = json_records(body)
        elif request.content_type == "application/octet-stream":
            values = framed_records(body)
        else:
            raise ApiError.of(ErrorCode.UNSUPPORTED_MEDIA_TYPE,
                              f"Content-Type {request.content_type!r}: send application/json (a "
                              f"list of strings or {{\"base64\": ...}} objects) or "
                              f"application/octet-stream (length-prefixed records)")
        appended = await self.service.append(values, timeout_s)
        return web.json_response({"first_offset": appended.first_offset,
                                  "last_offset": appended.last_offset, "epoch": appended.epoch})

    async def read_records(self, request: web.Request) -> web.Response:
        query = Query.of(request, _RECORDS_READ_PARAMS)
        offset = query.integer("offset", default=None, minimum=0, maximum=2**63 - 1)
        max_records = query.integer("max_records", default=DEFAULT_READ_RECORDS, minimum=1,
                                    maximum=MAX_READ_RECORDS)
        wait_ms = query.integer("wait_ms", default=0, minimum=0, maximum=MAX_WAIT_MS)
        with self.long_polls.cancelled_when_gone(request):
            page = await self.service.read(offset, max_records, wait_ms / 1000)
        return web.json_response({"records": [_record_json(record) for record in page.records],
                                  "high_watermark": page.high_watermark,
                                  "next_offset": page.next_offset})

    # --- key-value store ---------------------------------------------------------------------

    async def kv_put(self, request: web.Request) -> web.Response:
        timeout_s = _timeout_s(Query.of(request, _WRITE_PARAMS))
        key = checked_key(path_key(request))  # refused before its body is read
        body = await read_body(request, MAX_VALUE_BYTES)
        try:
            value = body.decode("utf-8")
        except UnicodeDecodeError as error:
            bad_request(f"the value must be UTF-8 text: {error}")
        return _written_json(await self.service.put(key, value, timeout_s), "applied")

    async def kv_delete(self, request: web.Request) -> web.Response:
        timeout_s = _timeout_s(Query.of(request, _WRITE_PARAMS))
        written = await self.service.delete(path_key(request), timeout_s)
        return _written_json(written, "deleted")

    async def kv_cas(self, request: web.Request) -> web.Response:
        timeout_s = _timeout_s(Query.of(request, _WRITE_PARAMS))
        key = checked_key(path_key(request))  # refused before its body is read
        document = parse_json_body(await read_body(request, MAX_CAS_BODY_BYTES))
        if not isinstance(document, dict):
            bad_request('expected a JSON object {"expected": ..., "value": ...}')
        missing = sorted({"expected", "value"} - set(document))
        unknown = sorted(set(document) - {"expected", "value"})
        if missing or unknown:
            what = f"missing {missing[0]!r}" if missing else f"unknown field {unknown[0]!r}"
            bad_request(f'{what}: expected {{"expected": string or null, '
                        f'"value": string or null}}')
        for name in ("expected", "value"):
            if document[name] is not None and not isinstance(document[name], str):
                bad_request(f"{name!r} must be a string or null")
        written = await self.service.cas(key, document["expected"], document["value"],
                                         timeout_s)
        return _written_json(written, "applied")

    async def kv_txn(self, request: web.Request) -> web.Response:
        timeout_s = _timeout_s(Query.of(request, _WRITE_PARAMS))
        document = parse_json_body(await read_body(request, MAX_TXN_BODY_BYTES),
                                   'a txn {"compare": [...], "success": [...], "failure": [...]}')
        try:
            txn = txn_from_document(document)
        except KvOpError as error:
            raise refused_op(error) from None
        return web.json_response(txn_result_json(await self.service.txn(txn, timeout_s)))

    async def kv_list(self, request: web.Request) -> web.Response:
        """A page of the keys starting with ``prefix``, in key order, after ``start_after``;
        linearizable unless ``stale``, as a get."""
        query = utf8_query(request, _KV_LIST_PARAMS)
        limit = query.integer("limit", default=DEFAULT_LIST_LIMIT, minimum=1,
                              maximum=MAX_LIST_LIMIT)
        page = await self.service.list_keys(query.string("prefix") or "",
                                            query.string("start_after"), limit,
                                            stale=query.boolean("stale"),
                                            timeout_s=_timeout_s(query))
        return web.json_response({
            "entries": [{"key": key, "value": value} for key, value in page.entries],
            # Where the next page starts (start_after=...), null on the last page; a page holds
            # fewer than ``limit`` keys when they would be over kv_service.MAX_ANSWER_BYTES.
            "next_start_after": page.next_start_after,
            "applied_offset": page.applied_offset,
        })

    async def kv_watch(self, request: web.Request) -> web.Response:
        """The changes of a key (``key``) or of the keys under ``prefix`` committed at or after
        ``offset``, waiting up to ``wait_ms`` while there is none (a long-poll: the next one
        starts at ``next_offset``). Any node answers, from its own store."""
        query = utf8_query(request, _WATCH_PARAMS)
        key, prefix = query.string("key"), query.string("prefix")
        if (key is None) == (prefix is None):
            bad_request("give exactly one of 'key' and 'prefix'")
        offset = query.integer("offset", default=None, minimum=0, maximum=2**63 - 1)
        wait_ms = query.integer("wait_ms", default=0, minimum=0, maximum=MAX_WAIT_MS)
        max_events = query.integer("max_events", default=DEFAULT_WATCH_EVENTS, minimum=1,
                                   maximum=MAX_WATCH_EVENTS)
        with self.long_polls.cancelled_when_gone(request):
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
        query = Query.of(request, _KV_READ_PARAMS)
        stale = query.boolean("stale")
        timeout_s = _timeout_s(query)
        found = await self.service.get(path_key(request), stale=stale, timeout_s=timeout_s)
        if found.value is None:
            raise ApiError.of(ErrorCode.KEY_NOT_FOUND,
                              f"key {found.key!r} not found (applied up to offset "
                              f"{found.applied_offset})")
        return web.json_response({"key": found.key, "value": found.value,
                                  "applied_offset": found.applied_offset})


class LongPollConnections:
    """The long polls waiting, each with its request: one whose client has closed its
    connection is cancelled (looked at every DISCONNECT_CHECK_S while any waits)."""

    def __init__(self) -> None:
        self._waiting: dict[asyncio.Task[Any], web.Request] = {}
        self._check: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._waiting)

    @contextlib.contextmanager
    def cancelled_when_gone(self, request: web.Request) -> Iterator[None]:
        """Within it, the current task is cancelled once ``request``'s connection is gone."""
        task = asyncio.current_task()
        assert task is not None, "a handler runs in a task"
        self._waiting[task] = request
        if self._check is None:
            self._check = asyncio.get_running_loop().call_later(DISCONNECT_CHECK_S,
                                                                self._cancel_gone)
        try:
            yield
        finally:
            del self._waiting[task]

    def _cancel_gone(self) -> None:
        self._check = None
        for task, request in self._waiting.items():
            transport = request.transport
            if (transport is None or transport.is_closing()) and not task.cancelling():
                task.cancel("the client closed its connection")
        if self._waiting:
            self._check = asyncio.get_running_loop().call_later(DISCONNECT_CHECK_S,
                                                                self._cancel_gone)


def path_key(request: web.Request) -> str:
    """The ``{key}`` of a ``/v1/kv/{key}...`` path, percent-decoded as UTF-8 (400 if it is not).
    Decoded here from the raw path: the router keeps an undecodable ``%ff`` as it is, so that
    ``%ff`` and ``%25ff`` would name the same key."""
    raw = request.rel_url.raw_path.split("/")[3]
    try:
        return urllib.parse.unquote_to_bytes(raw).decode("utf-8")
    except UnicodeError as error:
        bad_request(f"the key is not UTF-8 once percent-decoded: {error}")


def utf8_query(request: web.Request, allowed: frozenset[str]) -> Query:
    """``Query.of``, refusing a parameter that is not UTF-8 once percent-decoded (the query
    parser would make its bytes U+FFFD: another key or prefix than the one sent)."""
    query = Query.of(request, allowed)
    for pair in request.rel_url.raw_query_string.split("&"):
        name, _, value = pair.partition("=")
        try:
            urllib.parse.unquote_to_bytes(value.replace("+", " ")).decode("utf-8")
        except UnicodeError as error:
            bad_request(f"query parameter {urllib.parse.unquote(name)!r} is not UTF-8 once "
                        f"percent-decoded: {error}")
    return query


def _written_json(written: Written, applied_name: str) -> web.Response:
    return web.json_response({"key": written.key, applied_name: written.applied,
                              "offset": written.offset, "epoch": written.epoch})


def txn_result_json(result: TxnResult) -> dict[str, Any]:
    return {"succeeded": result.succeeded,
            "responses": [txn_response_json(response) for response in result.responses],
            "offset": result.offset, "epoch": result.epoch}


def txn_response_json(response: TxnResponse) -> dict[str, Any]:
    """A get's key, value (null: absent), version and modification offset; a put's key and
    whether it existed; a delete's key and whether it deleted one."""
    if response.op == "get":
        return {"op": "get", "key": response.key, "value": response.value,
                "version": response.version, "mod_offset": response.mod_offset}
    found = "existed" if response.op == "put" else "deleted"
    return {"op": response.op, "key": response.key, found: response.found}


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

def json_records(body: bytes) -> list[bytes]:
    """An append's JSON body: a list of strings (UTF-8) or ``{"base64": ...}`` objects."""
    document = parse_json_body(body)
    if not isinstance(document, list):
        bad_request('expected a JSON list of strings or {"base64": "..."} objects')
    values: list[bytes] = []
    for index, item in enumerate(document):
        if isinstance(item, str):
            try:
                value = item.encode("utf-8")
            except UnicodeEncodeError:
                bad_request(f"record {index}: not valid Unicode text")
        elif isinstance(item, dict) and set(item) == {"base64"} \
                and isinstance(item["base64"], str):
            try:
                value = base64.b64decode(item["base64"], validate=True)
            except (binascii.Error, ValueError) as error:
                bad_request(f"record {index}: invalid base64: {error}")
        else:
            bad_request(f'record {index}: expected a string or {{"base64": "..."}}, '
                        f"got {json.dumps(item)[:60]}")
        check_record_size(index, len(value))
        values.append(value)
    return values


def framed_records(body: bytes) -> list[bytes]:
    """An append's octet-stream body: records back to back, each a big-endian uint32 length
    and its bytes."""
    values: list[bytes] = []
    position = 0
    end = len(body)
    unpack_length = _FRAME_LENGTH.unpack_from  # the hot loop of batched appends
    while position < end:
        if end - position < 4:
            bad_request(f"record {len(values)}: truncated length prefix at byte {position}")
        (length,) = unpack_length(body, position)
        position += 4
        if length > MAX_RECORD_BYTES:
            check_record_size(len(values), length)
        if position + length > end:
            bad_request(f"record {len(values)}: length {length} runs past the end of the body "
                        f"({end - position} bytes left)")
        values.append(body[position:position + length])
        position += length
    return values
