"""The quorum's shared secret for peer RPCs on a PLAINTEXT controller listener
(``controller.listener.secret.file``).

Without TLS a node cannot prove who it is; the secret at least proves that a caller could read the
file, which a client or a host that merely reaches the port cannot. Every peer RPC (the stream's
WebSocket handshake and each POST) carries it in ``X-Quorum-Peer-Secret``; a request without it is
refused with 401 before its handler runs, so it changes nothing. What it does not protect against
(anyone who can see the traffic learns it) is in docs/security.md.
"""

from __future__ import annotations

import hmac
import logging
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

from aiohttp import web

from quorum_node.security.authorization import RAFT_PREFIX

PEER_SECRET_HEADER: Final = "X-Quorum-Peer-Secret"
MIN_SECRET_CHARS: Final = 16
# Printable ASCII without spaces: it travels as an HTTP header value.
_SECRET = re.compile(r"[!-~]+")
_AUDIT_REPEAT_S = 10.0

audit_log = logging.getLogger("quorum_node.audit")


class PeerSecretError(ValueError):
    """The secret file cannot be used; one line naming it."""


def load_peer_secret(path: Path) -> str:
    """The secret: the file's one non-empty line."""
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as error:
        raise PeerSecretError(f"{path}: unreadable: {error}") from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) != 1:
        raise PeerSecretError(f"{path}: expected the secret on one line, found {len(lines)} "
                              "non-empty lines")
    secret = lines[0]
    if not _SECRET.fullmatch(secret) or len(secret) < MIN_SECRET_CHARS:
        raise PeerSecretError(f"{path}: the secret must be at least {MIN_SECRET_CHARS} printable "
                              "ASCII characters without spaces")
    return secret


def peer_secret_middleware(secret: Callable[[], str]
                           ) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Refuse (401, one line) every routed peer RPC whose ``X-Quorum-Peer-Secret`` is not the
    current ``secret()``; other routes pass through."""
    last_logged: dict[str, float] = {}

    @web.middleware
    async def check_peer_secret(
            request: web.Request,
            handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        route = request.match_info.route
        if request.match_info.http_exception is not None or route.resource is None \
                or not route.resource.canonical.startswith(RAFT_PREFIX):
            return await handler(request)  # 404, 405 and the other routes: not ours
        offered = request.headers.get(PEER_SECRET_HEADER)
        expected = secret().encode()
        if offered is not None and hmac.compare_digest(
                offered.encode("utf-8", "surrogateescape"), expected):
            return await handler(request)
        why = ("missing" if offered is None else "wrong") + f" {PEER_SECRET_HEADER}"
        remote = request.remote or "-"
        now = time.monotonic()
        if now - last_logged.get(remote, -_AUDIT_REPEAT_S) >= _AUDIT_REPEAT_S:
            if len(last_logged) > 10_000:
                last_logged.clear()  # bounded, whatever the callers' addresses
            last_logged[remote] = now
            audit_log.warning("denied status=401 method=%s path=%s remote=%s reason=%r",
                              request.method, request.path, remote, why)
        return web.Response(status=401, text=f"peer RPC refused: {why} (the quorum's "
                                             "controller.listener.secret.file)\n")

    return check_peer_secret
