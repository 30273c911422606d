"""A synchronous Python client for the quorum's client API (``quorum_node.node.api.client``).

    with QuorumClient("127.0.0.1:9091,127.0.0.1:9092") as client:
        client.put("colour", "blue")
        client.get("colour")                 # 'blue', linearizable
        client.cas("colour", "blue", "red")  # WriteResult(applied=True, ...)
        client.txn(compare=[{"key": "colour", "target": "version", "result": ">",
                             "version": 1}],
                   success=[{"op": "put", "key": "shade", "value": "dark"}],
                   failure=[{"op": "get", "key": "colour"}])  # TxnResult(succeeded=True, ...)
        first, last = client.append([b"a", b"b"])
        client.read(first, wait_ms=1000).records
        client.list_keys("col").entries      # [('colour', 'red')]: one page
        list(client.scan_keys("col"))        # every key under "col", page after page
        client.watch(offset, prefix="col", wait_ms=5000).events
        client.add_voter(3, "<directory id>")  # admin: AddVoter, RemoveVoter (KIP-856)

It talks to any node of the bootstrap list, follows a redirect to the leader (and sticks to the
leader it found), and retries across the list within ``timeout_s`` per call (a try begun at its
end is given a quarter of a second to be answered), whenever a try is known not to have taken
effect: the node could not be reached, knew no leader, was shutting down, or the leader lost the
append to a new leader. While nodes answer (an election is under
way) it tries again every few tens of milliseconds, as etcd's client does, so that a write
lands as soon as a new leader serves; while none answers, the back-off doubles up to a second.
When a connection breaks after a request was sent, its outcome is unknown: reads, puts and
deletes are retried all the same (idempotent, as HTTP's GET, PUT and DELETE are), but a cas, a
txn or an append is not, as it could apply twice: that raises QuorumClientError with code
OUTCOME_UNKNOWN. A write the node timed out on (code TIMEOUT) may still commit and is never
retried; a read is.

Against a secured quorum (docs/security.md) pass ``credentials=ClientCredentials(...)``: a
bearer token, and the CA (and optionally a client certificate) for ``https://`` servers, which
are the default scheme once a CA or certificate is given. A refused credential raises
QuorumClientError with code UNAUTHENTICATED (401) or FORBIDDEN (403), never retried.

Two protocols, the same calls, retries and errors: ``protocol="binary"`` (the default) sends the
key-value and record calls over one WebSocket stream per node (``GET /v1/stream``,
``quorum_node.wire``, ``quorum_node.client_stream``: websockets' Sans-I/O protocol on a socket),
where a call costs a fraction of an HTTP request; ``protocol="http"`` uses the HTTP API
(``http.client`` with keep-alive connections). Voter changes (the admin API) are
always HTTP. ``put_many`` pipelines puts over the stream (many in flight, answered as they
complete).

Threads may share one client, as they share a gRPC channel: their calls go over the same stream
to a node, each answered as it comes, and HTTP calls take a keep-alive connection each from a
pool. ``last_answer`` is then the last answer of any thread's call.

QuorumClient checks a call's arguments and hands it to its transport (``ClientTransport``: the
HTTP API's or the stream's), which sends it, follows redirects and reads the answer; every try
of either transport goes through the client's one retry policy (``_Policy``), which also keeps
the server to try first and the last answer.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import random
import select
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Protocol, TypeVar

from quorum_node import wire
from quorum_node.client_stream import ClientStream, StreamBroken, StreamNotOpened
from quorum_node.security.client_credentials import ClientCredentials

_T = TypeVar("_T")

DEFAULT_TIMEOUT_S = 10.0
MAX_REDIRECTS = 5
VOTERS_PATH = "/v1/quorum/voters"
_FIRST_BACKOFF_S = 0.05
_MAX_BACKOFF_S = 1.0
# Time left for the answer to travel back after the server's own timeout.
_SERVER_TIMEOUT_MARGIN_S = 0.25
# Server answers after which nothing took effect, so that trying again (elsewhere) is safe.
_RETRYABLE_CODES = frozenset({"NO_LEADER", "NODE_FAILED", "SHUTTING_DOWN", "APPEND_LOST"})
# ... and, for reads, which change nothing.
_RETRYABLE_READ_CODES = _RETRYABLE_CODES | {"TIMEOUT"}
PROTOCOLS: Final = wire.CLIENT_PROTOCOLS
DEFAULT_PROTOCOL: Final = wire.DEFAULT_CLIENT_PROTOCOL
# Requests put_many keeps in flight on a stream (the node bounds them per stream too).
DEFAULT_WINDOW = 64
_READ_OPS = frozenset({wire.Op.GET, wire.Op.READ, wire.Op.LIST, wire.Op.WATCH})
_IDEMPOTENT_OPS = _READ_OPS | {wire.Op.PUT, wire.Op.DELETE}


class QuorumClientError(Exception):
    """A call failed. ``code`` is the server's error code (BAD_REQUEST, TOO_LARGE, TIMEOUT,
    OUTCOME_UNKNOWN, ...) or UNAVAILABLE when no node could serve it in time."""

    def __init__(self, message: str, *, code: str = "ERROR", status: int | None = None,
                 body: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.body = body  # the server's JSON error answer, when it gave one


@dataclass(frozen=True)
class WriteResult:
    """A committed key-value write. ``applied``: always True for put; for delete, whether the
    key existed; for cas, whether the expectation held (and the value was set)."""

    key: str
    offset: int
    epoch: int
    applied: bool


@dataclass(frozen=True)
class TxnResult:
    """A committed transaction: whether every compare held (the success operations ran, else
    the failure ones) and each operation's answer, as the HTTP API gives it: ``{"op": "get",
    "key", "value" (None: absent), "version", "mod_offset"}``, ``{"op": "put", "key",
    "existed"}``, ``{"op": "delete", "key", "deleted"}``."""

    succeeded: bool
    responses: list[dict[str, Any]]
    offset: int
    epoch: int


@dataclass(frozen=True)
class Voter:
    id: int
    directory_id: str | None  # Kafka's 22-character base64url form; None: not known yet


@dataclass(frozen=True)
class ReadRecord:
    offset: int
    value: bytes
    key: bytes | None
    timestamp_ms: int


@dataclass(frozen=True)
class KeyPage:
    entries: list[tuple[str, str]]  # (key, value), in key order
    next_start_after: str | None  # pass as start_after for the next page; None: the last page
    applied_offset: int


@dataclass(frozen=True)
class KvEvent:
    offset: int
    key: str
    value: str | None  # None: the key was deleted


@dataclass(frozen=True)
class WatchResult:
    events: list[KvEvent]
    next_offset: int  # where the next watch continues
    applied_offset: int


@dataclass(frozen=True)
class ReadResult:
    records: list[ReadRecord]
    high_watermark: int | None
    next_offset: int  # where the next read continues (past any skipped control records)


def parse_bootstrap(bootstrap: str | Sequence[str], default_scheme: str = "http") -> list[str]:
    """``host:port[,host:port]`` (or a list of them, ``http://`` or ``https://`` optional) as
    base URLs."""
    entries = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    servers: list[str] = []
    for raw in entries:
        entry = raw.strip()
        if not entry:
            continue
        url = entry if "://" in entry else f"{default_scheme}://{entry}"
        parts = urllib.parse.urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme not in ("http", "https") or not parts.hostname or port is None \
                or parts.path not in ("", "/") or parts.query:
            raise ValueError(f"bootstrap server {entry!r} is not of the form host:port")
        servers.append(f"{parts.scheme}://{parts.netloc}")
    if not servers:
        raise ValueError("no bootstrap server given (expected host:port[,host:port...])")
    return servers


def retry_backoff_s(silent_tries: int) -> float:
    """The wait before a call's next try, after ``silent_tries`` tries in a row that no node
    answered. A node that answers without serving (it knows no leader yet, or sends the client
    to one that is gone) means an election is under way, which ends within the quorum's
    timeouts: the next try comes soon, so that the write lands once the new leader serves, not
    a doubled back-off later. Only while no node answers does the wait double, up to
    _MAX_BACKOFF_S. Jittered, so that clients spread their tries."""
    base: float = min(_MAX_BACKOFF_S, _FIRST_BACKOFF_S * 2 ** min(max(silent_tries - 1, 0), 10))
    return base * random.uniform(0.5, 1.0)


class _NotSent(Exception):
    """The request never reached the server: trying again elsewhere is safe."""

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable  # no connection could be made at all


class _OutOfTime(Exception):
    """The call's deadline passed before a request could be sent."""


class _Interrupted(Exception):
    """The request was sent but no answer came: its outcome is unknown."""


@dataclass
class _Request:
    method: str
    path: str
    query: dict[str, str]
    body: bytes | None
    content_type: str | None
    server_timeout: bool  # whether to tell the node how long this client will wait


@dataclass
class _Answer:
    status: int
    body: Any
    location: str | None


@dataclass
class _Refusal:
    """An error answer (either protocol)."""

    code: str
    message: str
    status: int | None  # HTTP's; None over the stream
    body: dict[str, Any]


@dataclass(frozen=True)
class _WireAnswer:
    """A stream call's answer, turned into the HTTP API's JSON only when asked for."""

    op: wire.Op
    key: str | None
    fields: tuple[Any, ...]


_A = TypeVar("_A", bound="dict[str, Any] | _WireAnswer")


class _Policy:
    """The client's retry policy, the one piece of code every transport's calls run through
    (which failures are retried, the back-off, fail_fast, OUTCOME_UNKNOWN: the client's policy,
    not a protocol's), and what the calls learnt: the server tried first (the last one that
    served: the leader, once found) and the last answer, whichever transport made the call."""

    def __init__(self, servers: list[str], timeout_s: float, fail_fast: bool) -> None:
        self.servers = servers
        self.timeout_s = timeout_s
        self.fail_fast = fail_fast
        self.preferred = servers[0]
        self.last_answer: dict[str, Any] | _WireAnswer = {}

    def call(self, attempt: Callable[[str, float], tuple[_A | _Refusal, str]], *, read: bool,
             idempotent: bool, extra_time_s: float = 0.0) -> _A:
        """Run ``attempt(server, deadline)`` across the servers until it succeeds, fails in a
        way a retry cannot mend, or the time is up. ``read``: it changes nothing, any failure
        may be retried; ``idempotent``: applying it twice is applying it once."""
        start = time.monotonic()
        deadline = start + self.timeout_s + extra_time_s
        candidates = [self.preferred] + [s for s in self.servers if s != self.preferred]
        tries = 0
        last_problem = "no attempt made"
        unreachable: dict[str, str] = {}  # servers that refused a connection, since an answer
        silent = 0  # tries in a row that no node answered
        while True:
            server = candidates[tries % len(candidates)]
            tries += 1
            try:
                answer, server = attempt(server, deadline)
            except _OutOfTime:
                break
            except _NotSent as problem:
                last_problem = str(problem)
                # Not unreachable: a node answered, with a redirect to a leader that is gone.
                silent = silent + 1 if problem.unreachable else 0
                if problem.unreachable:
                    unreachable[server] = str(problem)
                    if self.fail_fast and len(unreachable) == len(candidates):
                        raise QuorumClientError(
                            "no node reachable: " + "; ".join(unreachable.values()),
                            code="UNAVAILABLE") from None
            except _Interrupted as problem:
                silent += 1
                if not idempotent:
                    raise QuorumClientError(
                        f"{problem}; the write may or may not have taken effect",
                        code="OUTCOME_UNKNOWN") from None
                last_problem = str(problem)
            else:
                unreachable.clear()
                silent = 0
                if not isinstance(answer, _Refusal):
                    self.preferred = server
                    self.last_answer = answer
                    return answer
                if answer.code not in (_RETRYABLE_READ_CODES if read else _RETRYABLE_CODES):
                    raise QuorumClientError(answer.message, code=answer.code,
                                            status=answer.status, body=answer.body)
                last_problem = f"{server}: {answer.message}"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            time.sleep(min(remaining, retry_backoff_s(silent)))
        raise QuorumClientError(f"no node served the request within "
                                f"{time.monotonic() - start:.1f} s (last: {last_problem})",
                                code="UNAVAILABLE")


class ClientTransport(Protocol):
    """How the key-value and record calls travel to the nodes: one protocol's requests,
    redirects to the leader and answers. Its calls get arguments QuorumClient has checked, make
    their tries through the client's _Policy, and answer as QuorumClient does."""

    def put(self, key: str, value: str) -> WriteResult: ...

    def get(self, key: str, stale: bool) -> str | None: ...

    def delete(self, key: str) -> WriteResult: ...

    def cas(self, key: str, expected: str | None, value: str | None) -> WriteResult: ...

    def txn(self, compare: Sequence[Mapping[str, Any]], success: Sequence[Mapping[str, Any]],
            failure: Sequence[Mapping[str, Any]]) -> TxnResult: ...

    def list_keys(self, prefix: str, start_after: str | None, limit: int,
                  stale: bool) -> KeyPage: ...

    def watch(self, offset: int, key: str | None, prefix: str | None, wait_ms: int,
              max_events: int) -> WatchResult:
        """``key`` or ``prefix``: exactly one is given."""
        ...

    def append(self, values: Sequence[bytes]) -> tuple[int, int]: ...

    def read(self, offset: int, max_records: int, wait_ms: int) -> ReadResult: ...

    def put_many(self, items: Sequence[tuple[str, str]], window: int) -> list[WriteResult]: ...

    def close(self) -> None: ...


class QuorumClient:
    def __init__(self, bootstrap: str | Sequence[str], timeout_s: float = DEFAULT_TIMEOUT_S,
                 *, credentials: ClientCredentials | None = None,
                 fail_fast: bool = False, protocol: str = DEFAULT_PROTOCOL) -> None:
        """``fail_fast``: give up at once when no server of the list accepts a connection
        (the command-line tools' policy: nothing is running there); otherwise keep trying
        until the timeout (a program that starts with its nodes). ``protocol``: "binary"
        (the stream) or "http"."""
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        self.protocol = protocol
        self.credentials = credentials or ClientCredentials()
        self._policy = _Policy(parse_bootstrap(bootstrap,
                                               "https" if self.credentials.uses_tls else "http"),
                               timeout_s, fail_fast)
        # The admin API is HTTP's alone: voter changes take this one whatever the protocol.
        self._http = _HttpTransport(self._policy, self.credentials)
        self._transport: ClientTransport = self._http if protocol == "http" else \
            _StreamTransport(self._policy, self.credentials)

    @property
    def servers(self) -> list[str]:
        return self._policy.servers

    @property
    def timeout_s(self) -> float:
        return self._policy.timeout_s

    @property
    def fail_fast(self) -> bool:
        return self._policy.fail_fast

    @property
    def last_answer(self) -> dict[str, Any]:
        """The JSON answer of the last call that succeeded (or found no key): what the API said
        (over the stream: what the HTTP API would have said)."""
        answer = self._policy.last_answer
        return _http_answer(answer) if isinstance(answer, _WireAnswer) else answer

    def __enter__(self) -> QuorumClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()
        self._transport.close()

    # --- key-value store ---------------------------------------------------------------------

    def put(self, key: str, value: str) -> WriteResult:
        return self._transport.put(_checked_key(key), value)

    def get(self, key: str, stale: bool = False) -> str | None:
        """The key's value, None if absent. Linearizable unless ``stale`` (then any node's
        local copy, possibly behind)."""
        return self._transport.get(_checked_key(key), stale)

    def delete(self, key: str) -> WriteResult:
        return self._transport.delete(_checked_key(key))

    def cas(self, key: str, expected: str | None, value: str | None) -> WriteResult:
        """Set ``key`` to ``value`` (None: delete it) only if its value is ``expected`` (None:
        only if it is absent); ``applied`` tells whether it did."""
        return self._transport.cas(_checked_key(key), expected, value)

    def txn(self, compare: Sequence[Mapping[str, Any]] = (),
            success: Sequence[Mapping[str, Any]] = (),
            failure: Sequence[Mapping[str, Any]] = ()) -> TxnResult:
        """A multi-key transaction, etcd's Txn (README.md, Transactions): if every compare
        (``{"key", "target": "value" | "version" | "mod_offset", "result": "=" | "!=" | "<" |
        ">", <target>: operand}``) holds, the ``success`` operations apply, else the
        ``failure`` ones (``{"op": "put", "key", "value"}``, ``{"op": "delete", "key"}``,
        ``{"op": "get", "key"}``), all at one offset. Never retried once sent (as a cas). The
        node checks the compares and operations (BAD_REQUEST), over either protocol."""
        return self._transport.txn(compare, success, failure)

    def list_keys(self, prefix: str = "", *, start_after: str | None = None, limit: int = 100,
                  stale: bool = False) -> KeyPage:
        """A page of the keys starting with ``prefix``, in key order, after ``start_after``
        (linearizable unless ``stale``). A page holds fewer than ``limit`` keys when they would
        be more than the node answers at once (about 1 MiB of keys and values):
        ``next_start_after`` is where the next page starts, None after the last."""
        _utf8_text(prefix, "a prefix")
        if start_after is not None:
            _utf8_text(start_after, "start_after")
        return self._transport.list_keys(prefix, start_after, _u32(limit, "limit"), stale)

    def scan_keys(self, prefix: str = "", *, start_after: str | None = None,
                  page_size: int = 100, stale: bool = False) -> Iterator[tuple[str, str]]:
        """Every (key, value) under ``prefix`` after ``start_after``, in key order: ``list_keys``
        page after page, each page read when the previous is used up (each linearizable
        unless ``stale``, but not the whole scan at once)."""
        after = start_after
        while True:
            page = self.list_keys(prefix, start_after=after, limit=page_size, stale=stale)
            yield from page.entries
            after = page.next_start_after
            if after is None:
                return

    def watch(self, offset: int, *, key: str | None = None, prefix: str | None = None,
              wait_ms: int = 0, max_events: int = 100) -> WatchResult:
        """The changes of ``key`` (or of the keys under ``prefix``) committed at or after
        ``offset``, waiting up to ``wait_ms`` while there is none; continue from
        ``next_offset`` (an answer holds fewer than ``max_events`` changes when they would be
        more than the node answers at once, about 1 MiB). Raises QuorumClientError COMPACTED
        when they are no longer known."""
        if (key is None) == (prefix is None):
            raise ValueError("watch a key or a prefix")
        if key is not None:
            _checked_key(key)
        else:
            _utf8_text(prefix or "", "a prefix")
        return self._transport.watch(_u64(offset, "offset"), key, prefix,
                                     _u32(wait_ms, "wait_ms"), _u32(max_events, "max_events"))

    # --- records -----------------------------------------------------------------------------

    def append(self, values: Sequence[bytes]) -> tuple[int, int]:
        """Append records as one batch; their (first, last) offsets once committed."""
        if not values:
            raise ValueError("nothing to append")
        return self._transport.append(values)

    def read(self, offset: int, max_records: int = 100, wait_ms: int = 0) -> ReadResult:
        """Committed records from ``offset``, waiting up to ``wait_ms`` for the first one."""
        return self._transport.read(_u64(offset, "offset"), _u32(max_records, "max_records"),
                                    _u32(wait_ms, "wait_ms"))

    # --- voter changes (the admin API) ------------------------------------------------------

    def add_voter(self, voter_id: int, directory_id: str) -> list[Voter]:
        """AddVoter (KIP-856): make observer (``voter_id``, ``directory_id``: Kafka's base64url
        form) a voter. Returns the voter set once the change is committed. A refusal raises
        QuorumClientError with Kafka's error name as its code: DUPLICATE_VOTER,
        INVALID_REQUEST, or REQUEST_TIMED_OUT (another change is pending, or this one was not
        done in time and may still complete)."""
        body = json.dumps({"id": voter_id, "directory_id": directory_id}).encode()
        return _voters(self._http.call("POST", VOTERS_PATH, body=body,
                                       content_type="application/json"))

    def remove_voter(self, voter_id: int, directory_id: str, *,
                     decommission: bool = False) -> list[Voter]:
        """RemoveVoter (KIP-856), as ``add_voter``; VOTER_NOT_FOUND if it is not a voter (also
        when a retry follows a try whose answer was lost). Removing a node id's last directory
        is refused (INVALID_REQUEST) unless ``decommission``: scaling the quorum down."""
        path = f"{VOTERS_PATH}/{voter_id}/{urllib.parse.quote(directory_id, safe='')}"
        query = {"decommission": "true"} if decommission else None
        return _voters(self._http.call("DELETE", path, query=query))

    # --- pipelining -------------------------------------------------------------------------

    def put_many(self, items: Sequence[tuple[str, str]], *,
                 window: int = DEFAULT_WINDOW) -> list[WriteResult]:
        """Put each (key, value); their results, in the order given. Over the stream up to
        ``window`` puts are in flight at once (one round trip for many puts); a put refused or
        cut off there is tried again alone, with ``put``'s redirects and retries. The puts
        are not applied in a guaranteed order: put a key once per call."""
        if window < 1:
            raise ValueError("window must be at least 1")
        for key, _ in items:
            _checked_key(key)
        return self._transport.put_many(items, window)


class _HttpTransport:
    """The HTTP API (``quorum_node.node.api.client``, and the admin API's voter changes):
    ``http.client`` keep-alive connections, pooled per server (one for each thread calling at
    once), and the 307/308 redirects to the leader."""

    def __init__(self, policy: _Policy, credentials: ClientCredentials) -> None:
        self._policy = policy
        self._credentials = credentials
        self._tls = _TlsContext(credentials)
        self._lock = threading.Lock()  # guards the pool
        self._idle: dict[str, list[http.client.HTTPConnection]] = {}

    def close(self) -> None:
        with self._lock:
            idle = [connection for pool in self._idle.values() for connection in pool]
            self._idle.clear()
        for connection in idle:
            connection.close()

    def put(self, key: str, value: str) -> WriteResult:
        body = self.call("PUT", _kv_path(key), body=value.encode("utf-8"),
                         content_type="text/plain; charset=utf-8")
        return _write_result(body, "applied")

    def get(self, key: str, stale: bool) -> str | None:
        body = self.call("GET", _kv_path(key), query={"stale": "true"} if stale else {},
                         server_timeout=not stale, absent_ok=True)
        if body.get("code") == "KEY_NOT_FOUND":
            return None
        return _field(body, "value", str)

    def delete(self, key: str) -> WriteResult:
        return _write_result(self.call("DELETE", _kv_path(key)), "deleted")

    def cas(self, key: str, expected: str | None, value: str | None) -> WriteResult:
        body = json.dumps({"expected": expected, "value": value}).encode()
        return _write_result(self.call("POST", _kv_path(key) + "/cas", body=body,
                                       content_type="application/json"), "applied")

    def txn(self, compare: Sequence[Mapping[str, Any]], success: Sequence[Mapping[str, Any]],
            failure: Sequence[Mapping[str, Any]]) -> TxnResult:
        body = json.dumps({"compare": list(compare), "success": list(success),
                           "failure": list(failure)}).encode()
        answer = self.call("POST", "/v1/txn", body=body, content_type="application/json")
        return TxnResult(_field(answer, "succeeded", bool), _field(answer, "responses", list),
                         _field(answer, "offset", int), _field(answer, "epoch", int))

    def list_keys(self, prefix: str, start_after: str | None, limit: int,
                  stale: bool) -> KeyPage:
        query = {"prefix": prefix, "limit": str(limit)}
        if start_after is not None:
            query["start_after"] = start_after
        if stale:
            query["stale"] = "true"
        body = self.call("GET", "/v1/kv", query=query, server_timeout=not stale)
        entries = []
        for entry in _field(body, "entries", list):
            if not isinstance(entry, dict):
                raise QuorumClientError("malformed answer: an entry is not an object")
            entries.append((_field(entry, "key", str), _field(entry, "value", str)))
        after = body.get("next_start_after")
        return KeyPage(entries, after if isinstance(after, str) else None,
                       _field(body, "applied_offset", int))

    def watch(self, offset: int, key: str | None, prefix: str | None, wait_ms: int,
              max_events: int) -> WatchResult:
        query = {"offset": str(offset), "wait_ms": str(wait_ms),
                 "max_events": str(max_events)}
        query.update({"key": key} if key is not None else {"prefix": prefix or ""})
        body = self.call("GET", "/v1/watch", query=query, server_timeout=False,
                         extra_time_s=wait_ms / 1000)
        events = []
        for entry in _field(body, "events", list):
            if not isinstance(entry, dict):
                raise QuorumClientError("malformed answer: an event is not an object")
            value = entry.get("value")
            events.append(KvEvent(_field(entry, "offset", int), _field(entry, "key", str),
                                  value if isinstance(value, str) else None))
        return WatchResult(events, _field(body, "next_offset", int),
                           _field(body, "applied_offset", int))

    def append(self, values: Sequence[bytes]) -> tuple[int, int]:
        body = b"".join(len(value).to_bytes(4, "big") + bytes(value) for value in values)
        answer = self.call("POST", "/v1/records", body=body,
                           content_type="application/octet-stream")
        return _field(answer, "first_offset", int), _field(answer, "last_offset", int)

    def read(self, offset: int, max_records: int, wait_ms: int) -> ReadResult:
        query = {"offset": str(offset), "max_records": str(max_records), "wait_ms": str(wait_ms)}
        body = self.call("GET", "/v1/records", query=query, server_timeout=False,
                         extra_time_s=wait_ms / 1000)
        records = []
        for entry in _field(body, "records", list):
            key = entry.get("key")
            records.append(ReadRecord(
                offset=_field(entry, "offset", int),
                value=base64.b64decode(_field(entry, "value", str)),
                key=base64.b64decode(key) if isinstance(key, str) else None,
                timestamp_ms=int(entry.get("timestamp_ms", 0)),
            ))
        high_watermark = body.get("high_watermark")
        return ReadResult(records, high_watermark if isinstance(high_watermark, int) else None,
                          _field(body, "next_offset", int))

    def put_many(self, items: Sequence[tuple[str, str]], window: int) -> list[WriteResult]:
        """One put after the other: HTTP/1.1 answers a connection's requests in order."""
        return [self.put(key, value) for key, value in items]

    def call(self, method: str, path: str, *, query: Mapping[str, str] | None = None,
             body: bytes | None = None, content_type: str | None = None,
             server_timeout: bool = True, absent_ok: bool = False,
             extra_time_s: float = 0.0) -> dict[str, Any]:
        """One HTTP API call with redirects and retries; the JSON answer of a success."""
        request = _Request(method, path, dict(query or {}), body, content_type, server_timeout)

        def attempt(server: str, deadline: float) -> tuple[dict[str, Any] | _Refusal, str]:
            answer, server = self._follow(request, server, deadline)
            code = answer.body.get("code") if isinstance(answer.body, dict) else None
            if 200 <= answer.status < 300 or (absent_ok and code == "KEY_NOT_FOUND"):
                return answer.body, server
            return _Refusal(code or "ERROR", _error_message(answer), answer.status,
                            answer.body), server

        return self._policy.call(attempt, read=method == "GET",
                                 idempotent=method in ("GET", "PUT", "DELETE"),
                                 extra_time_s=extra_time_s)

    def _follow(self, request: _Request, server: str, deadline: float) -> tuple[_Answer, str]:
        """Send to ``server``, following redirects to the leader; the answer and who gave it."""
        first = server
        for _ in range(MAX_REDIRECTS + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _OutOfTime
            query = dict(request.query)
            if request.server_timeout:
                # The node gives up (and says so) before this client stops waiting for it.
                query["timeout_ms"] = str(_server_budget_ms(remaining))
            target = request.path + ("?" + urllib.parse.urlencode(query) if query else "")
            try:
                answer = self._send(server, request, target, _answer_window_s(remaining))
            except _NotSent as problem:
                if server == first:
                    raise
                # The node it was sent to answered (with a redirect to a leader that may just
                # have died): the list is reachable, an election will tell the new leader.
                raise _NotSent(str(problem)) from None
            if answer.status not in (307, 308):
                return answer, server
            if not answer.location:
                raise QuorumClientError(f"{server}: redirect without a Location", code="ERROR",
                                        status=answer.status)
            location = urllib.parse.urlsplit(urllib.parse.urljoin(server + request.path,
                                                                  answer.location))
            server = f"{location.scheme}://{location.netloc}"
        # Nodes disagree about the leader (an election in progress): nothing was applied.
        raise _NotSent(f"redirected more than {MAX_REDIRECTS} times (last to {server})")

    def _send(self, server: str, request: _Request, target: str, timeout_s: float) -> _Answer:
        connection = self._connection(server, timeout_s)
        headers = {"Accept": "application/json", **self._credentials.headers()}
        if request.content_type is not None:
            headers["Content-Type"] = request.content_type
        try:
            connection.request(request.method, target, body=request.body, headers=headers)
            response = connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as error:
            connection.close()
            raise _Interrupted(f"{server}: {_describe(error)}") from None
        if response.will_close:
            connection.close()
        else:
            with self._lock:
                self._idle.setdefault(server, []).append(connection)
        try:
            document = json.loads(data) if data else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            document = None
        if not isinstance(document, dict):
            snippet = data[:200].decode("utf-8", "replace").strip()
            raise QuorumClientError(
                f"{server} answered HTTP {response.status} with no JSON: {snippet!r} (is it a "
                f"quorum node?)", code="ERROR", status=response.status)
        return _Answer(response.status, document, response.getheader("Location"))

    def _connection(self, server: str, timeout_s: float) -> http.client.HTTPConnection:
        """A connected keep-alive connection from the pool, taken until its answer is read; a
        fresh one if the server closed the idle ones (checked before sending, so that a closed
        idle connection never leaves a write's outcome unknown)."""
        while True:
            with self._lock:
                pool = self._idle.get(server)
                connection = pool.pop() if pool else None
            if connection is None or (connection.sock is not None
                                      and not _is_dropped(connection.sock)):
                break
            connection.close()
        if connection is None:
            parts = urllib.parse.urlsplit(server)
            if parts.scheme == "https":
                connection = http.client.HTTPSConnection(
                    parts.hostname or "", parts.port, timeout=timeout_s,
                    context=self._tls.get())
            else:
                connection = http.client.HTTPConnection(parts.hostname or "", parts.port,
                                                        timeout=timeout_s)
            try:
                connection.connect()
            except ssl.SSLCertVerificationError as error:
                connection.close()
                # A certificate problem is not something another try would fix (a handshake
                # cut short by a node going down is: an OSError, handled below).
                raise QuorumClientError(f"{server}: TLS handshake failed: {error}",
                                        code="TLS_ERROR") from None
            except OSError as error:
                connection.close()
                raise _NotSent(f"{server}: {_describe(error)}",
                               unreachable=not isinstance(error, TimeoutError)) from None
            connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection.timeout = timeout_s
        connection.sock.settimeout(timeout_s)
        return connection


class _TlsContext:
    """The credentials' TLS context, made at its first use by any thread (it reads the CA and
    certificate files), then shared by every connection."""

    def __init__(self, credentials: ClientCredentials) -> None:
        self._credentials = credentials
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None

    def get(self) -> ssl.SSLContext:
        with self._lock:
            if self._context is None:
                self._context = self._credentials.ssl_context()
            return self._context


class _StreamTransport:
    """The binary protocol (``quorum_node.wire``): one ClientStream per server, shared by the
    threads calling, NOT_LEADER answers followed to the leader they name, and put_many's puts
    pipelined on one stream."""

    def __init__(self, policy: _Policy, credentials: ClientCredentials) -> None:
        self._policy = policy
        self._credentials = credentials
        self._tls = _TlsContext(credentials)
        self._lock = threading.Lock()  # guards the maps
        self._streams: dict[str, ClientStream] = {}
        # Held while a stream to the server is opened: the threads that find none wait for it
        # rather than each opening one (after a failover, every thread is sent to the leader).
        self._opening: dict[str, threading.Lock] = {}

    def close(self) -> None:
        with self._lock:
            streams = list(self._streams.values())
            self._streams.clear()
        for stream in streams:
            stream.close()

    def put(self, key: str, value: str) -> WriteResult:
        offset, epoch, applied = self._call(wire.Op.PUT, (key, value), key=key)
        return WriteResult(key, offset, epoch, applied)

    def get(self, key: str, stale: bool) -> str | None:
        value, _ = self._call(wire.Op.GET, (key, stale), key=key, server_timeout=not stale)
        return value  # type: ignore[no-any-return]

    def delete(self, key: str) -> WriteResult:
        offset, epoch, applied = self._call(wire.Op.DELETE, (key,), key=key)
        return WriteResult(key, offset, epoch, applied)

    def cas(self, key: str, expected: str | None, value: str | None) -> WriteResult:
        offset, epoch, applied = self._call(wire.Op.CAS, (key, expected, value), key=key)
        return WriteResult(key, offset, epoch, applied)

    def txn(self, compare: Sequence[Mapping[str, Any]], success: Sequence[Mapping[str, Any]],
            failure: Sequence[Mapping[str, Any]]) -> TxnResult:
        offset, epoch, succeeded, responses = self._call(
            wire.Op.TXN, _txn_fields(compare, success, failure))
        return TxnResult(succeeded, [_txn_response(r) for r in responses], offset, epoch)

    def list_keys(self, prefix: str, start_after: str | None, limit: int,
                  stale: bool) -> KeyPage:
        entries, after, applied_offset = self._call(
            wire.Op.LIST, (prefix, start_after, limit, stale), server_timeout=not stale)
        return KeyPage([tuple(entry) for entry in entries], after, applied_offset)

    def watch(self, offset: int, key: str | None, prefix: str | None, wait_ms: int,
              max_events: int) -> WatchResult:
        watched = key if key is not None else prefix or ""
        events, next_offset, applied_offset = self._call(
            wire.Op.WATCH, (key is not None, watched, offset, wait_ms, max_events),
            server_timeout=False, extra_time_s=wait_ms / 1000)
        return WatchResult([KvEvent(*event) for event in events], next_offset, applied_offset)

    def append(self, values: Sequence[bytes]) -> tuple[int, int]:
        first, last, _ = self._call(wire.Op.APPEND, ([bytes(v) for v in values],))
        return first, last

    def read(self, offset: int, max_records: int, wait_ms: int) -> ReadResult:
        high_watermark, next_offset, entries = self._call(
            wire.Op.READ, (offset, max_records, wait_ms), server_timeout=False,
            extra_time_s=wait_ms / 1000)
        records = [ReadRecord(offset=record_offset, value=value, key=record_key,
                              timestamp_ms=timestamp_ms)
                   for record_offset, timestamp_ms, record_key, value in entries]
        return ReadResult(records, high_watermark, next_offset)

    def put_many(self, items: Sequence[tuple[str, str]], window: int) -> list[WriteResult]:
        results: list[WriteResult] = []
        for start in range(0, len(items), window):
            chunk = items[start:start + window]
            answers = self._pipeline(wire.Op.PUT, [(key, value) for key, value in chunk])
            for (key, value), answer in zip(chunk, answers, strict=True):
                if answer is None:
                    results.append(self.put(key, value))
                else:
                    offset, epoch, applied = answer
                    results.append(WriteResult(key, offset, epoch, applied))
        return results

    def _pipeline(self, op: wire.Op,
                  requests: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...] | None]:
        """Send ``requests`` on the preferred server's stream, all before the first answer is
        awaited; each one's answer, or None where it has none (an error answer, or the stream
        failed: the caller retries those alone)."""
        answers: list[tuple[Any, ...] | None] = [None] * len(requests)
        timeout_s = self._policy.timeout_s
        deadline = time.monotonic() + timeout_s
        budget_ms = _server_budget_ms(timeout_s)
        try:
            stream = self._stream(self._policy.preferred, timeout_s)
        except (_NotSent, _OutOfTime, QuorumClientError):
            return answers
        sent: list[tuple[int, int]] = []
        with contextlib.suppress(StreamBroken):
            for index, fields in enumerate(requests):
                sent.append((index, stream.send(op, budget_ms, fields)))
        for index, correlation in sent:  # each one waited for: none is left in flight
            try:
                answer = stream.wait(correlation, max(0.0, deadline - time.monotonic()))
            except StreamBroken:
                continue
            if not isinstance(answer, wire.ErrorAnswer):
                answers[index] = answer
        if stream.ended:
            self._drop_stream(stream)
        return answers

    def _call(self, op: wire.Op, fields: tuple[Any, ...], *, key: str | None = None,
              server_timeout: bool = True, extra_time_s: float = 0.0) -> tuple[Any, ...]:
        """One call over the stream with redirects and retries; the answer's fields."""

        def attempt(server: str, deadline: float) -> tuple[_WireAnswer | _Refusal, str]:
            return self._follow(op, key, fields, server, deadline,
                                server_timeout=server_timeout)

        return self._policy.call(attempt, read=op in _READ_OPS, idempotent=op in _IDEMPOTENT_OPS,
                                 extra_time_s=extra_time_s).fields

    def _follow(self, op: wire.Op, key: str | None, fields: tuple[Any, ...], server: str,
                deadline: float, *, server_timeout: bool
                ) -> tuple[_WireAnswer | _Refusal, str]:
        """Send over ``server``'s stream, following NOT_LEADER to the leader; the answer and
        who gave it."""
        first = server
        for _ in range(MAX_REDIRECTS + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _OutOfTime
            try:
                stream = self._stream(server, remaining)
            except _NotSent as problem:
                if server == first:
                    raise
                # As over HTTP: the node sent here answered, the list is reachable.
                raise _NotSent(str(problem)) from None
            timeout_ms = _server_budget_ms(remaining) if server_timeout else 0
            try:
                answer = stream.wait(stream.send(op, timeout_ms, fields),
                                     _answer_window_s(remaining))
            except StreamBroken as broken:
                if stream.ended:  # not a request given up: the stream serves the others
                    self._drop_stream(stream)
                raise _Interrupted(str(broken)) from None
            if not isinstance(answer, wire.ErrorAnswer):
                return _WireAnswer(op, key, answer), server
            leader_url = answer.leader[1] if answer.leader is not None else None
            if answer.code != "NOT_LEADER" or not leader_url:
                return _Refusal(answer.code, answer.message, None, answer.body()), server
            location = urllib.parse.urlsplit(leader_url)
            server = f"{location.scheme}://{location.netloc}"
        raise _NotSent(f"redirected more than {MAX_REDIRECTS} times (last to {server})")

    def _stream(self, server: str, timeout_s: float) -> ClientStream:
        """An open stream to ``server``; a new one if the node closed the last one."""
        with self._lock:
            stream = self._streams.get(server)
            opening = self._opening.setdefault(server, threading.Lock())
        if stream is not None and stream.usable:
            return stream
        if not opening.acquire(timeout=timeout_s):
            raise _OutOfTime
        try:
            with self._lock:
                stream = self._streams.get(server)
            if stream is not None and stream.usable:
                return stream  # another thread opened it meanwhile
            if stream is not None:
                self._drop_stream(stream)
            stream = self._open(server, timeout_s)
            with self._lock:
                self._streams[server] = stream
            return stream
        finally:
            opening.release()

    def _open(self, server: str, timeout_s: float) -> ClientStream:
        secure = urllib.parse.urlsplit(server).scheme == "https"
        ssl_context = self._tls.get() if secure else None
        try:
            return ClientStream.open(server, headers=self._credentials.headers(),
                                     ssl_context=ssl_context, timeout_s=timeout_s)
        except ssl.SSLCertVerificationError as error:
            raise QuorumClientError(f"{server}: TLS handshake failed: {error}",
                                    code="TLS_ERROR") from None
        except StreamNotOpened as problem:
            if problem.status is None:
                raise _NotSent(str(problem), unreachable=problem.unreachable) from None
            raise _stream_refused(server, problem) from None

    def _drop_stream(self, stream: ClientStream) -> None:
        stream.close()
        with self._lock:
            if self._streams.get(stream.server) is stream:
                del self._streams[stream.server]



def _answer_window_s(remaining_s: float) -> float:
    """How long a request sent now is waited for: what is left of the call's time, but never
    less than the margin an answer needs to travel back (the node was given the rest). A request
    sent in the call's last moments is waited for, not cut off with its outcome unknown."""
    return max(remaining_s, _SERVER_TIMEOUT_MARGIN_S)


def _server_budget_ms(remaining_s: float) -> int:
    """How long the node may take: it gives up (and says so) before this client stops
    waiting for it."""
    return max(1, min(int((remaining_s - _SERVER_TIMEOUT_MARGIN_S) * 1000), 60_000))


def _stream_refused(server: str, problem: StreamNotOpened) -> QuorumClientError:
    """A node's HTTP answer to the stream's upgrade, as an error."""
    try:
        body = json.loads(problem.body) if problem.body else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        body = None
    if problem.status == 404:
        return QuorumClientError(f"{server} does not serve the binary protocol ({wire.PATH}); "
                                 f"use the HTTP protocol", code="UNSUPPORTED_PROTOCOL",
                                 status=404)
    if isinstance(body, dict) and isinstance(body.get("code"), str):
        message = body.get("message") or f"HTTP {problem.status}"
        return QuorumClientError(str(message), code=body["code"], status=problem.status,
                                 body=body)
    return QuorumClientError(f"{server} refused the stream: HTTP {problem.status}",
                             code="ERROR", status=problem.status)


def _is_dropped(sock: socket.socket) -> bool:
    # An idle keep-alive connection has nothing to read unless the server closed it.
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _describe(error: BaseException) -> str:
    if isinstance(error, TimeoutError | socket.timeout):
        return "no answer in time"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, http.client.RemoteDisconnected):
        return "connection closed by the server"
    return str(error) or type(error).__name__


def _error_message(answer: _Answer) -> str:
    # Every error body is {"code", "message"} (quorum_node.node.api.http).
    message = answer.body.get("message")
    return str(message) if message else f"HTTP {answer.status}"


def _checked_key(key: str) -> str:
    if not key:
        raise ValueError("a key must not be empty")
    return _utf8_text(key, "a key")


def _utf8_text(text: str, what: str) -> str:
    """``text``, if it can be sent (keys and prefixes travel as UTF-8)."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{what} must be Unicode text (UTF-8 encodable), got "
                             f"{text!r}") from None
    return text


def _kv_path(key: str) -> str:
    return "/v1/kv/" + urllib.parse.quote(key, safe="")


def _u32(value: int, name: str) -> int:
    if not 0 <= value < 2**32:
        raise ValueError(f"{name} must be between 0 and {2**32 - 1}, got {value}")
    return value


def _u64(value: int, name: str) -> int:
    if not 0 <= value < 2**63:
        raise ValueError(f"{name} must be between 0 and {2**63 - 1}, got {value}")
    return value


def _txn_fields(compare: Sequence[Mapping[str, Any]], success: Sequence[Mapping[str, Any]],
                failure: Sequence[Mapping[str, Any]]) -> tuple[Any, ...]:
    """A txn's compares and operations as the TXN request's fields (the node checks them as it
    checks the HTTP API's body; here only what the framing needs)."""
    compares = []
    for index, item in enumerate(_txn_list("compare", compare)):
        if not isinstance(item, Mapping):
            raise ValueError(f"compare[{index}]: expected an object")
        target = item.get("target")
        operand = item.get(target) if isinstance(target, str) else None
        text = operand if target == "value" else None
        number = None if target == "value" else operand
        if not (isinstance(item.get("key"), str) and isinstance(target, str)
                and isinstance(item.get("result"), str) and (text is None or isinstance(text, str))
                and (number is None or (isinstance(number, int) and not isinstance(number, bool)
                                        and -2**63 <= number < 2**63))):
            raise ValueError(f"compare[{index}]: expected {{\"key\": str, \"target\": str, "
                             f"\"result\": str, <target>: str or 64-bit integer}}")
        compares.append((item["key"], target, item["result"], text, number))
    return compares, _txn_op_fields("success", success), _txn_op_fields("failure", failure)


def _txn_op_fields(name: str, ops: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    fields = []
    for index, op in enumerate(_txn_list(name, ops)):
        if not isinstance(op, Mapping):
            raise ValueError(f"{name}[{index}]: expected an object")
        kind, key, value = op.get("op"), op.get("key"), op.get("value")
        if not (isinstance(kind, str) and isinstance(key, str)
                and (value is None or isinstance(value, str))):
            raise ValueError(f"{name}[{index}]: expected {{\"op\": str, \"key\": str, "
                             f"\"value\": str (a put's)}}")
        fields.append((kind, key, value))
    return fields


def _txn_list(name: str, items: Any) -> Sequence[Any]:
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Sequence):
        raise ValueError(f"{name!r} must be a list")
    return items


def _txn_response(fields: tuple[Any, ...]) -> dict[str, Any]:
    """A TXN answer's response as the HTTP API's JSON (``txn_response_json``)."""
    op, key, found, value, version, mod_offset = fields
    if op == "get":
        return {"op": "get", "key": key, "value": value, "version": version,
                "mod_offset": mod_offset}
    return {"op": op, "key": key, ("existed" if op == "put" else "deleted"): found}


def _http_answer(answer: _WireAnswer) -> dict[str, Any]:
    """A stream call's answer as the HTTP API's JSON answer to the same call."""
    op, key, fields = answer.op, answer.key, answer.fields
    if op in (wire.Op.PUT, wire.Op.CAS, wire.Op.DELETE):
        offset, epoch, applied = fields
        return {"key": key, "offset": offset, "epoch": epoch,
                ("deleted" if op is wire.Op.DELETE else "applied"): applied}
    if op is wire.Op.TXN:
        offset, epoch, succeeded, responses = fields
        return {"succeeded": succeeded, "responses": [_txn_response(r) for r in responses],
                "offset": offset, "epoch": epoch}
    if op is wire.Op.GET:
        value, applied_offset = fields
        if value is None:
            return {"code": "KEY_NOT_FOUND", "message": f"key {key!r} not found (applied up to "
                                                        f"offset {applied_offset})"}
        return {"key": key, "value": value, "applied_offset": applied_offset}
    if op is wire.Op.APPEND:
        first, last, epoch = fields
        return {"first_offset": first, "last_offset": last, "epoch": epoch}
    if op is wire.Op.READ:
        high_watermark, next_offset, records = fields
        entries = []
        for offset, timestamp_ms, record_key, value in records:
            entry = {"offset": offset, "value": base64.b64encode(value).decode("ascii"),
                     "timestamp_ms": timestamp_ms}
            if record_key is not None:
                entry["key"] = base64.b64encode(record_key).decode("ascii")
            entries.append(entry)
        return {"records": entries, "high_watermark": high_watermark,
                "next_offset": next_offset}
    if op is wire.Op.LIST:
        page, next_start_after, applied_offset = fields
        return {"entries": [{"key": k, "value": v} for k, v in page],
                "next_start_after": next_start_after, "applied_offset": applied_offset}
    events, next_offset, applied_offset = fields
    return {"events": [{"offset": offset, "key": event_key,
                        "type": "put" if value is not None else "delete", "value": value}
                       for offset, event_key, value in events],
            "next_offset": next_offset, "applied_offset": applied_offset}


def _field(body: Mapping[str, Any], name: str, kind: type[_T]) -> _T:
    value = body.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise QuorumClientError(f"malformed answer: {name!r} missing or not a {kind.__name__}",
                                code="ERROR")
    return value


def _write_result(body: Mapping[str, Any], applied_field: str) -> WriteResult:
    return WriteResult(key=_field(body, "key", str), offset=_field(body, "offset", int),
                       epoch=_field(body, "epoch", int),
                       applied=_field(body, applied_field, bool))


def _voters(body: Mapping[str, Any]) -> list[Voter]:
    voters = []
    for entry in _field(body, "voters", list):
        if not isinstance(entry, dict):
            raise QuorumClientError("malformed answer: a voter is not an object", code="ERROR")
        directory_id = entry.get("directory_id")
        voters.append(Voter(_field(entry, "id", int),
                            directory_id if isinstance(directory_id, str) else None))
    return voters
