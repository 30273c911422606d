"""The client API, the Python client and the ``quorum-client`` CLI against real in-process nodes.

The nodes of a cluster run on one event loop in a background thread (as they would in their own
processes), so that the tests can use blocking HTTP, the synchronous client and the CLI. One
1-node and one 3-node cluster serve the whole module to keep it fast; tests use their own keys.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import http.server
import io
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from quorum_node.cli.client import main as client_main
from quorum_node.client import PROTOCOLS, QuorumClient, QuorumClientError, WatchResult
from quorum_node.kv.ops import MAX_KEY_BYTES, MAX_VALUE_BYTES
from quorum_node.node.app import build_app
from quorum_node.node.config import NodeConfig
from quorum_node.node.kv_service import (
    MAX_APPEND_BYTES,
    MAX_READ_RECORDS,
    MAX_RECORD_BYTES,
    MAX_WAIT_MS,
)
from quorum_node.node.runtime import QuorumNode
from quorum_node.node.wiring import build_node
from quorum_node.raft.config import QuorumConfig, VoterEndpoint
from quorum_node.raft.state import RaftState
from quorum_node.storage.meta_properties import format_log_dir, random_cluster_id

_T = TypeVar("_T")

FAST = QuorumConfig(election_timeout_ms=300, fetch_timeout_ms=600, request_timeout_ms=500,
                    fetch_max_wait_ms=100, append_linger_ms=2)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Member:
    node: QuorumNode

    @property
    def url(self) -> str:
        return self.node.config.client_url

    @property
    def address(self) -> str:
        return self.node.config.client_listeners[0].address


class Cluster:
    """Nodes with the client API, on an event loop of their own in a background thread."""

    def __init__(self, directory: Path, size: int,
                 configs: list[NodeConfig] | None = None) -> None:
        """A new cluster of ``size`` nodes in ``directory``, or a restart of ``configs``."""
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        if configs is None:
            cluster_id = random_cluster_id()
            # Each node serves clients and its peers on listeners of their own: a non-leader
            # redirects clients to the leader's client listener.
            ports = {i: free_port() for i in range(1, size + 1)}
            peer_ports = {i: free_port() for i in range(1, size + 1)}
            voters = tuple(VoterEndpoint(id=i, host="127.0.0.1", port=port)
                           for i, port in peer_ports.items())
            clients = tuple(VoterEndpoint(id=i, host="127.0.0.1", port=port)
                            for i, port in ports.items())
            configs = [
                NodeConfig(node_id=i, cluster_id=cluster_id, log_dir=directory / f"node-{i}",
                           listeners=f"CLIENT://127.0.0.1:{port},"
                                     f"CONTROLLER://127.0.0.1:{peer_ports[i]}",
                           listener_security_protocol_map="CLIENT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                           controller_listener_names="CONTROLLER", voters=voters,
                           client_endpoints=clients, quorum=FAST)
                for i, port in ports.items()
            ]
            for config in configs:
                format_log_dir(config.log_dir, cluster_id, config.node_id)
        self.configs = configs
        self.members: dict[int, Member] = {}
        self.run(self._start())

    async def _start(self) -> None:
        for config in self.configs:
            node = build_node(config)
            await node.start(build_app(node))
            self.members[config.node_id] = Member(node)

    def run(self, coroutine: Coroutine[Any, Any, _T], timeout_s: float = 15) -> _T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def shut_down(self, *members: Member) -> None:
        async def shutdown() -> None:
            await asyncio.gather(*(_shutdown(m.node) for m in members))

        self.run(shutdown())

    def stop(self) -> None:
        try:
            self.shut_down(*self.members.values())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()

    def leader(self, timeout_s: float = 10) -> Member:
        """The leader, once its high watermark is known (it can serve linearizable reads)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for member in self.members.values():
                core = member.node.core
                if core.state is RaftState.LEADER and core.high_watermark is not None \
                        and core.epoch_start_offset is not None \
                        and core.high_watermark > core.epoch_start_offset:
                    return member
            time.sleep(0.02)
        raise AssertionError("no leader elected")

    def follower(self) -> Member:
        leader = self.leader()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for member in self.members.values():
                core = member.node.core
                leader_id = leader.node.config.node_id
                if core.state is RaftState.FOLLOWER and core.leader_id == leader_id:
                    return member
            time.sleep(0.02)
        raise AssertionError("no follower knows the leader")

    @property
    def bootstrap(self) -> str:
        return ",".join(member.address for member in self.members.values())


async def _shutdown(node: QuorumNode) -> None:
    await asyncio.wait_for(node.shutdown(timeout_s=1), 10)


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("single"), 1)
    try:
        cluster.leader()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("trio"), 3)
    try:
        cluster.follower()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=PROTOCOLS)
def protocol(request: pytest.FixtureRequest) -> str:
    """Each client test runs over both of the client's protocols."""
    return str(request.param)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: Any

    @property
    def code(self) -> str | None:
        return self.body.get("code") if isinstance(self.body, dict) else None


def call(url: str, method: str, path: str, body: bytes | str | Any = None, *,
         content_type: str | None = "application/json", timeout_s: float = 10) -> Reply:
    """One HTTP request (no redirect followed); a JSON body unless bytes or str is given."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout_s)
    if body is not None and not isinstance(body, bytes | str):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode("utf-8")  # http.client would send Latin-1
    headers = {} if content_type is None else {"Content-Type": content_type}
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        data = response.read()
    finally:
        connection.close()
    try:
        document = json.loads(data)
    except ValueError:
        document = data
    return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, document)


def kv(key: str) -> str:
    return "/v1/kv/" + urllib.parse.quote(key, safe="")


def high_watermark(member: Member) -> int:
    return member.node.core.high_watermark or 0


# --- key-value store ---------------------------------------------------------------------------

def test_put_then_linearizable_get_on_a_single_node(single: Cluster) -> None:
    leader = single.leader()
    put = call(leader.url, "PUT", kv("colour"), "blue", content_type="text/plain")
    assert put.status == 200, put.body
    assert put.body["key"] == "colour" and put.body["applied"] is True
    assert put.body["offset"] >= 0 and put.body["epoch"] >= 1
    got = call(leader.url, "GET", kv("colour"))
    assert got.status == 200, got.body
    assert got.body["value"] == "blue"
    assert got.body["applied_offset"] >= put.body["offset"]


def test_missing_key_is_404(single: Cluster) -> None:
    got = call(single.leader().url, "GET", kv("never-written"))
    assert got.status == 404
    assert got.code == "KEY_NOT_FOUND"
    assert set(got.body) == {"code", "message"}
    assert "'never-written' not found" in got.body["message"]


def test_delete(single: Cluster) -> None:
    url = single.leader().url
    assert call(url, "PUT", kv("doomed"), "x").status == 200
    deleted = call(url, "DELETE", kv("doomed"))
    assert deleted.status == 200, deleted.body
    assert deleted.body["deleted"] is True
    assert call(url, "GET", kv("doomed")).status == 404
    again = call(url, "DELETE", kv("doomed"))
    assert again.status == 200 and again.body["deleted"] is False
    assert again.body["offset"] > deleted.body["offset"]


def test_cas_success_and_failure(single: Cluster) -> None:
    url = single.leader().url

    def cas(expected: str | None, value: str | None) -> bool:
        reply = call(url, "POST", kv("lock") + "/cas", {"expected": expected, "value": value})
        assert reply.status == 200, reply.body
        applied: bool = reply.body["applied"]
        return applied

    def value() -> str | None:
        reply = call(url, "GET", kv("lock"))
        return reply.body["value"] if reply.status == 200 else None

    assert cas(None, "owner-1")  # create if absent
    assert not cas(None, "owner-2")  # already present
    assert value() == "owner-1"
    assert not cas("owner-2", "owner-3")  # wrong expectation: unchanged
    assert value() == "owner-1"
    assert cas("owner-1", "owner-2")
    assert value() == "owner-2"
    assert cas("owner-2", None)  # null value deletes
    assert value() is None
    assert not cas("owner-2", "x")  # expected a value, key absent


def test_keys_are_percent_decoded_path_segments(single: Cluster) -> None:
    url = single.leader().url
    for key in ["a/b", "h\u00e9llo w\u00f6rld", "50%", "x?y=z#w", "cas"]:
        assert call(url, "PUT", kv(key), f"value of {key}").status == 200
        got = call(url, "GET", kv(key))
        assert got.status == 200 and got.body == {**got.body, "key": key,
                                                   "value": f"value of {key}"}
    # ".../cas" only names the compare-and-set of a key when it follows the key.
    assert call(url, "GET", kv("a") + "/cas").status == 405


def test_kv_bad_input_is_refused_and_nothing_is_appended(single: Cluster) -> None:
    leader = single.leader()
    url = leader.url
    call(url, "PUT", kv("settled"), "x")  # let the high watermark settle first
    before = high_watermark(leader)
    cases: list[tuple[Reply, int, str]] = [
        (call(url, "PUT", kv("k"), b"\xff\xfe", content_type=None), 400, "UTF-8"),
        (call(url, "PUT", kv("k" * (MAX_KEY_BYTES + 1)), "v"), 413, "key of 1025 bytes"),
        (call(url, "PUT", kv("k"), "v" * (MAX_VALUE_BYTES + 1)), 413, "exceeds the limit"),
        (call(url, "PUT", kv("k") + "?stael=true", "v"), 400, "unknown query parameter 'stael'"),
        (call(url, "PUT", kv("k") + "?timeout_ms=0", "v"), 400, "timeout_ms must be at least 1"),
        (call(url, "POST", kv("k") + "/cas", "{not json"), 400, "not valid JSON"),
        (call(url, "POST", kv("k") + "/cas", ["x"]), 400, "JSON object"),
        (call(url, "POST", kv("k") + "/cas", {"value": "v"}), 400, "missing 'expected'"),
        (call(url, "POST", kv("k") + "/cas", {"expected": None, "value": "v", "ttl": 3}), 400,
         "unknown field 'ttl'"),
        (call(url, "POST", kv("k") + "/cas", {"expected": 1, "value": "v"}), 400,
         "'expected' must be a string or null"),
        (call(url, "POST", kv("k") + "/cas", {"expected": None, "value": ["v"]}), 400,
         "'value' must be a string or null"),
        (call(url, "POST", kv("k") + "/cas",
              {"expected": None, "value": "v" * (MAX_VALUE_BYTES + 1)}), 413, "exceeds"),
        (call(url, "GET", kv("k") + "?stale=maybe"), 400, "stale must be true or false"),
        (call(url, "DELETE", kv("k" * (MAX_KEY_BYTES + 1))), 413, "key of"),
    ]
    for reply, status, message in cases:
        assert reply.status == status, reply.body
        assert message in reply.body["message"], reply.body
        assert reply.code == ("TOO_LARGE" if status == 413 else "BAD_REQUEST")
    assert high_watermark(leader) == before


# --- records -----------------------------------------------------------------------------------

def read(url: str, query: str) -> Reply:
    return call(url, "GET", "/v1/records?" + query)


def values_of(reply: Reply) -> list[bytes]:
    return [base64.b64decode(record["value"]) for record in reply.body["records"]]


def test_append_json_and_read_back(single: Cluster) -> None:
    url = single.leader().url
    appended = call(url, "POST", "/v1/records",
                    ["plain", "\u00e9t\u00e9", {"base64": base64.b64encode(b"\x00\xff").decode()}])
    assert appended.status == 200, appended.body
    first, last = appended.body["first_offset"], appended.body["last_offset"]
    assert last == first + 2 and appended.body["epoch"] >= 1
    got = read(url, f"offset={first}&max_records=3")
    assert got.status == 200, got.body
    assert values_of(got) == [b"plain", "\u00e9t\u00e9".encode(), b"\x00\xff"]
    assert [record["offset"] for record in got.body["records"]] == [first, first + 1, last]
    assert all("key" not in record for record in got.body["records"])
    assert got.body["next_offset"] == last + 1
    assert got.body["high_watermark"] >= last + 1
    # From the middle of a batch, and limited.
    middle = read(url, f"offset={first + 1}&max_records=1")
    assert values_of(middle) == ["\u00e9t\u00e9".encode()]
    assert middle.body["next_offset"] == first + 2


def test_append_length_prefixed_bytes(single: Cluster) -> None:
    url = single.leader().url
    values = [b"", b"\x00\x01\x02", b"x" * 1000]
    body = b"".join(len(v).to_bytes(4, "big") + v for v in values)
    appended = call(url, "POST", "/v1/records", body, content_type="application/octet-stream")
    assert appended.status == 200, appended.body
    first = appended.body["first_offset"]
    assert appended.body["last_offset"] == first + 2
    assert values_of(read(url, f"offset={first}&max_records=3")) == values


def test_reads_skip_control_records(single: Cluster) -> None:
    url = single.leader().url
    # Offset 0 holds the first leader's LeaderChange control record.
    first = call(url, "POST", "/v1/records", ["after-control"]).body["first_offset"]
    got = read(url, "offset=0&max_records=10000")
    offsets = [record["offset"] for record in got.body["records"]]
    assert 0 not in offsets
    assert first in offsets
    assert got.body["next_offset"] == offsets[-1] + 1
    leader_change_key = base64.b64encode(b"\x00\x02").decode()  # a control record's type
    assert all(record.get("key") != leader_change_key for record in got.body["records"])


def test_long_poll_returns_as_soon_as_a_record_commits(single: Cluster) -> None:
    url = single.leader().url
    end = read(url, "offset=0&max_records=1").body["high_watermark"]
    result: list[Reply] = []
    started = time.monotonic()
    poller = threading.Thread(target=lambda: result.append(
        read(url, f"offset={end}&wait_ms={MAX_WAIT_MS}")))
    poller.start()
    time.sleep(0.3)
    assert not result  # still waiting
    call(url, "POST", "/v1/records", ["wake up"])
    poller.join(10)
    elapsed = time.monotonic() - started
    assert result and result[0].status == 200
    assert values_of(result[0]) == [b"wake up"]
    assert 0.3 <= elapsed < 5


def test_long_poll_times_out_empty(single: Cluster) -> None:
    url = single.leader().url
    end = read(url, "offset=0&max_records=1").body["high_watermark"]
    started = time.monotonic()
    got = read(url, f"offset={end + 1000}&wait_ms=200")
    assert 0.2 <= time.monotonic() - started < 3
    assert got.status == 200
    assert got.body["records"] == [] and got.body["next_offset"] == end + 1000


def test_records_bad_input_is_refused_and_nothing_is_appended(single: Cluster) -> None:
    leader = single.leader()
    url = leader.url
    before = high_watermark(leader)
    big = base64.b64encode(b"x" * (MAX_RECORD_BYTES + 1)).decode()
    many = ["y" * (MAX_RECORD_BYTES // 2)] * (2 * MAX_APPEND_BYTES // MAX_RECORD_BYTES + 1)
    octet = "application/octet-stream"
    cases: list[tuple[Reply, int, str]] = [
        (call(url, "POST", "/v1/records", "[1, 2"), 400, "not valid JSON"),
        (call(url, "POST", "/v1/records", {"records": ["a"]}), 400, "expected a JSON list"),
        (call(url, "POST", "/v1/records", []), 400, "no records"),
        (call(url, "POST", "/v1/records", ["a", 7]), 400, "record 1: expected a string"),
        (call(url, "POST", "/v1/records", [{"base64": "@@@"}]), 400, "record 0: invalid base64"),
        (call(url, "POST", "/v1/records", [{"base64": "YQ==", "key": "k"}]), 400, "record 0"),
        (call(url, "POST", "/v1/records", [{"base64": big}]), 413, "record 0"),
        (call(url, "POST", "/v1/records", many), 413, "per append"),
        (call(url, "POST", "/v1/records", b"\x00\x00\x00\x05abc", content_type=octet), 400,
         "runs past the end"),
        (call(url, "POST", "/v1/records", b"\x00\x00\x00\x01a\x00\x00", content_type=octet), 400,
         "record 1: truncated length prefix"),
        (call(url, "POST", "/v1/records", b"", content_type=octet), 400, "no records"),
        (call(url, "POST", "/v1/records", "a,b", content_type="text/csv"), 415, "text/csv"),
        (read(url, "offset=-1"), 400, "offset must be at least 0"),
        (read(url, "max_records=5"), 400, "'offset' is required"),
        (read(url, "offset=abc"), 400, "offset must be an integer"),
        (read(url, "offset=1&offset=2"), 400, "more than once"),
        (read(url, f"offset=0&max_records={MAX_READ_RECORDS + 1}"), 400,
         f"max_records must be at most {MAX_READ_RECORDS}"),
        (read(url, "offset=0&max_records=0"), 400, "max_records must be at least 1"),
        (read(url, f"offset=0&wait_ms={MAX_WAIT_MS + 1}"), 400, "wait_ms must be at most"),
        (read(url, "offset=0&maxrecords=5"), 400, "unknown query parameter 'maxrecords'"),
    ]
    for reply, status, message in cases:
        assert reply.status == status, (message, reply.body)
        assert message in reply.body["message"], (message, reply.body)
    assert high_watermark(leader) == before


# --- three nodes -------------------------------------------------------------------------------

def test_writes_and_linearizable_reads_redirect_to_the_leader(trio: Cluster) -> None:
    leader = trio.leader()
    follower = trio.follower()
    core = leader.node.core
    deadline = time.monotonic() + 10  # a new leader's bootstrap voters may still be committing
    while not (core.accepts_writes and core.high_watermark == core.log.end_offset):
        assert time.monotonic() < deadline, "the leader's log never fully committed"
        time.sleep(0.01)
    before = high_watermark(leader)
    for method, path, body in [("PUT", kv("city"), "Oslo"), ("GET", kv("city"), None),
                               ("DELETE", kv("city"), None),
                               ("POST", kv("city") + "/cas", {"expected": None, "value": "x"}),
                               ("POST", "/v1/records?timeout_ms=5000", ["r"])]:
        reply = call(follower.url, method, path, body)
        assert reply.status == 307, (method, path, reply.body)
        assert reply.headers["location"] == leader.url + path
        assert reply.code == "NOT_LEADER"
        assert reply.body["leader"] == {"id": leader.node.config.node_id, "url": leader.url}
    assert high_watermark(leader) == before  # the follower appended nothing
    put = call(leader.url, "PUT", kv("city"), "Oslo")
    assert put.status == 200
    got = call(leader.url, "GET", kv("city"))
    assert got.status == 200 and got.body["value"] == "Oslo"


def test_stale_read_on_a_follower_once_committed(trio: Cluster) -> None:
    leader = trio.leader()
    follower = trio.follower()
    put = call(leader.url, "PUT", kv("stale-key"), "v1")
    assert put.status == 200
    # The follower learns the commit with its next fetch; its store then applies it.
    deadline = time.monotonic() + 5
    while True:
        got = call(follower.url, "GET", kv("stale-key") + "?stale=true")
        if got.status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert got.status == 200, got.body
    assert got.body["value"] == "v1"
    assert got.body["applied_offset"] >= put.body["offset"]
    # Committed records are served by any node, follower included.
    records = read(follower.url, f"offset={put.body['offset']}&max_records=1")
    assert records.status == 200
    assert records.body["records"][0]["key"] == base64.b64encode(b"\x00kv").decode()


def test_client_follows_redirects_and_retries_across_the_bootstrap_list(
        trio: Cluster, protocol: str) -> None:
    follower = trio.follower()
    dead = f"127.0.0.1:{free_port()}"
    with QuorumClient([dead, follower.address], timeout_s=10, protocol=protocol) as client:
        result = client.put("client-key", "one")
        assert result.applied and result.key == "client-key"
        assert client.get("client-key") == "one"
        assert not client.cas("client-key", "two", "three").applied
        assert client.cas("client-key", "one", "two").applied
        assert client.get("client-key", stale=True) in ("one", "two")  # whichever node answers
        assert client.get("client-key") == "two"
        assert client.delete("client-key").applied
        assert client.get("client-key") is None
        first, last = client.append([b"a", b"\x00b", b""])
        assert last == first + 2
        got = client.read(first, max_records=3, wait_ms=1000)
        assert [r.value for r in got.records] == [b"a", b"\x00b", b""]
        assert got.next_offset == last + 1
        with pytest.raises(QuorumClientError) as refused:
            client.put("k" * (MAX_KEY_BYTES + 1), "v")
        assert refused.value.code == "TOO_LARGE"
        assert refused.value.status == (413 if protocol == "http" else None)


def test_client_gives_up_within_its_timeout(protocol: str) -> None:
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    started = time.monotonic()
    with pytest.raises(QuorumClientError) as failed, \
            QuorumClient(dead, timeout_s=0.5, protocol=protocol) as client:
        client.put("k", "v")
    assert failed.value.code == "UNAVAILABLE"
    assert "connection refused" in str(failed.value)
    assert time.monotonic() - started < 2


def test_a_leader_cut_off_from_its_quorum_times_out_then_knows_no_leader(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, 3)
    try:
        leader = cluster.leader()
        others = [m for m in cluster.members.values() if m is not leader]
        cluster.shut_down(*others)
        # Until check-quorum makes it resign, it still leads but cannot confirm a read or
        # commit a write.
        got = call(leader.url, "GET", kv("k") + "?timeout_ms=200")
        assert got.status == 504 and got.code == "TIMEOUT", got.body
        assert "not confirmed by a majority" in got.body["message"]
        put = call(leader.url, "PUT", kv("k") + "?timeout_ms=200", "v")
        assert put.status == 504 and put.code == "TIMEOUT", put.body
        assert "may still commit" in put.body["message"]
        deadline = time.monotonic() + 5
        while (got := call(leader.url, "GET", kv("k"))).status != 503:
            assert time.monotonic() < deadline, got.body
            time.sleep(0.05)
        assert got.code == "NO_LEADER"
        assert call(leader.url, "PUT", kv("k"), "v").code == "NO_LEADER"
        # The local copy stays readable.
        assert call(leader.url, "GET", kv("k") + "?stale=true").code == "KEY_NOT_FOUND"
        for protocol in PROTOCOLS:
            with pytest.raises(QuorumClientError) as failed, \
                    QuorumClient(leader.address, timeout_s=0.5, protocol=protocol) as client:
                client.get("k")
            assert failed.value.code == "UNAVAILABLE" and "no leader" in str(failed.value)
        # A long poll in progress is answered when the node shuts down, not when it expires.
        polls: list[Reply] = []
        poller = threading.Thread(target=lambda: polls.append(
            read(leader.url, f"offset=1000&wait_ms={MAX_WAIT_MS}")))
        poller.start()
        time.sleep(0.2)
        started = time.monotonic()
        cluster.shut_down(leader)
        poller.join(10)
        assert polls and polls[0].status == 200 and polls[0].body["records"] == []
        assert time.monotonic() - started < 5
    finally:
        cluster.stop()


def test_the_store_is_rebuilt_from_the_log_at_restart(tmp_path: Path, protocol: str) -> None:
    cluster = Cluster(tmp_path, 1)
    try:
        with QuorumClient(cluster.bootstrap, protocol=protocol) as client:
            client.put("a", "1")
            client.cas("a", "1", "2")
            client.put("b", "1")
            client.delete("b")
            client.append([b"not a KV op"])
    finally:
        cluster.stop()
    restarted = Cluster(tmp_path, 1, configs=cluster.configs)
    try:
        leader = restarted.leader()
        with QuorumClient(restarted.bootstrap, protocol=protocol) as client:
            assert client.get("a") == "2"
            assert client.get("b") is None
            # The new epoch's LeaderChange ends the log: a read there skips it and moves on.
            end = high_watermark(leader)
            skipped = client.read(end - 1, wait_ms=0)
            assert skipped.records == [] and skipped.next_offset == end
    finally:
        restarted.stop()


class _MisbehavingServer(http.server.ThreadingHTTPServer):
    """A "node" that hangs up on every request, or redirects every request to itself (after
    ``delay_s``: a slow machine)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Misbehaving)
        self.mode = "hang-up"
        self.delay_s = 0.0
        self.calls: list[str] = []


class _Misbehaving(http.server.BaseHTTPRequestHandler):
    server: _MisbehavingServer

    def do_GET(self) -> None:
        self._answer()

    do_PUT = do_POST = do_DELETE = do_GET

    def _answer(self) -> None:
        self.server.calls.append(f"{self.command} {self.path}")
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        if self.server.mode == "hang-up":
            self.close_connection = True  # no answer at all: the outcome is unknown
            return
        time.sleep(self.server.delay_s)
        self.send_response(307)  # "loop": a leader that points at itself
        self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}{self.path}")
        self.send_header("Content-Type", "application/json")
        body = b'{"code": "NOT_LEADER", "message": "not the leader"}'
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def misbehaving() -> Iterator[_MisbehavingServer]:
    server = _MisbehavingServer()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_client_never_repeats_a_cas_or_append_whose_outcome_is_unknown(
        misbehaving: _MisbehavingServer) -> None:
    misbehaving.mode = "hang-up"
    # Over HTTP; test_client_stream has the stream's counterpart.
    with QuorumClient(f"127.0.0.1:{misbehaving.server_port}", timeout_s=0.3,
                      protocol="http") as client:
        for write in (lambda: client.cas("k", None, "v"), lambda: client.append([b"r"])):
            with pytest.raises(QuorumClientError) as unknown:
                write()
            assert unknown.value.code == "OUTCOME_UNKNOWN"
        assert len(misbehaving.calls) == 2  # one try each
        # Reads, puts and deletes are idempotent: they are tried again until the deadline.
        for idempotent in (lambda: client.get("k"), lambda: client.put("k", "v"),
                           lambda: client.delete("k")):
            with pytest.raises(QuorumClientError) as gave_up:
                idempotent()
            assert gave_up.value.code == "UNAVAILABLE"
        assert len(misbehaving.calls) > 2 + 3 * 2


def test_client_gives_up_on_a_redirect_loop(misbehaving: _MisbehavingServer) -> None:
    misbehaving.mode = "loop"
    with pytest.raises(QuorumClientError) as failed, \
            QuorumClient(f"127.0.0.1:{misbehaving.server_port}", timeout_s=0.3,
                         protocol="http") as client:
        client.cas("k", None, "v")
    assert failed.value.code == "UNAVAILABLE"
    assert "redirected more than 5 times" in str(failed.value)


def test_a_try_begun_at_the_end_of_a_call_is_waited_for(misbehaving: _MisbehavingServer) -> None:
    """A redirect that comes just after the call's time is up is still an answer (nothing was
    applied), not a cut-off request whose outcome is unknown."""
    misbehaving.mode, misbehaving.delay_s = "loop", 0.04
    started = time.monotonic()
    with pytest.raises(QuorumClientError) as failed, \
            QuorumClient(f"127.0.0.1:{misbehaving.server_port}", timeout_s=0.1,
                         protocol="http") as client:
        client.cas("k", None, "v")
    assert failed.value.code == "UNAVAILABLE"
    assert time.monotonic() - started < 0.1 + 0.25 + 0.2  # the margin, and no more


# --- listing and watching keys ----------------------------------------------------------------

def test_list_keys_by_prefix_in_pages(single: Cluster, protocol: str) -> None:
    with QuorumClient(single.bootstrap, protocol=protocol) as client:
        for name in ("list/b", "list/a", "list/c", "listx", "other"):
            client.put(name, name.upper())
        first = client.list_keys("list/", limit=2)
        assert first.entries == [("list/a", "LIST/A"), ("list/b", "LIST/B")]
        assert first.next_start_after == "list/b"
        second = client.list_keys("list/", start_after=first.next_start_after, limit=2)
        assert second.entries == [("list/c", "LIST/C")] and second.next_start_after is None
        assert client.list_keys("list/", stale=True, limit=10).entries[2] == ("list/c", "LIST/C")
    url = single.leader().url
    bad = call(url, "GET", "/v1/kv?limit=0")
    assert (bad.status, bad.body["code"]) == (400, "BAD_REQUEST")


def test_watch_a_key_and_a_prefix_from_an_offset(single: Cluster, protocol: str) -> None:
    with QuorumClient(single.bootstrap, protocol=protocol) as client:
        start = client.put("w/a", "1").offset
        client.put("w/b", "x")
        client.cas("w/a", "nope", "no")  # not applied: no change
        client.cas("w/a", "1", "2")
        client.delete("w/a")
        changes = client.watch(start, key="w/a")
        assert [(e.key, e.value) for e in changes.events] == [("w/a", "1"), ("w/a", "2"),
                                                              ("w/a", None)]
        assert changes.next_offset == changes.applied_offset + 1
        under = client.watch(start, prefix="w/", max_events=2)
        assert [(e.key, e.value) for e in under.events] == [("w/a", "1"), ("w/b", "x")]
        assert under.next_offset == under.events[-1].offset + 1  # more to come from there
        # A long-poll answers as soon as a change commits.
        result: list[object] = []
        poller = threading.Thread(target=lambda: result.append(
            QuorumClient(single.bootstrap, protocol=protocol).watch(
                changes.next_offset, key="w/a", wait_ms=MAX_WAIT_MS)))
        started = time.monotonic()
        poller.start()
        time.sleep(0.3)
        assert not result
        client.put("w/other", "not watched")
        time.sleep(0.2)
        assert not result
        client.put("w/a", "back")
        poller.join(10)
        assert 0.5 <= time.monotonic() - started < 5
        woken = result[0]
        assert isinstance(woken, WatchResult)
        assert [(e.key, e.value) for e in woken.events] == [("w/a", "back")]
    url = single.leader().url
    for query, message in [("offset=0", "exactly one of 'key' and 'prefix'"),
                           ("key=k&prefix=p&offset=0", "exactly one of"),
                           ("key=k", "'offset' is required"),
                           ("key=k&offset=0&max_events=0", "max_events must be at least 1")]:
        bad = call(url, "GET", f"/v1/watch?{query}")
        assert (bad.status, bad.body["code"]) == (400, "BAD_REQUEST"), query
        assert message in bad.body["message"]


def test_watch_below_the_changes_kept_is_compacted(single: Cluster) -> None:
    member = single.leader()
    store = member.node.state_machine.store
    store.events_start = 10**6  # as after loading a snapshot ending there
    try:
        gone = call(member.url, "GET", "/v1/watch?key=k&offset=5")
    finally:
        store.events_start = 0
    assert (gone.status, gone.body["code"]) == (410, "COMPACTED")
    assert f"watch from {10**6}" in gone.body["message"]


# --- the CLI -----------------------------------------------------------------------------------

def test_cli_against_a_running_node(single: Cluster, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                    protocol: str) -> None:
    server = ["--bootstrap-server", single.bootstrap, "--protocol", protocol]

    def run(*argv: str) -> tuple[int, str, str]:
        code = client_main([*server, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = run("put", "cli-key", "hello world")
    assert code == 0 and out.startswith("OK (offset ")
    assert run("get", "cli-key") == (0, "hello world\n", "")
    code, out, _ = run("get", "cli-key", "--stale", "--json")
    answer = json.loads(out)  # the API's answer, as it is
    assert code == 0 and answer["value"] == "hello world" and answer["applied_offset"] > 0
    code, out, _ = run("cas", "cli-key", "--expected", "nope", "--value", "v2")
    assert code == 3 and out.startswith("not applied")
    code, out, _ = run("cas", "cli-key", "--expected", "hello world", "--value", "v2", "--json")
    assert code == 0 and json.loads(out)["applied"] is True
    code, out, _ = run("cas", "cli-new", "--expected-absent", "--value", "fresh")
    assert code == 0 and out.startswith("applied")
    code, out, _ = run("cas", "cli-new", "--expected", "fresh", "--delete")
    assert code == 0
    code, out, _ = run("delete", "cli-key")
    assert code == 0 and out.startswith("deleted")
    code, out, _ = run("delete", "cli-key", "--json")
    assert code == 3 and json.loads(out)["deleted"] is False
    code, out, err = run("get", "cli-key")
    assert code == 3 and out == "" and "not found" in err
    code, out, err = run("get", "cli-key", "--json")
    assert code == 3 and json.loads(out)["code"] == "KEY_NOT_FOUND"
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"line 1\nline 2\n")))
    assert run("put", "multi", "-")[0] == 0
    assert run("get", "multi") == (0, "line 1\nline 2\n\n", "")
    value_file = tmp_path / "value"
    value_file.write_bytes("x\u00e9".encode() * 100_000)
    assert run("put", "big", "--file", str(value_file))[0] == 0
    code, out, _ = run("get", "big", "--json")
    assert json.loads(out)["value"] == "x\u00e9" * 100_000

    code, out, _ = run("append", "one", "two\tthree", "f\u00fcnf")
    assert code == 0 and out.startswith("appended 3 records at offsets ")
    first = int(out.split()[-1].split("-")[0])
    code, out, _ = run("read", "--offset", str(first), "--max-records", "3")
    assert code == 0
    assert out == f"{first}\tone\n{first + 1}\ttwo\\tthree\n{first + 2}\tf\u00fcnf\n"
    monkeypatch.setattr("sys.stdin", io.StringIO("from\nstdin\n"))
    code, out, _ = run("append", "-", "--json")
    appended = json.loads(out)
    assert code == 0 and appended["last_offset"] == appended["first_offset"] + 1
    code, out, _ = run("--json", "read", "--offset", str(appended["first_offset"]))
    document = json.loads(out)
    assert [base64.b64decode(r["value"]) for r in document["records"]] == [b"from", b"stdin"]
    assert document["next_offset"] == appended["last_offset"] + 1
    code, out, _ = run("read", "--offset", str(document["next_offset"]), "--wait-ms", "50")
    assert code == 0 and out == ""

    for name in ("cli-list/a", "cli-list/b", "cli-list/c"):
        assert run("put", name, f"value\t{name[-1]}")[0] == 0
    code, out, _ = run("list", "cli-list/", "--limit", "2")
    assert (code, out) == (0, "cli-list/a\tvalue\\ta\ncli-list/b\tvalue\\tb\n")
    code, out, _ = run("list", "cli-list/", "--limit", "2", "--all", "--keys-only")
    assert out == "cli-list/a\ncli-list/b\ncli-list/c\n"
    code, out, _ = run("list", "cli-list/", "--json")
    assert [e["key"] for e in json.loads(out)["entries"]] == ["cli-list/a", "cli-list/b",
                                                              "cli-list/c"]
    first = json.loads(run("get", "cli-list/a", "--json")[1])["applied_offset"] - 2
    code, out, _ = run("watch", "--prefix", "cli-list/", "--offset", str(first), "--once")
    assert code == 0
    assert [line.split("\t")[1:3] for line in out.splitlines()] == [
        ["put", "cli-list/a"], ["put", "cli-list/b"], ["put", "cli-list/c"]]
    code, out, _ = run("watch", "cli-list/a", "--once", "--wait-ms", "100")
    assert (code, out) == (0, "")  # nothing changed since


def test_cli_errors_are_one_line(single: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    server = ["-b", single.bootstrap]
    dead = f"127.0.0.1:{free_port()}"
    cases = [
        ([*server, "read"], 2, "the following arguments are required: --offset"),
        ([*server, "frobnicate"], 2, "invalid choice: 'frobnicate'"),
        ([*server, "cas", "k", "--value", "v"], 2, "--expected"),
        ([*server, "read", "--offset", "-3"], 2, "must not be negative"),
        ([*server, "read", "--offset", "0", "--max-records", "0"], 2, "must be at least 1"),
        (["-b", "no-port", "get", "k"], 2, "not of the form host:port"),
        (["-b", dead, "get", "k"], 1, "no node reachable: http://127.0.0.1:"),
        ([*server, "put", "k" * (MAX_KEY_BYTES + 1), "v"], 1, "exceeds the limit"),
    ]
    for argv, expected_code, message in cases:
        assert client_main(argv) == expected_code, argv
        out, err = capsys.readouterr()
        assert out == ""
        assert err.count("\n") == 1 and err.startswith("quorum-client"), err
        assert "error: " in err, err
        assert message in err, err


def test_cli_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert client_main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(command in out for command in ("put", "get", "delete", "cas", "append", "read"))
    for command in ("put", "get", "delete", "cas", "append", "read"):
        assert client_main([command, "--help"]) == 0
        assert "--bootstrap-server" in capsys.readouterr().out
    module = subprocess.run([sys.executable, "-m", "quorum_node.cli.client", "--help"],
                            capture_output=True, text=True, timeout=30, check=False)
    assert module.returncode == 0 and "quorum-client" in module.stdout


def test_a_stopped_kv_applier_fails_the_probes(tmp_path: Path) -> None:
    """If the KV applier stops (not for a bad op, which is skipped, but say the log cannot be
    read), the node can no longer serve KV: /healthz and /readyz answer 503 with the reason."""
    cluster = Cluster(tmp_path, 1)
    try:
        member = cluster.leader()
        assert call(member.url, "GET", "/healthz").status == 200

        async def fail() -> None:
            member.node.state_machine.applier_failed(OSError("the log cannot be read"))

        cluster.run(fail())
        for probe in ("/healthz", "/readyz"):
            reply = call(member.url, "GET", probe)
            assert reply.status == 503, probe
            text = reply.body.decode() if isinstance(reply.body, bytes) else str(reply.body)
            assert "KV state machine stopped: the log cannot be read" in text, text
    finally:
        cluster.stop()


# --- the one error body ------------------------------------------------------------------------

@pytest.mark.parametrize(("method", "path", "status", "code"), [
    ("GET", "/v1/nothing-here", 404, "NOT_FOUND"),
    ("PATCH", kv("k"), 405, "METHOD_NOT_ALLOWED"),
    ("GET", kv("k") + "?stale=1", 400, "BAD_REQUEST"),  # true or false only
    ("GET", kv("k") + "?stale", 400, "BAD_REQUEST"),
    ("GET", "/v1/kv?limit=0", 400, "BAD_REQUEST"),
    ("DELETE", "/v1/quorum/voters/1/AAAAAAAAAAAAAAAAAAAAAQ?decommission=yes", 400, "BAD_REQUEST"),
])
def test_every_refusal_is_the_one_error_body(single: Cluster, method: str, path: str,
                                             status: int, code: str) -> None:
    """aiohttp's own refusals (no route, wrong method) included: {"code", "message"}, JSON."""
    reply = call(single.leader().url, method, path)
    assert (reply.status, reply.headers["content-type"].split(";")[0]) == (status,
                                                                          "application/json")
    assert set(reply.body) == {"code", "message"} and reply.body["code"] == code, reply.body
    assert reply.body["message"] and "\n" not in reply.body["message"]
