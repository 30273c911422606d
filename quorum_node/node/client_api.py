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

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import re
import struct
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from aiohttp import web
from multidict import MultiMapping

from quorum_node.node.config import format_address
from quorum_node.node.kv import (
    MAX_VALUE_BYTES,
    Cas,
    Delete,
    KvOp,
    KvOpError,
    KvStore,
    Put,
    check_key,
    encode_op,
)
from quorum_node.node.limits import BodyRefused, JsonRefused, parse_json, read_body
from quorum_node.node.runtime import (
    AppendLostError,
    CommitUnknownError,
    QuorumNode,
    WaitInterrupted,
)
from quorum_node.node.snapshotting import KvSnapshots
from quorum_node.raft.records import Record, RecordBatch
from quorum_node.raft.state import RaftState
from quorum_node.raft.types import NotLeaderError

logger = logging.getLogger(__name__)

MAX_RECORD_BYTES = 1024 * 1024  # one record's value
# One append is one proposal and ends up in one batch; the log refuses batches over 8 MiB.
MAX_APPEND_BYTES = 4 * 1024 * 1024
# Body size read at most for an append (base64 and JSON quoting inflate the records).
MAX_APPEND_BODY_BYTES = 8 * 1024 * 1024
# A cas carries two values, which JSON escapes may inflate.
MAX_CAS_BODY_BYTES = 4 * MAX_VALUE_BYTES
DEFAULT_READ_RECORDS = 100
MAX_READ_RECORDS = 10_000
# A read answers once this many value bytes are gathered (at least one record).
READ_RESPONSE_BYTES = 1024 * 1024
MAX_WAIT_MS = 30_000
DEFAULT_TIMEOUT_MS = 10_000
MAX_TIMEOUT_MS = 60_000
# How much of the log to read at a time (whole batches; at least one). Small, as the node
# decodes all it reads, uncommitted batches past the high watermark included.
READ_CHUNK_BYTES = 64 * 1024
# Most committed records a step applies itself; more is a backlog for the applier task.
STEP_APPLY_RECORDS = 1000

_INTEGER = re.compile(r"-?[0-9]+")
_FRAME_LENGTH = struct.Struct(">I")
_T = TypeVar("_T")


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


def _answering_errors(handler: Handler) -> Handler:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as error:
            return error.response()

    return wrapped


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
DEFAULT_LIST_LIMIT = 100
MAX_LIST_LIMIT = 10_000
DEFAULT_WATCH_EVENTS = 100
MAX_WATCH_EVENTS = 10_000

CLIENT_API_KEY: web.AppKey[ClientApi] = web.AppKey("client_api")


def install_client_api(app: web.Application, node: QuorumNode) -> ClientApi:
    """Add the client routes to ``app`` and run the KV applier while the app runs (it starts
    with the app and stops when the app is cleaned up). Idempotent: returns the API already
    installed in ``app`` if there is one."""
    existing = app.get(CLIENT_API_KEY)
    if existing is not None:
        return existing
    api = ClientApi(node)
    app[CLIENT_API_KEY] = api
    app.add_routes(api.routes())

    async def on_startup(_: web.Application) -> None:
        api.start()

    async def on_shutdown(_: web.Application) -> None:
        api.begin_closing()

    async def on_cleanup(_: web.Application) -> None:
        await api.stop()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    return api


class ClientApi:
    """The handlers, the node's KV store and the applier that feeds it."""

    def __init__(self, node: QuorumNode) -> None:
        self.node = node
        self.store = KvStore()
        self.snapshots = KvSnapshots(node, self.store)
        self.failure: BaseException | None = None
        self._applier: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        # Replaced after every step of the applier: waiters hold the one current when they
        # checked, so no step is missed between the check and the wait.
        self._progress = asyncio.Event()
        self.long_polls = 0  # record reads waiting for records, bounded by http.max.long.polls

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/records", _answering_errors(self.append_records)),
            web.get("/v1/records", _answering_errors(self.read_records)),
            web.get("/v1/kv", _answering_errors(self.kv_list)),
            web.get("/v1/watch", _answering_errors(self.kv_watch)),
            web.put("/v1/kv/{key}", _answering_errors(self.kv_put)),
            web.get("/v1/kv/{key}", _answering_errors(self.kv_get)),
            web.delete("/v1/kv/{key}", _answering_errors(self.kv_delete)),
            web.post("/v1/kv/{key}/cas", _answering_errors(self.kv_cas)),
        ]

    # --- the applier -------------------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        """Start the applier: it follows the high watermark on every node, leader or not."""
        if self._applier is None:
            self._applier = asyncio.ensure_future(self._apply_committed())
            self.node.step_hooks.append(self._apply_after_step)
        return self._applier

    def begin_closing(self) -> None:
        """Answer every waiting request now (the server is about to wait for them to finish)."""
        self._closing.set()
        self.node.interrupt_waits()
        self._notify()

    async def stop(self) -> None:
        self.begin_closing()
        if self._applier is not None:
            self._applier.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._applier
        await self.snapshots.stop()

    def _notify(self) -> None:
        progress, self._progress = self._progress, asyncio.Event()
        progress.set()

    async def _apply_committed(self) -> None:
        node, store = self.node, self.store
        try:
            # Checked as well as cancelled: a cancellation can be lost in the node's waits.
            while not self._closing.is_set():
                if self.snapshots.load_if_behind():
                    self._notify()
                high_watermark = node.core.high_watermark
                if high_watermark is None or store.next_offset >= high_watermark:
                    # A bounded wait so that a stopped node is noticed (it raises then).
                    await node.wait_for_high_watermark(store.next_offset, 1.0)
                    continue
                self._apply_chunk(high_watermark)
                await asyncio.sleep(0)  # a long replay must not starve the handlers
        except NotLeaderError:
            # What the runtime raises to waiters once the node has stopped after a failure.
            self.failure = node.failure or RuntimeError("the node stopped")
        except Exception as error:
            self._applier_failed(error)
        self._notify()

    def _apply_chunk(self, high_watermark: int) -> None:
        store = self.store
        before = store.next_offset
        # The log's bytes rather than read_committed's decoded batches: the store skips batches
        # without KV operations undecoded.
        store.apply_encoded(self.node.log_dir.log.read(before, READ_CHUNK_BYTES),
                            limit=high_watermark)
        if store.next_offset == before:
            raise RuntimeError(f"no committed batch at offset {before} below the high "
                               f"watermark {high_watermark}")
        self._notify()
        self.snapshots.maybe_start_writing()

    def _apply_after_step(self) -> None:
        """On the leader, apply what a step of the core committed right away, so that a write
        is answered in the loop's next turn instead of after the applier's. A follower leaves it
        to the applier, after the fsync its leader waits for; a backlog, or a snapshot to load
        first, is the applier's anywhere."""
        if (self.failure is not None or self._closing.is_set()
                or self.node.core.state is not RaftState.LEADER):
            return
        high_watermark = self.node.core.high_watermark
        next_offset = self.store.next_offset
        if (high_watermark is None or next_offset >= high_watermark
                or high_watermark - next_offset > STEP_APPLY_RECORDS
                or next_offset < self.node.log_dir.log.start_offset):
            return
        try:
            self._apply_chunk(high_watermark)
        except Exception as error:
            self._applier_failed(error)
            self._notify()

    def _applier_failed(self, error: Exception) -> None:
        logger.exception("node %d: the KV applier stopped", self.node.config.node_id)
        self.failure = error

    async def wait_applied(self, next_offset: int, deadline: float) -> None:
        """Wait until the store has applied every offset below ``next_offset``."""
        loop = asyncio.get_running_loop()
        while self.store.next_offset < next_offset:
            self._check_running()
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise ApiError(504, "TIMEOUT",
                               f"offset {next_offset - 1} is committed but was not applied on "
                               f"this node in time (applied up to {self.store.applied_offset})")
            await self._wait_progress(remaining)

    async def _wait_progress(self, timeout_s: float) -> None:
        """Wait for the applier's next step (or closing), at most ``timeout_s``."""
        progress = self._progress
        # asyncio.timeout rather than wait_for: on 3.11, wait_for can swallow a cancellation.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await progress.wait()

    def _check_running(self) -> None:
        if self._closing.is_set():
            raise ApiError(503, "SHUTTING_DOWN", "the node is shutting down")
        if self.failure is not None:
            raise ApiError(503, "NODE_FAILED",
                           f"the node's state machine stopped: {self.failure}")

    # --- calls that need the leader ----------------------------------------------------------

    async def _until_closing(self, awaitable: Awaitable[_T], interrupted: ApiError) -> _T:
        """Await a wait of the node's; raise ``interrupted`` instead if the node starts shutting
        down first (its waits would otherwise hold the server's shutdown until they time
        out)."""
        try:
            return await awaitable
        except WaitInterrupted:
            raise interrupted from None

    def _check_node(self) -> None:
        self._check_running()
        if self.node.failure is not None:
            raise ApiError(503, "NODE_FAILED", f"the node stopped after a failure: "
                                               f"{self.node.failure}")

    def _not_leader(self, request: web.Request) -> ApiError:
        node = self.node
        leader_id = node.core.leader_id
        endpoint = node.leader_endpoint()
        if leader_id is None or endpoint is None or leader_id == node.config.node_id:
            # The last case is a leader that is resigning: its successor is not known yet.
            return ApiError(503, "NO_LEADER",
                            f"no leader is known in epoch {node.core.epoch}; retry shortly")
        url = f"{node.config.url_scheme}://{format_address(*endpoint)}"
        return ApiError(
            307, "NOT_LEADER", f"node {node.config.node_id} is not the leader; node {leader_id} is",
            extra={"leader": {"id": leader_id, "url": url}},
            headers={"Location": url + request.raw_path},
        )

    async def _append(self, request: web.Request, records: list[Record],
                      timeout_s: float) -> tuple[int, int, int]:
        """Append through the leader; (first offset, last offset, epoch) once committed."""
        self._check_node()
        epoch = self.node.core.epoch  # the epoch append() proposes in: no await in between
        try:
            first, last = await self._until_closing(
                self.node.append(records, timeout_s),
                ApiError(503, "OUTCOME_UNKNOWN",
                         "the node is shutting down; the write may or may not commit"))
        except NotLeaderError:
            raise self._not_leader(request) from None
        except CommitUnknownError as error:
            raise ApiError(504, "TIMEOUT", f"{error}; it may still commit") from None
        except AppendLostError as error:
            raise ApiError(503, "APPEND_LOST",
                           f"{error} by a new leader; it will never commit (retry it)") from None
        return first, last, epoch

    async def _read_index(self, request: web.Request, timeout_s: float) -> int:
        self._check_node()
        try:
            return await self._until_closing(
                self.node.read_barrier(timeout_s),
                ApiError(503, "SHUTTING_DOWN", "the node is shutting down"))
        except NotLeaderError:
            raise self._not_leader(request) from None
        except TimeoutError:
            raise ApiError(504, "TIMEOUT", f"leadership was not confirmed by a majority within "
                                           f"{timeout_s:g} s") from None

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
        if not values:
            _bad_request("no records to append")
        total = sum(len(value) for value in values)
        if total > MAX_APPEND_BYTES:
            _too_large(f"{total} bytes of records exceed the limit of {MAX_APPEND_BYTES} bytes "
                       f"per append")
        records = [Record(value=value) for value in values]
        first, last, epoch = await self._append(request, records, timeout_s)
        return web.json_response({"first_offset": first, "last_offset": last, "epoch": epoch})

    async def read_records(self, request: web.Request) -> web.Response:
        params = _Params.of(request, _RECORDS_READ_PARAMS)
        offset = params.integer("offset", default=None, minimum=0, maximum=2**63 - 1)
        max_records = params.integer("max_records", default=DEFAULT_READ_RECORDS, minimum=1,
                                     maximum=MAX_READ_RECORDS)
        wait_ms = params.integer("wait_ms", default=0, minimum=0, maximum=MAX_WAIT_MS)
        if wait_ms > 0:
            if self.long_polls >= self.node.config.http_max_long_polls:
                raise ApiError(429, "TOO_MANY_LONG_POLLS",
                               f"{self.long_polls} reads are already waiting for records on "
                               f"this node; retry later, or read with wait_ms=0",
                               headers={"Retry-After": "1"})
            self.long_polls += 1
            try:
                return await self._read_records(offset, max_records, wait_ms)
            finally:
                self.long_polls -= 1
        return await self._read_records(offset, max_records, wait_ms)

    async def _read_records(self, offset: int, max_records: int, wait_ms: int) -> web.Response:
        log_start = self.node.log_dir.log.start_offset
        if offset < log_start:
            raise ApiError(416, "OFFSET_OUT_OF_RANGE",
                           f"offset {offset} is below the log start {log_start} on node "
                           f"{self.node.config.node_id}: those records are compacted into a "
                           f"snapshot of the key-value store",
                           extra={"log_start_offset": log_start})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        position = offset
        records: list[dict[str, Any]] = []
        size = 0  # bytes of values gathered
        while True:
            high_watermark = self.node.core.high_watermark or 0
            if position < high_watermark:
                batches = self.node.read_committed(position, READ_CHUNK_BYTES)
                if not batches:
                    break
                position, size = _collect(batches, position, high_watermark,
                                          max_records=max_records, into=records, size=size)
                if len(records) >= max_records or size >= READ_RESPONSE_BYTES:
                    break
                continue  # more may be committed (or so far only control records were)
            if records:
                break  # answer with what there is; wait only while there is nothing
            # Nothing committed at ``position``: wait for the applier, which follows the high
            # watermark (and is woken, unlike the node's waits, when the server shuts down).
            remaining = deadline - loop.time()
            if remaining <= 0 or self._closing.is_set() or self.failure is not None:
                break
            await self._wait_progress(remaining)
        return web.json_response({"records": records,
                                  "high_watermark": self.node.core.high_watermark,
                                  "next_offset": position})

    # --- key-value store ---------------------------------------------------------------------

    async def _kv_write(self, request: web.Request, op: KvOp,
                        timeout_s: float) -> dict[str, Any]:
        try:
            record = encode_op(op)
        except KvOpError as error:
            _kv_error(error)
        deadline = asyncio.get_running_loop().time() + timeout_s
        first, _, epoch = await self._append(request, [record], timeout_s)
        try:
            await self.wait_applied(first + 1, deadline)
        except ApiError as error:
            if error.code == "TIMEOUT":
                raise
            raise ApiError(503, "OUTCOME_UNKNOWN", f"the operation committed at offset {first}, "
                                                   f"but {error.message}") from None
        outcome = self.store.pop_outcome(first)
        if outcome is None:
            # Only if more than the store's outcome limit of operations were applied meanwhile.
            raise ApiError(500, "OUTCOME_UNKNOWN",
                           f"the operation committed at offset {first} but its outcome is no "
                           f"longer known")
        return {"key": op.key, "applied": outcome.applied, "offset": first, "epoch": epoch}

    async def kv_put(self, request: web.Request) -> web.Response:
        timeout_s = _Params.of(request, _WRITE_PARAMS).timeout_s()
        key = _key(request)
        body = await _read_body(request, MAX_VALUE_BYTES)
        try:
            value = body.decode("utf-8")
        except UnicodeDecodeError as error:
            _bad_request(f"the value must be UTF-8 text: {error}")
        return web.json_response(await self._kv_write(request, Put(key, value), timeout_s))

    async def kv_delete(self, request: web.Request) -> web.Response:
        timeout_s = _Params.of(request, _WRITE_PARAMS).timeout_s()
        answer = await self._kv_write(request, Delete(_key(request)), timeout_s)
        answer["deleted"] = answer.pop("applied")
        return web.json_response(answer)

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
        op = Cas(key, document["expected"], document["value"])
        return web.json_response(await self._kv_write(request, op, timeout_s))

    async def kv_list(self, request: web.Request) -> web.Response:
        """A page of the keys starting with ``prefix``, in key order, after ``start_after``;
        linearizable unless ``stale``, as a get."""
        params = _Params.of(request, _KV_LIST_PARAMS)
        prefix = params.values.get("prefix", "")
        start_after = params.values.get("start_after")
        limit = params.integer("limit", default=DEFAULT_LIST_LIMIT, minimum=1,
                               maximum=MAX_LIST_LIMIT)
        stale = params.boolean("stale")
        timeout_s = params.timeout_s()
        if not stale:
            deadline = asyncio.get_running_loop().time() + timeout_s
            read_index = await self._read_index(request, timeout_s)
            await self.wait_applied(read_index, deadline)
        page = self.store.scan(prefix, start_after, limit + 1)
        more = len(page) > limit
        page = page[:limit]
        return web.json_response({
            "entries": [{"key": key, "value": value} for key, value in page],
            # Where the next page starts (start_after=...), null on the last page.
            "next_start_after": page[-1][0] if more else None,
            "applied_offset": self.store.applied_offset,
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
        watched = key if key is not None else prefix or ""
        if wait_ms == 0:
            return web.json_response(self._watch(offset, watched, key is not None, max_events))
        if self.long_polls >= self.node.config.http_max_long_polls:
            raise ApiError(429, "TOO_MANY_LONG_POLLS",
                           f"{self.long_polls} requests are already waiting on this node; retry "
                           f"later, or watch with wait_ms=0", headers={"Retry-After": "1"})
        self.long_polls += 1
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wait_ms / 1000
            while True:
                answer = self._watch(offset, watched, key is not None, max_events)
                remaining = deadline - loop.time()
                if answer["events"] or remaining <= 0 or self._closing.is_set() \
                        or self.failure is not None:
                    return web.json_response(answer)
                await self._wait_progress(remaining)
        finally:
            self.long_polls -= 1

    def _watch(self, offset: int, watched: str, exact: bool,
               max_events: int) -> dict[str, Any]:
        store = self.store
        if offset < store.events_start:
            raise ApiError(410, "COMPACTED",
                           f"the changes before offset {store.events_start} are no longer "
                           f"known on node {self.node.config.node_id} (compacted into a "
                           f"snapshot, or older than the changes kept); watch from "
                           f"{store.events_start} after reading the current values",
                           extra={"events_start": store.events_start})
        events = store.events(offset, watched, exact, max_events)
        full = len(events) == max_events
        return {
            "events": [{"offset": e.offset, "key": e.key,
                        "type": "put" if e.value is not None else "delete", "value": e.value}
                       for e in events],
            # Where the next watch continues: every change below it was answered.
            "next_offset": events[-1].offset + 1 if full else max(offset, store.next_offset),
            "applied_offset": store.applied_offset,
        }

    async def kv_get(self, request: web.Request) -> web.Response:
        params = _Params.of(request, _KV_READ_PARAMS)
        stale = params.boolean("stale")
        timeout_s = params.timeout_s()
        key = _key(request)
        if not stale:
            deadline = asyncio.get_running_loop().time() + timeout_s
            read_index = await self._read_index(request, timeout_s)
            await self.wait_applied(read_index, deadline)
        value = self.store.get(key)
        if value is None:
            raise ApiError(404, "KEY_NOT_FOUND", f"key {key!r} not found",
                           extra={"key": key, "applied_offset": self.store.applied_offset})
        return web.json_response({"key": key, "value": value,
                                  "applied_offset": self.store.applied_offset})


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
        _check_record_size(index, len(value))
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
            _check_record_size(len(values), length)
        if position + length > end:
            _bad_request(f"record {len(values)}: length {length} runs past the end of the body "
                         f"({end - position} bytes left)")
        values.append(body[position:position + length])
        position += length
    return values


def _check_record_size(index: int, size: int) -> None:
    if size > MAX_RECORD_BYTES:
        _too_large(f"record {index}: {size} bytes exceed the limit of {MAX_RECORD_BYTES} bytes")


def _collect(batches: list[RecordBatch], position: int, high_watermark: int, *,
             max_records: int, into: list[dict[str, Any]], size: int) -> tuple[int, int]:
    """Add to ``into`` the data records of ``batches`` from ``position``, below the high
    watermark, up to ``max_records`` and about READ_RESPONSE_BYTES of values (``size`` so far).
    Returns the offset to read next (past any control records skipped) and the new size."""
    for batch in batches:
        end = min(batch.next_offset, high_watermark)
        if batch.is_control:
            position = max(position, end)
            continue
        for offset in range(max(position, batch.base_offset), end):
            if len(into) >= max_records or (into and size >= READ_RESPONSE_BYTES):
                return position, size
            record = batch.records[offset - batch.base_offset]
            entry: dict[str, Any] = {
                "offset": offset,
                "value": base64.b64encode(record.value).decode("ascii"),
                "timestamp_ms": batch.timestamp_ms,
            }
            if record.key is not None:
                entry["key"] = base64.b64encode(record.key).decode("ascii")
            into.append(entry)
            size += len(record.value)
            position = offset + 1
    return position, size
