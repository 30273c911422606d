"""Who may call which route: credentials to a principal and roles, the role each route needs,
and an aiohttp middleware that refuses (401 without a valid credential, 403 without the role)
before the handler runs, so that a refused request changes nothing. Every refusal, and every
admin request, is written to the ``quorum_node.audit`` log.

A credential is a bearer token (``Authorization: Bearer ...``) or, over TLS, the verified client
certificate's one subject common name (a certificate with several is refused). A token, when sent,
decides: a wrong one is refused even on a connection with a good certificate.

Peers: over TLS, a certificate whose common name is a node's (``auth.peer.principal.template``)
may open the peer routes, and each request on them must then name that node as its sender
(``check_peer_claim``): a node's certificate speaks for that one node id.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from aiohttp import web

from quorum_node.security.peer_identity import PeerPrincipals
from quorum_node.security.roles import PrincipalGrant, Role, roles_of_principal
from quorum_node.security.tls import certificate_common_names
from quorum_node.security.tokens import TokenTable

audit_log = logging.getLogger("quorum_node.audit")

# (method, route pattern) -> the role it needs; None: open (probes, metrics, the API's
# description). HEAD is GET's. A routed request missing here needs admin (fail closed), and the
# Raft RPCs (RAFT_PREFIX) need peer.
ROUTE_ROLES: Final[dict[tuple[str, str], Role | None]] = {
    ("GET", "/healthz"): None,
    ("GET", "/readyz"): None,
    ("GET", "/metrics"): None,
    ("GET", "/v1/openapi.json"): None,
    ("GET", "/v1/records"): Role.READ,
    ("POST", "/v1/records"): Role.WRITE,
    ("GET", "/v1/kv"): Role.READ,
    ("GET", "/v1/watch"): Role.READ,
    ("GET", "/v1/kv/{key}"): Role.READ,
    ("PUT", "/v1/kv/{key}"): Role.WRITE,
    ("DELETE", "/v1/kv/{key}"): Role.WRITE,
    ("POST", "/v1/kv/{key}/cas"): Role.WRITE,
    ("POST", "/v1/txn"): Role.WRITE,  # a txn of gets only too, as the stream's TXN
    # The binary client protocol: opening a stream needs read; each write on it, write.
    ("GET", "/v1/stream"): Role.READ,
    ("GET", "/v1/node"): Role.ADMIN,
    ("GET", "/v1/quorum"): Role.ADMIN,
    ("POST", "/v1/quorum/voters"): Role.ADMIN,
    ("DELETE", "/v1/quorum/voters/{id}/{directory_id}"): Role.ADMIN,
    ("GET", "/v1/backup"): Role.ADMIN,
}
RAFT_PREFIX: Final = "/raft/"
_AUDIT_REPEAT_S = 10.0


def required_role(method: str, pattern: str) -> Role | None:
    if pattern.startswith(RAFT_PREFIX):
        return Role.PEER
    return ROUTE_ROLES.get(("GET" if method == "HEAD" else method, pattern), Role.ADMIN)


@dataclass(frozen=True)
class Identity:
    principal: str
    roles: frozenset[Role]
    via: str  # "token" or "certificate"


# The identity the middleware let a request through with (absent when credentials are not
# required): a stream checks each operation on it against its roles.
IDENTITY_KEY: Final = web.RequestKey("identity", Identity)


class Refused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class Authorizer:
    """Decides on requests. ``tokens`` is called for the current table (it may be reloaded);
    None when no token file is configured."""

    def __init__(self, *, tls: bool, grants: tuple[PrincipalGrant, ...],
                 tokens: Callable[[], TokenTable] | None,
                 peers: PeerPrincipals | None = None) -> None:
        self.tls = tls
        self.grants = grants
        self.peers = peers if peers is not None else PeerPrincipals()
        self._tokens = tokens
        self._audit = _AuditLog()

    @property
    def enabled(self) -> bool:
        """Credentials are required: over TLS, or whenever tokens are configured."""
        return self.tls or self._tokens is not None

    def identify(self, authorization: str | None, peercert: object) -> Identity | None:
        """The caller's identity; None without any credential. Raises Refused (401) for a
        credential that is not valid."""
        if authorization is not None:
            scheme, _, token = authorization.strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Refused(401, "UNAUTHENTICATED",
                              "unsupported Authorization header: send 'Bearer <token>'")
            holder = self._tokens().lookup(token.strip()) if self._tokens is not None else None
            if holder is None:
                raise Refused(401, "UNAUTHENTICATED", "the bearer token is not valid")
            return Identity(holder.principal, holder.roles, "token")
        principal = self._certificate_principal(peercert) if self.tls else None
        if principal is None:
            return None
        roles = roles_of_principal(self.grants, principal)
        if self.peers.node_id_of(principal) is not None:
            roles |= {Role.PEER}
        return Identity(principal, roles, "certificate")

    @staticmethod
    def _certificate_principal(peercert: object) -> str | None:
        names = certificate_common_names(peercert)
        if len(names) > 1:
            # Which one would count is a choice of this server, not of the CA: take none.
            raise Refused(401, "UNAUTHENTICATED",
                          f"the client certificate holds {len(names)} subject common names "
                          f"({', '.join(names)}); exactly one is required")
        return names[0] if names else None

    def peer_node_id(self, request: web.Request) -> int | None:
        """The node id the connection's certificate speaks for, which every peer request on it
        must name as its sender; None when peers are not identified by certificates (a
        PLAINTEXT listener). Raises Refused (401, 403) for a connection that is not a peer's
        (the middleware has refused it already; this fails closed all the same)."""
        if not self.tls:
            return None
        identity = self.check(Role.PEER, None, _peercert(request))
        node_id = self.peers.node_id_of(identity.principal)
        if node_id is None:
            raise Refused(403, "FORBIDDEN", f"{identity.principal} is not a node's certificate")
        return node_id

    def check_peer_claim(self, request: web.Request, peer_node_id: int | None,
                         claimed_node_id: int) -> Refused | None:
        """None if a request naming ``claimed_node_id`` as its sender may come from this
        connection (``peer_node_id`` from ``peer_node_id``); else the refusal, audited."""
        if peer_node_id is None or claimed_node_id == peer_node_id:
            return None
        refusal = Refused(403, "FORBIDDEN",
                          f"{self.peers.principal_of(peer_node_id)} may speak as node "
                          f"{peer_node_id} only, not as node {claimed_node_id} (its certificate "
                          f"would need the common name {self.peers.principal_of(claimed_node_id)})")
        self._audit.denied(request, refusal)
        return refusal

    def check(self, role: Role, authorization: str | None, peercert: object) -> Identity:
        """The identity, if it holds ``role``; raises Refused (401 or 403) otherwise."""
        identity = self.identify(authorization, peercert)
        if identity is None:
            how = ("a node's certificate of the quorum's CA" if role is Role.PEER
                   else "a bearer token (Authorization: Bearer ...) or a client certificate"
                   if self.tls else "a bearer token (Authorization: Bearer ...)")
            raise Refused(401, "UNAUTHENTICATED", f"authentication required: send {how}")
        if role is Role.PEER and role not in identity.roles:
            raise Refused(403, "FORBIDDEN", f"{identity.principal} ({identity.via}) is no node "
                                            "of this quorum: a peer's certificate has its node's "
                                            f"common name, {self.peers.template}")
        if role not in identity.roles:
            held = ", ".join(sorted(r.value for r in identity.roles)) or "none"
            raise Refused(403, "FORBIDDEN", f"{identity.principal} ({identity.via}; roles: "
                                            f"{held}) may not do this: it needs the "
                                            f"{role.value} role")
        return identity

    def middleware(self) -> Callable[..., Awaitable[web.StreamResponse]]:
        @web.middleware
        async def authorize(request: web.Request,
                            handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                            ) -> web.StreamResponse:
            route = request.match_info.route
            if request.match_info.http_exception is not None or route.resource is None:
                return await handler(request)  # 404, 405: nothing to protect
            role = required_role(request.method, route.resource.canonical)
            # Without TLS, nodes have no way to prove who they are: peer RPCs stay open.
            if role is None or not self.enabled or (role is Role.PEER and not self.tls):
                return await handler(request)
            try:
                identity = self.check(role, request.headers.get("Authorization"),
                                      _peercert(request))
            except Refused as refusal:
                self._audit.denied(request, refusal)
                return refusal_response(refusal)
            request[IDENTITY_KEY] = identity
            response = await handler(request)
            if role is Role.ADMIN:
                self._audit.granted(request, identity, response.status)
            return response

        return authorize


def refusal_response(refusal: Refused) -> web.Response:
    # The error body of every endpoint (quorum_node.node.api.http).
    body = {"code": refusal.code, "message": refusal.message}
    headers = {"WWW-Authenticate": 'Bearer realm="quorum-node"'} if refusal.status == 401 else {}
    return web.json_response(body, status=refusal.status, headers=headers)


def _peercert(request: web.Request) -> object:
    transport = request.transport
    return transport.get_extra_info("peercert") if transport is not None else None


class _AuditLog:
    """One line per decision; the same refusal repeated (a peer retrying with a bad certificate)
    is logged once per _AUDIT_REPEAT_S, with how many were left out."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, ...], tuple[float, int]] = {}

    def denied(self, request: web.Request, refusal: Refused) -> None:
        remote = request.remote or "-"
        key = (remote, request.method, request.path, refusal.code, refusal.message)
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last[0] < _AUDIT_REPEAT_S:
            self._last[key] = (last[0], last[1] + 1)
            return
        if len(self._last) > 10_000:
            self._last.clear()  # bounded, whatever a client varies
        self._last[key] = (now, 0)
        repeated = f" repeated={last[1]}" if last is not None and last[1] else ""
        audit_log.warning("denied status=%d method=%s path=%s remote=%s reason=%r%s",
                          refusal.status, request.method, redacted_path(request), remote,
                          refusal.message, repeated)

    @staticmethod
    def granted(request: web.Request, identity: Identity, status: int) -> None:
        audit_log.info("allowed status=%d method=%s path=%s remote=%s principal=%s via=%s",
                       status, request.method, redacted_path(request), request.remote or "-",
                       identity.principal, identity.via)


# Query parameters whose values are never logged: a key containing any of these (access_token,
# client_secret, password, api_key, ...).
_SENSITIVE_QUERY_KEYS: Final = ("token", "secret", "password", "passwd", "credential", "auth",
                                "api_key", "apikey")
REDACTED: Final = "REDACTED"


def redacted_path(request: web.BaseRequest) -> str:
    """The request's path and query, with the values of sensitive query parameters replaced:
    a token sent as ``?access_token=...`` must not end up in the audit log."""
    url = request.rel_url
    if not url.query_string:
        return url.raw_path
    query = [(key, REDACTED if _sensitive(key) else value) for key, value in url.query.items()]
    return str(url.with_query(query))


def _sensitive(key: str) -> bool:
    lowered = key.lower()
    return any(word in lowered for word in _SENSITIVE_QUERY_KEYS)
