"""The physical floor of a pull-based commit on this machine, measured beside the systems in
the same run: what no implementation of the protocol can go below here.

A lone put's commit waits for, at least::

    client -> leader                  half a round trip
    leader appends; its Fetch answer  half a round trip   (the leader's own fsync overlaps
      reaches a follower                                    from here to the follower's ack)
    the follower appends, fsyncs      one fsync
    its next Fetch -> leader          half a round trip   (the high watermark advances)
    leader -> client                  half a round trip

so the floor is two loopback round trips of the transport (the client's stream and the peers'
are both WebSockets) and one fsync of a small append. Each is measured the way the nodes do it:
the fsync of a small append to a file on the filesystem of the data directories, and a round
trip of a small binary WebSocket message between two processes (aiohttp, the peers' library),
with a raw TCP round trip (TCP_NODELAY) beside it for what the WebSocket framing and the event
loops add.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import socket
import statistics
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

MESSAGE = b"m" * 200  # about a Fetch request's frame
ROUND_TRIPS = 1000
FSYNCS = 300


def fsync_append_ms(directory: Path, count: int = FSYNCS) -> list[float]:
    """Append ``len(MESSAGE)`` bytes to a file in ``directory`` and fsync, ``count`` times:
    each fsync's time (ms), as the log's flush does after an append."""
    path = directory / "floor-fsync.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    samples = []
    try:
        os.fsync(fd)  # the file's creation is not what is measured
        for _ in range(count):
            os.write(fd, MESSAGE)
            started = time.perf_counter()
            os.fsync(fd)
            samples.append((time.perf_counter() - started) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return sorted(samples)


def _serve_echo(ready: Connection) -> None:
    """In a child process: a WebSocket and a raw TCP echo on loopback; sends their ports."""

    async def websocket(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(compress=False)
        await ws.prepare(request)
        async for message in ws:
            await ws.send_bytes(message.data)
        return ws

    async def tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)

    async def main() -> None:
        app = web.Application()
        app.add_routes([web.get("/echo", websocket)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ws_port = runner.addresses[0][1]
        server = await asyncio.start_server(tcp, "127.0.0.1", 0)
        tcp_port = server.sockets[0].getsockname()[1]
        ready.send((ws_port, tcp_port))
        await asyncio.get_running_loop().run_in_executor(None, ready.recv)  # until told to stop

    asyncio.run(main())


async def _websocket_round_trips(port: int, count: int) -> list[float]:
    samples = []
    async with aiohttp.ClientSession() as session, \
            session.ws_connect(f"http://127.0.0.1:{port}/echo", compress=0) as ws:
        for _ in range(count):
            started = time.perf_counter()
            await ws.send_bytes(MESSAGE)
            await ws.receive()
            samples.append((time.perf_counter() - started) * 1000)
    return sorted(samples)


def _tcp_round_trips(port: int, count: int) -> list[float]:
    samples = []
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count):
            started = time.perf_counter()
            sock.sendall(MESSAGE)
            received = 0
            while received < len(MESSAGE):
                received += len(sock.recv(65536))
            samples.append((time.perf_counter() - started) * 1000)
    return sorted(samples)


def measure_floor(directory: Path, round_trips: int = ROUND_TRIPS,
                  fsyncs: int = FSYNCS) -> dict[str, Any]:
    """The floor's parts (p50 and p99, ms) and the floor itself: two WebSocket round trips and
    one fsync (the module's docstring says which hops)."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    server = context.Process(target=_serve_echo, args=(theirs,), daemon=True)
    server.start()
    try:
        ws_port, tcp_port = ours.recv()
        _tcp_round_trips(tcp_port, 50)  # warm-up
        tcp = _tcp_round_trips(tcp_port, round_trips)
        ws = asyncio.run(_websocket_round_trips(ws_port, round_trips))
    finally:
        ours.send("stop")
        server.join(10)
        if server.is_alive():
            server.kill()
    fsync = fsync_append_ms(directory, fsyncs)
    parts = {"fsync_ms": fsync, "websocket_rtt_ms": ws, "tcp_rtt_ms": tcp}
    result: dict[str, Any] = {
        name: {"p50": statistics.median(samples), "p99": _p99(samples)}
        for name, samples in parts.items()}
    result["commit_floor_ms"] = {
        quantile: 2 * result["websocket_rtt_ms"][quantile] + result["fsync_ms"][quantile]
        for quantile in ("p50", "p99")}
    result["hops"] = ("client->leader, leader's Fetch answer->follower, follower append + "
                      "fsync, next Fetch->leader (HWM), leader->client: 2 WebSocket round trips "
                      "+ 1 fsync; the leader's own fsync overlapped")
    return result


def _p99(ordered: list[float]) -> float:
    return ordered[min(len(ordered) - 1, max(0, int(len(ordered) * 0.99) - 1))]
