"""What a client with only the read or the write role can do to a node's memory and event loop
through the key-value store, against real in-process nodes over HTTP and the binary stream:
waiting watches cost a write nothing unless it concerns them; a watch ends with its connection;
a page of keys and a watch's answer are bounded in bytes (with a continuation the client
follows); the change history is bounded in bytes, also once a restart has rebuilt it; keys are
UTF-8 or refused."""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_client_api import FAST, Cluster, call, free_port, high_watermark, kv
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect
from websockets.typing import Subprotocol

from quorum_node import wire
from quorum_node.client import PROTOCOLS, QuorumClient
from quorum_node.client_stream import ClientStream
from quorum_node.node.config import NodeConfig
from quorum_node.node.kv_service import MAX_ANSWER_BYTES, KvService
from quorum_node.raft.config import VoterEndpoint
from quorum_node.storage.meta_properties import format_log_dir, random_cluster_id

MIB = 1024 * 1024


def one_node(directory: Path, **settings: Any) -> Cluster:
    """A started single-node cluster whose NodeConfig has ``settings``."""
    cluster_id = random_cluster_id()
    port, peer = free_port(), free_port()
    config = NodeConfig(
        node_id=1, cluster_id=cluster_id, log_dir=directory / "node-1",
        listeners=f"CLIENT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{peer}",
        listener_security_protocol_map="CLIENT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        controller_listener_names="CONTROLLER",
        voters=(VoterEndpoint(id=1, host="127.0.0.1", port=peer),),
        client_endpoints=(VoterEndpoint(id=1, host="127.0.0.1", port=port),),
        quorum=FAST, **settings)
    format_log_dir(config.log_dir, cluster_id, 1)
    cluster = Cluster(directory, 1, configs=[config])
    cluster.leader()
    return cluster


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = one_node(tmp_path_factory.mktemp("kv-exhaustion"), http_max_long_polls=2000)
    try:
        yield cluster
    finally:
        cluster.stop()


def eventually(condition: Callable[[], bool], timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


# --- waiting watches -------------------------------------------------------------------------

def test_waiting_watches_are_not_woken_by_writes_they_do_not_concern(node: Cluster) -> None:
    """A thousand long polls on prefixes that nothing written matches: the writes wake none of
    them (each looked at the history once, when it started), and a write of one's prefix
    answers that one alone."""
    member = node.leader()
    service = KvService(member.node)
    looks = 0
    look = service._changes

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal looks
        looks += 1
        return look(*args, **kwargs)

    service._changes = counted  # type: ignore[method-assign]
    start = member.node.state_machine.store.next_offset
    watches: list[asyncio.Task[Any]] = []

    async def start_watches() -> None:
        watches.extend(asyncio.ensure_future(service.watch(start, prefix=f"idle-{i}/",
                                                           wait_s=30))
                       for i in range(1000))

    node.run(start_watches())
    try:
        assert eventually(lambda: service.long_polls == 1000)
        with QuorumClient(node.bootstrap) as client:
            for i in range(100):
                client.put(f"busy/{i}", "v")
            time.sleep(0.3)
            assert looks == 1000, f"{looks - 1000} looks at the history caused by 100 writes"
            offset = client.put("idle-7/x", "mine").offset
        assert eventually(lambda: sum(task.done() for task in watches) == 1)
        (woken,) = [task for task in watches if task.done()]
        changes = woken.result()
        assert [(e.offset, e.key, e.value) for e in changes.events] == [(offset, "idle-7/x",
                                                                         "mine")]
        assert changes.next_offset == offset + 1
    finally:
        for task in watches:
            node.loop.call_soon_threadsafe(task.cancel)
    assert eventually(lambda: service.long_polls == 0)
    assert not member.node.state_machine.store.watchers


def watch_query(**query: Any) -> str:
    return "/v1/watch?" + urllib.parse.urlencode(query)


@pytest.mark.parametrize("transport", ["http", "stream"])
def test_a_closed_connection_ends_its_waiting_watch(tmp_path: Path, transport: str) -> None:
    """With room for one long poll, a watch whose client hangs up frees it at once, not after
    its 30 s wait: the next client's watch is served."""
    cluster = one_node(tmp_path, http_max_long_polls=1)
    try:
        member = cluster.leader()
        host, port = member.address.rsplit(":", 1)
        offset = member.node.state_machine.store.next_offset
        waiting = watch_query(prefix="nothing/", offset=offset, wait_ms=30_000)
        stream: ClientStream | None = None
        sock: socket.socket | None = None
        if transport == "http":
            sock = socket.create_connection((host, int(port)), timeout=5)
            sock.sendall(f"GET {waiting} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        else:
            stream = ClientStream.open(member.url, headers={}, ssl_context=None, timeout_s=5)
            stream.send(wire.Op.WATCH, 0, (False, "nothing/", offset, 30_000, 100))

        def next_watch() -> int:
            return call(member.url, "GET", watch_query(key="k", offset=offset,
                                                       wait_ms=1)).status

        assert eventually(lambda: next_watch() == 429)  # the one long poll is taken
        if sock is not None:
            sock.close()
        if stream is not None:
            stream.close()
        started = time.monotonic()
        assert eventually(lambda: next_watch() == 200, timeout_s=10), \
            "the closed connection's watch still holds its place"
        assert time.monotonic() - started < 10  # its wait was 30 s
        assert not member.node.state_machine.store.watchers
    finally:
        cluster.stop()


# --- bounded answers ---------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_pages_and_watch_answers_are_bounded_in_bytes(node: Cluster, protocol: str) -> None:
    big = "x" * (400 * 1024)
    prefix = f"big-{protocol}/"
    with QuorumClient(node.bootstrap, protocol=protocol) as client:
        offsets = [client.put(f"{prefix}{i}", big + str(i)).offset for i in range(5)]
        first = client.list_keys(prefix, limit=100)
        assert [key for key, _ in first.entries] == [f"{prefix}0", f"{prefix}1"]
        assert first.next_start_after == f"{prefix}1"
        assert [key for key, _ in client.scan_keys(prefix)] == [f"{prefix}{i}" for i in range(5)]
        changes = client.watch(offsets[0], prefix=prefix, max_events=100)
        assert [e.offset for e in changes.events] == offsets[:2]
        assert changes.next_offset == offsets[2]
        seen = [e.offset for e in changes.events]
        while changes.next_offset <= offsets[-1]:
            changes = client.watch(changes.next_offset, prefix=prefix, max_events=100)
            assert 1 <= len(changes.events) <= 2
            seen += [e.offset for e in changes.events]
        assert seen == offsets
        # A watch waiting when the values come is handed no more than one answer's worth.
        waiting_from = changes.next_offset
        client.put_many([(f"{prefix}{i}", big) for i in range(5)])
        woken = client.watch(waiting_from, prefix=prefix, max_events=100, wait_ms=5000)
        assert 1 <= len(woken.events) <= 2
    page = call(node.leader().url, "GET", f"/v1/kv?prefix={prefix}&limit=10000")
    assert page.status == 200 and len(page.body["entries"]) == 2
    assert sum(len(e["key"]) + len(e["value"]) for e in page.body["entries"]) <= MAX_ANSWER_BYTES


def test_the_change_history_is_bounded_in_bytes_also_after_a_restart(tmp_path: Path) -> None:
    """Writes of large values to one key keep at most kv.history.retention.bytes of changes on
    the node, and the store a restart rebuilds from the log keeps no more: a watch from before
    them is told COMPACTED."""
    bound = 2 * MIB
    cluster = one_node(tmp_path, kv_history_retention_bytes=bound)
    try:
        with QuorumClient(cluster.bootstrap) as client:
            offsets = [client.put("hot", f"{i}" + "v" * (512 * 1024)).offset for i in range(12)]
        configs = cluster.configs
        store = cluster.leader().node.state_machine.store
        assert 0 < store.events_bytes <= bound and store.events_kept <= 3
        gone = call(cluster.leader().url, "GET", watch_query(key="hot", offset=offsets[0]))
        assert (gone.status, gone.body["code"]) == (410, "COMPACTED")
        kept_from = store.events_start
    finally:
        cluster.stop()
    cluster = Cluster(tmp_path, 1, configs=configs)
    try:
        member = cluster.leader()
        store = member.node.state_machine.store
        assert eventually(lambda: store.next_offset > offsets[-1])
        assert 0 < store.events_bytes <= bound and store.events_start == kept_from
        gone = call(member.url, "GET", watch_query(key="hot", offset=offsets[0]))
        assert (gone.status, gone.body["code"]) == (410, "COMPACTED")
        assert f"watch from {kept_from}" in gone.body["message"]
        seen: list[int] = []
        position = kept_from
        while position <= offsets[-1]:  # an answer at a time: each holds one 512 KiB value
            kept = call(member.url, "GET", watch_query(key="hot", offset=position))
            seen += [event["offset"] for event in kept.body["events"]]
            position = kept.body["next_offset"]
        assert seen == [offset for offset in offsets if offset >= kept_from]
    finally:
        cluster.stop()


# --- keys are UTF-8 ------------------------------------------------------------------------------

def test_keys_that_are_not_utf8_are_refused(node: Cluster) -> None:
    member = node.leader()
    url = member.url
    assert call(url, "PUT", kv("settled"), "x").status == 200
    before = high_watermark(member)
    for raw in ("%ff", "a%C3", "%ED%A0%80", "%C0%AF"):  # a stray byte, cut, a surrogate, overlong
        for method, path in (("PUT", f"/v1/kv/{raw}"), ("GET", f"/v1/kv/{raw}"),
                             ("DELETE", f"/v1/kv/{raw}"), ("POST", f"/v1/kv/{raw}/cas"),
                             ("GET", f"/v1/kv?prefix={raw}"),
                             ("GET", f"/v1/kv?start_after={raw}"),
                             ("GET", f"/v1/watch?key={raw}&offset=0"),
                             ("GET", f"/v1/watch?prefix={raw}&offset=0")):
            reply = call(url, method, path, {"expected": None, "value": "v"}
                         if path.endswith("/cas") else "v")
            assert reply.status == 400, (method, path, reply.body)
            assert set(reply.body) == {"code", "message"} and reply.body["code"] == "BAD_REQUEST"
            assert "UTF-8" in reply.body["message"]
    assert high_watermark(member) == before
    # Percent-encoded, "%" is a key's character like any other.
    assert call(url, "PUT", "/v1/kv/%25ff", "percent").status == 200
    assert call(url, "GET", "/v1/kv/%25ff").body["key"] == "%ff"
    for protocol in PROTOCOLS:
        with QuorumClient(node.bootstrap, protocol=protocol) as client:
            assert client.get("%ff") == "percent"
            for refused in (lambda: client.get("\ud800"), lambda: client.list_keys("\udcff"),
                            lambda: client.watch(0, prefix="\ud800")):
                with pytest.raises(ValueError, match="UTF-8"):
                    refused()  # not Unicode text: refused before anything is sent


def test_a_stream_request_whose_key_is_not_utf8_closes_the_stream(node: Cluster) -> None:
    """The stream's strings are UTF-8 by its definition (quorum_node.wire): a request whose key
    is not is not a request of the protocol, and the stream closes with the reason (1002)."""
    frame = (wire.REQUEST_HEAD.pack(1, wire.Op.PUT, 0) + (1).to_bytes(4, "big") + b"\xff"
             + (1).to_bytes(4, "big") + b"v")
    before = high_watermark(node.leader())
    with connect(f"ws://{node.leader().address}{wire.PATH}", compression=None, proxy=None,
                 subprotocols=[Subprotocol(wire.SUBPROTOCOL)], open_timeout=5) as stream:
        stream.send(frame)
        with pytest.raises(ConnectionClosed) as closed:
            stream.recv(timeout=5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1002
    assert "not UTF-8" in closed.value.rcvd.reason
    assert high_watermark(node.leader()) == before
