"""Kubernetes Events about a KafkaQuorum, aggregated as client-go's event recorder does: an Event
repeated (the same object, type, reason and message) is not posted again but counted on the
Event already posted (``count`` and ``lastTimestamp``, which ``kubectl describe`` shows as
"(x5 over 2m)"). A condition that persists for many passes is one Event, not one per pass.

Why not kopf's helpers (``kopf.event``, ``kopf.info``, ``kopf.warn``) for these: kopf posts every
call as a new Event and leaves aggregation to "the client library, as it is done in the Go client"
(its ``post_event``), so a pass that repeats a reason every few seconds would write an Event to
etcd each time; its ``info`` is dropped below ``settings.posting.level`` (WARNING here, which
keeps kopf's own chatter out of Events); and it posts later, from its queue, so an Event could
not be counted on the one it repeats. kopf's helpers serve where a handler reports on the object
it was called for, once: ``handlers.quorum_backup_event`` (a QuorumBackup naming no quorum)."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from kafka_quorum_operator import API_VERSION, KIND, MANAGER
from kafka_quorum_operator import resources as r
from kafka_quorum_operator.kube import Kube, KubeError, path
from kafka_quorum_operator.status import iso

logger = logging.getLogger(__name__)
# Events remembered for counting (client-go's event cache holds as many): the least recently
# posted are forgotten first, and their next repetition starts a new Event.
CACHE_SIZE = 4096
MESSAGE_MAX = 1000

# involvedObject (namespace, name, uid), type, reason, message.
Key = tuple[str, str, str, str, str, str]


@dataclass
class Posted:
    name: str  # the Event object's name
    count: int


@dataclass
class EventRecorder:
    kube: Kube
    clock: Callable[[], float]
    # Who posts (the Event's reportingInstance): the operator's identity, its pod's name.
    instance: str = MANAGER
    posted: OrderedDict[Key, Posted] = field(default_factory=OrderedDict)

    async def post(self, owner: r.Owner, reason: str, message: str,
                   kind: str = "Normal") -> None:
        """Post the Event, or count it on the same one posted before; never raises (an Event
        is worth a log line, never a failed pass)."""
        message = message[:MESSAGE_MAX]
        key = (owner.namespace, owner.name, owner.uid, kind, reason, message)
        logger.info("%s/%s %s: %s", owner.namespace, owner.name, reason, message)
        now = iso(self.clock())
        try:
            seen = self.posted.get(key)
            if seen is not None and await self._count(owner, seen, now):
                self.posted.move_to_end(key)
                return
            created = await self.kube.create(path("Event", owner.namespace), {
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{owner.name}.", "namespace": owner.namespace},
                "involvedObject": {"apiVersion": API_VERSION, "kind": KIND, "name": owner.name,
                                   "namespace": owner.namespace, "uid": owner.uid},
                "reason": reason, "message": message, "type": kind,
                "source": {"component": MANAGER}, "reportingComponent": MANAGER,
                "reportingInstance": self.instance,
                "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            })
        except KubeError as error:
            logger.warning("could not post event %s: %s", reason, error)
            return
        name = (created.get("metadata") or {}).get("name")
        if name:
            self.posted[key] = Posted(name, 1)
            self.posted.move_to_end(key)
            while len(self.posted) > CACHE_SIZE:
                self.posted.popitem(last=False)

    async def _count(self, owner: r.Owner, seen: Posted, now: str) -> bool:
        """One more of an Event already posted; False when it is gone (Events expire, an
        hour by default), so that a new one is posted."""
        answer = await self.kube.patch(path("Event", owner.namespace, seen.name),
                                       {"count": seen.count + 1, "lastTimestamp": now})
        if answer is None:
            return False
        seen.count += 1
        return True
