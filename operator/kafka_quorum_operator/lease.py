"""Single active operator: a coordination.k8s.io Lease, with client-go's leader election rules.

kopf's peering only pauses operators of lower priority and freezes equal ones (and has been
seen to let a paused replica work, kopf #1266); voter changes must never come from two
operators at once, so only the Lease's holder acts, and it checks that it still holds the lease
immediately before each voter change or deletion (``LeaderElector.leading``).

- The lease is renewed by its own task every ``RETRY_PERIOD_S``, whatever a reconciliation
  pass is doing (a pass can wait 20 s for a voter change).
- The holder counts itself leader only until ``RENEW_DEADLINE_S`` after it *sent* its last
  successful renewal: a renewal stuck in a slow API call, or a process that was paused, loses the
  leadership on its own clock, before anyone else may take it.
- Another replica judges the lease expired on its *own* monotonic clock: ``leaseDurationSeconds``
  after it last saw the lease change (holder or renewTime). The clocks of two machines are never
  compared (renewTime is written for people, not read for the decision). Since a renewal is seen
  no earlier than it was sent, and the deadline (10 s) is shorter than the duration (15 s), the
  old holder has stopped acting before a new one can start, as long as the two clocks run at
  about the same rate.
- Writes are conditional on the lease's resourceVersion: of two replicas acquiring at once, one
  gets 409 and stays a follower.
- Whoever loses the lease (its renewal deadline passed, another holds it, or it released it) is
  told at once (``on_lost``; the operator stops exporting its per-quorum gauges): ``run`` asks
  after every round, so within a retry period even while no pass runs.
- At shutdown the holder releases the lease (client-go's ``ReleaseOnCancel``): once it has
  stopped acting it clears the holder, and a standby acquires it on its next round instead of
  waiting out the lease duration (an upgrade's rolling replacement hands over in seconds).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka_quorum_operator.kube import Kube, KubeError, path

logger = logging.getLogger(__name__)
LEASE_DURATION_S = 15.0
RENEW_DEADLINE_S = 10.0
RETRY_PERIOD_S = 2.0


def micro_time(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, datetime.UTC).strftime(
        "%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Record:
    """What identifies one state of the lease: a change of any of these restarts the count."""

    holder: str | None
    renew_time: str | None
    transitions: int

    @classmethod
    def of(cls, lease: dict[str, Any]) -> Record:
        spec = lease.get("spec") or {}
        return cls(spec.get("holderIdentity") or None, spec.get("renewTime"),
                   int(spec.get("leaseTransitions") or 0))


@dataclass
class LeaderElector:
    kube: Kube
    namespace: str
    name: str
    identity: str
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    lease_duration_s: float = LEASE_DURATION_S
    renew_deadline_s: float = RENEW_DEADLINE_S
    retry_period_s: float = RETRY_PERIOD_S
    # Called when this replica stops leading (once per loss; not for a replica never leading).
    on_lost: Callable[[], None] = lambda: None

    # When this replica sent its last successful renewal (its own clock); None: not holding.
    _renewed_at: float | None = None
    # The lease as last seen, and when it was first seen so (this replica's clock).
    _observed: Record | None = None
    _observed_at: float = 0.0
    _observed_duration: float = LEASE_DURATION_S
    _was_leading: bool = False

    @property
    def leading(self) -> bool:
        """Whether this replica may act now: it renewed within the renew deadline."""
        leading = self._renewed_at is not None and \
            self.clock() - self._renewed_at < self.renew_deadline_s
        if self._was_leading and not leading:
            logger.warning("lost the lease %s/%s", self.namespace, self.name)
            self._was_leading = False
            self.on_lost()
        self._was_leading = leading
        return leading

    async def run(self) -> None:
        """Acquire and renew the lease, forever (the operator's background task)."""
        while True:
            started = self.clock()
            try:
                await asyncio.wait_for(self.try_acquire_or_renew(), self.renew_deadline_s)
            except (KubeError, OSError, TimeoutError) as error:
                logger.warning("lease %s/%s: %s", self.namespace, self.name, error)
            except Exception:  # the elector must keep running; a bug shows in the log
                logger.exception("lease %s/%s", self.namespace, self.name)
            _ = self.leading  # a loss is noticed (on_lost) though no pass asks
            await asyncio.sleep(max(0.0, self.retry_period_s - (self.clock() - started)))

    async def try_acquire_or_renew(self) -> bool:
        """One round: create, renew, acquire an expired lease, or observe another's."""
        sent = self.clock()
        url = path("Lease", self.namespace)
        lease = await self.kube.get(f"{url}/{self.name}")
        now = micro_time(self.wall_clock())
        spec: dict[str, Any] = {"holderIdentity": self.identity, "renewTime": now,
                                "leaseDurationSeconds": int(self.lease_duration_s)}
        if lease is None:
            try:
                await self.kube.create(url, {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {**spec, "acquireTime": now, "leaseTransitions": 0}})
            except KubeError as error:
                if error.status != 409:
                    raise
                return False  # another replica created it first
            return self._held(sent)
        record = Record.of(lease)
        if record != self._observed:
            self._observed, self._observed_at = record, sent
            self._observed_duration = float(
                (lease.get("spec") or {}).get("leaseDurationSeconds") or self.lease_duration_s)
        ours = record.holder == self.identity
        if not ours and record.holder and self.clock() - self._observed_at < \
                self._observed_duration:
            self._renewed_at = None
            return False  # another's, not expired on this replica's clock
        if not ours:
            spec.update(acquireTime=now, leaseTransitions=record.transitions + 1)
        # resourceVersion makes the write conditional: two acquirers cannot both win.
        version = (lease.get("metadata") or {}).get("resourceVersion")
        try:
            await self.kube.patch(f"{url}/{self.name}", {
                "metadata": {"resourceVersion": version}, "spec": spec})
        except KubeError as error:
            if error.status != 409:
                raise
            self._renewed_at = None
            return False
        if not ours:
            logger.info("acquired the lease %s/%s (held by %s before)", self.namespace,
                        self.name, record.holder)
        return self._held(sent)

    async def release(self) -> bool:
        """Give the lease up (at shutdown, once nothing acts any more and ``run`` has stopped):
        leading ends at once; the holder is cleared, with a 1 s duration as client-go writes it,
        if the lease is still this replica's. Conditional on the resourceVersion: a renewal sent
        just before (its answer lost to the shutdown) makes it read the lease again. Whether it
        was released."""
        self._renewed_at = None
        if self._was_leading:
            self._was_leading = False
            self.on_lost()
        lease_path = path("Lease", self.namespace, self.name)
        for _ in range(3):
            lease = await self.kube.get(lease_path)
            if lease is None or Record.of(lease).holder != self.identity:
                return False
            now = micro_time(self.wall_clock())
            try:
                await self.kube.patch(lease_path, {
                    "metadata": {"resourceVersion": (lease.get("metadata") or {}).get(
                        "resourceVersion")},
                    "spec": {"holderIdentity": None, "leaseDurationSeconds": 1,
                             "renewTime": now, "acquireTime": now}})
            except KubeError as error:
                if error.status != 409:
                    raise
                continue
            logger.info("released the lease %s/%s", self.namespace, self.name)
            return True
        return False

    def _held(self, sent: float) -> bool:
        self._renewed_at = sent
        self._observed = None  # the next read shows our own write
        return True
