"""Roles and the grants of certificate principals.

``read`` < ``write`` < ``admin`` form a ladder (a writer may read, an administrator may do
everything a client may); ``peer`` stands apart: only the quorum's own nodes may send Raft RPCs,
and no other role implies it. ``peer`` is never granted: over SSL a node's certificate holds it by
its common name (``quorum_node.security.peer_identity``), so no pattern can make a client's
certificate of the same CA, or one node's certificate for another node, a peer.
"""

from __future__ import annotations

import enum
import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass


class Role(enum.Enum):
    READ = "read"
    WRITE = "write"
    ADMIN = "admin"
    PEER = "peer"


_IMPLIED: dict[Role, frozenset[Role]] = {
    Role.READ: frozenset({Role.READ}),
    Role.WRITE: frozenset({Role.READ, Role.WRITE}),
    Role.ADMIN: frozenset({Role.READ, Role.WRITE, Role.ADMIN}),
    Role.PEER: frozenset({Role.PEER}),
}


def effective_roles(granted: Iterable[Role]) -> frozenset[Role]:
    """The granted roles with the ones they imply."""
    roles: set[Role] = set()
    for role in granted:
        roles |= _IMPLIED[role]
    return frozenset(roles)


PEER_NOT_GRANTED = ("peer is not a role to grant: peers are identified by "
                    "auth.peer.principal.template")


def parse_roles(text: str) -> frozenset[Role]:
    """``read,write`` (or ``read+write``) as roles; ValueError names an unknown one, or
    ``peer``, which is not granted (PEER_NOT_GRANTED)."""
    names = [name.strip() for name in text.replace("+", ",").split(",") if name.strip()]
    if not names:
        raise ValueError("no role given (expected read, write or admin)")
    roles = set()
    for name in names:
        try:
            role = Role(name.lower())
        except ValueError:
            raise ValueError(f"unknown role {name!r} (expected read, write or admin)") from None
        if role is Role.PEER:
            raise ValueError(PEER_NOT_GRANTED)
        roles.add(role)
    return frozenset(roles)


@dataclass(frozen=True)
class PrincipalGrant:
    """Roles for the certificate principals (subject common names) matching a glob pattern."""

    pattern: str
    roles: frozenset[Role]

    def matches(self, principal: str) -> bool:
        return fnmatch.fnmatchcase(principal, self.pattern)


def parse_principal_grants(text: str) -> tuple[PrincipalGrant, ...]:
    """``auth.certificate.roles``: ``PATTERN:ROLE[,ROLE...]`` entries separated by ``;``, e.g.
    ``quorum-operator:admin;billing:read,write``. ValueError on a bad one."""
    grants = []
    for raw in text.split(";"):
        entry = raw.strip()
        if not entry:
            continue
        pattern, colon, roles = entry.rpartition(":")
        pattern = pattern.strip()
        if not colon or not pattern:
            raise ValueError(f"{entry!r} is not PATTERN:ROLE[,ROLE...] (e.g. "
                             "quorum-operator:admin;app-*:read)")
        try:
            grants.append(PrincipalGrant(pattern, parse_roles(roles)))
        except ValueError as error:
            if str(error) == PEER_NOT_GRANTED:
                raise  # one line on its own: the key is the problem, not this entry
            raise ValueError(f"{entry!r}: {error}") from None
    return tuple(grants)


def roles_of_principal(grants: Iterable[PrincipalGrant], principal: str) -> frozenset[Role]:
    """Every role granted to ``principal`` by any matching pattern, with the implied ones."""
    return effective_roles(role for grant in grants if grant.matches(principal)
                           for role in grant.roles)
