"""A fake leader for the process tests: a process on a stopped voter's controller port that
claims to lead an epoch it never won, as one node's credential (the quorum's peer secret, or a
node's certificate) allows, and answers the followers' fetches with whatever the test wants.
Peer RPCs are forged as POSTs to ``/raft/v1/<Rpc>`` through ``forge``."""

from __future__ import annotations

import asyncio
import struct
import threading
import urllib.request
from collections.abc import Callable
from typing import cast

from aiohttp import WSMsgType, web
from proc_cluster import PEER_SECRET_HEADER, NodeProcess, ProcessCluster

from quorum_node.node.transport import (
    CONTENT_TYPE,
    REQUEST_TYPES,
    RESPONSE_TYPES,
    STREAM_PATH,
    decode_frame,
    encode_frame,
)
from quorum_node.raft.messages import (
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochResponse,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    RaftRequest,
    RaftResponse,
    SnapshotIdField,
    VoteRequest,
    VoteResponse,
)
from quorum_node.raft.snapshots import SnapshotId
from quorum_node.raft.types import Errors

RPC_NAMES = {cls: name for name, cls in REQUEST_TYPES.items()}
_TAG = struct.Struct(">IB")  # the stream's request/response tag (see transport.py)
_REQUEST_CLASSES = tuple(REQUEST_TYPES.values())


def forge(cluster: ProcessCluster, node: NodeProcess, message: RaftRequest) -> RaftResponse:
    """POST one peer RPC to a node's controller listener, as an insider holding the quorum's
    peer secret could; the node's answer."""
    request = urllib.request.Request(
        f"{node.peer_url}/raft/v1/{RPC_NAMES[type(message)]}", data=encode_frame(message),
        method="POST", headers={"Content-Type": CONTENT_TYPE,
                                PEER_SECRET_HEADER: cluster.peer_secret})
    with urllib.request.urlopen(request, timeout=5) as reply:
        answer = decode_frame(RESPONSE_TYPES[type(message)], reply.read())
    assert isinstance(answer, VoteResponse | BeginQuorumEpochResponse | EndQuorumEpochResponse
                      | FetchResponse)
    return answer


class FakeLeader:
    """Serves a stopped voter's port and claims to lead ``epoch``. Its first answer to each
    follower's Fetch is ``records_for(fetch)`` (records, with a high watermark at their end),
    or, given ``snapshot``, that snapshot's id, whose bytes it then serves to FetchSnapshot;
    after that it answers every Fetch with an error, so that the followers time out and elect.
    ``served``: the replicas that got the records, or the snapshot's last byte."""

    def __init__(self, port: int, node_id: int, epoch: int,
                 records_for: Callable[[FetchRequest], tuple[bytes, int]] | None = None,
                 snapshot: tuple[SnapshotId, bytes] | None = None) -> None:
        assert (records_for is None) != (snapshot is None)
        self.node_id, self.epoch = node_id, epoch
        self._records_for, self._snapshot = records_for, snapshot
        self.served: set[int] = set()
        self._answered: set[int] = set()  # replicas whose first Fetch was answered
        self._streams: set[web.WebSocketResponse] = set()
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(port, started), daemon=True)
        self._thread.start()
        assert started.wait(5)

    def _run(self, port: int, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_get(STREAM_PATH, self._stream)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", port, reuse_address=True)
        self._loop.run_until_complete(site.start())
        started.set()
        self._loop.run_forever()

    def close(self) -> None:
        async def stop() -> None:
            assert self._runner is not None
            for stream in list(self._streams):
                await stream.close()
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _stream(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self._streams.add(ws)
        async for message in ws:
            if message.type != WSMsgType.BINARY:
                continue
            correlation, index = _TAG.unpack_from(message.data)
            cls = _REQUEST_CLASSES[index]
            rpc: RaftRequest = decode_frame(cls, message.data[_TAG.size:])
            answer = self._answer(rpc)
            await ws.send_bytes(_TAG.pack(correlation, 0) + encode_frame(answer))
        self._streams.discard(ws)
        return ws

    def _answer(self, rpc: RaftRequest) -> Message:
        lead = {"leader_id": self.node_id, "leader_epoch": self.epoch}
        if isinstance(rpc, FetchRequest):
            if rpc.replica_id in self._answered or rpc.current_leader_epoch != self.epoch:
                return FetchResponse(error_code=Errors.NOT_LEADER_OR_FOLLOWER, **lead)
            self._answered.add(rpc.replica_id)
            if self._snapshot is not None:
                snapshot_id, _ = self._snapshot
                return FetchResponse(snapshot_id=SnapshotIdField(
                    end_offset=snapshot_id.end_offset, epoch=snapshot_id.epoch), **lead)
            assert self._records_for is not None
            self.served.add(rpc.replica_id)
            records, high_watermark = self._records_for(rpc)
            return FetchResponse(high_watermark=high_watermark, records=records, **lead)
        if isinstance(rpc, FetchSnapshotRequest) and self._snapshot is not None:
            return self._snapshot_chunk(rpc, lead)
        if isinstance(rpc, VoteRequest):
            return VoteResponse(**lead)
        if isinstance(rpc, BeginQuorumEpochRequest):
            return BeginQuorumEpochResponse(error_code=Errors.FENCED_LEADER_EPOCH, **lead)
        response_type = cast("type[RaftResponse]", RESPONSE_TYPES[type(rpc)])
        return response_type(error_code=Errors.NOT_LEADER_OR_FOLLOWER, **lead)

    def _snapshot_chunk(self, rpc: FetchSnapshotRequest, lead: dict[str, int]
                        ) -> FetchSnapshotResponse:
        assert self._snapshot is not None
        snapshot_id, data = self._snapshot
        chunk = data[rpc.position:rpc.position + min(rpc.max_bytes, 64 * 1024)]
        if rpc.position + len(chunk) >= len(data):
            self.served.add(rpc.replica_id)
        return FetchSnapshotResponse(
            snapshot_id=SnapshotIdField(end_offset=snapshot_id.end_offset,
                                        epoch=snapshot_id.epoch),
            size=len(data), position=rpc.position, records=chunk, **lead)
