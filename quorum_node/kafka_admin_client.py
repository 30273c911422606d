"""``quorum-admin --bootstrap-controller``: the quorum's admin RPCs over Kafka's protocol, to the
controller listeners, as Kafka's ``Admin`` client sends them (KIP-919): DescribeCluster for the
controllers and the active one (the leader), then DescribeQuorum, AddRaftVoter or
RemoveRaftVoter to it. Blocking sockets, one connection at a time, on the codec of
``quorum_node.node.kafka.codec`` (kio's message types).

Credentials as everywhere: TLS with the CA (and the client certificate) given, and a bearer
token as SASL/PLAIN's password. While no leader is known, or a node answers that it is not the
leader, the servers are asked again until the timeout."""

from __future__ import annotations

import datetime
import socket
import ssl
import time
import uuid
from collections.abc import Sequence
from typing import Any, Final

from kio.schema.add_raft_voter.v1 import request as add_voter_request
from kio.schema.add_raft_voter.v1 import response as add_voter_response
from kio.schema.describe_cluster.v1 import request as cluster_request
from kio.schema.describe_cluster.v1 import response as cluster_response
from kio.schema.describe_quorum.v2 import request as quorum_request
from kio.schema.describe_quorum.v2 import response as quorum_response
from kio.schema.errors import ErrorCode as KafkaError
from kio.schema.remove_raft_voter.v0 import request as remove_voter_request
from kio.schema.remove_raft_voter.v0 import response as remove_voter_response
from kio.schema.sasl_authenticate.v2 import request as sasl_authenticate_request
from kio.schema.sasl_authenticate.v2 import response as sasl_authenticate_response
from kio.schema.sasl_handshake.v1 import request as sasl_handshake_request
from kio.schema.sasl_handshake.v1 import response as sasl_handshake_response
from kio.schema.types import TopicName
from kio.static.primitive import i8, i32, i32Timedelta, u16

from quorum_node.addresses import host_port
from quorum_node.node.kafka.codec import (
    SIZE_BYTES,
    encode_request,
    frame_size,
    read_response,
)
from quorum_node.security.client_credentials import ClientCredentials
from quorum_node.storage.kafka_uuid import parse_uuid, to_kafka_string

CLIENT_ID: Final = "quorum-admin"
METADATA_TOPIC: Final = "__cluster_metadata"
CONTROLLER_ENDPOINT_TYPE: Final = 2
MAX_RESPONSE_BYTES: Final = 16 * 1024 * 1024
RETRY_BACKOFF_S: Final = 0.1
_RETRIABLE: Final = frozenset({KafkaError.not_leader_or_follower, KafkaError.not_controller,
                               KafkaError.broker_not_available})


class KafkaAdminError(Exception):
    """The request failed; one line. ``code``: Kafka's error name (or ERROR, UNAVAILABLE)."""

    def __init__(self, message: str, code: str = "ERROR") -> None:
        super().__init__(message)
        self.code = code


class _Retry(KafkaAdminError):
    """No leader known, or the node asked is not it: worth asking again."""


class KafkaQuorumAdmin:
    def __init__(self, servers: Sequence[tuple[str, int]], timeout_s: float,
                 credentials: ClientCredentials) -> None:
        self.servers = list(servers)
        self.timeout_s = timeout_s
        self.credentials = credentials
        self._deadline = 0.0
        self._correlation = 0
        self._context: ssl.SSLContext | None = None

    # --- the operations ---------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """DescribeQuorum, in the shape of the HTTP admin API's answer (``GET /v1/quorum``);
        each replica's endpoint is Kafka's ``LISTENER://host:port``."""
        def describe(cluster: Any, leader: tuple[str, int]) -> dict[str, Any]:
            return self._describe_at(cluster, leader)[0]

        quorum: dict[str, Any] = self._with_leader(describe)
        return quorum

    def add_voter(self, voter_id: int, directory_id: str) -> None:
        """AddRaftVoter, with the voter's controller endpoint as the leader reports it."""
        key = parse_uuid(directory_id)

        def add(cluster: Any, leader: tuple[str, int]) -> None:
            _, endpoints = self._describe_at(cluster, leader)
            listeners = tuple(
                add_voter_request.Listener(name=name, host=host, port=u16(port))
                for name, host, port in endpoints.get(voter_id, ()))
            remaining_ms = max(1, int((self._deadline - time.monotonic()) * 1000))
            self._change(leader, add_voter_request.AddRaftVoterRequest(
                cluster_id=cluster.cluster_id,
                timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=remaining_ms)),
                voter_id=i32(voter_id), voter_directory_id=key, listeners=listeners),
                add_voter_response.AddRaftVoterResponse)

        self._with_leader(add)

    def remove_voter(self, voter_id: int, directory_id: str) -> None:
        key = parse_uuid(directory_id)

        def remove(cluster: Any, leader: tuple[str, int]) -> None:
            self._change(leader, remove_voter_request.RemoveRaftVoterRequest(
                cluster_id=cluster.cluster_id, voter_id=i32(voter_id),
                voter_directory_id=key), remove_voter_response.RemoveRaftVoterResponse)

        self._with_leader(remove)

    # --- finding the leader -----------------------------------------------------------------

    def _with_leader(self, action: Any) -> Any:
        self._deadline = time.monotonic() + self.timeout_s
        while True:
            problems: list[str] = []
            retry = False
            for server in self.servers:
                try:
                    cluster = self._describe_cluster(server)
                    leader = _leader_endpoint(cluster)
                    return action(cluster, leader)
                except _Retry as error:
                    retry = True
                    problems.append(str(error))
                except KafkaAdminError as error:
                    if error.code not in ("UNAVAILABLE",):
                        raise
                    problems.append(str(error))
            if not retry or time.monotonic() + RETRY_BACKOFF_S >= self._deadline:
                raise KafkaAdminError("; ".join(problems), "UNAVAILABLE")
            time.sleep(RETRY_BACKOFF_S)

    def _describe_cluster(self, server: tuple[str, int]) -> Any:
        answer = self._call(server, cluster_request.DescribeClusterRequest(
            include_cluster_authorized_operations=False,
            endpoint_type=i8(CONTROLLER_ENDPOINT_TYPE)),
            cluster_response.DescribeClusterResponse)
        _check(server, answer.error_code, answer.error_message)
        return answer

    def _describe_at(self, cluster: Any, leader: tuple[str, int]
                     ) -> tuple[dict[str, Any], dict[int, list[tuple[str, str, int]]]]:
        """The quorum (as ``describe``), and each node's controller endpoints."""
        answer = self._call(leader, quorum_request.DescribeQuorumRequest(topics=(
            quorum_request.TopicData(topic_name=TopicName(METADATA_TOPIC), partitions=(
                quorum_request.PartitionData(partition_index=i32(0)),)),)),
            quorum_response.DescribeQuorumResponse)
        _check(leader, answer.error_code, answer.error_message)
        partition = answer.topics[0].partitions[0]
        _check(leader, partition.error_code, partition.error_message)
        return _quorum_json(cluster.cluster_id, partition, answer.nodes)

    def _change(self, leader: tuple[str, int], request: Any, schema: Any) -> None:
        answer = self._call(leader, request, schema)
        _check(leader, answer.error_code, answer.error_message)

    # --- the wire ---------------------------------------------------------------------------

    def _call(self, server: tuple[str, int], request: Any, schema: Any) -> Any:
        where = host_port(*server)
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise KafkaAdminError(f"{where}: timed out", "UNAVAILABLE")
        try:
            with self._connect(server, remaining) as sock:
                self._authenticate(sock, where)
                return self._exchange(sock, request, schema, where)
        except TimeoutError:
            raise KafkaAdminError(f"{where}: no answer in time", "UNAVAILABLE") from None
        except ssl.SSLError as error:
            raise KafkaAdminError(f"{where}: TLS: {error}", "TLS_ERROR") from None
        except OSError as error:
            raise KafkaAdminError(f"{where}: {error.strerror or error}", "UNAVAILABLE"
                                  ) from None

    def _connect(self, server: tuple[str, int], timeout_s: float) -> socket.socket:
        sock = socket.create_connection(server, timeout=timeout_s)
        if not self.credentials.uses_tls:
            return sock
        if self._context is None:
            self._context = self.credentials.ssl_context()
        return self._context.wrap_socket(sock, server_hostname=server[0])

    def _authenticate(self, sock: socket.socket, where: str) -> None:
        token = self.credentials.token
        if token is None:
            return
        handshake = self._exchange(sock, sasl_handshake_request.SaslHandshakeRequest(
            mechanism="PLAIN"), sasl_handshake_response.SaslHandshakeResponse, where)
        _check_auth(where, handshake.error_code, "SASL/PLAIN refused")
        answer = self._exchange(sock, sasl_authenticate_request.SaslAuthenticateRequest(
            auth_bytes=b"\0" + CLIENT_ID.encode() + b"\0" + token.encode()),
            sasl_authenticate_response.SaslAuthenticateResponse, where)
        _check_auth(where, answer.error_code, answer.error_message or "")

    def _exchange(self, sock: socket.socket, request: Any, schema: Any, where: str) -> Any:
        self._correlation += 1
        sock.sendall(encode_request(self._correlation, CLIENT_ID, request))
        size = frame_size(_receive(sock, SIZE_BYTES, where))
        if not 0 < size <= MAX_RESPONSE_BYTES:
            raise KafkaAdminError(f"{where}: an answer of {size} bytes")
        correlation, answer = read_response(schema, _receive(sock, size, where))
        if correlation != self._correlation:
            raise KafkaAdminError(f"{where}: the answer of another request")
        return answer


def _receive(sock: socket.socket, size: int, where: str) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise KafkaAdminError(f"{where}: connection closed by the server (is it a "
                                  "controller listener?)", "UNAVAILABLE")
        chunks += chunk
    return bytes(chunks)


def _check(server: tuple[str, int], error: KafkaError, message: str | None) -> None:
    if error == KafkaError.none:
        return
    name = error.name.upper()
    text = f"{host_port(*server)}: {name}" + (f": {message}" if message else "")
    if error in _RETRIABLE:
        raise _Retry(text, name)
    raise KafkaAdminError(text, name)


def _check_auth(where: str, error: KafkaError, message: str) -> None:
    if error != KafkaError.none:
        raise KafkaAdminError(f"{where}: {error.name.upper()}: {message}", error.name.upper())


def _leader_endpoint(cluster: Any) -> tuple[str, int]:
    for broker in cluster.brokers:
        if broker.broker_id == cluster.controller_id:
            return broker.host, int(broker.port)
    raise _Retry(f"no leader known (controller id {cluster.controller_id})", "NO_LEADER")


def _quorum_json(cluster_id: str, partition: Any, nodes: Any
                 ) -> tuple[dict[str, Any], dict[int, list[tuple[str, str, int]]]]:
    listeners = {int(node.node_id): [(each.name, each.host, int(each.port))
                                     for each in node.listeners] for node in nodes}
    voters = {int(state.replica_id) for state in partition.current_voters}
    leader_end = next((state.log_end_offset for state in partition.current_voters
                       if state.replica_id == partition.leader_id), None)

    def replica(state: Any) -> dict[str, Any]:
        directory: uuid.UUID | None = state.replica_directory_id
        endpoints = listeners.get(int(state.replica_id), [])
        end = int(state.log_end_offset)
        return {
            "id": int(state.replica_id),
            "directory_id": None if directory is None or directory.int == 0
            else to_kafka_string(directory),
            "log_end_offset": end,
            "lag": -1 if end < 0 or leader_end is None else int(leader_end) - end,
            "last_fetch_timestamp": int(state.last_fetch_timestamp),
            "last_caught_up_timestamp": int(state.last_caught_up_timestamp),
            "endpoint": (f"{endpoints[0][0]}://{host_port(endpoints[0][1], endpoints[0][2])}"
                         if endpoints else None),
        }

    observers = []
    for state in partition.observers:
        row = replica(state)
        # AddRaftVoter takes a replica with a directory id whose id has a controller endpoint.
        row["could_be_voter"] = row["directory_id"] is not None \
            and int(state.replica_id) in listeners and int(state.replica_id) not in voters
        observers.append(row)
    return {"cluster_id": cluster_id, "leader_id": int(partition.leader_id),
            "leader_epoch": int(partition.leader_epoch),
            "high_watermark": int(partition.high_watermark),
            "voters": [replica(state) for state in partition.current_voters],
            "observers": observers}, listeners
