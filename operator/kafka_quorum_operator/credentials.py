"""A quorum's credentials as the operator generates them, and when to change them (pure).

Secrets, all owned by the KafkaQuorum (deleted with it):

- ``NAME-ca``: the CA's certificate and key (``tls.crt``, ``tls.key``) and the bundle nodes and
  clients trust (``ca.crt``); read by the operator only.
- ``NAME-node-ID``: a node's certificate (CN ``quorum-node-ID``, the pod's DNS names, server and
  client authentication: nodes present it to their peers), its key and the bundle.
- ``NAME-operator``: the operator's client certificate (CN ``quorum-operator``: admin) and the
  bundle.
- ``NAME-peer``: the peer secret (``secret``) that peer RPCs carry on a PLAINTEXT controller
  listener (a TLS switch's stages, a quorum without TLS). Created once and never rewritten.
- ``NAME-tokens``: the nodes' token file (``tokens``) with the admin token, which is also alone
  under ``admin-token`` (for ``quorum-admin --token-file``). Created once and never rewritten:
  lines added for applications stay.

Each is generated once and kept; a certificate is issued again when it is missing, unreadable,
no longer says what it must, is not signed by the current CA, or expires within
``renewBeforeDays``. Nodes reload changed files (``security.reload.interval.ms``), so a renewal
restarts nothing.

The CA is rotated in two steps so that no node ever meets a certificate it does not trust yet:
a year before it expires a successor CA is generated and added to the bundle (``next.crt``,
``next.key``); once the bundle has had ``CA_PROPAGATION`` to reach every node, the successor
signs, every certificate is issued again, and the old CA stays in the bundle until it expires.
"""

from __future__ import annotations

import base64
import datetime
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography import x509

from kafka_quorum_operator import certs
from kafka_quorum_operator import resources as r

CA_VALIDITY = datetime.timedelta(days=3650)
CA_RENEW_BEFORE = datetime.timedelta(days=365)
# Longer than a mounted Secret takes to be updated in pods (the kubelet's sync period, about a
# minute) plus the nodes' reload interval.
CA_PROPAGATION = datetime.timedelta(minutes=10)
ADMIN_TOKEN_KEY = "admin-token"
CA_KEY = "ca.crt"
_NEXT_SINCE = "next-since"
_TLS = "kubernetes.io/tls"


@dataclass(frozen=True)
class Authority:
    """The CA Secret's content: who signs, who will sign next (and since when it is trusted),
    and the bundle of every CA to trust."""

    signing: certs.KeyPair
    bundle: bytes
    next: certs.KeyPair | None = None
    next_since: datetime.datetime | None = None

    def to_data(self) -> dict[str, bytes]:
        data = {"tls.crt": self.signing.certificate, "tls.key": self.signing.key,
                CA_KEY: self.bundle}
        if self.next is not None and self.next_since is not None:
            data.update({"next.crt": self.next.certificate, "next.key": self.next.key,
                         _NEXT_SINCE: self.next_since.isoformat().encode()})
        return data

    @classmethod
    def from_data(cls, data: Mapping[str, bytes]) -> Authority | None:
        signing = _pair(data, "tls.crt", "tls.key")
        if signing is None:
            return None
        following = _pair(data, "next.crt", "next.key")
        since = None
        if following is not None and _NEXT_SINCE in data:
            try:
                since = datetime.datetime.fromisoformat(data[_NEXT_SINCE].decode())
            except (ValueError, UnicodeDecodeError):
                following = None
        return cls(signing, data.get(CA_KEY) or signing.certificate,
                   following if since is not None else None, since)


def next_authority(current: Authority | None, ca_name: str, now: datetime.datetime
                   ) -> tuple[Authority, str | None]:
    """The CA Secret's content after this pass, and what changed (None: nothing)."""
    if current is None or certs.ca_renewal_reason(current.signing, now,
                                                  datetime.timedelta(0)) is not None:
        # None or broken: nothing can be kept (a broken CA key is unusable for signing).
        fresh = certs.new_ca(ca_name, now, CA_VALIDITY)
        return Authority(fresh, fresh.certificate), "CA generated"
    if current.next is not None and current.next_since is not None:
        if now - current.next_since < CA_PROPAGATION:
            return current, None
        # The successor has been trusted long enough: it signs from now on.
        bundle = _valid_bundle([current.next.certificate, current.bundle], now)
        return Authority(current.next, bundle), "CA rotated: the successor CA signs"
    if certs.ca_renewal_reason(current.signing, now, CA_RENEW_BEFORE) is not None:
        successor = certs.new_ca(ca_name, now, CA_VALIDITY)
        bundle = _valid_bundle([current.bundle, successor.certificate], now)
        return (Authority(current.signing, bundle, successor, now),
                f"successor CA generated: the CA expires "
                f"{certs.not_after(current.signing.certificate).isoformat()}")
    bundle = _valid_bundle([current.bundle], now)
    if bundle != current.bundle:
        return Authority(current.signing, bundle), "expired CA left the bundle"
    return current, None


def next_leaf(data: Mapping[str, bytes] | None, authority: Authority, wanted: certs.Wanted,
              now: datetime.datetime, *, validity: datetime.timedelta,
              renew_before: datetime.timedelta) -> tuple[dict[str, bytes] | None, str | None]:
    """A certificate Secret's new content (None: keep it) and why."""
    data = data or {}
    pair = _pair(data, "tls.crt", "tls.key")
    reason = certs.renewal_reason(pair, authority.signing.certificate, wanted, now,
                                  renew_before)
    if reason is not None:
        issued = certs.issue(authority.signing, wanted, now, validity)
        return ({"tls.crt": issued.certificate, "tls.key": issued.key,
                 CA_KEY: authority.bundle}, f"issued ({reason})")
    assert pair is not None
    if data.get(CA_KEY) != authority.bundle:
        return ({"tls.crt": pair.certificate, "tls.key": pair.key, CA_KEY: authority.bundle},
                "CA bundle updated")
    return None, None


def node_wanted(owner: r.Owner, node_id: int, cluster_domain: str) -> certs.Wanted:
    return certs.Wanted(r.node_principal(node_id),
                        r.node_dns_names(owner.name, owner.namespace, node_id, cluster_domain),
                        server=True)


OPERATOR_WANTED = certs.Wanted(r.OPERATOR_PRINCIPAL)


def new_tokens() -> dict[str, bytes]:
    """The token Secret's content: a random admin token (256 bits), for the operator's
    principal, as the node's token file and alone."""
    token = secrets.token_urlsafe(32)
    return {r.TOKENS_KEY: f"# TOKEN PRINCIPAL ROLES (docs/security.md)\n"
                          f"{token} {r.OPERATOR_PRINCIPAL} admin\n".encode(),
            ADMIN_TOKEN_KEY: token.encode()}


def peer_secret(owner: r.Owner) -> dict[str, Any]:
    """A random peer secret (256 bits, printable: the node's controller.listener.secret.file)."""
    return secret(owner, r.peer_secret_name(owner.name),
                  {r.PEER_SECRET_KEY: secrets.token_urlsafe(32).encode()}, "Opaque")


def secret(owner: r.Owner, name: str, data: Mapping[str, bytes], kind: str = _TLS
           ) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": kind,
            "metadata": {"name": name, "namespace": owner.namespace,
                         "labels": r.labels(owner.name, "credentials"),
                         "ownerReferences": [owner.reference()]},
            "data": encode(data)}


def tokens_secret(owner: r.Owner) -> dict[str, Any]:
    return secret(owner, r.tokens_secret_name(owner.name), new_tokens(), "Opaque")


def encode(data: Mapping[str, bytes]) -> dict[str, str]:
    return {k: base64.b64encode(v).decode() for k, v in sorted(data.items())}


def decode(obj: Mapping[str, Any] | None) -> dict[str, bytes] | None:
    """A Secret's data (None: no Secret). Undecodable values count as absent."""
    if obj is None:
        return None
    decoded = {}
    for key, value in (obj.get("data") or {}).items():
        try:
            decoded[key] = base64.b64decode(value, validate=True)
        except (ValueError, TypeError):
            continue
    return decoded


def ca_bundle(owner: r.Owner, bundle: bytes) -> dict[str, Any]:
    """The CA bundle for clients, public: a ConfigMap."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": r.ca_bundle_name(owner.name), "namespace": owner.namespace,
                         "labels": r.labels(owner.name, "credentials"),
                         "ownerReferences": [owner.reference()]},
            "data": {CA_KEY: bundle.decode()}}


def _pair(data: Mapping[str, bytes], certificate: str, key: str) -> certs.KeyPair | None:
    if certificate not in data or key not in data:
        return None
    return certs.KeyPair(data[certificate], data[key])


def _valid_bundle(bundles: list[bytes], now: datetime.datetime) -> bytes:
    """The CAs of the bundles, without duplicates and without those expired."""
    seen: list[bytes] = []
    for pem in bundles:
        try:
            found = x509.load_pem_x509_certificates(pem)
        except ValueError:
            continue
        for certificate in found:
            encoded = certs.pem(certificate)
            if certificate.not_valid_after_utc > now and encoded not in seen:
                seen.append(encoded)
    return certs.bundle(seen)
