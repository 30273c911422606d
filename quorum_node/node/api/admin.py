"""The admin API: DescribeQuorum, AddVoter and RemoveVoter (KIP-595, KIP-856) as JSON over HTTP.

- ``GET /v1/quorum``: DescribeQuorum.
- ``POST /v1/quorum/voters`` with ``{"id": N, "directory_id": "<22-char base64url>"}``:
  AddVoter, making observer (N, directory id) a voter.
- ``DELETE /v1/quorum/voters/{id}/{directory_id}``: RemoveVoter, dropping that voter.

Only the leader keeps the progress of every replica and changes the voter set, so only the leader
answers (as in Kafka). Elsewhere a request is redirected (307, same path and query) to the leader
when its address is known, or refused with 503 ``NO_LEADER`` during an election (the one error
body of ``quorum_node.node.api.http``, ``"leader": {"id", "url"}`` on both).

DescribeQuorum answers::

    {"cluster_id": "...", "leader_id": 1, "leader_epoch": 3, "high_watermark": 42,
     "voters": [REPLICA, ...],
     "observers": [REPLICA + {"could_be_voter": bool, "retired": bool}, ...]}

    REPLICA = {"id": 2, "directory_id": "<22-char base64url>" | null, "log_end_offset": 42,
               "lag": 0, "last_fetch_timestamp": <ms>, "last_caught_up_timestamp": <ms>,
               "endpoint": "http://host:port" | null}

Unknown numbers are -1, as on Kafka's wire (a replica that has not fetched in this epoch: offsets,
lag and timestamps; a leader whose first-epoch record is not committed yet: the high watermark).
Replicas are listed by id. Timestamps are wall-clock milliseconds; the leader's own row carries
"now" for both.
``directory_id`` is known for the leader itself and for replicas the core knows by directory id;
statically configured voters are known by id only (Kafka's static quorums report them the same way).
``could_be_voter``: the observer has a directory id and the id of a configured voter, the only
ids AddVoter accepts (KIP-856's CouldBeVoters), and is not ``retired``. ``retired``: a replaced
disk, listed until its fetch state expires: another directory of its node id is a voter and has
fetched since it last did.

A voter change takes ``timeout_ms`` (query, or the POST body; default 30000, at most 600000) and
answers once the new voter set is committed: 200 ``{"error": "NONE", "id", "directory_id",
"voters": [{"id", "directory_id"}, ...]}``. Refusals of the change carry Kafka's error name as
their code: 409 ``DUPLICATE_VOTER`` (already a voter), 409 ``VOTER_NOT_FOUND`` (not a voter), 400
``INVALID_REQUEST`` (not an observer, an id not configured, removing an id's last directory
without ``?decommission=true``, removing the only voter); a malformed request is 400
``BAD_REQUEST``, as on every endpoint; 504
``REQUEST_TIMED_OUT`` (another change is pending, or this one was not done in time: it may still
complete), 503 ``NO_LEADER`` / ``NOT_LEADER_OR_FOLLOWER`` (retry)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from quorum_node.node.admin_service import QuorumAdmin
from quorum_node.node.api.backup import backup_routes
from quorum_node.node.api.http import (
    ApiError,
    Query,
    bad_request,
    endpoint_url,
    parse_integer,
    read_json,
)
from quorum_node.node.errors import ErrorCode
from quorum_node.node.runtime import QuorumNode
from quorum_node.node.voter_candidates import could_be_voter, retired_directory
from quorum_node.raft.core import QuorumDescription, ReplicaDescription
from quorum_node.raft.types import Errors, ReplicaKey, VoterChangeError
from quorum_node.storage.kafka_uuid import parse_uuid, to_kafka_string

QUORUM_PATH = "/v1/quorum"
VOTERS_PATH = QUORUM_PATH + "/voters"
NODE_PATH = "/v1/node"
# Long enough for a new voter to catch up with the leader's log before it is added.
DEFAULT_VOTER_TIMEOUT_MS = 30_000
MAX_VOTER_TIMEOUT_MS = 600_000
MAX_BODY_BYTES = 64 * 1024  # {"id", "directory_id", "timeout_ms"}: a few dozen bytes
_ADD_VOTER_BODY = '{"id": N, "directory_id": "..."}'


def describe_quorum_json(node: QuorumNode, description: QuorumDescription) -> dict[str, Any]:
    """The JSON form of the leader's DescribeQuorum answer."""
    leader_end = next(
        (r.log_end_offset for r in description.voters if r.key.id == description.leader_id),
        None,
    )

    def replica(row: ReplicaDescription) -> dict[str, Any]:
        end = row.log_end_offset
        return {
            **_key_json(row.key),
            "log_end_offset": -1 if end is None else end,
            "lag": -1 if end is None or leader_end is None else leader_end - end,
            "last_fetch_timestamp": _or_unknown(row.last_fetch_ms),
            "last_caught_up_timestamp": _or_unknown(row.last_caught_up_ms),
            # The voter's controller listener, as Kafka's DescribeQuorum reports it.
            "endpoint": endpoint_url(node.endpoints.get(row.key.id),
                                     node.config.controller_listener.scheme),
        }

    return {
        "cluster_id": node.config.cluster_id,
        "leader_id": description.leader_id,
        "leader_epoch": description.epoch,
        "high_watermark": _or_unknown(description.high_watermark),
        # By id: the core keeps the leader first, which would move rows around on a failover.
        "voters": [replica(row) for row in sorted(description.voters, key=_by_id)],
        "observers": [{**replica(row),
                       "could_be_voter": could_be_voter(row, node.endpoints, description.voters),
                       "retired": retired_directory(row, description.voters)}
                      for row in sorted(description.observers, key=_by_id)],
    }


def _key_id(key: ReplicaKey) -> int:
    return key.id


def _by_id(row: ReplicaDescription) -> int:
    return row.key.id


def _or_unknown(value: int | None) -> int:
    return -1 if value is None else value


def node_status_json(node: QuorumNode) -> dict[str, Any]:
    """This node's own view (``GET /v1/node``, answered by any node, never redirected): what
    ``quorum-admin status`` shows a row of, like etcd's ``endpoint status``."""
    status = node.status()
    directory_id = status.directory_id
    return {
        "node_id": status.node_id,
        "directory_id": None if directory_id is None else to_kafka_string(directory_id),
        "cluster_id": status.cluster_id,
        "state": str(status.state),
        "epoch": status.epoch,
        "leader_id": status.leader_id,
        "is_voter": status.is_voter,
        # The leader's high watermark is the quorum's: a leader that knows it serves writes,
        # unless it is a new quorum's first leader that has yet to hear from these voters.
        "high_watermark": _or_unknown(status.high_watermark),
        "voters_unheard": list(status.voters_unheard),
        "log_start_offset": status.log_start_offset,
        "log_end_offset": status.log_end_offset,
        "voters": [_key_json(key) for key in sorted(status.voters, key=_key_id)],
        # Where the configured voters serve clients, for a tool to find every node from one.
        "client_endpoints": [
            {"id": voter_id, "url": endpoint_url(endpoint, node.config.url_scheme)}
            for voter_id, endpoint in sorted(node.client_endpoints.items())],
        "failure": None if node.failure is None else str(node.failure),
    }


def admin_routes(node: QuorumNode) -> list[web.RouteDef]:
    admin = QuorumAdmin(node)

    async def node_status(_: web.Request) -> web.Response:
        return web.json_response(node_status_json(node))

    async def describe_quorum(request: web.Request) -> web.Response:
        description = admin.describe()  # NotLeaderError: redirected
        return web.json_response(describe_quorum_json(node, description))

    async def add_voter(request: web.Request) -> web.Response:
        query = Query.of(request, frozenset({"timeout_ms"}))
        body = await read_json(request, MAX_BODY_BYTES, _ADD_VOTER_BODY)
        if not isinstance(body, dict):
            bad_request(f"expected a JSON object {_ADD_VOTER_BODY}")
        key = ReplicaKey(_voter_id(body.pop("id", None)),
                         _directory_id(body.pop("directory_id", None)))
        body_timeout = body.pop("timeout_ms", None)
        if body:
            bad_request(f"unknown field {sorted(body)[0]!r} (expected id, directory_id, "
                        f"timeout_ms)")
        return await change_voters(admin.add_voter, key, _timeout_ms(query, body_timeout))

    async def remove_voter(request: web.Request) -> web.Response:
        query = Query.of(request, frozenset({"timeout_ms", "decommission"}))
        key = ReplicaKey(_voter_id(request.match_info["id"]),
                         _directory_id(request.match_info["directory_id"]))
        decommission = query.boolean("decommission")

        async def remove(key: ReplicaKey, timeout_ms: int) -> tuple[ReplicaKey, ...]:
            return await admin.remove_voter(key, timeout_ms, decommission=decommission)

        return await change_voters(remove, key, _timeout_ms(query, None))

    async def change_voters(
            change: Callable[[ReplicaKey, int], Awaitable[tuple[ReplicaKey, ...]]],
            key: ReplicaKey, timeout_ms: int) -> web.Response:
        try:
            voters = await change(key, timeout_ms)  # NotLeaderError: redirected
        except VoterChangeError as error:
            raise _refused(error) from None
        return web.json_response({"error": "NONE", **_key_json(key),
                                  "voters": [_key_json(voter) for voter in voters]})

    return [
        web.get(NODE_PATH, node_status),
        web.get(QUORUM_PATH, describe_quorum),
        web.post(VOTERS_PATH, add_voter),
        web.delete(VOTERS_PATH + "/{id}/{directory_id}", remove_voter),
        *backup_routes(node),
    ]


# Kafka's errors of a refused voter change that are codes of ours (the same name) -> the HTTP
# status that says the same.
_VOTER_CHANGE_STATUS: dict[Errors, int] = {
    Errors.DUPLICATE_VOTER: 409,
    Errors.VOTER_NOT_FOUND: 409,
    Errors.INVALID_REQUEST: 400,
    Errors.REQUEST_TIMED_OUT: 504,
    Errors.NOT_LEADER_OR_FOLLOWER: 503,  # leadership lost while the change was under way
    Errors.UNSUPPORTED_VERSION: 500,
}


def _refused(error: VoterChangeError) -> ApiError:
    status = _VOTER_CHANGE_STATUS.get(error.error)
    if status is None:
        return ApiError.of(ErrorCode.INTERNAL, f"{error.error.name}: {error.message}")
    return ApiError(status, ErrorCode(error.error.name), error.message)


def _voter_id(value: object) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)  # from the path
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**31:
        bad_request(f"id must be a node id (an integer >= 0), got {value!r}")
    return value


def _directory_id(value: object) -> uuid.UUID:
    if not isinstance(value, str):
        bad_request(f"directory_id must be a directory id string, got {value!r}")
    try:
        return parse_uuid(value)
    except ValueError as error:
        bad_request(f"directory_id: {error}")


def _timeout_ms(query: Query, from_body: object) -> int:
    """The query's or the body's ``timeout_ms`` (not both), or the default."""
    raw = query.string("timeout_ms")
    if raw is not None and from_body is not None:
        bad_request("timeout_ms is given more than once")
    if raw is not None:
        return parse_integer("timeout_ms", raw, minimum=1, maximum=MAX_VOTER_TIMEOUT_MS)
    if from_body is None:
        return DEFAULT_VOTER_TIMEOUT_MS
    if not isinstance(from_body, int) or isinstance(from_body, bool) \
            or not 1 <= from_body <= MAX_VOTER_TIMEOUT_MS:
        bad_request(f"timeout_ms must be an integer from 1 to {MAX_VOTER_TIMEOUT_MS}, "
                    f"got {from_body!r}")
    return from_body


def _key_json(key: ReplicaKey) -> dict[str, Any]:
    directory_id = key.directory_id
    return {"id": key.id,
            "directory_id": to_kafka_string(directory_id) if directory_id is not None else None}
