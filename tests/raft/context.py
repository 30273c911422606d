"""A test harness for ``RaftCore`` in the spirit of Kafka's ``RaftClientTestContext``.

One ``RaftTestContext`` wraps one core (the local replica) and plays every other party by hand: it
delivers requests "from" peers, answers the core's outbound requests, moves a fake clock, flushes
the ``MemoryLog`` and keeps a simulated quorum-state store (the last ``Effects.persist``).

Every call into the core is followed by ``take_effects()``; the effects are kept in ``history`` and
their messages go to ``outbox`` until a test consumes them. The random source returns 0 from
``randrange`` so that every election timer is exactly ``election_timeout_ms`` and the unattached
discovery fetch always goes to the first other voter.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from quorum_node.raft.config import QuorumConfig
from quorum_node.raft.core import Effects, OutboundRequest, OutboundResponse, RaftCore
from quorum_node.raft.log import MemoryLog
from quorum_node.raft.memory_snapshots import MemorySnapshotStore
from quorum_node.raft.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    EpochEndOffset,
    FetchRequest,
    FetchResponse,
    RaftRequest,
    RaftResponse,
    ReplicaInfo,
    VoteRequest,
    VoteResponse,
)
from quorum_node.raft.records import Record, encode_batch
from quorum_node.raft.snapshots import SnapshotRecordsCheck
from quorum_node.raft.state import ElectionState, RaftState
from quorum_node.raft.types import Errors, ReplicaKey

CLUSTER_ID = "test-cluster"
# controller.quorum.fetch.timeout.ms as Kafka ships it, which the catalogue's tests count with.
KAFKA_FETCH_TIMEOUT_MS = 2000

RequestT = TypeVar("RequestT", bound=RaftRequest)


class ZeroRandom(random.Random):
    """``randrange`` always answers its lower bound: election timers are exactly T."""

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
        return 0 if stop is None else start


def records(*values: str) -> list[Record]:
    return [Record(value=v.encode()) for v in values]


def append_batches(log: MemoryLog, epochs: Iterable[tuple[int, int]]) -> None:
    """Append one leader batch per (epoch, record count)."""
    for epoch, count in epochs:
        log.append_as_leader(records(*(f"e{epoch}-{i}" for i in range(count))), epoch, 0)


def encoded_batches(base_offset: int, epochs: Iterable[tuple[int, int]]) -> bytes:
    """Bytes of consecutive batches starting at ``base_offset`` (a leader's Fetch payload)."""
    out = bytearray()
    offset = base_offset
    for epoch, count in epochs:
        values = records(*(f"r{offset + i}" for i in range(count)))
        out += encode_batch(offset, epoch, values, 0)
        offset += count
    return bytes(out)


@dataclass
class RaftTestContext:
    local_id: int
    voter_keys: tuple[ReplicaKey, ...]
    log: MemoryLog
    config: QuorumConfig
    core: RaftCore
    now_ms: int
    store: ElectionState | None
    outbox: list[OutboundRequest | OutboundResponse] = field(default_factory=list)
    history: list[Effects] = field(default_factory=list)
    last_effects: Effects = field(default_factory=Effects)
    _next_correlation: int = 1000

    # Module helpers, reachable from the fixture without importing this module by name.
    records = staticmethod(records)
    encoded_batches = staticmethod(encoded_batches)

    # --- building -----------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        local_id: int = 1,
        voters: Sequence[int] = (1, 2, 3),
        *,
        log_epochs: Iterable[tuple[int, int]] = (),
        election_state: ElectionState | None = None,
        directory_ids: dict[int, uuid.UUID] | None = None,
        local_directory_id: uuid.UUID | None = None,
        now_ms: int = 0,
        rng: random.Random | None = None,
        observer_ids: Sequence[int] = (),
        snapshots: MemorySnapshotStore | None = None,
        check_snapshot_records: SnapshotRecordsCheck | None = None,
        **config: Any,
    ) -> RaftTestContext:
        dirs = directory_ids or {}
        keys = tuple(ReplicaKey(v, dirs.get(v)) for v in voters)
        log = MemoryLog()
        append_batches(log, log_epochs)
        log.flush()
        # Kafka answers a parked Fetch as soon as the high watermark moves, and the catalogue's
        # tests expect that; the linger has tests of its own. They count time with Kafka's fetch
        # timeout too (the node's default is shorter: test_config).
        config.setdefault("high_watermark_linger_ms", 0)
        config.setdefault("leader_flush_delay_ms", 0)  # Kafka's leader flushes at once
        config.setdefault("fetch_timeout_ms", KAFKA_FETCH_TIMEOUT_MS)
        quorum_config = QuorumConfig(**config)
        core = RaftCore(
            node_id=local_id,
            directory_id=local_directory_id if local_directory_id is not None
            else dirs.get(local_id),
            cluster_id=CLUSTER_ID,
            voters=keys,
            log=log,
            election_state=election_state,
            config=quorum_config,
            random=rng if rng is not None else ZeroRandom(0),
            now_ms=now_ms,
            snapshots=snapshots if snapshots is not None else MemorySnapshotStore(),
            observer_ids=observer_ids,
            check_snapshot_records=check_snapshot_records,
        )
        ctx = cls(local_id, keys, log, quorum_config, core, now_ms, election_state)
        ctx.collect()
        return ctx

    # --- plumbing -----------------------------------------------------------------------------

    def collect(self) -> Effects:
        """Take the core's effects after a direct call into it (the helpers do this)."""
        effects = self.core.take_effects()
        self.history.append(effects)
        self.last_effects = effects
        if effects.persist is not None:
            self.store = effects.persist
        self.outbox.extend(effects.messages)
        return effects

    def next_correlation_id(self) -> int:
        self._next_correlation += 1
        return self._next_correlation

    def state(self) -> RaftState:
        """The core's state, re-read at each call (unlike ``core.state`` for a type checker)."""
        return self.core.state

    @property
    def local_key(self) -> ReplicaKey:
        return self.core.local_key

    # --- time -----------------------------------------------------------------------------------

    def poll(self) -> Effects:
        self.core.poll(self.now_ms)
        return self.collect()

    def advance(self, ms: int) -> Effects:
        """Move the clock forward and poll once."""
        self.now_ms += ms
        return self.poll()

    def advance_to(self, now_ms: int) -> Effects:
        assert now_ms >= self.now_ms
        self.now_ms = now_ms
        return self.poll()

    # --- durability -----------------------------------------------------------------------------

    def flush(self) -> Effects:
        """What the driver does on ``Effects.flush``: fsync the log, report the flushed offset."""
        flushed = self.log.flush()
        self.core.handle_flushed(self.now_ms, flushed)
        return self.collect()

    # --- inbound ------------------------------------------------------------------------------

    def deliver_request(self, source: int, request: RaftRequest) -> list[RaftResponse]:
        """Deliver ``request`` from ``source``; return the responses the core sent back at once
        (an empty list when it parked a Fetch)."""
        correlation_id = self.next_correlation_id()
        self.core.handle_request(self.now_ms, source, correlation_id, request)
        self.collect()
        return self.take_responses(source, correlation_id)

    def deliver_one(self, source: int, request: RaftRequest) -> RaftResponse:
        responses = self.deliver_request(source, request)
        assert len(responses) == 1, responses
        return responses[0]

    def take_responses(self, destination: int, correlation_id: int | None = None) -> list[
            RaftResponse]:
        found = [
            m for m in self.outbox
            if isinstance(m, OutboundResponse) and m.destination == destination
            and (correlation_id is None or m.correlation_id == correlation_id)
        ]
        for m in found:
            self.outbox.remove(m)
        return [m.message for m in found]

    def deliver_response(self, request: OutboundRequest, response: RaftResponse) -> Effects:
        self.core.handle_response(self.now_ms, request.destination, request.correlation_id,
                                  response)
        return self.collect()

    # --- outbound -----------------------------------------------------------------------------

    def take_requests(
        self, kind: type[RequestT], destination: int | None = None
    ) -> list[OutboundRequest]:
        """Remove and return the requests of ``kind`` (to ``destination``) from the outbox."""
        found = [
            m for m in self.outbox
            if isinstance(m, OutboundRequest) and isinstance(m.message, kind)
            and (destination is None or m.destination == destination)
        ]
        for m in found:
            self.outbox.remove(m)
        return found

    def take_request(self, kind: type[RequestT], destination: int | None = None) -> OutboundRequest:
        found = self.take_requests(kind, destination)
        assert len(found) == 1, f"expected one {kind.__name__} to {destination}, got {found}"
        return found[0]

    def pending_requests(self, kind: type[RequestT] | None = None) -> list[OutboundRequest]:
        return [
            m for m in self.outbox
            if isinstance(m, OutboundRequest) and (kind is None or isinstance(m.message, kind))
        ]

    def clear_outbox(self) -> None:
        self.outbox.clear()

    # --- request builders (as sent by a peer) ------------------------------------------------

    def vote_request(
        self,
        candidate: int,
        epoch: int,
        last_epoch: int,
        last_offset: int,
        *,
        pre_vote: bool = False,
        voter_id: int | None = None,
        voter_directory_id: uuid.UUID | None = None,
        candidate_directory_id: uuid.UUID | None = None,
        cluster_id: str | None = CLUSTER_ID,
    ) -> VoteRequest:
        return VoteRequest(
            cluster_id=cluster_id,
            voter_id=self.local_id if voter_id is None else voter_id,
            voter_directory_id=voter_directory_id,
            replica_epoch=epoch,
            replica_id=candidate,
            replica_directory_id=candidate_directory_id,
            last_offset_epoch=last_epoch,
            last_offset=last_offset,
            pre_vote=pre_vote,
        )

    def fetch_request(
        self,
        replica: int,
        epoch: int,
        fetch_offset: int,
        last_fetch_epoch: int,
        *,
        max_wait_ms: int = 500,
        high_watermark: int | None = None,
        cluster_id: str | None = CLUSTER_ID,
        directory_id: uuid.UUID | None = None,
        read_barrier: int = 0,
    ) -> FetchRequest:
        return FetchRequest(
            cluster_id=cluster_id,
            replica_id=replica,
            replica_directory_id=directory_id,
            max_wait_ms=max_wait_ms,
            current_leader_epoch=epoch,
            fetch_offset=fetch_offset,
            last_fetch_epoch=last_fetch_epoch,
            high_watermark=high_watermark,
            read_barrier=read_barrier,
        )

    def begin_quorum_request(
        self,
        leader: int,
        epoch: int,
        *,
        voter_id: int | None = None,
        voter_directory_id: uuid.UUID | None = None,
        cluster_id: str | None = CLUSTER_ID,
    ) -> BeginQuorumEpochRequest:
        return BeginQuorumEpochRequest(
            cluster_id=cluster_id, leader_id=leader, leader_epoch=epoch,
            voter_id=self.local_id if voter_id is None else voter_id,
            voter_directory_id=voter_directory_id,
        )

    def end_quorum_request(
        self,
        leader: int,
        epoch: int,
        successors: Sequence[int | ReplicaKey] = (),
        *,
        voter_id: int | None = None,
        voter_directory_id: uuid.UUID | None = None,
        cluster_id: str | None = CLUSTER_ID,
    ) -> EndQuorumEpochRequest:
        return EndQuorumEpochRequest(
            cluster_id=cluster_id, leader_id=leader, leader_epoch=epoch,
            voter_id=self.local_id if voter_id is None else voter_id,
            voter_directory_id=voter_directory_id,
            preferred_successors=tuple(
                ReplicaInfo.of(s if isinstance(s, ReplicaKey) else ReplicaKey(s))
                for s in successors
            ),
        )

    # --- response builders (as sent by a peer) -----------------------------------------------

    @staticmethod
    def vote_response(
        granted: bool, epoch: int, leader: int | None = None, error: Errors = Errors.NONE
    ) -> VoteResponse:
        return VoteResponse(error_code=error, leader_id=leader, leader_epoch=epoch,
                            vote_granted=granted)

    @staticmethod
    def fetch_response(
        leader: int | None,
        epoch: int,
        *,
        records_bytes: bytes = b"",
        high_watermark: int | None = None,
        diverging: tuple[int, int] | None = None,
        error: Errors = Errors.NONE,
    ) -> FetchResponse:
        return FetchResponse(
            error_code=error, leader_id=leader, leader_epoch=epoch,
            high_watermark=high_watermark, records=records_bytes,
            diverging_epoch=None if diverging is None
            else EpochEndOffset(epoch=diverging[0], end_offset=diverging[1]),
        )

    @staticmethod
    def begin_quorum_response(
        leader: int | None, epoch: int, error: Errors = Errors.NONE
    ) -> BeginQuorumEpochResponse:
        return BeginQuorumEpochResponse(error_code=error, leader_id=leader, leader_epoch=epoch)

    @staticmethod
    def end_quorum_response(
        leader: int | None, epoch: int, error: Errors = Errors.NONE
    ) -> EndQuorumEpochResponse:
        return EndQuorumEpochResponse(error_code=error, leader_id=leader, leader_epoch=epoch)

    # --- scripted transitions -------------------------------------------------------------

    def expire_election_timer(self) -> Effects:
        """Advance exactly one election timeout (the timers are exactly T, see ZeroRandom)."""
        return self.advance(self.config.election_timeout_ms)

    def grant_pre_votes(self, *voters: int) -> None:
        """Answer the pending pre-votes of ``voters`` with a grant; the other pending pre-vote
        requests are dropped from the outbox (stale once the round is decided)."""
        epoch = self.core.epoch
        pending = {r.destination: r for r in self.take_requests(VoteRequest)}
        for voter in voters:
            request = pending[voter]
            assert isinstance(request.message, VoteRequest) and request.message.pre_vote
            self.deliver_response(request, self.vote_response(True, epoch))

    def grant_votes(self, *voters: int) -> None:
        epoch = self.core.epoch
        for voter in voters:
            request = self.take_request(VoteRequest, voter)
            assert isinstance(request.message, VoteRequest) and not request.message.pre_vote
            self.deliver_response(request, self.vote_response(True, epoch))

    def become_leader(self) -> int:
        """From Unattached/Follower: time out, win the pre-vote and the vote with the first other
        voters (just a majority), flush the LeaderChange. Returns the new epoch; the outbox is
        cleared."""
        if self.state() is RaftState.FOLLOWER:
            self.advance(self.config.fetch_timeout_ms)
        elif self.state() is not RaftState.PROSPECTIVE:
            self.expire_election_timer()
        assert self.state() is RaftState.PROSPECTIVE, self.state()
        others = [k.id for k in self.voter_keys if k.id != self.local_id]
        granting = others[: len(self.voter_keys) // 2]
        self.grant_pre_votes(*granting)
        assert self.state() is RaftState.CANDIDATE, self.state()
        self.grant_votes(*granting)
        assert self.state() is RaftState.LEADER, self.state()
        self.flush()
        self.clear_outbox()
        return self.core.epoch

    def log_layout(self) -> list[tuple[int, int, int]]:
        """(base offset, last offset, epoch) of each batch of the local log."""
        return [(b.base_offset, b.last_offset, b.epoch) for b in self.log.batches]

    def assert_persisted(
        self, epoch: int, leader_id: int | None = None, voted: ReplicaKey | int | None = None
    ) -> None:
        voted_key = ReplicaKey(voted) if isinstance(voted, int) else voted
        expected = ElectionState(epoch, leader_id, voted_key)
        assert self.store == expected, f"store {self.store} != {expected}"
        assert self.core.election_state == expected


