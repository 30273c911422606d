"""Single active operator: a coordination.k8s.io Lease, as Kubernetes' own controllers use.

kopf's peering only pauses operators of lower priority and freezes equal ones (and has been
seen to let a paused replica work, kopf #1266); voter changes must never come from two
operators at once, so only the Lease's holder acts. Another replica keeps watching and takes
over once the lease expires.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import Any

from kafka_quorum_operator.kube import KubeClient, KubeError, path

logger = logging.getLogger(__name__)
LEASE_DURATION_S = 15


def micro_time(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, datetime.UTC).strftime(
        "%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    for pattern in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            parsed = datetime.datetime.strptime(text, pattern)
        except ValueError:
            continue
        return parsed.replace(tzinfo=datetime.UTC).timestamp()
    return None


def lease_decision(lease: dict[str, Any] | None, identity: str, now: float) -> str:
    """create (no lease yet), renew (ours), acquire (free or expired) or wait (another's)."""
    if lease is None:
        return "create"
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity")
    if holder == identity:
        return "renew"
    renewed = parse_micro_time(spec.get("renewTime"))
    duration = spec.get("leaseDurationSeconds") or LEASE_DURATION_S
    if not holder or renewed is None or renewed + duration < now:
        return "acquire"
    return "wait"


@dataclass
class LeaderElector:
    kube: KubeClient
    namespace: str
    name: str
    identity: str
    leading: bool = False

    renewed: float = 0.0

    async def tick(self, now: float) -> bool:
        """Try to hold the lease; whether this operator leads now. A held lease is renewed
        when a third of its duration has passed."""
        if self.leading and now - self.renewed < LEASE_DURATION_S / 3:
            return True
        url = path("Lease", self.namespace)
        try:
            lease = await self.kube.get(f"{url}/{self.name}")
            decision = lease_decision(lease, self.identity, now)
            spec = {"holderIdentity": self.identity, "leaseDurationSeconds": LEASE_DURATION_S,
                    "renewTime": micro_time(now)}
            if decision == "create":
                await self.kube.create(url, {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {**spec, "acquireTime": micro_time(now), "leaseTransitions": 0}})
            elif decision in ("renew", "acquire"):
                assert lease is not None
                if decision == "acquire":
                    transitions = int((lease.get("spec") or {}).get("leaseTransitions") or 0)
                    spec.update(acquireTime=micro_time(now), leaseTransitions=transitions + 1)
                # resourceVersion makes the patch conditional: two acquirers cannot both win.
                version = (lease.get("metadata") or {}).get("resourceVersion")
                await self.kube.patch(f"{url}/{self.name}", {
                    "metadata": {"resourceVersion": version} if version else {},
                    "spec": spec})
            leading = decision != "wait"
            if leading:
                self.renewed = now
        except KubeError as error:
            logger.warning("lease %s/%s: %s", self.namespace, self.name, error)
            leading = False
        if leading != self.leading:
            logger.info("%s the lease %s/%s", "holding" if leading else "lost", self.namespace,
                        self.name)
        self.leading = leading
        return leading
