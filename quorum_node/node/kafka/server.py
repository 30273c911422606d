"""The controller listener's Kafka protocol: the admin RPCs that Kafka's ``Admin`` client and
``kafka-metadata-quorum --bootstrap-controller`` send to controllers (KIP-919), served over the
admin service the HTTP admin API uses (``quorum_node.node.admin_service``).

APIs and versions (``SUPPORTED``): ApiVersions 0-4, SaslHandshake 0-1, SaslAuthenticate 0-2,
DescribeCluster 1-2 (controller endpoints only, as a controller answers: the voters' controller
listeners, the leader as the controller id), DescribeQuorum 0-2, AddRaftVoter 0-1 and
RemoveRaftVoter 0 (KIP-853), with Kafka's error codes. A request of another API is not
answered: its connection is closed with a log line, as Kafka closes it.

Security, as on the HTTP listeners: the listener's TLS (the same certificates), then per
request the credential of ``Authorizer``: the client certificate's common name, or SASL/PLAIN
whose password is a bearer token of ``auth.token.file`` (the user name is only logged). Every
RPC but ApiVersions and the SASL exchange needs the admin role, as ``/v1/quorum`` does; without
it the answer is CLUSTER_AUTHORIZATION_FAILED. The first authenticated request counts the
connection as its principal's (``max.connections.per.principal``).

Bounds: a frame is at most ``MAX_REQUEST_BYTES`` (an admin request is a few hundred bytes); a
larger one, or one that does not parse whole, closes the connection with a log line (one per
reason every few seconds at most), and so does a failed SASL authentication after its answer.
Requests are answered in order, one at a time; while ``MAX_QUEUED_REQUESTS`` wait the connection
is not read. A connection that sends no request for ``idle_timeout_s``
(``http.read.timeout.ms``) while none is being answered is closed. The listener's connection
bounds count these connections as any other.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime
import logging
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any, Final, cast

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode as KafkaError
from kio.static.primitive import i8, i16, i32, i64, u16

from quorum_node.node.admin_service import QuorumAdmin
from quorum_node.node.config import Listener
from quorum_node.node.errors import ServiceError
from quorum_node.node.kafka.codec import (
    SIZE_BYTES,
    MalformedRequest,
    RequestFrame,
    encode_response,
    frame_size,
    peek_header,
    read_request,
)
from quorum_node.node.listener import SecondProtocol
from quorum_node.node.runtime import QuorumNode
from quorum_node.raft.core import QuorumDescription, ReplicaDescription
from quorum_node.raft.types import Errors, NotLeaderError, ReplicaKey, VoterChangeError
from quorum_node.security.authorization import Authorizer, Identity, Refused, audit_log
from quorum_node.security.roles import Role

logger = logging.getLogger(__name__)

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
DESCRIBE_CLUSTER, DESCRIBE_QUORUM, ADD_RAFT_VOTER, REMOVE_RAFT_VOTER = 60, 55, 80, 81
# api key -> (name, min version, max version)
SUPPORTED: Final[dict[int, tuple[str, int, int]]] = {
    API_VERSIONS: ("ApiVersions", 0, 4),
    SASL_HANDSHAKE: ("SaslHandshake", 0, 1),
    SASL_AUTHENTICATE: ("SaslAuthenticate", 0, 2),
    DESCRIBE_CLUSTER: ("DescribeCluster", 1, 2),
    DESCRIBE_QUORUM: ("DescribeQuorum", 0, 2),
    ADD_RAFT_VOTER: ("AddRaftVoter", 0, 1),
    REMOVE_RAFT_VOTER: ("RemoveRaftVoter", 0, 0),
}
MAX_REQUEST_BYTES: Final = 64 * 1024
MAX_QUEUED_REQUESTS: Final = 8
METADATA_TOPIC: Final = "__cluster_metadata"
CONTROLLER_ENDPOINT_TYPE: Final = 2  # DescribeCluster's EndpointType of controllers (KIP-919)
PLAIN: Final = "PLAIN"
# The voter changes' default wait when a request gives none (Kafka's tools always give one).
DEFAULT_CHANGE_TIMEOUT_MS: Final = 30_000
MAX_CHANGE_TIMEOUT_MS: Final = 600_000
_NO_TIME = datetime.timedelta(0)


class KafkaAdminServer:
    """Makes the handler of each Kafka connection of one controller listener."""

    def __init__(self, admin: QuorumAdmin, authorizer: Authorizer, *, cluster_id: str,
                 listener_name: str, idle_timeout_s: float) -> None:
        self.admin = admin
        self.authorizer = authorizer
        self.cluster_id = cluster_id
        self.listener_name = listener_name
        self.idle_timeout_s = idle_timeout_s

    def connection(self, claim: Callable[[str], bool]) -> KafkaConnection:
        return KafkaConnection(self, claim)


class _Closed(Exception):
    """The connection must be closed; the message says why (one log line)."""


class KafkaConnection(asyncio.Protocol):
    def __init__(self, server: KafkaAdminServer, claim: Callable[[str], bool]) -> None:
        self.server = server
        self._claim = claim
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._queue: collections.deque[bytes] = collections.deque()
        self._worker: asyncio.Task[None] | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._peer = "-"
        self._sasl_mechanism: str | None = None
        self._identity: Identity | None = None
        self._claimed = False
        self._reading = True
        self._failed_authentication = False

    # --- the transport's side ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are no subclasses
        peer = transport.get_extra_info("peername")
        self._peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and peer else "-"
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        try:
            while len(self._buffer) >= SIZE_BYTES:
                size = frame_size(bytes(self._buffer[:SIZE_BYTES]))
                if not 0 < size <= MAX_REQUEST_BYTES:
                    raise _Closed(f"a request of {size} bytes (at most {MAX_REQUEST_BYTES})")
                if len(self._buffer) < SIZE_BYTES + size:
                    break
                self._queue.append(bytes(self._buffer[SIZE_BYTES:SIZE_BYTES + size]))
                del self._buffer[:SIZE_BYTES + size]
        except _Closed as error:
            self._close(str(error))
            return
        if len(self._queue) >= MAX_QUEUED_REQUESTS and self._reading \
                and self._transport is not None:
            self._reading = False
            self._transport.pause_reading()
        if self._queue and self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._serve())

    def eof_received(self) -> bool | None:
        return None  # closes the connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._idle is not None:
            self._idle.cancel()
        if self._worker is not None:
            self._worker.cancel()

    def force_close(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _close(self, reason: str) -> None:
        _CLOSINGS.note(self._peer, reason)
        self.force_close()

    def _arm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self._idle = asyncio.get_running_loop().call_later(
            self.server.idle_timeout_s, self.force_close)

    # --- requests, one at a time ------------------------------------------------------------

    async def _serve(self) -> None:
        try:
            while self._queue and self._transport is not None:
                if self._idle is not None:
                    self._idle.cancel()
                frame = self._queue.popleft()
                if not self._reading and len(self._queue) < MAX_QUEUED_REQUESTS:
                    self._reading = True
                    self._transport.resume_reading()
                answer = await self._answer(frame)
                if self._transport is not None:
                    self._transport.write(answer)
                    self._arm_idle()
                if self._failed_authentication:  # as Kafka: answered, then closed
                    self._close("SASL authentication failed")
                    return
        except _Closed as error:
            self._close(str(error))
        except Exception:  # a fault of this server: this connection ends, the node goes on
            logger.exception("Kafka protocol: closing the connection of %s", self._peer)
            self.force_close()
        finally:
            self._worker = None

    async def _answer(self, frame: bytes) -> bytes:
        api_key, api_version, correlation_id = _peeked(frame)
        supported = SUPPORTED.get(api_key)
        if supported is None:
            raise _Closed(f"api key {api_key} is not served here (ApiVersions lists those that "
                          "are)")
        name, low, high = supported
        if not low <= api_version <= high:
            if api_key == API_VERSIONS:
                # Kafka's answer to a newer client: v0, listing what is served.
                return encode_response(correlation_id,
                                       self._api_versions(0, KafkaError.unsupported_version))
            raise _Closed(f"{name} version {api_version} (versions {low}-{high} are served)")
        try:
            request = read_request(frame)
        except MalformedRequest as error:
            raise _Closed(f"malformed request: {error}") from None
        response = await self._dispatch(request)
        return encode_response(correlation_id, response)

    async def _dispatch(self, request: RequestFrame) -> Any:
        api_key, version, body = request.api_key, request.api_version, request.body
        if api_key == API_VERSIONS:
            return self._api_versions(version, KafkaError.none)
        if api_key == SASL_HANDSHAKE:
            return self._sasl_handshake(version, body)
        if api_key == SASL_AUTHENTICATE:
            return self._sasl_authenticate(version, body)
        refusal = self._authorize(request)
        if refusal is not None:
            return _error_response(api_key, version, KafkaError.cluster_authorization_failed,
                                   refusal)
        if api_key == DESCRIBE_CLUSTER:
            return self._describe_cluster(version, body)
        if api_key == DESCRIBE_QUORUM:
            return self._describe_quorum(version)
        return await self._change_voters(request)

    # --- ApiVersions and SASL ---------------------------------------------------------------

    def _api_versions(self, version: int, error: KafkaError) -> Any:
        schema = load_response_schema(API_VERSIONS, version)
        entry = _nested(schema, "ApiVersion")
        keys = tuple(entry(api_key=i16(key), min_version=i16(low), max_version=i16(high))
                     for key, (_, low, high) in sorted(SUPPORTED.items()))
        return _build(schema, error_code=error, api_keys=keys, throttle_time=_NO_TIME)

    def _sasl_handshake(self, version: int, body: Any) -> Any:
        schema = load_response_schema(SASL_HANDSHAKE, version)
        if self._sasl_mechanism is not None or self._identity is not None:
            return _build(schema, error_code=KafkaError.illegal_sasl_state, mechanisms=(PLAIN,))
        if body.mechanism != PLAIN:
            return _build(schema, error_code=KafkaError.unsupported_sasl_mechanism,
                          mechanisms=(PLAIN,))
        if version == 0:  # v0 is followed by raw SASL tokens, which this server does not read
            raise _Closed("SaslHandshake v0 (raw SASL tokens): use SaslAuthenticate (v1)")
        self._sasl_mechanism = PLAIN
        return _build(schema, error_code=KafkaError.none, mechanisms=(PLAIN,))

    def _sasl_authenticate(self, version: int, body: Any) -> Any:
        schema = load_response_schema(SASL_AUTHENTICATE, version)

        def answer(error: KafkaError, message: str | None) -> Any:
            return _build(schema, error_code=error, error_message=message, auth_bytes=b"",
                          session_lifetime=_NO_TIME)

        if self._sasl_mechanism != PLAIN or self._identity is not None:
            return answer(KafkaError.illegal_sasl_state, "SaslHandshake (PLAIN) comes first")
        # RFC 4616: [authzid] NUL authcid NUL passwd
        parts = bytes(body.auth_bytes).split(b"\0")
        if len(parts) != 3:
            raise _Closed("SASL/PLAIN: malformed message")
        user = parts[1].decode(errors="replace")
        try:
            identity = self.server.authorizer.identify(
                f"Bearer {parts[2].decode(errors='replace')}", None)
        except Refused as refusal:
            audit_log.warning("denied Kafka SaslAuthenticate (user %r) from %s: %s", user,
                              self._peer, refusal)
            # Kafka closes the connection after this answer; the client reports it.
            self._failed_authentication = True
            return answer(KafkaError.sasl_authentication_failed,
                          "Authentication failed: invalid credentials")
        assert identity is not None  # a credential was sent
        self._identity = identity
        if not self._claim_for(identity):
            raise _Closed(f"{identity.principal} holds its connections' bound")
        return answer(KafkaError.none, None)

    def _claim_for(self, identity: Identity | None) -> bool:
        if identity is None or self._claimed:
            return True
        self._claimed = True
        return self._claim(identity.principal)

    def _authorize(self, request: RequestFrame) -> str | None:
        """Why ``request`` is refused (None: it is not)."""
        authorizer = self.server.authorizer
        if not authorizer.enabled:
            return None
        name = SUPPORTED[request.api_key][0]
        try:
            if self._identity is None:
                peercert = (self._transport.get_extra_info("peercert")
                            if self._transport is not None else None)
                identity = authorizer.check(Role.ADMIN, None, peercert)
                if not self._claim_for(identity):
                    raise _Closed(f"{identity.principal} holds its connections' bound")
            elif Role.ADMIN not in self._identity.roles:
                raise Refused(403, "FORBIDDEN", f"{self._identity.principal} may not do this: "
                                                "it needs the admin role")
        except Refused as refusal:
            audit_log.warning("denied Kafka %s from %s: %s", name, self._peer, refusal)
            if refusal.status == 401 and self._identity is None:
                return ("authentication required: over Kafka's protocol, a client certificate "
                        "(SSL), or SASL/PLAIN with a bearer token as the password")
            return str(refusal)
        return None

    # --- the admin RPCs ---------------------------------------------------------------------

    def _describe_cluster(self, version: int, body: Any) -> Any:
        schema = load_response_schema(DESCRIBE_CLUSTER, version)
        if int(body.endpoint_type) != CONTROLLER_ENDPOINT_TYPE:
            return _build(schema, throttle_time=_NO_TIME,
                          error_code=KafkaError.unsupported_endpoint_type,
                          error_message="this is a controller listener: it describes "
                                        "controllers only (--bootstrap-controller)",
                          endpoint_type=body.endpoint_type, cluster_id=self.server.cluster_id,
                          controller_id=i32(-1), brokers=())
        broker = _nested(schema, "DescribeClusterBroker")
        admin = self.server.admin
        status = admin.status()
        voter_ids = sorted({key.id for key in status.voters})
        brokers = []
        for voter_id in voter_ids:
            endpoint = admin.controller_endpoint(voter_id)
            if endpoint is not None:
                brokers.append(_build(broker, broker_id=i32(voter_id), host=endpoint[0],
                                      port=i32(endpoint[1]), rack=None, is_fenced=False))
        leader = status.leader_id
        return _build(schema, throttle_time=_NO_TIME, error_code=KafkaError.none,
                      error_message=None, endpoint_type=body.endpoint_type,
                      cluster_id=self.server.cluster_id,
                      controller_id=i32(-1 if leader is None else leader),
                      brokers=tuple(brokers))

    def _describe_quorum(self, version: int) -> Any:
        schema = load_response_schema(DESCRIBE_QUORUM, version)
        try:
            description = self.server.admin.describe()
        except NotLeaderError as error:
            return self._quorum_error(schema, KafkaError.not_leader_or_follower,
                                      f"node {self.server.admin.node.config.node_id} is not the "
                                      f"leader (leader: {error.leader_id})")
        except ServiceError as error:
            return self._quorum_error(schema, KafkaError.broker_not_available, error.message)
        return self._quorum_answer(schema, description)

    def _quorum_error(self, schema: Any, error: KafkaError, message: str) -> Any:
        # The error in the partition too: the Admin client reads it there.
        partition = _build(_nested(schema, "PartitionData"), partition_index=i32(0),
                           error_code=error, error_message=message, leader_id=i32(-1),
                           leader_epoch=i32(-1), high_watermark=i64(-1), current_voters=(),
                           observers=())
        topic = _build(_nested(schema, "TopicData"), topic_name=METADATA_TOPIC,
                       partitions=(partition,))
        return _build(schema, error_code=KafkaError.none, error_message=None, topics=(topic,),
                      nodes=())

    def _quorum_answer(self, schema: Any, description: QuorumDescription) -> Any:
        state = _nested(schema, "ReplicaState")

        def replica(row: ReplicaDescription) -> Any:
            end = row.log_end_offset
            return _build(state, replica_id=i32(row.key.id),
                          replica_directory_id=row.key.directory_id,
                          log_end_offset=i64(-1 if end is None else end),
                          last_fetch_timestamp=i64(_known(row.last_fetch_ms)),
                          last_caught_up_timestamp=i64(_known(row.last_caught_up_ms)))

        partition = _build(
            _nested(schema, "PartitionData"), partition_index=i32(0),
            error_code=KafkaError.none, error_message=None,
            leader_id=i32(description.leader_id), leader_epoch=i32(description.epoch),
            high_watermark=i64(_known(description.high_watermark)),
            current_voters=tuple(map(replica, sorted(description.voters, key=_by_id))),
            observers=tuple(map(replica, sorted(description.observers, key=_by_id))))
        topic = _build(_nested(schema, "TopicData"), topic_name=METADATA_TOPIC,
                       partitions=(partition,))
        nodes = []
        if "Node" in vars(sys.modules[schema.__module__]):
            node, listener = _nested(schema, "Node"), _nested(schema, "Listener")
            ids = sorted({row.key.id for row in (*description.voters, *description.observers)})
            for replica_id in ids:
                endpoint = self.server.admin.controller_endpoint(replica_id)
                if endpoint is not None:
                    nodes.append(node(node_id=i32(replica_id), listeners=(listener(
                        name=self.server.listener_name, host=endpoint[0],
                        port=u16(endpoint[1])),)))
        return _build(schema, error_code=KafkaError.none, error_message=None, topics=(topic,),
                      nodes=tuple(nodes))

    async def _change_voters(self, request: RequestFrame) -> Any:
        api_key, version, body = request.api_key, request.api_version, request.body
        schema = load_response_schema(api_key, version)

        def answer(error: KafkaError, message: str | None) -> Any:
            return _build(schema, throttle_time=_NO_TIME, error_code=error,
                          error_message=message)

        if body.cluster_id is not None and body.cluster_id != self.server.cluster_id:
            return answer(KafkaError.inconsistent_cluster_id,
                          f"this is cluster {self.server.cluster_id}, not {body.cluster_id}")
        directory_id: uuid.UUID | None = body.voter_directory_id
        if directory_id is None or directory_id.int == 0:
            return answer(KafkaError.invalid_request, "a voter's directory id is required")
        key = ReplicaKey(int(body.voter_id), directory_id)
        timeout = getattr(body, "timeout", None)
        timeout_ms = (DEFAULT_CHANGE_TIMEOUT_MS if timeout is None else
                      max(1, min(int(timeout.total_seconds() * 1000), MAX_CHANGE_TIMEOUT_MS)))
        adding = api_key == ADD_RAFT_VOTER
        if adding:
            problem = self._endpoint_problem(key.id, body.listeners)
            if problem is not None:
                return answer(KafkaError.invalid_request, problem)
        what = f"{'AddRaftVoter' if adding else 'RemoveRaftVoter'} {key.id}"
        audit_log.info("Kafka %s (directory %s) from %s (%s)", what, directory_id, self._peer,
                       self._identity.principal if self._identity else "no credential")
        try:
            if adding:
                await self.server.admin.add_voter(key, timeout_ms)
            else:
                await self.server.admin.remove_voter(key, timeout_ms)
        except NotLeaderError as error:
            return answer(KafkaError.not_leader_or_follower,
                          f"not the leader (leader: {error.leader_id})")
        except ServiceError as error:
            return answer(KafkaError.broker_not_available, error.message)
        except VoterChangeError as error:
            return answer(_KAFKA_ERRORS.get(error.error, KafkaError.unknown_server_error),
                          error.message)
        return answer(KafkaError.none, None)

    def _endpoint_problem(self, voter_id: int, listeners: Any) -> str | None:
        """Why AddRaftVoter's endpoints do not name the controller listener the voter has in
        controller.quorum.voters, which is where its peers reach it (None: they do)."""
        configured = self.server.admin.controller_endpoint(voter_id)
        if configured is None:
            return None  # not a configured voter: the core refuses it with its reason
        name = self.server.listener_name
        named = [each for each in listeners if each.name == name]
        if not named:
            given = ", ".join(each.name for each in listeners) or "none"
            return f"no endpoint of listener {name} (given: {given})"
        host, port = configured
        endpoint = named[0]
        wildcard = endpoint.host in ("", "localhost", "0.0.0.0", "::")
        if int(endpoint.port) != port or not (wildcard or endpoint.host == host):
            return (f"endpoint {name}://{endpoint.host}:{endpoint.port} differs from voter "
                    f"{voter_id}'s in controller.quorum.voters ({host}:{port})")
        return None


class _ClosingLog:
    """One log line per reason every ``_LOG_REPEAT_S`` at most (a client sending the same bad
    request again and again is counted, not logged each time)."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int]] = {}

    def note(self, peer: str, reason: str) -> None:
        now = time.monotonic()
        last, left_out = self._last.get(reason, (-_LOG_REPEAT_S, 0))
        if now - last < _LOG_REPEAT_S:
            self._last[reason] = (last, left_out + 1)
            return
        if len(self._last) > _MAX_LOGGED_REASONS:
            self._last.clear()  # bounded, whatever the reasons
        self._last[reason] = (now, 0)
        more = f" ({left_out} more since the last line)" if left_out else ""
        logger.warning("Kafka protocol: closing the connection of %s: %s%s", peer, reason, more)


_LOG_REPEAT_S: Final = 10.0
_MAX_LOGGED_REASONS: Final = 1000
_CLOSINGS: Final = _ClosingLog()


# Kafka's errors by the core's (the same codes).
_KAFKA_ERRORS: Final = {error: KafkaError(int(error)) for error in Errors
                        if int(error) in {int(code) for code in KafkaError}}


def _peeked(frame: bytes) -> tuple[int, int, int]:
    try:
        return peek_header(frame)
    except MalformedRequest as error:
        raise _Closed(f"malformed request: {error}") from None


def _error_response(api_key: int, version: int, error: KafkaError, message: str) -> Any:
    """An answer of ``error`` to a request of one of the admin RPCs."""
    schema = load_response_schema(api_key, version)
    if api_key == DESCRIBE_QUORUM:
        return _build(schema, error_code=error, error_message=message, topics=(), nodes=())
    return _build(schema, throttle_time=_NO_TIME, error_code=error, error_message=message,
                  endpoint_type=i8(CONTROLLER_ENDPOINT_TYPE), cluster_id="",
                  controller_id=i32(-1), brokers=())


def _build(schema: Any, **values: Any) -> Any:
    """``schema`` (a kio entity of one version) of the ``values`` its version has."""
    names = {field.name for field in dataclasses.fields(schema)}
    return schema(**{name: value for name, value in values.items() if name in names})


def _nested(schema: Any, name: str) -> Any:
    """An entity of ``schema``'s version (its module holds each nested one)."""
    return getattr(sys.modules[schema.__module__], name)


def _known(value: int | None) -> int:
    return -1 if value is None else value


def _by_id(row: ReplicaDescription) -> int:
    return row.key.id


def kafka_protocol_of(node: QuorumNode) -> Callable[[Listener], SecondProtocol]:
    """The Kafka protocol's connections of each controller listener of ``node``."""
    admin = QuorumAdmin(node)

    def of_listener(listener: Listener) -> SecondProtocol:
        server = KafkaAdminServer(admin, node.security.peer_authorizer(listener),
                                  cluster_id=node.config.cluster_id,
                                  listener_name=listener.name,
                                  idle_timeout_s=node.config.http_read_timeout_ms / 1000)
        return server.connection

    return of_listener
