"""Clients written by hand on sockets, for the hostile-client tests: connections from a chosen
loopback address (all of 127.0.0.0/8 is this host), WebSockets opened by their HTTP upgrade,
frames sent in pieces, requests on a kept-alive connection, and what a node process holds."""

from __future__ import annotations

import base64
import http.client
import os
import socket
import ssl
import struct
import time
from pathlib import Path

from quorum_node.node.transport import STREAM_PATH


def connect(port: int, *, source: str = "127.0.0.1", context: ssl.SSLContext | None = None,
            receive_buffer: int | None = None) -> socket.socket:
    """A connection to ``127.0.0.1:port`` from ``source``, over TLS with ``context``; with
    ``receive_buffer``, the kernel buffers little of what the node sends (a client that does
    not read then stops the node's writes soon)."""
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.settimeout(10)
    if receive_buffer is not None:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    raw.bind((source, 0))
    raw.connect(("127.0.0.1", port))
    return context.wrap_socket(raw, server_hostname="127.0.0.1") if context else raw


def upgrade(connection: socket.socket, port: int, path: str,
            headers: dict[str, str] | None = None) -> socket.socket:
    """Open a WebSocket on ``connection`` (``path``, with ``headers``); asserts the 101."""
    key = base64.b64encode(os.urandom(16)).decode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    connection.sendall(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        f"{extra}\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = connection.recv(1)  # byte by byte: nothing past the head is taken
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head
    return connection


def open_raw_stream(port: int, context: ssl.SSLContext) -> ssl.SSLSocket:
    """A peer stream opened by hand, so that a test can send part of a message."""
    connection = connect(port, context=context)
    assert isinstance(connection, ssl.SSLSocket)
    upgrade(connection, port, STREAM_PATH)
    return connection


def binary_frame_head(length: int) -> bytes:
    """A masked binary frame's head (mask 0: the payload goes as it is)."""
    return bytes([0x82, 0x80 | 127]) + struct.pack(">Q", length) + b"\0\0\0\0"


def binary_frame(payload: bytes) -> bytes:
    return binary_frame_head(len(payload)) + payload


def request(connection: socket.socket, path: str, *, method: str = "GET",
            headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """One HTTP/1.1 request on a kept-alive ``connection``: the answer's status and body."""
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    connection.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())
    response = http.client.HTTPResponse(connection)
    response.begin()
    return response.status, response.read()


def seconds_until_closed(connection: socket.socket, within_s: float) -> float | None:
    """How long until the other side closes the connection (reading and dropping what it
    sends); None if it is still open after ``within_s``."""
    start = time.monotonic()
    while (left := within_s - (time.monotonic() - start)) > 0:
        connection.settimeout(left)
        try:
            if not connection.recv(65536):
                return time.monotonic() - start
        except TimeoutError:
            return None
        except (ConnectionError, ssl.SSLError, OSError):
            return time.monotonic() - start
    return None


def closed_unanswered(connection: socket.socket, within_s: float = 5) -> bool:
    """Whether the other side closes ``connection`` within ``within_s`` without a byte."""
    connection.settimeout(within_s)
    try:
        return connection.recv(1) == b""
    except (ConnectionError, ssl.SSLError):
        return True
    except TimeoutError:
        return False


def send_until_refused(connection: socket.socket, data_bytes: int) -> int:
    """Send up to ``data_bytes`` of payload in 1 MiB pieces; how many were sent before the
    other side stopped taking them."""
    chunk = bytes(1024 * 1024)
    sent = 0
    connection.settimeout(10)
    try:
        while sent < data_bytes:
            piece = chunk[:min(len(chunk), data_bytes - sent)]
            connection.sendall(piece)
            sent += len(piece)
    except (ConnectionError, ssl.SSLError, OSError):
        pass
    return sent


def rss_bytes(pid: int) -> int:
    """The resident memory of process ``pid``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")
