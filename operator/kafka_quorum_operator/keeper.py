"""Keeps a quorum's credentials (``credentials.py``) in its Secrets, pass after pass: creates
what is missing, renews what expires, and gives the operator its TLS context towards the
quorum's nodes. With ``spec.security.tls.certManager``, cert-manager issues the certificates
(the Certificates are among the objects the reconciler applies) and only the token Secret is
the operator's.

Secrets are read again at most every ``RECHECK_S`` (renewals are days ahead; a pass stays cheap),
except those not seen yet, and those missing, which are looked for at every pass.
"""

from __future__ import annotations

import datetime
import hashlib
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kafka_quorum_operator import credentials as c
from kafka_quorum_operator import resources as r
from kafka_quorum_operator.kube import Kube, KubeError, path
from kafka_quorum_operator.nodes import client_context
from kafka_quorum_operator.spec import Spec

RECHECK_S = 30.0
CLUSTER_DOMAIN = "cluster.local"


class SecretNotOwned(Exception):
    """A Secret the operator would use exists but another made it."""


@dataclass(frozen=True)
class Secured:
    """What a pass of the keeper found and did."""

    objects: list[dict[str, Any]] = field(default_factory=list)  # for the reconciler to apply
    changes: list[str] = field(default_factory=list)  # one Event each


@dataclass
class Keeper:
    kube: Kube
    cluster_domain: str = CLUSTER_DOMAIN
    clock: Callable[[], float] = time.time
    # (namespace, name) -> (when read, monotonic; its data, None: no such Secret; the uids of
    # its owners).
    _cache: dict[tuple[str, str], tuple[float, dict[str, bytes] | None, frozenset[str]]] = \
        field(default_factory=dict)
    # The operator's TLS contexts, by a digest of the credentials they hold.
    _contexts: dict[bytes, ssl.SSLContext] = field(default_factory=dict)

    async def client_tls(self, owner: r.Owner, spec: Spec, *, wanted: bool = False
                         ) -> ssl.SSLContext | None:
        """The operator's context towards the quorum's nodes (its client certificate and the
        CA bundle); None while its Secret is missing or incomplete, or with TLS off (unless
        ``wanted``: a TLS switch runs, some nodes still speak it)."""
        if not spec.security.tls and not wanted:
            return None
        data = await self._read(owner, r.operator_secret_name(owner.name),
                                owned=spec.security.issuer is None) or {}
        parts = [data.get(k) for k in (c.CA_KEY, "tls.crt", "tls.key")]
        if not all(parts):
            return None
        ca, certificate, key = (p for p in parts if p is not None)
        digest = hashlib.sha256(b"\0".join((ca, certificate, key))).digest()
        context = self._contexts.get(digest)
        if context is None:
            try:
                context = client_context(ca, certificate, key)
            except (ssl.SSLError, ValueError, OSError):
                return None  # a half-written Secret (cert-manager mid-issue): the next pass
            if len(self._contexts) > 64:
                self._contexts.clear()  # renewed credentials: the old contexts are unused
            self._contexts[digest] = context
        return context

    async def secure(self, owner: r.Owner, spec: Spec, node_ids: Sequence[int]) -> Secured:
        """Create or renew the quorum's credentials for ``node_ids``."""
        changes: list[str] = []
        # Whatever the protocol: a TLS switch, and a quorum without TLS, have a PLAINTEXT
        # controller listener.
        if await self._read(owner, r.peer_secret_name(owner.name)) is None:
            await self._create(c.peer_secret(owner))
            changes.append(f"peer secret generated (Secret {r.peer_secret_name(owner.name)})")
        if not spec.security.tls:
            return Secured(changes=changes)
        if await self._read(owner, r.tokens_secret_name(owner.name)) is None:
            await self._create(c.tokens_secret(owner))
            changes.append(f"admin token generated (Secret {r.tokens_secret_name(owner.name)})")
        objects: list[dict[str, Any]] = []
        if spec.security.issuer is not None:
            objects += r.certificates(owner, spec, node_ids, self.cluster_domain)
        else:
            changes += await self._generate(owner, spec, node_ids)
        operator = await self._read(owner, r.operator_secret_name(owner.name),
                                    owned=spec.security.issuer is None) or {}
        if operator.get(c.CA_KEY):
            objects.append(c.ca_bundle(owner, operator[c.CA_KEY]))
        return Secured(objects, changes)

    async def _generate(self, owner: r.Owner, spec: Spec, node_ids: Sequence[int]
                        ) -> list[str]:
        now = datetime.datetime.fromtimestamp(self.clock(), datetime.UTC)
        changes = []
        ca_name = r.ca_secret_name(owner.name)
        data = await self._read(owner, ca_name)
        current = c.Authority.from_data(data) if data is not None else None
        authority, change = c.next_authority(
            current, r.ca_subject(owner.name, owner.namespace), now)
        if change is not None:
            await self._write(owner, ca_name, data, authority.to_data())
            changes.append(f"{change} (Secret {ca_name})")
        validity = datetime.timedelta(days=spec.security.certificate_days)
        renew_before = datetime.timedelta(days=spec.security.renew_before_days)
        wanted = {r.operator_secret_name(owner.name): c.OPERATOR_WANTED}
        for node_id in node_ids:
            wanted[r.node_secret_name(owner.name, node_id)] = c.node_wanted(
                owner, node_id, self.cluster_domain)
        for name, want in wanted.items():
            data = await self._read(owner, name)
            new, why = c.next_leaf(data, authority, want, now, validity=validity,
                                   renew_before=renew_before)
            if new is not None:
                await self._write(owner, name, data, new)
                changes.append(f"certificate {want.common_name}: {why} (Secret {name})")
        return changes

    async def _read(self, owner: r.Owner, name: str, *, owned: bool = True
                    ) -> dict[str, bytes] | None:
        """A Secret's data; ``SecretNotOwned`` if ``owned`` and it exists without an owner
        reference to this KafkaQuorum (its uid): a Secret of that name made by someone else (a
        planted CA, a KafkaQuorum of the same name before) is never used nor overwritten."""
        key = (owner.namespace, name)
        cached = self._cache.get(key)
        if cached is None or cached[1] is None or time.monotonic() - cached[0] >= RECHECK_S:
            obj = await self.kube.get(path("Secret", owner.namespace, name))
            owners = frozenset(ref.get("uid") for ref in
                               ((obj or {}).get("metadata") or {}).get("ownerReferences") or [])
            cached = (time.monotonic(), c.decode(obj), owners)
            self._cache[key] = cached
        _, data, owners = cached
        if owned and data is not None and owner.uid not in owners:
            raise SecretNotOwned(f"Secret {owner.namespace}/{name} exists but is not owned by "
                                 f"KafkaQuorum {owner.name} (uid {owner.uid}): refused, never "
                                 f"used or overwritten; delete it to have the operator make its "
                                 f"own")
        return data

    async def _create(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        try:
            await self.kube.create(path("Secret", meta["namespace"]), obj)
        except KubeError as error:
            self._cache.pop(key, None)  # read again on the next pass
            if error.status == 409:
                return  # made by a pass whose answer was lost
            raise
        owners = frozenset(ref["uid"] for ref in meta.get("ownerReferences") or [])
        self._cache[key] = (time.monotonic(), c.decode(obj), owners)

    async def _write(self, owner: r.Owner, name: str, old: Mapping[str, bytes] | None,
                     new: Mapping[str, bytes]) -> None:
        if old is None:
            await self._create(c.secret(owner, name, new))
            return
        # A merge patch: keys no longer wanted (a promoted successor CA's) are set to null.
        data: dict[str, str | None] = {k: None for k in old if k not in new}
        data.update(c.encode(new))
        key = (owner.namespace, name)
        try:
            await self.kube.patch(path("Secret", owner.namespace, name), {"data": data})
        except KubeError:
            self._cache.pop(key, None)
            raise
        self._cache[key] = (time.monotonic(), dict(new), frozenset([owner.uid]))
