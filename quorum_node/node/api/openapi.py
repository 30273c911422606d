"""The OpenAPI 3.0 description of the client and admin APIs, served at ``GET /v1/openapi.json``
and kept as ``docs/openapi.json`` (``python -m quorum_node.node.api.openapi > docs/openapi.json``;
a test keeps the two equal). Schemathesis fuzzes the API from it (tests/security)."""

from __future__ import annotations

import json
import sys
from typing import Any

from aiohttp import web

from quorum_node.kv.ops import COMPARE_RESULTS, MAX_TXN_BYTES, MAX_TXN_OPS
from quorum_node.node.api.admin import MAX_VOTER_TIMEOUT_MS
from quorum_node.node.errors import ErrorCode
from quorum_node.node.kv_service import (
    MAX_LIST_LIMIT,
    MAX_READ_RECORDS,
    MAX_TIMEOUT_MS,
    MAX_WAIT_MS,
    MAX_WATCH_EVENTS,
)

OPENAPI_PATH = "/v1/openapi.json"
_INT64_MAX = 2**63 - 1


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _answer(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, **_json(schema)}


def _error(description: str) -> dict[str, Any]:
    return _answer(description, _ref("Error"))


def _int_query(name: str, minimum: int, maximum: int, *, required: bool = False,
               description: str = "") -> dict[str, Any]:
    return {"name": name, "in": "query", "required": required, "description": description,
            "schema": {"type": "integer", "minimum": minimum, "maximum": maximum}}


_TIMEOUT = _int_query("timeout_ms", 1, MAX_TIMEOUT_MS,
                      description="How long the node waits for the commit (default 10000).")
_KEY = {"name": "key", "in": "path", "required": True,
        "description": "UTF-8 once percent-decoded (else 400), up to 1 KiB (percent-encode "
                       "'/')",
        "schema": {"type": "string", "minLength": 1, "maxLength": 1024}}
# A request line or header over 8 KiB is refused by the HTTP layer, in plain text.
_BAD_REQUEST = {"description": "BAD_REQUEST: a malformed request (INVALID_REQUEST: a voter "
                               "change Kafka refuses); plain text when the HTTP layer refuses a "
                               "request line or header over 8 KiB.",
                "content": {"application/json": {"schema": _ref("Error")},
                            "text/plain": {"schema": {"type": "string"}}}}
# Answers every protected operation may give besides its own.
_COMMON = {
    "400": _BAD_REQUEST,
    "307": {"description": "NOT_LEADER: the same request to the Location header's URL (the "
                           "leader's, also in the body's leader.url).",
            **_json(_ref("Error"))},
    "401": _error("No valid credential (UNAUTHENTICATED)."),
    "403": _error("The credential lacks the role (FORBIDDEN)."),
    "413": _error("TOO_LARGE: a key over 1 KiB, or a body over its limit."),
    "503": _error("NO_LEADER, NODE_FAILED, SHUTTING_DOWN, OUTCOME_UNKNOWN or APPEND_LOST: "
                  "retry."),
}
_WRITE = {**_COMMON,
          "408": _error("The body did not arrive in time (REQUEST_TIMEOUT)."),
          "504": _error("TIMEOUT: not known to be committed in time; it may still commit."),
          "507": _error("DISK_FULL: the leader's disk has no room; nothing was appended. Retry "
                        "once space is freed (the leader takes writes again by itself).")}
_KV_WRITE = _answer("Committed and applied.", _ref("KvWrite"))

_VOTER_CHANGE = {
    **_COMMON,
    "200": _answer("The new voter set is committed.", _ref("VoterChange")),
    "408": _error("The body did not arrive in time."),
    "409": _error("DUPLICATE_VOTER or VOTER_NOT_FOUND."),
    "504": _error("REQUEST_TIMED_OUT: another change is pending, or not done in time."),
}

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "description": "Every error of every endpoint: a stable machine code (Kafka's error "
                       "name for a refused voter change) and one human line; leader only on "
                       "NOT_LEADER (307) and NO_LEADER (503).",
        "required": ["code", "message"], "additionalProperties": False,
        "properties": {
            "code": {"type": "string", "enum": [str(code) for code in ErrorCode]},
            "message": {"type": "string"},
            "leader": {"type": "object", "required": ["id", "url"],
                       "additionalProperties": False,
                       "properties": {"id": {"type": "integer", "nullable": True},
                                      "url": {"type": "string", "nullable": True}}},
        },
    },
    "AppendResult": {
        "type": "object", "required": ["first_offset", "last_offset", "epoch"],
        "properties": {"first_offset": {"type": "integer"}, "last_offset": {"type": "integer"},
                       "epoch": {"type": "integer"}},
    },
    "ReadResult": {
        "type": "object", "required": ["records", "high_watermark", "next_offset"],
        "properties": {
            "records": {"type": "array", "items": {
                "type": "object", "required": ["offset", "value", "timestamp_ms"],
                "properties": {"offset": {"type": "integer"}, "value": {"type": "string"},
                               "key": {"type": "string"}, "timestamp_ms": {"type": "integer"}}}},
            "high_watermark": {"type": "integer", "nullable": True},
            "next_offset": {"type": "integer"},
        },
    },
    "KvWrite": {
        "type": "object", "required": ["key", "offset", "epoch"],
        "properties": {"key": {"type": "string"}, "applied": {"type": "boolean"},
                       "deleted": {"type": "boolean"}, "offset": {"type": "integer"},
                       "epoch": {"type": "integer"}},
    },
    "KvPage": {
        "type": "object", "required": ["entries", "next_start_after", "applied_offset"],
        "properties": {
            "entries": {"type": "array", "items": {
                "type": "object", "required": ["key", "value"],
                "properties": {"key": {"type": "string"}, "value": {"type": "string"}}}},
            "next_start_after": {"type": "string", "nullable": True},
            "applied_offset": {"type": "integer"},
        },
    },
    "KvEvents": {
        "type": "object", "required": ["events", "next_offset", "applied_offset"],
        "properties": {
            "events": {"type": "array", "items": {
                "type": "object", "required": ["offset", "key", "type", "value"],
                "properties": {"offset": {"type": "integer"}, "key": {"type": "string"},
                               "type": {"type": "string", "enum": ["put", "delete"]},
                               "value": {"type": "string", "nullable": True}}}},
            "next_offset": {"type": "integer"},
            "applied_offset": {"type": "integer"},
        },
    },
    "KvValue": {
        "type": "object", "required": ["key", "value", "applied_offset"],
        "properties": {"key": {"type": "string"}, "value": {"type": "string"},
                       "applied_offset": {"type": "integer"}},
    },
    "Cas": {
        "type": "object", "required": ["expected", "value"], "additionalProperties": False,
        "properties": {"expected": {"type": "string", "nullable": True},
                       "value": {"type": "string", "nullable": True}},
    },
    "TxnCompare": {
        "description": "Whether the key's value (a string; never holds for an absent key), "
                       "version (writes since it was created; 0: absent) or mod_offset (the "
                       "offset that last wrote it; -1: absent) stands in 'result' to the "
                       "operand, given under the target's name. Versions and offsets count "
                       "from the quorum's first transaction: a key last written before it "
                       "counts as written once, just before it.",
        "type": "object", "required": ["key", "target", "result"],
        "properties": {
            "key": {"type": "string", "minLength": 1},
            "target": {"type": "string", "enum": ["value", "version", "mod_offset"]},
            "result": {"type": "string", "enum": list(COMPARE_RESULTS)},
            "value": {"type": "string"},
            "version": {"type": "integer", "format": "int64"},
            "mod_offset": {"type": "integer", "format": "int64"},
        },
    },
    "TxnOp": {
        "description": "A put (with its value), a delete or a get of a key; no key is put or "
                       "deleted twice in one branch.",
        "type": "object", "required": ["op", "key"], "additionalProperties": False,
        "properties": {"op": {"type": "string", "enum": ["put", "delete", "get"]},
                       "key": {"type": "string", "minLength": 1},
                       "value": {"type": "string"}},
    },
    "Txn": {
        "description": f"etcd's Txn: if every compare holds the success operations apply, "
                     f"else the failure ones, in order, at one offset. At most {MAX_TXN_OPS} "
                     f"compares and as many operations in each branch, {MAX_TXN_BYTES} bytes "
                     f"of keys and values in all (413 TOO_LARGE beyond).",
        "type": "object", "additionalProperties": False,
        "properties": {
            "compare": {"type": "array", "maxItems": MAX_TXN_OPS, "items": _ref("TxnCompare")},
            "success": {"type": "array", "maxItems": MAX_TXN_OPS, "items": _ref("TxnOp")},
            "failure": {"type": "array", "maxItems": MAX_TXN_OPS, "items": _ref("TxnOp")},
        },
    },
    "TxnResult": {
        "type": "object", "required": ["succeeded", "responses", "offset", "epoch"],
        "properties": {
            "succeeded": {"type": "boolean"},
            "responses": {
                "description": "One for each operation of the branch that ran: a get's value "
                               "(null: absent), version and mod_offset at that point of the "
                               "txn; whether a put's key existed; whether a delete deleted.",
                "type": "array",
                "items": {"type": "object", "required": ["op", "key"],
                          "properties": {
                              "op": {"type": "string", "enum": ["put", "delete", "get"]},
                              "key": {"type": "string"},
                              "value": {"type": "string", "nullable": True},
                              "version": {"type": "integer"},
                              "mod_offset": {"type": "integer"},
                              "existed": {"type": "boolean"},
                              "deleted": {"type": "boolean"}}}},
            "offset": {"type": "integer"}, "epoch": {"type": "integer"},
        },
    },
    "Replica": {
        "type": "object",
        "required": ["id", "directory_id", "log_end_offset", "lag", "last_fetch_timestamp",
                     "last_caught_up_timestamp", "endpoint"],
        "properties": {"id": {"type": "integer"},
                       "directory_id": {"type": "string", "nullable": True},
                       "log_end_offset": {"type": "integer"}, "lag": {"type": "integer"},
                       "last_fetch_timestamp": {"type": "integer"},
                       "last_caught_up_timestamp": {"type": "integer"},
                       "endpoint": {"type": "string", "nullable": True},
                       "could_be_voter": {"type": "boolean"},
                       "retired": {"type": "boolean"}},
    },
    "NodeStatus": {
        "type": "object",
        "required": ["node_id", "directory_id", "cluster_id", "state", "epoch", "leader_id",
                     "is_voter", "high_watermark", "voters_unheard", "log_start_offset",
                     "log_end_offset", "voters", "client_endpoints", "failure"],
        "properties": {
            "node_id": {"type": "integer"}, "directory_id": {"type": "string"},
            "cluster_id": {"type": "string"},
            "state": {"type": "string", "enum": ["unattached", "prospective", "candidate",
                                                 "leader", "follower", "resigned"]},
            "epoch": {"type": "integer"}, "leader_id": {"type": "integer", "nullable": True},
            "is_voter": {"type": "boolean"}, "high_watermark": {"type": "integer"},
            "voters_unheard": {"type": "array", "items": {"type": "integer"}},
            "log_start_offset": {"type": "integer"}, "log_end_offset": {"type": "integer"},
            "voters": {"type": "array", "items": _ref("VoterKey")},
            "client_endpoints": {"type": "array", "items": {
                "type": "object", "required": ["id", "url"],
                "properties": {"id": {"type": "integer"}, "url": {"type": "string"}}}},
            "failure": {"type": "string", "nullable": True},
        },
    },
    "Quorum": {
        "type": "object",
        "required": ["cluster_id", "leader_id", "leader_epoch", "high_watermark", "voters",
                     "observers"],
        "properties": {"cluster_id": {"type": "string"}, "leader_id": {"type": "integer"},
                       "leader_epoch": {"type": "integer"}, "high_watermark": {"type": "integer"},
                       "voters": {"type": "array", "items": _ref("Replica")},
                       "observers": {"type": "array", "items": _ref("Replica")}},
    },
    "VoterKey": {
        "type": "object", "required": ["id", "directory_id"],
        "properties": {"id": {"type": "integer"},
                       "directory_id": {"type": "string", "nullable": True}},
    },
    "AddVoter": {
        "type": "object", "required": ["id", "directory_id"], "additionalProperties": False,
        "properties": {
            "id": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
            "directory_id": {"type": "string",
                             "description": "22-character base64url (Kafka's form) or a UUID"},
            "timeout_ms": {"type": "integer", "minimum": 1, "maximum": MAX_VOTER_TIMEOUT_MS},
        },
    },
    "VoterChange": {
        "type": "object", "required": ["error", "id", "directory_id", "voters"],
        "properties": {"error": {"type": "string", "enum": ["NONE"]}, "id": {"type": "integer"},
                       "directory_id": {"type": "string", "nullable": True},
                       "voters": {"type": "array", "items": _ref("VoterKey")}},
    },
}

_TEXT = {"content": {"text/plain": {"schema": {"type": "string"}}}}

PATHS: dict[str, Any] = {
    "/v1/records": {
        "post": {
            "operationId": "appendRecords", "summary": "Append records as one batch",
            "security": [{"bearer": []}, {"mutualTls": []}, {}],
            "parameters": [_TIMEOUT],
            "requestBody": {"required": True, "content": {
                "application/json": {"schema": {"type": "array", "minItems": 1, "items": {
                    "oneOf": [{"type": "string"},
                              {"type": "object", "required": ["base64"],
                               "additionalProperties": False,
                               "properties": {"base64": {"type": "string",
                                                         "format": "byte"}}}]}}},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            }},
            "responses": {**_WRITE,
                          "200": _answer("Committed.", _ref("AppendResult")),
                          "415": _error("Another content type (UNSUPPORTED_MEDIA_TYPE).")},
        },
        "get": {
            "operationId": "readRecords", "summary": "Committed records from an offset",
            "security": [{"bearer": []}, {"mutualTls": []}, {}],
            "parameters": [
                _int_query("offset", 0, _INT64_MAX, required=True),
                _int_query("max_records", 1, MAX_READ_RECORDS),
                _int_query("wait_ms", 0, MAX_WAIT_MS,
                           description="Wait this long while nothing is committed at offset."),
            ],
            "responses": {**_COMMON,
                          "200": _answer("Records (maybe none).", _ref("ReadResult")),
                          "416": _error("Below the log start (OFFSET_OUT_OF_RANGE)."),
                          "429": _error("Too many waiting reads (TOO_MANY_LONG_POLLS).")},
        },
    },
    "/v1/kv": {
        "get": {
            "operationId": "kvList",
            "summary": "A page of the keys under a prefix, in key order (linearizable unless "
                       "stale)",
            "description": "At most `limit` keys and no more than 1 MiB of keys and values (one "
                           "entry however large): fewer keys than `limit` when they would be "
                           "more. `next_start_after` is where the next page starts (null after "
                           "the last). Strings must be UTF-8 once percent-decoded.",
            "security": [{"bearer": []}, {"mutualTls": []}, {}],
            "parameters": [
                {"name": "prefix", "in": "query", "required": False,
                 "schema": {"type": "string"}},
                {"name": "start_after", "in": "query", "required": False,
                 "description": "the previous page's next_start_after",
                 "schema": {"type": "string"}},
                _int_query("limit", 1, MAX_LIST_LIMIT),
                {"name": "stale", "in": "query", "required": False,
                 "schema": {"type": "boolean"}},
                _TIMEOUT,
            ],
            "responses": {**_COMMON,
                          "200": _answer("The page.", _ref("KvPage")),
                          "504": _error("Leadership not confirmed in time (TIMEOUT).")},
        },
    },
    "/v1/watch": {
        "get": {
            "operationId": "kvWatch",
            "summary": "The changes of a key or of a prefix's keys from an offset (long-poll; "
                       "any node)",
            "description": "At most `max_events` changes and no more than 1 MiB of keys and "
                           "values (one change however large); `next_offset` is where the next "
                           "watch continues. A waiting watch ends when its client closes the "
                           "connection.",
            "security": [{"bearer": []}, {"mutualTls": []}, {}],
            "parameters": [
                {"name": "key", "in": "query", "required": False,
                 "schema": {"type": "string", "minLength": 1}},
                {"name": "prefix", "in": "query", "required": False,
                 "schema": {"type": "string"}},
                _int_query("offset", 0, _INT64_MAX, required=True),
                _int_query("wait_ms", 0, MAX_WAIT_MS),
                _int_query("max_events", 1, MAX_WATCH_EVENTS),
            ],
            "responses": {**_COMMON,
                          "200": _answer("The changes.", _ref("KvEvents")),
                          "410": _error("COMPACTED: the changes before an offset (the "
                                        "message says which) are no longer known."),
                          "429": _error("TOO_MANY_LONG_POLLS.")},
        },
    },
    "/v1/kv/{key}": {
        "parameters": [_KEY],
        "put": {
            "operationId": "kvPut", "summary": "Set a key",
            "security": [{"bearer": []}, {"mutualTls": []}, {}],
            "parameters": [_TIMEOUT],
            # HTTP cannot tell an absent body from an empty one: either is the empty value.
            "requestBody": {"required": False, "description": "the value (UTF-8); no body is "
                            "the empty value", **_TEXT},
            "responses": {**_WRITE, "200": _KV_WRITE},
        },
        "get": {
            "operationId": "kvGet", "summary": "Read a key (linearizable unless stale)",
            "security": [{"bearer": []}, {"mutualTls": []}, {}],
            "parameters": [
                {"name": "stale", "in": "query", "required": False,
                 "schema": {"type": "boolean"}},
                _TIMEOUT,
            ],
            "responses": {**_COMMON,
                          "200": _answer("The value.", _ref("KvValue")),
                          "404": _error("KEY_NOT_FOUND."),
                          "504": _error("Leadership not confirmed in time (TIMEOUT).")},
        },
        "delete": {
            "operationId": "kvDelete", "summary": "Delete a key",
            "security": [{"bearer": []}, {"mutualTls": []}, {}],
            "parameters": [_TIMEOUT],
            "responses": {**_WRITE, "200": _KV_WRITE},
        },
    },
    "/v1/kv/{key}/cas": {
        "parameters": [_KEY],
        "post": {
            "operationId": "kvCas", "summary": "Compare-and-set",
            "security": [{"bearer": []}, {"mutualTls": []}, {}],
            "parameters": [_TIMEOUT],
            "requestBody": {"required": True, **_json(_ref("Cas"))},
            "responses": {**_WRITE, "200": _KV_WRITE},
        },
    },
    "/v1/txn": {
        "post": {
            "operationId": "kvTxn", "summary": "A multi-key transaction (etcd's Txn)",
            "security": [{"bearer": []}, {"mutualTls": []}, {}],
            "parameters": [_TIMEOUT],
            "requestBody": {"required": True, **_json(_ref("Txn"))},
            "responses": {**_WRITE,
                          "200": _answer("Committed and applied.", _ref("TxnResult"))},
        },
    },
    "/v1/node": {
        "get": {
            "operationId": "nodeStatus", "summary": "This node's own status (admin, any node)",
            "security": [{"bearer": []}, {"mutualTls": []}, {}],
            "responses": {**_COMMON, "200": _answer("The node's view.", _ref("NodeStatus"))},
        },
    },
    "/v1/backup": {
        "get": {
            "operationId": "backup",
            "summary": "A consistent backup of this node (admin): a tar of meta.properties, the "
                       "latest snapshot and the committed log after it, backup.json last "
                       "(quorum-node backup; docs/backup.md)",
            "security": [{"bearer": []}, {"mutualTls": []}, {}],
            "responses": {**_COMMON,
                          "200": {"description": "The backup, streamed.",
                                  "content": {"application/x-tar": {
                                      "schema": {"type": "string", "format": "binary"}}}},
                          "503": _error("No committed offset yet, the node is stopping, or "
                                        "backup.max.streams backups are streaming already "
                                        "(BACKUP_UNAVAILABLE).")},
        },
    },
    "/v1/quorum": {
        "get": {
            "operationId": "describeQuorum", "summary": "DescribeQuorum (admin)",
            "security": [{"bearer": []}, {"mutualTls": []}, {}],
            "responses": {**_COMMON, "200": _answer("The quorum.", _ref("Quorum"))},
        },
    },
    "/v1/quorum/voters": {
        "post": {
            "operationId": "addVoter", "summary": "AddVoter (admin, KIP-856)",
            "security": [{"bearer": []}, {"mutualTls": []}, {}],
            "parameters": [_int_query("timeout_ms", 1, MAX_VOTER_TIMEOUT_MS)],
            "requestBody": {"required": True, **_json(_ref("AddVoter"))},
            "responses": _VOTER_CHANGE,
        },
    },
    "/v1/quorum/voters/{id}/{directory_id}": {
        "parameters": [
            {"name": "id", "in": "path", "required": True,
             "schema": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}},
            {"name": "directory_id", "in": "path", "required": True,
             "schema": {"type": "string", "minLength": 1}},
        ],
        "delete": {
            "operationId": "removeVoter", "summary": "RemoveVoter (admin, KIP-856)",
            "security": [{"bearer": []}, {"mutualTls": []}, {}],
            "parameters": [
                _int_query("timeout_ms", 1, MAX_VOTER_TIMEOUT_MS),
                {"name": "decommission", "in": "query", "required": False,
                 "description": "true: may remove the node id's last directory (scale down)",
                 "schema": {"type": "string", "enum": ["true", "false"]}},
            ],
            "responses": _VOTER_CHANGE,
        },
    },
    "/healthz": {"get": {"operationId": "healthz", "summary": "Liveness", "security": [],
                         "responses": {"200": {"description": "Alive.", **_TEXT},
                                       "503": _error("Failed (NODE_FAILED).")}}},
    "/readyz": {"get": {"operationId": "readyz", "summary": "Readiness", "security": [],
                        "responses": {"200": {"description": "Ready: why, in text.", **_TEXT},
                                      "503": _error("Not ready (NOT_READY: why, such as a "
                                                    "full disk), or failed (NODE_FAILED).")}}},
    "/metrics": {"get": {"operationId": "metrics", "summary": "Prometheus metrics",
                         "security": [],
                         "responses": {"200": {"description": "Text exposition format.",
                                               **_TEXT}}}},
}


def openapi_document() -> dict[str, Any]:
    return {
        "openapi": "3.0.3",
        "info": {"title": "quorum-node client and admin API", "version": "1",
                 "description": "Every node serves it. Every error is the Error schema: "
                                "{code, message}. With security "
                                "on (docs/security.md) a bearer token or a client certificate "
                                "is required: read for reads, write for writes, admin for "
                                "/v1/quorum."},
        "paths": PATHS,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer",
                           "description": "A token of auth.token.file."},
                "mutualTls": {"type": "http", "scheme": "mutual-tls",
                              "description": "A client certificate of the quorum's CA, its "
                                             "subject common name mapped to roles by "
                                             "auth.certificate.roles (OpenAPI 3.1's mutualTLS; "
                                             "3.0 has no scheme for it)."},
            },
        },
    }


def openapi_routes() -> list[web.RouteDef]:
    document = openapi_document()

    async def serve(_: web.Request) -> web.Response:
        return web.json_response(document)

    return [web.get(OPENAPI_PATH, serve)]


if __name__ == "__main__":
    json.dump(openapi_document(), sys.stdout, indent=2)
    sys.stdout.write("\n")
