"""The peer transport: frames, the WebSocket stream (concurrent answers, errors, reconnects) and
the per-RPC POST routes."""

from __future__ import annotations

import asyncio
import struct
import sys
from collections.abc import AsyncIterator, Awaitable

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from fake_nodes import closed_port

from quorum_node.node.transport import (
    STREAM_PATH,
    FrameError,
    PeerClient,
    PeerServer,
    PeerUnavailable,
    Reply,
    decode_frame,
    encode_frame,
)
from quorum_node.raft.messages import (
    FetchRequest,
    FetchResponse,
    RaftRequest,
    RaftResponse,
    VoteRequest,
    VoteResponse,
)
from quorum_node.raft.requests import RequestFailure
from quorum_node.raft.types import Errors


def fetch(offset: int, max_wait_ms: int = 0) -> FetchRequest:
    return FetchRequest(cluster_id="c", replica_id=2, max_wait_ms=max_wait_ms,
                        current_leader_epoch=1, fetch_offset=offset, last_fetch_epoch=0)


class Peer:
    """A node's RPC server on a loopback port, answering from a scripted handler."""

    def __init__(self, idle_timeout_s: float | None = None) -> None:
        self.server = PeerServer(self.handle, idle_timeout_s=idle_timeout_s)
        self.runner: web.AppRunner | None = None
        self.port = 0
        self.delays: dict[int, float] = {}  # fetch offset -> seconds before answering
        self.unanswered: set[int] = set()  # fetch offsets the node parks, then gives up on
        self.fail = False

    def handle(self, request: RaftRequest, reply: Reply) -> RaftResponse | None:
        if self.fail:
            raise web.HTTPServiceUnavailable(text="node stopping")
        if isinstance(request, VoteRequest):
            return VoteResponse(leader_epoch=request.replica_epoch, vote_granted=True)
        assert isinstance(request, FetchRequest)
        answer = FetchResponse(leader_id=1, leader_epoch=1, high_watermark=request.fetch_offset,
                               records=b"\x01" * request.fetch_offset)
        if request.fetch_offset in self.unanswered:
            asyncio.get_running_loop().call_later(0.05, reply, None)
            return None
        delay = self.delays.get(request.fetch_offset, 0)
        if delay == 0:
            return answer
        asyncio.get_running_loop().call_later(delay, reply, answer)  # a parked long poll
        return None

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.add_routes(self.server.routes())
        self.runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        await self.server.close()
        if self.runner is not None:
            await self.runner.cleanup()


@pytest_asyncio.fixture
async def peer() -> AsyncIterator[Peer]:
    started = Peer()
    await started.start()
    try:
        yield started
    finally:
        await started.stop()


def test_frames_round_trip_with_raw_records() -> None:
    response = FetchResponse(leader_id=1, leader_epoch=3, high_watermark=7, records=b"\x00\xff")
    assert decode_frame(FetchResponse, encode_frame(response)) == response
    with pytest.raises(FrameError):
        decode_frame(VoteResponse, encode_frame(response))  # records where none belong
    with pytest.raises(FrameError):
        decode_frame(FetchResponse, b"\x00\x00")


async def test_an_idle_stream_is_closed_but_not_one_waiting_for_a_parked_request() -> None:
    peer = Peer(idle_timeout_s=0.3)
    await peer.start()
    loop = asyncio.get_running_loop()
    try:
        async with aiohttp.ClientSession() as session, \
                session.ws_connect(f"http://127.0.0.1:{peer.port}{STREAM_PATH}") as silent:
            started = loop.time()
            closing = await silent.receive(timeout=5)  # it sends nothing, answers pings
            assert closing.type is aiohttp.WSMsgType.CLOSE
            assert closing.data == aiohttp.WSCloseCode.GOING_AWAY
            assert closing.extra == "idle for 0.3 s"
            assert 0.25 <= loop.time() - started < 2
        # A peer whose request is parked for longer than that waits for the node, not idle.
        peer.delays[3] = 0.8
        client = PeerClient({1: ("127.0.0.1", peer.port)}, timeout_ms=3000)
        try:
            answer = await client.send(1, fetch(3))
            assert isinstance(answer, FetchResponse) and answer.high_watermark == 3
        finally:
            await client.close()
    finally:
        await peer.stop()


async def test_requests_on_one_stream_are_answered_concurrently(peer: Peer) -> None:
    peer.delays[1] = 0.3  # a parked long poll must not hold up the answers behind it
    client = PeerClient({1: ("127.0.0.1", peer.port)}, timeout_ms=2000)
    try:
        slow = asyncio.ensure_future(client.send(1, fetch(1)))
        await asyncio.sleep(0.05)
        fast = await client.send(1, fetch(5))
        assert not slow.done()
        assert isinstance(fast, FetchResponse) and fast.records == b"\x01" * 5
        slowly = await slow
        assert isinstance(slowly, FetchResponse) and slowly.high_watermark == 1
        vote = await client.send(1, VoteRequest(cluster_id="c", voter_id=1, replica_epoch=4,
                                                replica_id=2, last_offset_epoch=0,
                                                last_offset=0))
        assert isinstance(vote, VoteResponse) and vote.vote_granted
    finally:
        await client.close()


async def test_a_refusal_or_timeout_is_peer_unavailable(peer: Peer) -> None:
    client = PeerClient({1: ("127.0.0.1", peer.port)}, timeout_ms=300)
    try:
        peer.fail = True
        with pytest.raises(PeerUnavailable, match="refused"):
            await client.send(1, fetch(0))
        peer.fail = False
        peer.delays[2] = 1.0
        with pytest.raises(PeerUnavailable, match="did not answer"):
            await client.send(1, fetch(2))
        assert (await client.send(1, fetch(3))).error_code is Errors.NONE  # a new stream
        with pytest.raises(PeerUnavailable, match="no endpoint"):
            await client.send(9, fetch(0))
    finally:
        await client.close()


async def _closed_then_refused(client: PeerClient, waiting: Awaitable[RaftResponse]) -> None:
    """The call waiting on node 1's stream fails as the peer ended it (``CLOSED``), and the next
    connection is refused (``REFUSED``): its process is gone."""
    with pytest.raises(PeerUnavailable) as cut:
        await asyncio.wait_for(waiting, 2)
    assert cut.value.failure is RequestFailure.CLOSED
    with pytest.raises(PeerUnavailable) as gone:
        await client.send(1, fetch(0))
    assert gone.value.failure is RequestFailure.REFUSED


async def test_only_a_refused_connection_says_the_peer_is_gone(peer: Peer) -> None:
    """The core starts an election at once when its leader's address refuses a connection
    (``RequestFailure.REFUSED``): nothing listens there, the process is gone. A request the
    node refused or a timeout says nothing of the kind; a stream the peer ended under a waiting
    call (``CLOSED``) says it may be, which the next connection tells."""
    client = PeerClient({1: ("127.0.0.1", peer.port), 2: ("127.0.0.1", closed_port())},
                        timeout_ms=300)
    try:
        with pytest.raises(PeerUnavailable) as refused:
            await client.send(2, fetch(0))
        assert refused.value.failure is RequestFailure.REFUSED
        peer.fail = True
        with pytest.raises(PeerUnavailable) as answered:
            await client.send(1, fetch(0))
        assert answered.value.failure is RequestFailure.UNANSWERED
        peer.fail = False
        peer.delays[2] = 1.0
        with pytest.raises(PeerUnavailable) as timed_out:
            await client.send(1, fetch(2))
        assert timed_out.value.failure is RequestFailure.UNANSWERED
        peer.delays[2] = 0.25
        waiting = asyncio.ensure_future(client.send(1, fetch(2)))
        await asyncio.sleep(0.05)
        await peer.stop()  # the process goes: the waiting call's stream ends
        await _closed_then_refused(client, waiting)
    finally:
        await client.close()


# A node's RPC server in a process of its own that parks every request: killed, its kernel
# ends the streams it held.
_PARKING_NODE = """
import asyncio
from aiohttp import web
from quorum_node.node.transport import PeerServer

async def main():
    app = web.Application()
    app.add_routes(PeerServer(lambda request, reply: None).routes())
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(site._server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_a_killed_peer_ends_the_stream_under_a_parked_request() -> None:
    """What a follower sees of its leader's death: the parked Fetch's stream ends (``CLOSED``),
    and the next connection is refused (``REFUSED``)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _PARKING_NODE, stdout=asyncio.subprocess.PIPE)
    assert process.stdout is not None
    port = int(await asyncio.wait_for(process.stdout.readline(), 30))
    client = PeerClient({1: ("127.0.0.1", port)}, timeout_ms=5000)
    try:
        parked = asyncio.ensure_future(client.send(1, fetch(1, max_wait_ms=5000)))
        await asyncio.sleep(0.2)
        assert not parked.done()
        process.kill()
        await process.wait()
        await _closed_then_refused(client, parked)
    finally:
        await client.close()
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_a_parked_request_the_node_gives_up_on_is_refused(peer: Peer) -> None:
    peer.unanswered.add(6)
    client = PeerClient({1: ("127.0.0.1", peer.port)}, timeout_ms=2000)
    try:
        with pytest.raises(PeerUnavailable, match="refused: no response from the quorum core"):
            await client.send(1, fetch(6))
        answer = await client.send(1, fetch(2))
        assert isinstance(answer, FetchResponse) and answer.high_watermark == 2  # goes on
    finally:
        await client.close()
    async with aiohttp.ClientSession() as session, session.post(
            f"http://127.0.0.1:{peer.port}/raft/v1/Fetch", data=encode_frame(fetch(6))) as reply:
        assert reply.status == 503
        assert "no response from the quorum core" in await reply.text()


async def test_the_client_reconnects_after_the_peer_restarts(peer: Peer) -> None:
    client = PeerClient({1: ("127.0.0.1", peer.port)}, timeout_ms=1000)
    try:
        answer = await client.send(1, fetch(1))
        assert isinstance(answer, FetchResponse) and answer.high_watermark == 1
        port = peer.port
        await peer.stop()
        with pytest.raises(PeerUnavailable):
            await client.send(1, fetch(1))
        restarted = Peer()
        await restarted.start(port)
        try:
            answer = await client.send(1, fetch(4))
            assert isinstance(answer, FetchResponse) and answer.high_watermark == 4
        finally:
            await restarted.stop()
    finally:
        await client.close()


async def test_malformed_stream_messages_get_an_error_answer(peer: Peer) -> None:
    async with aiohttp.ClientSession() as session, session.ws_connect(
            f"http://127.0.0.1:{peer.port}{STREAM_PATH}") as socket:
        await socket.send_bytes(struct.pack(">IB", 7, 200) + encode_frame(fetch(0)))
        await socket.send_bytes(struct.pack(">IB", 8, 3) + b"\x00\x00\x00\x05junk!")
        answers = {}
        for _ in range(2):
            data = (await socket.receive()).data
            correlation, status = struct.unpack_from(">IB", data)
            answers[correlation] = (status, data[5:].decode())
    assert answers[7][0] == 1 and "unknown rpc" in answers[7][1]
    assert answers[8][0] == 1 and "JSON" in answers[8][1]


async def test_each_rpc_is_also_a_post(peer: Peer) -> None:
    async with aiohttp.ClientSession() as session, session.post(
            f"http://127.0.0.1:{peer.port}/raft/v1/Fetch", data=encode_frame(fetch(3))) as reply:
        assert reply.status == 200
        assert decode_frame(FetchResponse, await reply.read()).high_watermark == 3
