"""The admin API: DescribeQuorum, AddVoter and RemoveVoter (KIP-595, KIP-856) as JSON over HTTP.

- ``GET /v1/quorum``: DescribeQuorum.
- ``POST /v1/quorum/voters`` with ``{"id": N, "directory_id": "<22-char base64url>"}``:
  AddVoter, making observer (N, directory id) a voter.
- ``DELETE /v1/quorum/voters/{id}/{directory_id}``: RemoveVoter, dropping that voter.

Only the leader keeps the progress of every replica and changes the voter set, so only the leader
answers (as in Kafka). Elsewhere a request is redirected (307, same path and query) to the leader
when its address is known, or refused with 503 ``{"code": "NO_LEADER"}`` during an election.

DescribeQuorum answers::

    {"cluster_id": "...", "leader_id": 1, "leader_epoch": 3, "high_watermark": 42,
     "voters": [REPLICA, ...], "observers": [REPLICA + {"could_be_voter": bool}, ...]}

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
ids AddVoter accepts (KIP-856's CouldBeVoters).

A voter change takes ``timeout_ms`` (query, or the POST body; default 30000, at most 600000) and
answers once the new voter set is committed: 200 ``{"error": "NONE", "id", "directory_id",
"voters": [{"id", "directory_id"}, ...]}``. Refusals are ``{"code": KAFKA_ERROR, "message"}``:
409 ``DUPLICATE_VOTER`` (already a voter), 409 ``VOTER_NOT_FOUND`` (not a voter), 400
``INVALID_REQUEST`` (not an observer, an id not configured, removing an id's last directory
without ``?decommission=true``, removing the only voter, or a malformed request), 504
``REQUEST_TIMED_OUT`` (another change is pending, or this one was not done in time: it may still
complete), 503 ``NO_LEADER`` / ``NOT_LEADER_OR_FOLLOWER`` (retry).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from quorum_node.backup.endpoint import backup_routes
from quorum_node.node.config import format_address
from quorum_node.node.limits import BodyRefused, JsonRefused, parse_json, read_body
from quorum_node.node.metrics import could_be_voter
from quorum_node.raft.core import QuorumDescription, ReplicaDescription
from quorum_node.raft.types import Errors, NotLeaderError, ReplicaKey, VoterChangeError
from quorum_node.storage.kafka_uuid import parse_uuid, to_kafka_string

if TYPE_CHECKING:
    from quorum_node.node.runtime import QuorumNode

QUORUM_PATH = "/v1/quorum"
VOTERS_PATH = QUORUM_PATH + "/voters"
# Long enough for a new voter to catch up with the leader's log before it is added.
NODE_PATH = "/v1/node"
DEFAULT_VOTER_TIMEOUT_MS = 30_000
MAX_VOTER_TIMEOUT_MS = 600_000
MAX_BODY_BYTES = 64 * 1024  # {"id", "directory_id", "timeout_ms"}: a few dozen bytes


def _now_ms() -> int:
    # The same wall clock the runtime hands the core, so that "now" matches its timestamps.
    return time.time_ns() // 1_000_000


def endpoint_url(endpoint: tuple[str, int] | None, scheme: str) -> str | None:
    return None if endpoint is None else f"{scheme}://{format_address(*endpoint)}"


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
        "observers": [{**replica(row), "could_be_voter": could_be_voter(row, node.endpoints)}
                      for row in sorted(description.observers, key=_by_id)],
    }


def _key_id(key: ReplicaKey) -> int:
    return key.id


def _by_id(row: ReplicaDescription) -> int:
    return row.key.id


def _or_unknown(value: int | None) -> int:
    return -1 if value is None else value


def _not_leader(node: QuorumNode, request: web.Request) -> web.Response:
    """307 to the leader, same path and query (and, for a POST or DELETE, method and body), or
    503 NO_LEADER while none is known."""
    core = node.core
    leader = core.leader_id
    location = endpoint_url(node.leader_endpoint(), node.config.url_scheme)
    # A resigned leader still names itself: no one to redirect to until a successor wins.
    if leader is not None and leader != node.config.node_id and location is not None:
        return web.json_response(
            {"code": "NOT_LEADER", "leader_id": leader, "leader_url": location},
            status=307, headers={"Location": location + request.path_qs})
    return web.json_response(
        {"code": "NO_LEADER", "epoch": core.epoch,
         "message": f"no leader known in epoch {core.epoch} (state {core.state})"},
        status=503)


def _failed(node: QuorumNode) -> web.Response | None:
    if node.failure is None:
        return None
    return web.json_response(
        {"code": "NODE_FAILED", "message": f"node stopped after a failure: {node.failure}"},
        status=503)


def node_status_json(node: QuorumNode) -> dict[str, Any]:
    """This node's own view (``GET /v1/node``, answered by any node, never redirected): what
    ``quorum-admin status`` shows a row of, like etcd's ``endpoint status``."""
    core = node.core
    log = node.log_dir.log
    directory_id = node.log_dir.meta.directory_id
    return {
        "node_id": node.config.node_id,
        "directory_id": to_kafka_string(directory_id),
        "cluster_id": node.config.cluster_id,
        "state": str(core.state),
        "epoch": core.epoch,
        "leader_id": core.leader_id,
        "is_voter": core.is_voter,
        # The leader's high watermark is the quorum's: a leader that knows it serves writes.
        "high_watermark": _or_unknown(core.high_watermark),
        "log_start_offset": log.start_offset,
        "log_end_offset": log.end_offset,
        "voters": [_key_json(key) for key in sorted(core.voters, key=_key_id)],
        # Where the configured voters serve clients, for a tool to find every node from one.
        "client_endpoints": [
            {"id": voter_id, "url": endpoint_url(endpoint, node.config.url_scheme)}
            for voter_id, endpoint in sorted(node.client_endpoints.items())],
        "failure": None if node.failure is None else str(node.failure),
    }


def admin_routes(node: QuorumNode) -> list[web.RouteDef]:
    async def node_status(_: web.Request) -> web.Response:
        return web.json_response(node_status_json(node))

    async def describe_quorum(request: web.Request) -> web.Response:
        failed = _failed(node)
        if failed is not None:
            return failed
        try:
            description = node.core.describe_quorum(_now_ms())
        except NotLeaderError:
            return _not_leader(node, request)
        return web.json_response(describe_quorum_json(node, description))

    async def add_voter(request: web.Request) -> web.Response:
        body = await _json_body(request)
        key = ReplicaKey(_voter_id(body.pop("id", None)),
                         _directory_id(body.pop("directory_id", None)))
        body_timeout = body.pop("timeout_ms", None)
        if body:
            raise _InvalidRequest(f"unknown field {sorted(body)[0]!r} (expected id, directory_id, "
                           f"timeout_ms)")
        return await change_voters(request, node.add_voter, key,
                                   _timeout_ms(request, body_timeout))

    async def remove_voter(request: web.Request) -> web.Response:
        key = ReplicaKey(_voter_id(request.match_info["id"]),
                         _directory_id(request.match_info["directory_id"]))
        decommission = _decommission(request)
        timeout_ms = _timeout_ms(request, None, also_allowed=("decommission",))

        async def remove(key: ReplicaKey, timeout_s: float) -> None:
            await node.remove_voter(key, timeout_s, decommission=decommission)

        return await change_voters(request, remove, key, timeout_ms)

    async def change_voters(request: web.Request,
                            change: Callable[[ReplicaKey, float], Awaitable[None]],
                            key: ReplicaKey, timeout_ms: int) -> web.Response:
        failed = _failed(node)
        if failed is not None:
            return failed
        try:
            await change(key, timeout_ms / 1000)
        except NotLeaderError:
            return _not_leader(node, request)
        except VoterChangeError as error:
            return web.json_response(
                {"code": error.error.name, "message": error.message},
                status=_VOTER_CHANGE_STATUS.get(error.error, 500))
        return web.json_response({"error": "NONE", **_key_json(key),
                                  "voters": [_key_json(voter) for voter in node.core.voters]})

    return [
        web.get(NODE_PATH, node_status),
        web.get(QUORUM_PATH, describe_quorum),
        web.post(VOTERS_PATH, _refusing_invalid(add_voter)),
        web.delete(VOTERS_PATH + "/{id}/{directory_id}", _refusing_invalid(remove_voter)),
        *backup_routes(node),
    ]


# Kafka's error of a refused voter change -> the HTTP status that says the same.
_VOTER_CHANGE_STATUS: dict[Errors, int] = {
    Errors.DUPLICATE_VOTER: 409,
    Errors.VOTER_NOT_FOUND: 409,
    Errors.INVALID_REQUEST: 400,
    Errors.REQUEST_TIMED_OUT: 504,
    Errors.NOT_LEADER_OR_FOLLOWER: 503,  # leadership lost while the change was under way
}


class _InvalidRequest(Exception):
    """A malformed voter change request, answered 400 INVALID_REQUEST (or, for a body too large
    or too slow, 413 or 408, closing the connection)."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


Handler = Callable[[web.Request], Awaitable[web.Response]]


def _refusing_invalid(handler: Handler) -> Handler:
    async def wrapped(request: web.Request) -> web.Response:
        try:
            return await handler(request)
        except _InvalidRequest as error:
            response = web.json_response({"code": Errors.INVALID_REQUEST.name,
                                          "message": str(error)}, status=error.status)
            if error.status != 400:
                response.force_close()
            return response

    return wrapped


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        raw = await read_body(request, MAX_BODY_BYTES)
    except BodyRefused as refusal:
        raise _InvalidRequest(refusal.message, status=refusal.status) from None
    try:
        body = parse_json(raw)
    except JsonRefused as error:
        raise _InvalidRequest(f'{error}: expected {{"id": N, "directory_id": "..."}}') from None
    if not isinstance(body, dict):
        raise _InvalidRequest('expected a JSON object {"id": N, "directory_id": "..."}')
    return body


def _voter_id(value: object) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)  # from the path
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**31:
        raise _InvalidRequest(f"id must be a node id (an integer >= 0), got {value!r}")
    return value


def _directory_id(value: object) -> uuid.UUID:
    if not isinstance(value, str):
        raise _InvalidRequest(f"directory_id must be a directory id string, got {value!r}")
    try:
        return parse_uuid(value)
    except ValueError as error:
        raise _InvalidRequest(f"directory_id: {error}") from None


def _timeout_ms(request: web.Request, from_body: object,
                also_allowed: tuple[str, ...] = ()) -> int:
    allowed = ("timeout_ms", *also_allowed)
    unknown = sorted(set(request.query) - set(allowed))
    if unknown:
        raise _InvalidRequest(f"unknown query parameter {unknown[0]!r} "
                              f"(allowed: {', '.join(allowed)})")
    raw = request.query.getall("timeout_ms", [])
    if len(raw) + (from_body is not None) > 1:
        raise _InvalidRequest("timeout_ms is given more than once")
    value = from_body if from_body is not None else (raw[0] if raw else DEFAULT_VOTER_TIMEOUT_MS)
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) \
            or not 1 <= value <= MAX_VOTER_TIMEOUT_MS:
        raise _InvalidRequest(f"timeout_ms must be an integer from 1 to {MAX_VOTER_TIMEOUT_MS}, "
                       f"got {value!r}")
    return value


def _decommission(request: web.Request) -> bool:
    raw = request.query.getall("decommission", [])
    if len(raw) > 1:
        raise _InvalidRequest("decommission is given more than once")
    if not raw:
        return False
    if raw[0] not in ("true", "false"):
        raise _InvalidRequest(f"decommission must be true or false, got {raw[0]!r}")
    return raw[0] == "true"


def _key_json(key: ReplicaKey) -> dict[str, Any]:
    directory_id = key.directory_id
    return {"id": key.id,
            "directory_id": to_kafka_string(directory_id) if directory_id is not None else None}
