"""A node's security, built from its configuration: the reloading TLS contexts (None without an
SSL listener), the authorizers, the peer secret of a PLAINTEXT controller listener, which
connections a controller listener admits, and the task that reloads certificates, tokens and the
secret (a changed secret is announced: what was opened with the old one is closed)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Protocol

from aiohttp import web

from quorum_node.security.authorization import IDENTITY_KEY, Authorizer
from quorum_node.security.file_watch import Reloading
from quorum_node.security.peer_identity import PeerPrincipals
from quorum_node.security.peer_secret import (
    PeerSecretError,
    load_peer_secret,
    peer_secret_middleware,
)
from quorum_node.security.roles import Role, parse_principal_grants, roles_of_principal
from quorum_node.security.tls import (
    ReloadingTls,
    TlsFiles,
    TlsFilesError,
    certificate_common_names,
)
from quorum_node.security.tokens import TokenFileError, TokenTable

logger = logging.getLogger(__name__)

Middleware = Callable[..., Awaitable[web.StreamResponse]]


class Listener(Protocol):
    """What the security reads of one of the node's listeners (``node.config.Listener`` answers
    it; warnings print it as it prints itself): only its protocol."""

    @property
    def tls(self) -> bool: ...


class SecurityConfig(Protocol):
    """What a node's security is built from: the keys of docs/security.md and the listeners.
    The node's configuration (``node.config.NodeConfig``) answers it, so security depends on no
    module of the node: the node points at its security, never the other way."""

    @property
    def ssl_certificate_location(self) -> Path | None: ...
    @property
    def ssl_key_location(self) -> Path | None: ...
    @property
    def ssl_ca_location(self) -> Path | None: ...
    @property
    def ssl_endpoint_identification_algorithm(self) -> str: ...
    @property
    def auth_token_file(self) -> Path | None: ...
    @property
    def auth_certificate_roles(self) -> str: ...
    @property
    def auth_peer_principal_template(self) -> str: ...
    @property
    def controller_listener_secret_file(self) -> Path | None: ...
    @property
    def security_reload_interval_ms(self) -> int: ...
    @property
    def any_tls(self) -> bool: ...
    @property
    def combined_listener(self) -> bool: ...
    @property
    def controller_listener(self) -> Listener: ...
    @property
    def controller_listeners(self) -> Sequence[Listener]: ...
    @property
    def client_listeners(self) -> Sequence[Listener]: ...


class SecuritySetupError(ValueError):
    """A certificate, key, CA, token or secret file cannot be loaded at start-up; one line."""


class NodeSecurity:
    def __init__(self, config: SecurityConfig) -> None:
        self.tls: ReloadingTls | None = None
        self.tokens: Reloading[TokenTable] | None = None
        self.peer_secret: Reloading[str] | None = None
        self.reload_interval_s = config.security_reload_interval_ms / 1000
        # Called when the peer secret changes: they close what was opened with the old one.
        self.on_peer_secret_change: list[Callable[[], None]] = []
        self._config = config
        if config.any_tls:
            assert config.ssl_certificate_location is not None
            assert config.ssl_key_location is not None
            assert config.ssl_ca_location is not None
            files = TlsFiles(config.ssl_certificate_location, config.ssl_key_location,
                             config.ssl_ca_location,
                             check_hostname=config.ssl_endpoint_identification_algorithm == "https")
            try:
                self.tls = ReloadingTls(files)
            except TlsFilesError as error:
                raise SecuritySetupError(f"ssl: {error}") from None
        token_file = config.auth_token_file
        if token_file is not None:
            try:
                self.tokens = Reloading([token_file], lambda: TokenTable.load(token_file),
                                        "token file")
            except TokenFileError as error:
                raise SecuritySetupError(f"auth.token.file: {error}") from None
        secret_file = config.controller_listener_secret_file
        if secret_file is not None:
            try:
                self.peer_secret = Reloading([secret_file], lambda: load_peer_secret(secret_file),
                                             "controller listener secret")
            except PeerSecretError as error:
                raise SecuritySetupError(f"controller.listener.secret.file: {error}") from None
        tokens = self.tokens
        grants = parse_principal_grants(config.auth_certificate_roles)
        self._grants = grants
        token_table = (lambda: tokens.current) if tokens is not None else None
        self._peers = PeerPrincipals(config.auth_peer_principal_template)
        # By protocol: whether a listener can see client certificates decides what it asks for.
        self._authorizers = {
            tls: Authorizer(tls=tls, grants=grants, tokens=token_table, peers=self._peers)
            for tls in (False, True)
        }

    @property
    def authorizer(self) -> Authorizer:
        """The authorizer of the client listeners."""
        return self._authorizers[self._config.client_listeners[0].tls]

    def authenticates(self, listener: Listener) -> bool:
        """Whether requests on ``listener`` carry credentials (over SSL, or with tokens)."""
        return self._authorizers[listener.tls].enabled

    def peer_authorizer(self, listener: Listener) -> Authorizer:
        """The authorizer of a controller listener: over SSL it tells which node a peer is."""
        return self._authorizers[listener.tls]

    @property
    def peer_tls(self) -> ReloadingTls | None:
        """The TLS contexts towards the peers: None when this node connects to them on a
        PLAINTEXT controller listener."""
        return self.tls if self._config.controller_listener.tls else None

    def current_peer_secret(self) -> str | None:
        """What this node sends its peers in X-Quorum-Peer-Secret (None: nothing). Only over
        PLAINTEXT: a peer's SSL listener identifies this node by its certificate."""
        if self.peer_secret is None or self._config.controller_listener.tls:
            return None
        return self.peer_secret.current

    def middlewares(self, listener: Listener, *, serves_peers: bool) -> list[Middleware]:
        """What refuses requests on ``listener`` before any handler runs: the peer secret (on a
        PLAINTEXT listener serving peers, when configured), then the authorizer."""
        chain: list[Middleware] = []
        secret = self.peer_secret
        if serves_peers and not listener.tls and secret is not None:
            chain.append(peer_secret_middleware(lambda: secret.current))
        chain.append(self._authorizers[listener.tls].middleware())
        return chain

    def admits_peer(self, transport: asyncio.Transport) -> str | None:
        """Why a connection to an SSL listener that serves peers only is refused at once,
        after its handshake: it presented no certificate of a node (one common name, the
        template's); None if it did. Without one, no request on it could be served."""
        names = certificate_common_names(transport.get_extra_info("peercert"))
        if len(names) == 1 and self._peers.node_id_of(names[0]) is not None:
            return None
        return "no node certificate" if not names else f"not a node's certificate ({names[0]})"

    def admits_peer_or_admin(self, transport: asyncio.Transport) -> str | None:
        """As ``admits_peer``, for an SSL controller listener that also serves Kafka's admin
        protocol: a connection is kept, until its first byte says which protocol it speaks,
        when some request on it could be served: a node's certificate (peer RPCs), a
        certificate of the admin role, or none where tokens could authenticate (SASL/PLAIN)."""
        refusal = self.admits_peer(transport)
        if refusal is None or self.tokens is not None:
            return None
        names = certificate_common_names(transport.get_extra_info("peercert"))
        if len(names) == 1 and Role.ADMIN in roles_of_principal(self._grants, names[0]):
            return None
        return refusal

    @staticmethod
    def principal_of(request: web.Request) -> str | None:
        """Who the authorization let ``request`` through as (None: no credential needed)."""
        identity = request.get(IDENTITY_KEY)
        return identity.principal if identity is not None else None

    def warn_if_open(self) -> None:
        """Warn, once at start, about each way the configuration leaves the node open."""
        config = self._config
        if config.combined_listener:
            logger.warning("one listener, %s, serves peers, clients and admin: a client that "
                           "reaches it also reaches the peer RPCs; set controller.listener.names "
                           "to give the peers a listener of their own", config.controller_listener)
        for controller in config.controller_listeners:
            self._warn_if_open_to_peers(controller)
        for listener in config.client_listeners:
            if listener.tls:
                continue
            if self.tokens is None:
                logger.warning("%s is PLAINTEXT without auth.token.file: anyone who can reach it "
                               "can read, write and change the voters (fine for a local quorum "
                               "only; see docs/security.md)", listener)
            else:
                logger.warning("%s is PLAINTEXT: bearer tokens and data cross the network in "
                               "the clear", listener)

    def _warn_if_open_to_peers(self, controller: Listener) -> None:
        if not controller.tls and self.peer_secret is None:
            logger.warning("peer RPCs on the PLAINTEXT listener %s are open: anyone who can reach "
                           "it can vote, claim leadership and fetch every record (set "
                           "controller.listener.secret.file, or use SSL; see docs/security.md)",
                           controller)
        elif not controller.tls:
            logger.warning("peer RPCs on the PLAINTEXT listener %s are authenticated by the "
                           "shared secret only: anyone who can see the traffic learns it and "
                           "every record (SSL on any network that is not trusted)", controller)

    async def reload_forever(self) -> None:
        """Check the files every reload interval (a Kubernetes Secret is rotated in place)."""
        reloading = [r for r in (self.tls, self.tokens) if r is not None]
        while reloading or self.peer_secret is not None:
            await asyncio.sleep(self.reload_interval_s)
            for item in reloading:
                item.reload_if_changed()
            self._reload_peer_secret()

    def _reload_peer_secret(self) -> None:
        secret = self.peer_secret
        if secret is None:
            return
        previous = secret.current
        if not secret.reload_if_changed() or secret.current == previous:
            return
        for hook in self.on_peer_secret_change:
            try:
                hook()
            except Exception:  # one hook's failure must not keep the others from closing
                logger.exception("closing what the previous peer secret opened failed")
