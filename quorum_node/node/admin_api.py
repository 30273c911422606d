"""The admin API: ``GET /v1/quorum``, DescribeQuorum as JSON.

Only the leader keeps the progress of every replica, so only the leader answers (as in Kafka,
where DescribeQuorum is leader-only). Elsewhere the request is redirected (307) to the leader
when its address is known, or refused with 503 ``{"code": "NO_LEADER"}`` during an election.

The answer::

    {"cluster_id": "...", "leader_id": 1, "leader_epoch": 3, "high_watermark": 42,
     "voters": [REPLICA, ...], "observers": [REPLICA, ...]}

    REPLICA = {"id": 2, "directory_id": "<22-char base64url>" | null, "log_end_offset": 42,
               "lag": 0, "last_fetch_timestamp": <ms>, "last_caught_up_timestamp": <ms>,
               "endpoint": "http://host:port" | null}

Unknown numbers are -1, as on Kafka's wire (a replica that has not fetched in this epoch: offsets,
lag and timestamps; a leader whose first-epoch record is not committed yet: the high watermark).
Replicas are listed by id. Timestamps are wall-clock milliseconds; the leader's own row carries
"now" for both.
``directory_id`` is known for the leader itself and for replicas the core knows by directory id;
statically configured voters are known by id only (Kafka's static quorums report them the same way).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from quorum_node.node.config import format_address
from quorum_node.raft.core import QuorumDescription, ReplicaDescription
from quorum_node.raft.types import NotLeaderError
from quorum_node.storage.kafka_uuid import to_kafka_string

if TYPE_CHECKING:
    from quorum_node.node.runtime import QuorumNode

QUORUM_PATH = "/v1/quorum"


def _now_ms() -> int:
    # The same wall clock the runtime hands the core, so that "now" matches its timestamps.
    return time.time_ns() // 1_000_000


def endpoint_url(endpoint: tuple[str, int] | None) -> str | None:
    return None if endpoint is None else f"http://{format_address(*endpoint)}"


def describe_quorum_json(node: QuorumNode, description: QuorumDescription) -> dict[str, Any]:
    """The JSON form of the leader's DescribeQuorum answer."""
    leader_end = next(
        (r.log_end_offset for r in description.voters if r.key.id == description.leader_id),
        None,
    )

    def replica(row: ReplicaDescription) -> dict[str, Any]:
        end = row.log_end_offset
        directory_id = row.key.directory_id
        return {
            "id": row.key.id,
            "directory_id": to_kafka_string(directory_id) if directory_id is not None else None,
            "log_end_offset": -1 if end is None else end,
            "lag": -1 if end is None or leader_end is None else leader_end - end,
            "last_fetch_timestamp": _or_unknown(row.last_fetch_ms),
            "last_caught_up_timestamp": _or_unknown(row.last_caught_up_ms),
            "endpoint": endpoint_url(node.endpoints.get(row.key.id)),
        }

    return {
        "cluster_id": node.config.cluster_id,
        "leader_id": description.leader_id,
        "leader_epoch": description.epoch,
        "high_watermark": _or_unknown(description.high_watermark),
        # By id: the core keeps the leader first, which would move rows around on a failover.
        "voters": [replica(row) for row in sorted(description.voters, key=_by_id)],
        "observers": [replica(row) for row in sorted(description.observers, key=_by_id)],
    }


def _by_id(row: ReplicaDescription) -> int:
    return row.key.id


def _or_unknown(value: int | None) -> int:
    return -1 if value is None else value


def admin_routes(node: QuorumNode) -> list[web.RouteDef]:
    async def describe_quorum(request: web.Request) -> web.Response:
        core = node.core
        if node.failure is not None:
            return web.json_response(
                {"code": "NODE_FAILED", "message": f"node stopped after a failure: {node.failure}"},
                status=503)
        try:
            description = core.describe_quorum(_now_ms())
        except NotLeaderError:
            leader = core.leader_id
            location = endpoint_url(node.leader_endpoint())
            # A resigned leader still names itself: no one to redirect to until a successor wins.
            if leader is not None and leader != node.config.node_id and location is not None:
                return web.json_response(
                    {"code": "NOT_LEADER", "leader_id": leader, "leader_url": location},
                    status=307, headers={"Location": location + request.path_qs})
            return web.json_response(
                {"code": "NO_LEADER", "epoch": core.epoch,
                 "message": f"no leader known in epoch {core.epoch} (state {core.state})"},
                status=503)
        return web.json_response(describe_quorum_json(node, description))

    return [web.get(QUORUM_PATH, describe_quorum)]
