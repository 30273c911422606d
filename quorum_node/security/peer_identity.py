"""Which node a peer's certificate speaks for.

Over SSL a node is known by its certificate's one subject common name, which must be
``auth.peer.principal.template`` with ``{id}`` replaced by its node id (``quorum-node-{id}`` by
default). A node's certificate therefore lets it speak as that one node id and no other: every
Raft RPC names the node sending it (ReplicaId, or LeaderId for the epoch announcements), and a
request naming another node is refused before the quorum core sees it.
"""

from __future__ import annotations

from typing import Final

DEFAULT_PEER_PRINCIPAL_TEMPLATE: Final = "quorum-node-{id}"
_PLACEHOLDER: Final = "{id}"


def validate_peer_principal_template(template: str) -> str:
    """The template itself; ValueError (one line) unless it holds ``{id}`` exactly once and no
    other brace."""
    if template.count(_PLACEHOLDER) != 1:
        raise ValueError(f"{template!r} must contain {_PLACEHOLDER} exactly once (e.g. "
                         f"{DEFAULT_PEER_PRINCIPAL_TEMPLATE})")
    if any(brace in template.replace(_PLACEHOLDER, "") for brace in "{}"):
        raise ValueError(f"{template!r}: no brace is allowed besides {_PLACEHOLDER}")
    if any(char.isspace() for char in template):
        raise ValueError(f"{template!r}: a common name template has no whitespace")
    return template


class PeerPrincipals:
    """The template's principals: node id -> principal, and back."""

    def __init__(self, template: str = DEFAULT_PEER_PRINCIPAL_TEMPLATE) -> None:
        self.template = validate_peer_principal_template(template)
        self._prefix, _, self._suffix = template.partition(_PLACEHOLDER)

    def principal_of(self, node_id: int) -> str:
        return f"{self._prefix}{node_id}{self._suffix}"

    def node_id_of(self, principal: str) -> int | None:
        """The node id whose principal this is exactly; None for any other name (a node id is
        written in its one decimal form: ``quorum-node-01`` and ``quorum-node-x9`` are nobody)."""
        if not (principal.startswith(self._prefix) and principal.endswith(self._suffix)):
            return None
        digits = principal[len(self._prefix):len(principal) - len(self._suffix)]
        if not digits.isascii() or not digits.isdigit() or len(digits) > 10:
            return None
        node_id = int(digits)
        return node_id if self.principal_of(node_id) == principal else None
