"""Stand-ins for a node on loopback, for the client's tests: an HTTP server whose handler
answers as a test needs, and a port nobody listens on."""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any


def closed_port() -> int:
    """A port nobody listens on (a node that was killed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def send_json(handler: http.server.BaseHTTPRequestHandler, status: int,
              document: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    """Answer ``handler``'s request with a JSON body, as a node does."""
    body = json.dumps(document).encode()
    handler.send_response(status)
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@contextlib.contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[int]:
    """Serve ``handler`` on a loopback port for the block; the port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
