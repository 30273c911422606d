"""The client operations of a node, whatever the transport: the record log and the key-value
store, as async calls that the HTTP handlers (``quorum_node.node.api.client``) and any other
client protocol are thin wrappers of.

``KvService(node)`` serves from the node's state machine (``node.state_machine``, which the
runtime runs). Its operations:

- ``append(values, timeout_s) -> Appended``: append records (their values) as one proposal
  through the leader; answers once they are committed (first and last offset, epoch).
- ``read(offset, max_records, wait_s) -> RecordsPage``: committed records from ``offset``
  (control records skipped), waiting up to ``wait_s`` while none is committed there. Any node
  answers (committed records never change).
- ``put(key, value, timeout_s)``, ``delete(key, timeout_s)``, ``cas(key, expected, value,
  timeout_s) -> Written``: a KV write, answered once it is committed and applied here
  (``applied``: False for a cas whose expectation did not hold, or a delete of an absent key).
- ``txn(txn, timeout_s) -> TxnResult``: a multi-key transaction (``kv.Txn``, etcd's Txn) as one
  record: its compares and the branch they choose apply at its one offset, on every replica
  alike; answered once committed and applied here, with whether the compares held and what each
  operation of the branch answered (a get: the value at that point of the txn).
- ``get(key, stale, timeout_s) -> Value``: a key's value (None if absent); linearizable (a
  ReadIndex confirmed by a majority, then this node's store caught up to it) unless ``stale``,
  which reads this node's store as it is, on any node.
- ``list_keys(prefix, start_after, limit, stale, timeout_s) -> Page``: a page of the keys under
  ``prefix`` in key order, after ``start_after``; linearizable unless ``stale``, as ``get``.
- ``watch(offset, key=... | prefix=..., wait_s, max_events) -> Changes``: the changes of a key or
  of the keys under a prefix from ``offset`` on, waiting up to ``wait_s`` while there is none.
  Any node answers, from its own store.

A page and a watch's answer hold at most ``MAX_ANSWER_BYTES`` of keys and values (one entry
however large), whatever ``limit`` or ``max_events`` asks: the answer's continuation
(``next_start_after``, ``next_offset``) says where the next one starts. A watch that waits is
registered in the store's ``WatchIndex`` and handed the changes of its key or prefix as they are
applied, so that waiting watches cost an applied write nothing unless it concerns them; a
caller that goes away cancels its call, which ends its wait at once.

Errors, every one a plain exception for the transport to map to its one error answer:

- ``NotLeaderError`` (``quorum_node.raft.types``): the call needs the leader; ``leader_id`` is
  the leader's id, or None while none is known (an election, or this leader resigning).
- ``ServiceError`` (``quorum_node.node.errors``) with ``code`` and ``message``: ``BAD_REQUEST``
  and ``TOO_LARGE`` (the arguments), ``TIMEOUT`` (not done in time; a write may still commit),
  ``OUTCOME_UNKNOWN`` (a write may or may not take effect), ``APPEND_LOST`` (truncated by a new
  leader: retry it), ``SHUTTING_DOWN``, ``NODE_FAILED``, ``OFFSET_OUT_OF_RANGE`` (a read below
  the log start), ``COMPACTED`` (a watch from before the changes kept), ``TOO_MANY_LONG_POLLS``
  (``http.max.long.polls`` calls already wait, across transports).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from quorum_node.kv.ops import (
    Cas,
    Delete,
    KvOp,
    KvOpError,
    Outcome,
    Put,
    Txn,
    TxnOutcome,
    TxnResponse,
    check_key,
    encode_op,
)
from quorum_node.kv.store import KvEvent, KvStore
from quorum_node.node.errors import ErrorCode, ServiceError
from quorum_node.node.proposals import Appended
from quorum_node.node.runtime import AppendLostError, CommitUnknownError, QuorumNode
from quorum_node.node.state_machine import (
    READ_CHUNK_BYTES,
    KvStateMachine,
    StateMachineClosing,
    StateMachineFailed,
)
from quorum_node.node.waits import WaitInterrupted
from quorum_node.raft.log import LogFullError
from quorum_node.raft.records import Record, RecordBatch
from quorum_node.raft.types import NotLeaderError

MAX_RECORD_BYTES = 1024 * 1024  # one record's value
# One append is one proposal and ends up in one batch; the log refuses batches over 8 MiB.
MAX_APPEND_BYTES = 4 * 1024 * 1024
DEFAULT_READ_RECORDS = 100
MAX_READ_RECORDS = 10_000
# A read answers once this many value bytes are gathered (at least one record).
READ_RESPONSE_BYTES = 1024 * 1024
MAX_WAIT_MS = 30_000
DEFAULT_TIMEOUT_MS = 10_000
MAX_TIMEOUT_MS = 60_000
DEFAULT_LIST_LIMIT = 100
MAX_LIST_LIMIT = 10_000
DEFAULT_WATCH_EVENTS = 100
MAX_WATCH_EVENTS = 10_000
# Bytes of keys and values a page of keys or a watch's answer holds at most (kv.change_bytes;
# one entry however large): what one answer costs the node's memory and event loop is bounded,
# whatever limit or max_events was asked for.
MAX_ANSWER_BYTES = 1024 * 1024
# Changes of the history a watch looks at before it lets other work run.
WATCH_SCAN_SLICE = 10_000

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class CommittedRecord:
    offset: int
    value: bytes
    key: bytes | None
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class RecordsPage:
    records: list[CommittedRecord]
    high_watermark: int | None
    next_offset: int  # where the next read continues (past any control records skipped)


@dataclass(frozen=True, slots=True)
class Written:
    key: str
    applied: bool
    offset: int
    epoch: int


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool  # whether every compare held (the success branch ran)
    responses: tuple[TxnResponse, ...]  # one for each operation of the branch that ran
    offset: int
    epoch: int


@dataclass(frozen=True, slots=True)
class Value:
    key: str
    value: str | None  # None: absent
    applied_offset: int


@dataclass(frozen=True, slots=True)
class Page:
    entries: list[tuple[str, str]]
    next_start_after: str | None  # where the next page starts; None on the last page
    applied_offset: int


@dataclass(frozen=True, slots=True)
class Changes:
    events: list[KvEvent]
    next_offset: int  # where the next watch continues: every change below it was answered
    applied_offset: int


def bad_request(message: str) -> ServiceError:
    return ServiceError(ErrorCode.BAD_REQUEST, message)


def too_large(message: str) -> ServiceError:
    return ServiceError(ErrorCode.TOO_LARGE, message)


def refused_op(error: KvOpError) -> ServiceError:
    return too_large(str(error)) if error.too_large else bad_request(str(error))


def check_record_size(index: int, size: int) -> None:
    """Raise TOO_LARGE if record ``index`` of an append, ``size`` bytes, is over the limit."""
    if size > MAX_RECORD_BYTES:
        raise too_large(f"record {index}: {size} bytes exceed the limit of {MAX_RECORD_BYTES} "
                        f"bytes")


def checked_key(key: str) -> str:
    try:
        check_key(key)
    except KvOpError as error:
        raise refused_op(error) from None
    return key


class KvService:
    """The client operations of one node (see the module's docstring)."""

    def __init__(self, node: QuorumNode) -> None:
        self.node = node
        self.state_machine: KvStateMachine = node.state_machine
        self.long_polls = 0  # calls waiting for records or changes, bounded by the config

    # --- records -----------------------------------------------------------------------------

    async def append(self, values: Sequence[bytes], timeout_s: float) -> Appended:
        if not values:
            raise bad_request("no records to append")
        for index, value in enumerate(values):
            check_record_size(index, len(value))
        total = sum(len(value) for value in values)
        if total > MAX_APPEND_BYTES:
            raise too_large(f"{total} bytes of records exceed the limit of {MAX_APPEND_BYTES} "
                            f"bytes per append")
        return await self._append([Record(value=value) for value in values], timeout_s)

    async def read(self, offset: int, max_records: int, wait_s: float) -> RecordsPage:
        if wait_s <= 0:
            return await self._read(offset, max_records, 0.0)
        async with self._long_poll("reads are already waiting for records",
                                   "read with wait_ms=0"):
            return await self._read(offset, max_records, wait_s)

    async def _read(self, offset: int, max_records: int, wait_s: float) -> RecordsPage:
        node, state_machine = self.node, self.state_machine
        log_start = node.log_dir.log.start_offset
        if offset < log_start:
            raise ServiceError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"offset {offset} is below the log start {log_start} on node "
                f"{node.config.node_id}: those records are compacted into a snapshot of the "
                f"key-value store")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        position = offset
        records: list[CommittedRecord] = []
        size = 0  # bytes of values gathered
        while True:
            high_watermark = node.high_watermark or 0
            if position < high_watermark:
                batches = node.read_committed(position, READ_CHUNK_BYTES)
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
            if remaining <= 0 or not state_machine.running:
                break
            await state_machine.wait_progress(remaining)
        return RecordsPage(records, node.high_watermark, position)

    # --- key-value store ---------------------------------------------------------------------

    async def put(self, key: str, value: str, timeout_s: float) -> Written:
        return await self._write(Put(checked_key(key), value), timeout_s)

    async def delete(self, key: str, timeout_s: float) -> Written:
        return await self._write(Delete(checked_key(key)), timeout_s)

    async def cas(self, key: str, expected: str | None, value: str | None,
                  timeout_s: float) -> Written:
        return await self._write(Cas(checked_key(key), expected, value), timeout_s)

    async def txn(self, txn: Txn, timeout_s: float) -> TxnResult:
        outcome, offset, epoch = await self._commit(txn, timeout_s)
        assert isinstance(outcome, TxnOutcome), "a txn's record leaves a txn's outcome"
        return TxnResult(outcome.succeeded, outcome.responses, offset, epoch)

    async def get(self, key: str, *, stale: bool, timeout_s: float) -> Value:
        checked_key(key)
        if not stale:
            await self._catch_up_linearizable(timeout_s)
        store = self.state_machine.store
        return Value(key, store.get(key), store.applied_offset)

    async def list_keys(self, prefix: str, start_after: str | None, limit: int, *,
                        stale: bool, timeout_s: float) -> Page:
        if not stale:
            await self._catch_up_linearizable(timeout_s)
        store = self.state_machine.store
        entries, more = store.scan(prefix, start_after, limit, MAX_ANSWER_BYTES)
        return Page(entries, entries[-1][0] if more else None, store.applied_offset)

    async def watch(self, offset: int, *, key: str | None = None, prefix: str | None = None,
                    wait_s: float = 0.0, max_events: int = DEFAULT_WATCH_EVENTS) -> Changes:
        """``key`` or ``prefix``, exactly one."""
        if (key is None) == (prefix is None):
            raise bad_request("give exactly one of 'key' and 'prefix'")
        if key is not None:
            checked_key(key)
        watched = key if key is not None else prefix or ""
        exact = key is not None
        if wait_s <= 0:
            return await self._changes(offset, watched, exact, max_events)
        async with self._long_poll("requests are already waiting", "watch with wait_ms=0"):
            changes = await self._changes(offset, watched, exact, max_events)
            if changes.events or not self.state_machine.running:
                return changes
            # Every change kept was looked at, and none since (no await in between): wait to be
            # handed the next ones.
            return await self._next_changes(changes.next_offset, watched, exact, max_events,
                                            wait_s)

    async def _changes(self, offset: int, watched: str, exact: bool,
                       max_events: int) -> Changes:
        """The changes kept from ``offset`` on, looked at a slice at a time (other work runs in
        between); COMPACTED if ``offset`` is below them."""
        store = self.state_machine.store
        events: list[KvEvent] = []
        size = 0
        position = offset
        while True:
            if position < store.events_start:
                if events:  # the history moved past the rest meanwhile: the next call is told
                    return Changes(events, position, store.applied_offset)
                raise self._compacted(store)
            size, position, done = store.changes(
                position, watched, exact, into=events, size=size, max_events=max_events,
                max_bytes=MAX_ANSWER_BYTES, max_scanned=WATCH_SCAN_SLICE)
            if done:
                return Changes(events, position, store.applied_offset)
            await asyncio.sleep(0)

    async def _next_changes(self, start: int, watched: str, exact: bool, max_events: int,
                            wait_s: float) -> Changes:
        """Wait up to ``wait_s`` to be handed the changes at or after ``start`` (every change
        before it looked at already)."""
        store = self.state_machine.store
        waiter = _ChangeWaiter(watched, exact, start, max_events,
                               asyncio.get_running_loop().create_future())
        store.watchers.add(waiter)
        try:
            with contextlib.suppress(TimeoutError):
                # asyncio.timeout rather than wait_for: on 3.11, wait_for can swallow a
                # cancellation (a caller gone).
                async with asyncio.timeout(wait_s):
                    await waiter.woken
        finally:
            store.watchers.discard(waiter)
        if waiter.lost and not waiter.events:
            raise self._compacted(store)
        if waiter.full_at is not None:
            next_offset = waiter.full_at
        elif waiter.lost:  # what came after them went into a snapshot
            next_offset = waiter.events[-1].offset + 1
        else:  # every change applied so far was looked at
            next_offset = max(start, store.next_offset)
        return Changes(waiter.events, next_offset, store.applied_offset)

    def _compacted(self, store: KvStore) -> ServiceError:
        return ServiceError(
            ErrorCode.COMPACTED,
            f"the changes before offset {store.events_start} are no longer known on node "
            f"{self.node.config.node_id} (compacted into a snapshot, or older than the "
            f"changes kept); watch from {store.events_start} after reading the current "
            f"values")

    # --- what the operations share -----------------------------------------------------------

    def _long_poll(self, waiting: str, instead: str) -> _LongPoll:
        if self.long_polls >= self.node.config.http_max_long_polls:
            raise ServiceError(ErrorCode.TOO_MANY_LONG_POLLS,
                               f"{self.long_polls} {waiting} on this node; retry later, or "
                               f"{instead}")
        return _LongPoll(self)

    async def _write(self, op: Put | Delete | Cas, timeout_s: float) -> Written:
        outcome, offset, epoch = await self._commit(op, timeout_s)
        assert isinstance(outcome, Outcome), "a write's record leaves a write's outcome"
        return Written(op.key, outcome.applied, offset, epoch)

    async def _commit(self, op: KvOp, timeout_s: float) -> tuple[Outcome | TxnOutcome, int, int]:
        """Append ``op`` and wait until it is applied here: its outcome, offset and epoch."""
        try:
            record = encode_op(op)
        except KvOpError as error:
            raise refused_op(error) from None
        deadline = asyncio.get_running_loop().time() + timeout_s
        appended = await self._append([record], timeout_s)
        first = appended.first_offset
        try:
            await self._wait_applied(first + 1, deadline)
        except ServiceError as error:
            if error.code is ErrorCode.TIMEOUT:
                raise
            raise ServiceError(ErrorCode.OUTCOME_UNKNOWN, f"the operation committed at offset "
                                                          f"{first}, but {error.message}") from None
        outcome = self.state_machine.store.pop_outcome(first)
        if outcome is None:
            # Only if more than the store's outcome limit of operations were applied meanwhile.
            raise ServiceError(ErrorCode.OUTCOME_UNKNOWN,
                               f"the operation committed at offset {first} but its outcome is "
                               f"no longer known")
        return outcome, first, appended.epoch

    async def _catch_up_linearizable(self, timeout_s: float) -> None:
        """Wait until this node's store holds every write acknowledged before the call."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        read_index = await self._read_index(timeout_s)
        await self._wait_applied(read_index, deadline)

    async def _wait_applied(self, next_offset: int, deadline: float) -> None:
        try:
            await self.state_machine.wait_applied(next_offset, deadline)
        except TimeoutError as error:
            raise ServiceError(ErrorCode.TIMEOUT, str(error)) from None
        except StateMachineClosing as error:
            raise ServiceError(ErrorCode.SHUTTING_DOWN, str(error)) from None
        except StateMachineFailed as error:
            raise ServiceError(ErrorCode.NODE_FAILED, str(error)) from None

    def _check_node(self) -> None:
        state_machine = self.state_machine
        if state_machine.closing:
            raise ServiceError(ErrorCode.SHUTTING_DOWN, "the node is shutting down")
        if state_machine.failure is not None:
            raise ServiceError(ErrorCode.NODE_FAILED,
                               f"the node's state machine stopped: {state_machine.failure}")
        if self.node.failure is not None:
            raise ServiceError(ErrorCode.NODE_FAILED,
                               f"the node stopped after a failure: {self.node.failure}")

    def _not_leader(self) -> NotLeaderError:
        node = self.node
        leader_id = node.leader_id
        # A leader that is resigning still names itself: its successor is not known yet.
        known = leader_id is not None and leader_id != node.config.node_id
        return NotLeaderError(leader_id if known else None, node.epoch)

    async def _until_closing(self, awaitable: Awaitable[_T], interrupted: ServiceError) -> _T:
        """Await a wait of the node's; raise ``interrupted`` instead if the node starts shutting
        down first (its waits would otherwise hold the server's shutdown until they time
        out)."""
        try:
            return await awaitable
        except WaitInterrupted:
            raise interrupted from None

    async def _append(self, records: list[Record], timeout_s: float) -> Appended:
        """Append through the leader; answers once committed."""
        self._check_node()
        try:
            return await self._until_closing(
                self.node.append(records, timeout_s),
                ServiceError(ErrorCode.OUTCOME_UNKNOWN,
                             "the node is shutting down; the write may or may not commit"))
        except NotLeaderError:
            raise self._not_leader() from None
        except CommitUnknownError as error:
            raise ServiceError(ErrorCode.TIMEOUT, f"{error}; it may still commit") from None
        except AppendLostError as error:
            raise ServiceError(ErrorCode.APPEND_LOST, f"{error} by a new leader; it will never "
                                                      f"commit (retry it)") from None
        except LogFullError as error:
            raise ServiceError(ErrorCode.DISK_FULL, f"{error}; nothing was appended (retry once "
                                                    f"space is freed)") from None

    async def _read_index(self, timeout_s: float) -> int:
        self._check_node()
        try:
            return await self._until_closing(
                self.node.read_barrier(timeout_s),
                ServiceError(ErrorCode.SHUTTING_DOWN, "the node is shutting down"))
        except NotLeaderError:
            raise self._not_leader() from None
        except TimeoutError:
            raise ServiceError(ErrorCode.TIMEOUT, f"leadership was not confirmed by a majority "
                                                  f"within {timeout_s:g} s") from None


class _ChangeWaiter:
    """A waiting watch, in the store's WatchIndex: the changes it is handed, within its answer's
    bounds, and the future its call waits on (resolved by the first)."""

    __slots__ = ("events", "exact", "full_at", "lost", "max_events", "size", "start", "watched",
                 "woken")

    def __init__(self, watched: str, exact: bool, start: int, max_events: int,
                 woken: asyncio.Future[None]) -> None:
        self.watched = watched
        self.exact = exact
        self.start = start
        self.max_events = max_events
        self.woken = woken
        self.events: list[KvEvent] = []
        self.size = 0
        self.full_at: int | None = None  # where the next watch continues, once full
        self.lost = False

    def take(self, offset: int, key: str, value: str | None, size: int) -> bool:
        if offset < self.start:
            return True
        # The changes of one offset (a txn's) all go in one answer: they are handed over in
        # one synchronous apply, before the waiting call resumes.
        same_offset = bool(self.events) and self.events[-1].offset == offset
        if not same_offset and (len(self.events) >= self.max_events
                                or (self.events and self.size + size > MAX_ANSWER_BYTES)):
            self.full_at = offset
            return False
        self.events.append(KvEvent(offset, key, value))
        self.size += size
        if not self.woken.done():
            self.woken.set_result(None)
        if len(self.events) >= self.max_events:
            self.full_at = offset + 1  # unless more changes of this offset come
        return True

    def end(self, *, lost: bool) -> None:
        self.lost = lost
        if not self.woken.done():
            self.woken.set_result(None)


class _LongPoll:
    """Counts a waiting call against the node's bound while it runs."""

    def __init__(self, service: KvService) -> None:
        self._service = service

    async def __aenter__(self) -> None:
        self._service.long_polls += 1

    async def __aexit__(self, *_: object) -> None:
        self._service.long_polls -= 1


def _collect(batches: list[RecordBatch], position: int, high_watermark: int, *,
             max_records: int, into: list[CommittedRecord], size: int) -> tuple[int, int]:
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
            into.append(CommittedRecord(offset, record.value, record.key, batch.timestamp_ms))
            size += len(record.value)
            position = offset + 1
    return position, size
