"""A node's security, built from its configuration: the reloading TLS contexts (None on a
PLAINTEXT listener), the authorizer, and the task that reloads certificates and tokens."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from quorum_node.security.authorization import Authorizer
from quorum_node.security.file_watch import Reloading
from quorum_node.security.peer_identity import PeerPrincipals
from quorum_node.security.roles import parse_principal_grants
from quorum_node.security.tls import ReloadingTls, TlsFiles, TlsFilesError
from quorum_node.security.tokens import TokenFileError, TokenTable

if TYPE_CHECKING:
    from quorum_node.node.config import NodeConfig

logger = logging.getLogger(__name__)


class SecuritySetupError(ValueError):
    """A certificate, key, CA or token file cannot be loaded at start-up; one line."""


class NodeSecurity:
    def __init__(self, config: NodeConfig) -> None:
        self.tls: ReloadingTls | None = None
        self.tokens: Reloading[TokenTable] | None = None
        self.reload_interval_s = config.security_reload_interval_ms / 1000
        if config.listen_tls:
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
        tokens = self.tokens
        self.authorizer = Authorizer(
            tls=self.tls is not None,
            grants=parse_principal_grants(config.auth_certificate_roles),
            tokens=(lambda: tokens.current) if tokens is not None else None,
            peers=PeerPrincipals(config.auth_peer_principal_template))

    def warn_if_open(self, listener: str) -> None:
        if self.tls is None and self.tokens is None:
            logger.warning("%s is PLAINTEXT without auth.token.file: anyone who can reach it can "
                           "read, write and change the voters (fine for a local quorum only; "
                           "see docs/security.md)", listener)
        elif self.tls is None:
            logger.warning("%s is PLAINTEXT: bearer tokens and data cross the network in the "
                           "clear, and peers are not authenticated", listener)

    async def reload_forever(self) -> None:
        """Check the files every reload interval (a Kubernetes Secret is rotated in place)."""
        reloading = [r for r in (self.tls, self.tokens) if r is not None]
        while reloading:
            await asyncio.sleep(self.reload_interval_s)
            for item in reloading:
                item.reload_if_changed()
