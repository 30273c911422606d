"""Hostile HTTP clients against one node: slow request heads and bodies are cut off, waiting
reads are bounded, oversized and malformed requests are answered with their error code, and
none of it changes the log or stops the node."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from secured_cluster import InProcessCluster, plain_configs

from quorum_node.node.api.client import MAX_APPEND_BODY_BYTES
from quorum_node.node.transport import (
    MAX_HEADER_BYTES,
    REQUEST_TYPES,
    RESPONSE_TYPES,
    decode_frame,
)
from quorum_node.raft.messages import RaftResponse

READ_TIMEOUT_MS = 600


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessCluster]:
    cluster = InProcessCluster(plain_configs(
        tmp_path_factory.mktemp("hostile"), 1, http_read_timeout_ms=READ_TIMEOUT_MS,
        http_max_long_polls=2))
    try:
        deadline = time.monotonic() + 10
        while cluster.leader() is None or not cluster.nodes[1].core.accepts_writes:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        yield cluster
    finally:
        cluster.stop()


def address(cluster: InProcessCluster) -> tuple[str, int]:
    return "127.0.0.1", cluster.nodes[1].config.controller_listener.port


def call(cluster: InProcessCluster, method: str, path: str, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    connection = http.client.HTTPConnection(*address(cluster), timeout=10)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        data = response.read()
        try:
            return response.status, json.loads(data)
        except ValueError:
            return response.status, data.decode(errors="replace")
    finally:
        connection.close()


def log_end(cluster: InProcessCluster) -> int:
    return cluster.nodes[1].log_dir.log.end_offset


def test_a_slow_request_head_is_cut_off(node: InProcessCluster) -> None:
    with socket.create_connection(address(node), timeout=10) as sock:
        sock.sendall(b"PUT /v1/kv/slow HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        started = time.monotonic()
        assert sock.recv(1024) == b""  # closed by the node
        assert time.monotonic() - started < READ_TIMEOUT_MS / 1000 * 2 + 1


def test_a_slow_body_is_answered_408_and_changes_nothing(node: InProcessCluster) -> None:
    before = log_end(node)
    with socket.create_connection(address(node), timeout=10) as sock:
        sock.sendall(b"PUT /v1/kv/slow HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert b'"REQUEST_TIMEOUT"' in reply
    assert log_end(node) == before


def test_waiting_reads_are_bounded(node: InProcessCluster) -> None:
    far = log_end(node) + 1000
    answers: list[int] = []

    def wait() -> None:
        answers.append(call(node, "GET", f"/v1/records?offset={far}&wait_ms=1500")[0])

    waiters = [threading.Thread(target=wait) for _ in range(2)]
    for thread in waiters:
        thread.start()
    time.sleep(0.4)
    status, answer = call(node, "GET", f"/v1/records?offset={far}&wait_ms=1500")
    assert (status, answer["code"]) == (429, "TOO_MANY_LONG_POLLS")
    assert call(node, "GET", f"/v1/records?offset={far}&wait_ms=0")[0] == 200  # no wait: fine
    for thread in waiters:
        thread.join(5)
    assert answers == [200, 200]
    assert call(node, "GET", f"/v1/records?offset={far}&wait_ms=10")[0] == 200  # freed


HUGE = b"x" * (MAX_APPEND_BODY_BYTES + 1)
# Nested past the interpreter's recursion limit (the JSON parser's RecursionError was a 500), and
# just past the APIs' nesting limit.
DEEP = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJECT = b'{"expected": null, "value": ' + b'{"a":' * 100_000 + b"1" + b"}" * 100_001
NESTED_65 = b"[" * 65 + b"]" * 65
DEEP_SMALL = b"[" * 30_000 + b"]" * 30_000  # within the admin API's 64 KiB body limit
MALFORMED = [
    ("POST", "/v1/records", DEEP, "application/json", 400, "BAD_REQUEST"),
    ("POST", "/v1/records", NESTED_65, "application/json", 400, "BAD_REQUEST"),
    ("POST", "/v1/kv/k/cas", DEEP, "application/json", 400, "BAD_REQUEST"),
    ("POST", "/v1/kv/k/cas", DEEP_OBJECT, "application/json", 400, "BAD_REQUEST"),
    ("POST", "/v1/quorum/voters", DEEP_SMALL, "application/json", 400, "BAD_REQUEST"),
    ("POST", "/v1/quorum/voters", b'{"id": ' + DEEP_SMALL + b"}", "application/json", 400,
     "BAD_REQUEST"),
    # (method, path, body, content type, status, code)
    ("POST", "/v1/records", b"[", "application/json", 400, "BAD_REQUEST"),
    ("POST", "/v1/records", b"{}", "application/json", 400, "BAD_REQUEST"),
    ("POST", "/v1/records", b"[1, 2]", "application/json", 400, "BAD_REQUEST"),
    ("POST", "/v1/records", b'[{"base64": "!!"}]', "application/json", 400, "BAD_REQUEST"),
    ("POST", "/v1/records", b"[]", "application/json", 400, "BAD_REQUEST"),
    ("POST", "/v1/records", b"\x00\x00\x00\x09abc", "application/octet-stream", 400,
     "BAD_REQUEST"),
    ("POST", "/v1/records", b"\xff\xff\xff\xff", "application/octet-stream", 413, "TOO_LARGE"),
    ("POST", "/v1/records", HUGE, "application/octet-stream", 413, "TOO_LARGE"),
    ("POST", "/v1/records", b"a", "text/csv", 415, "UNSUPPORTED_MEDIA_TYPE"),
    ("POST", "/v1/records?timeout_ms=-1", b'["a"]', "application/json", 400, "BAD_REQUEST"),
    ("POST", "/v1/records?timeout_ms=99999999999999999999", b'["a"]', "application/json", 400,
     "BAD_REQUEST"),
    ("POST", "/v1/records?bogus=1", b'["a"]', "application/json", 400, "BAD_REQUEST"),
    ("GET", "/v1/records?offset=-1", None, None, 400, "BAD_REQUEST"),
    ("GET", "/v1/records?offset=99999999999999999999999", None, None, 400, "BAD_REQUEST"),
    ("GET", "/v1/records?offset=x", None, None, 400, "BAD_REQUEST"),
    ("GET", "/v1/records?offset=0&max_records=0", None, None, 400, "BAD_REQUEST"),
    ("GET", "/v1/records?offset=0&wait_ms=30001", None, None, 400, "BAD_REQUEST"),
    ("GET", "/v1/records?offset=0&offset=1", None, None, 400, "BAD_REQUEST"),
    ("PUT", "/v1/kv/k", b"\xff\xfe", None, 400, "BAD_REQUEST"),
    ("PUT", "/v1/kv/" + "k" * 1025, b"v", None, 413, "TOO_LARGE"),
    ("PUT", "/v1/kv/k", b"v" * (1024 * 1024 + 1), None, 413, "TOO_LARGE"),
    ("POST", "/v1/kv/k/cas", b"[]", "application/json", 400, "BAD_REQUEST"),
    ("POST", "/v1/kv/k/cas", b'{"expected": 1, "value": "x"}', "application/json", 400,
     "BAD_REQUEST"),
    ("POST", "/v1/kv/k/cas", b'{"value": "x"}', "application/json", 400, "BAD_REQUEST"),
    ("POST", "/v1/kv/k/cas", b'{"expected": null, "value": "x", "more": 1}',
     "application/json", 400, "BAD_REQUEST"),
    ("GET", "/v1/kv/k?stale=maybe", None, None, 400, "BAD_REQUEST"),
    ("POST", "/v1/quorum/voters", b"not json", "application/json", 400, "BAD_REQUEST"),
    ("POST", "/v1/quorum/voters", b'{"id": -1, "directory_id": "AAAAAAAAAAAAAAAAAAAAAQ"}',
     "application/json", 400, "BAD_REQUEST"),
    ("POST", "/v1/quorum/voters", b'{"id": 1, "directory_id": "nope"}', "application/json", 400,
     "BAD_REQUEST"),
    ("POST", "/v1/quorum/voters", b'{"id": true, "directory_id": "AAAAAAAAAAAAAAAAAAAAAQ"}',
     "application/json", 400, "BAD_REQUEST"),
    ("POST", "/v1/quorum/voters", b"x" * 70_000, "application/json", 413, "TOO_LARGE"),
    ("POST", "/v1/quorum/voters", b'{"id": 7, "directory_id": "AAAAAAAAAAAAAAAAAAAAAQ"}',
     "application/json", 400, "INVALID_REQUEST"),  # not a configured voter id
    ("DELETE", "/v1/quorum/voters/1/AAAAAAAAAAAAAAAAAAAAAQ", None, None, 409, "VOTER_NOT_FOUND"),
    ("DELETE", "/v1/quorum/voters/x/AAAAAAAAAAAAAAAAAAAAAQ", None, None, 400, "BAD_REQUEST"),
    ("DELETE", "/v1/quorum/voters/1/AAAAAAAAAAAAAAAAAAAAAQ?timeout_ms=0", None, None, 400,
     "BAD_REQUEST"),
]


@pytest.mark.parametrize("case", MALFORMED, ids=lambda case: f"{case[0]} {case[1][:50]}")
def test_malformed_requests_get_their_error_and_change_nothing(
        node: InProcessCluster, case: tuple[str, str, bytes | None, str | None, int, str]) -> None:
    method, path, body, content_type, status, code = case
    before = (log_end(node), node.nodes[1].core.voters)
    headers = {"Content-Type": content_type} if content_type else {}
    answer_status, answer = call(node, method, path, body, headers)
    assert (answer_status, answer["code"]) == (status, code), answer
    time.sleep(0.05)
    assert (log_end(node), node.nodes[1].core.voters) == before
    assert node.nodes[1].failure is None


@pytest.mark.parametrize("path", ["/v1/records", "/v1/kv/k/cas", "/v1/quorum/voters"])
@pytest.mark.parametrize("body", [DEEP_SMALL, NESTED_65, b'{"a": ' + NESTED_65 + b"}"])
def test_deeply_nested_json_is_refused_for_its_depth(node: InProcessCluster, path: str,
                                                      body: bytes) -> None:
    status, answer = call(node, "POST", path, body, {"Content-Type": "application/json"})
    assert status == 400
    assert "nests deeper than 64 levels" in answer["message"], answer


@pytest.mark.parametrize(
    ("rpc", "header", "error"),
    [
        ("Fetch", {"ClusterId": "another-cluster", "ReplicaId": 2, "MaxWaitMs": 0,
                   "CurrentLeaderEpoch": 1, "FetchOffset": 0, "LastFetchEpoch": 0},
         "INCONSISTENT_CLUSTER_ID"),
        ("Fetch", {"ClusterId": None, "ReplicaId": 2, "MaxWaitMs": 0,
                   "CurrentLeaderEpoch": 0, "FetchOffset": 0, "LastFetchEpoch": 0},
         "FENCED_LEADER_EPOCH"),  # a stale epoch
        ("Fetch", {"ClusterId": None, "ReplicaId": 2, "MaxWaitMs": 0,
                   "CurrentLeaderEpoch": 99, "FetchOffset": 0, "LastFetchEpoch": 0},
         "UNKNOWN_LEADER_EPOCH"),  # a future epoch
        ("Fetch", {"ClusterId": None, "ReplicaId": 2, "MaxWaitMs": 0,
                   "CurrentLeaderEpoch": 1, "FetchOffset": -5, "LastFetchEpoch": 0},
         "INVALID_REQUEST"),
        # Another leader for the epoch this node leads; the one node of this quorum is its only
        # voter, so the named leader is refused first for not being one (as EndQuorumEpoch's).
        ("BeginQuorumEpoch", {"ClusterId": None, "LeaderId": 2, "LeaderEpoch": 1,
                              "VoterId": 1}, "INCONSISTENT_VOTER_SET"),
        ("Vote", {"ClusterId": None, "VoterId": 1,
                  "VoterDirectoryId": "00000000-0000-0000-0000-00000000abcd",
                  "ReplicaEpoch": 1, "ReplicaId": 1, "LastOffsetEpoch": 0, "LastOffset": 0},
         "INVALID_VOTER_KEY"),  # an unknown voter uuid (from a voter: others are refused first)
    ],
)
def test_malformed_peer_requests_get_their_error(
        node: InProcessCluster, rpc: str, header: dict[str, Any], error: str) -> None:
    core = node.nodes[1].core
    epoch = core.epoch
    for key in ("CurrentLeaderEpoch", "LeaderEpoch", "ReplicaEpoch"):
        if key in header and header[key] in (0, 1):
            header = {**header, key: epoch + header[key] - 1}  # relative to the leader's
    body = json.dumps(header).encode()
    before = (log_end(node), core.epoch, core.state)
    status, _ = call(node, "POST", f"/raft/v1/{rpc}",
                     len(body).to_bytes(4, "big") + body)
    assert status == 200
    connection = http.client.HTTPConnection(*address(node), timeout=10)
    connection.request("POST", f"/raft/v1/{rpc}", body=len(body).to_bytes(4, "big") + body)
    answer = connection.getresponse().read()
    connection.close()
    response = decode_frame(RESPONSE_TYPES[REQUEST_TYPES[rpc]], answer)
    assert isinstance(response, RaftResponse)
    assert response.error_code.name == error
    assert (log_end(node), core.epoch, core.state) == before
    assert node.nodes[1].failure is None


@pytest.mark.parametrize("body", [b"", b"\x00\x00", b"\x00\x00\x00\x05{}", b"\x00\x00\x00\x02[]",
                                  b"\xff\xff\xff\xff{}", Path(__file__).read_bytes()[:200]])
def test_garbage_peer_frames_get_400(node: InProcessCluster, body: bytes) -> None:
    before = log_end(node)
    for rpc in ("Vote", "Fetch", "FetchSnapshot", "BeginQuorumEpoch", "EndQuorumEpoch"):
        status, _ = call(node, "POST", f"/raft/v1/{rpc}", body)
        assert status == 400, rpc
    assert log_end(node) == before and node.nodes[1].failure is None


def test_a_peer_post_larger_than_any_request_gets_413(node: InProcessCluster) -> None:
    # A request frame is a header of at most MAX_HEADER_BYTES (requests carry no records).
    largest = 4 + MAX_HEADER_BYTES
    status, _ = call(node, "POST", "/raft/v1/Fetch", b"\xff" * largest)
    assert status == 400  # within the limit: read, and refused as a frame
    status, answer = call(node, "POST", "/raft/v1/Fetch", b"\xff" * (largest + 1))
    assert status == 413, answer
    assert node.nodes[1].failure is None
