"""What a client (``QuorumClient``, ``quorum-client``, ``quorum-admin``, the operator) presents
to a secured quorum: a bearer token, and for TLS the CA to trust and optionally its own
certificate and key (mutual TLS, the certificate's common name being its principal). Standard
library only, as the client is."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path


class CredentialsError(ValueError):
    """A credential file cannot be used; one line naming it."""


@dataclass(frozen=True)
class ClientCredentials:
    token: str | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    check_hostname: bool = True

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise CredentialsError("a client certificate needs its key, and a key its "
                                   "certificate")

    @classmethod
    def from_files(cls, *, token_file: Path | None = None, ca_file: Path | None = None,
                   cert_file: Path | None = None, key_file: Path | None = None
                   ) -> ClientCredentials:
        """Read the token (the file's first non-empty line; a Kubernetes Secret key works)."""
        token = None
        if token_file is not None:
            try:
                token = token_file.read_text(encoding="utf-8").strip().splitlines()[0].strip()
            except (OSError, UnicodeDecodeError) as error:
                raise CredentialsError(f"token file {token_file}: unreadable: {error}") from None
            except IndexError:
                raise CredentialsError(f"token file {token_file} is empty") from None
        return cls(token, ca_file, cert_file, key_file)

    @property
    def uses_tls(self) -> bool:
        return self.ca_file is not None or self.cert_file is not None

    def ssl_context(self) -> ssl.SSLContext:
        """The context for https:// servers: the CA given (else the system's), and the client
        certificate if one is given."""
        try:
            context = ssl.create_default_context(
                cafile=str(self.ca_file) if self.ca_file is not None else None)
        except (OSError, ssl.SSLError) as error:
            raise CredentialsError(f"CA file {self.ca_file}: {error}") from None
        context.check_hostname = self.check_hostname
        if self.cert_file is not None and self.key_file is not None:
            try:
                context.load_cert_chain(str(self.cert_file), str(self.key_file))
            except (OSError, ssl.SSLError) as error:
                raise CredentialsError(f"certificate {self.cert_file} with key "
                                       f"{self.key_file}: {error}") from None
        return context

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token is not None else {}
