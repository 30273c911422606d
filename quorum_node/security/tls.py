"""TLS contexts of a node, rebuilt when their PEM files change.

One listener serves peers, clients and admin, so the server asks for a client certificate without
requiring one (``CERT_OPTIONAL``): a certificate that is presented must chain to the quorum's CA
or the handshake fails; a client with a bearer token needs none; and the peer routes require a
node's certificate, which speaks for that node only (``quorum_node.security.peer_identity``). A node
presents the same certificate when it connects to its peers, so the certificate must allow both
server and client authentication.

Reloading: the listening socket keeps one SSLContext for its lifetime, so that context only picks
the current one for each new connection (its SNI callback, which OpenSSL runs for every handshake,
with or without a server name, switches the connection to it). A certificate, key or CA bundle
that changes is loaded into a new context; established connections keep the one they started
with, until the node closes them (``ReloadingTls.on_reload``): a connection verified against a CA
that is no longer trusted must not outlive it, so after a reload every connection is made again
and verified against the current files. A file caught half-written (a key not matching its
certificate) keeps the previous context until the next check.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from quorum_node.security.file_watch import Reloading

logger = logging.getLogger(__name__)


class TlsFilesError(ValueError):
    """The certificate, key or CA files cannot be loaded; one line naming them."""


@dataclass(frozen=True)
class TlsFiles:
    certificate: Path
    key: Path
    ca: Path
    check_hostname: bool = True

    @property
    def paths(self) -> tuple[Path, Path, Path]:
        return (self.certificate, self.key, self.ca)


def server_context(files: TlsFiles) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    _load(context, files)
    context.verify_mode = ssl.CERT_OPTIONAL
    return context


def client_context(files: TlsFiles) -> ssl.SSLContext:
    """The context a node connects to its peers with: it presents its certificate and checks
    theirs (and, unless disabled, that it names the host it connects to)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    _load(context, files)
    context.check_hostname = files.check_hostname
    return context


def _load(context: ssl.SSLContext, files: TlsFiles) -> None:
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_verify_locations(cafile=str(files.ca))
    except (OSError, ssl.SSLError) as error:
        raise TlsFilesError(f"CA bundle {files.ca}: {_reason(error)}") from None
    try:
        context.load_cert_chain(str(files.certificate), str(files.key))
    except (OSError, ssl.SSLError) as error:
        raise TlsFilesError(f"certificate {files.certificate} with key {files.key}: "
                            f"{_reason(error)}") from None


def _reason(error: OSError | ssl.SSLError) -> str:
    if isinstance(error, ssl.SSLError):
        return error.reason or str(error)
    return error.strerror or str(error)


class ReloadingTls:
    """The node's server and client contexts, reloaded by ``reload_if_changed``."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._contexts = Reloading(
            files.paths, lambda: (server_context(files), client_context(files)),
            "TLS certificate, key and CA")
        # The context the listening socket holds; it only hands each handshake to the current.
        self.listening = server_context(files)
        self.listening.sni_callback = self._select
        # Called after each reload: they close the connections made under the old files.
        self.on_reload: list[Callable[[], None]] = []

    @property
    def client(self) -> ssl.SSLContext:
        return self._contexts.current[1]

    @property
    def reloads(self) -> int:
        return self._contexts.reloads

    def reload_if_changed(self) -> bool:
        if not self._contexts.reload_if_changed():
            return False
        for hook in self.on_reload:
            try:
                hook()
            except Exception:  # one hook's failure must not keep the others from closing
                logger.exception("closing the connections of the previous TLS files failed")
        return True

    def _select(self, connection: ssl.SSLObject | ssl.SSLSocket, _server_name: str | None,
                _context: ssl.SSLContext) -> None:
        connection.context = self._contexts.current[0]


def certificate_common_names(peercert: object) -> list[str]:
    """Every subject common name of a verified peer certificate (``getpeercert()``'s form), in
    order; none without a certificate."""
    if not isinstance(peercert, dict):
        return []
    return [value for rdn in peercert.get("subject", ()) for name, value in rdn
            if name == "commonName" and isinstance(value, str)]
