"""Bearer tokens from a file (``auth.token.file``), one per line::

    # TOKEN                                 PRINCIPAL        ROLES
    3q2+7w...at least 16 characters...      quorum-operator  admin
    Zm9vYmFy...                             billing-app      read,write

Tokens are looked up by their SHA-256 digest, so that the comparison does not depend on how many
leading characters of a guess are right. ``peer`` cannot be granted to a token: peers are nodes,
identified by their certificates.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from quorum_node.security.roles import Role, effective_roles, parse_roles

MIN_TOKEN_CHARS = 16


class TokenFileError(ValueError):
    """The token file cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class TokenHolder:
    principal: str
    roles: frozenset[Role]


class TokenTable:
    def __init__(self, holders: dict[bytes, TokenHolder]) -> None:
        self._by_digest = holders

    def __len__(self) -> int:
        return len(self._by_digest)

    def lookup(self, token: str) -> TokenHolder | None:
        return self._by_digest.get(_digest(token))

    @classmethod
    def parse(cls, text: str, source: str) -> TokenTable:
        holders: dict[bytes, TokenHolder] = {}
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            fields = line.split()
            where = f"{source}, line {number}"
            if len(fields) != 3:
                raise TokenFileError(f"{where}: expected TOKEN PRINCIPAL ROLES, got "
                                     f"{len(fields)} fields")
            token, principal, role_text = fields
            if len(token) < MIN_TOKEN_CHARS:
                raise TokenFileError(f"{where}: the token of {principal!r} is shorter than "
                                     f"{MIN_TOKEN_CHARS} characters")
            if "peer" in role_text.lower().replace("+", ",").split(","):
                raise TokenFileError(f"{where}: a token cannot have the peer role (peers are "
                                     "identified by their certificates)")
            try:
                roles = parse_roles(role_text)
            except ValueError as error:
                raise TokenFileError(f"{where}: {error}") from None
            digest = _digest(token)
            if digest in holders:
                raise TokenFileError(f"{where}: the token of {principal!r} is also "
                                     f"{holders[digest].principal!r}'s")
            holders[digest] = TokenHolder(principal, effective_roles(roles))
        return cls(holders)

    @classmethod
    def load(cls, path: Path) -> TokenTable:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise TokenFileError(f"{path}: unreadable: {error}") from None
        return cls.parse(text, str(path))


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
