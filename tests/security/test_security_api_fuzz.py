"""Schemathesis against the published OpenAPI description (GET /v1/openapi.json), on a 3-node
quorum: valid and invalid requests (negative testing) of every operation. No request may get a
500, a 5xx other than the documented retry answers, an answer outside the description, or crash
a node; a refused request (4xx) must not change the log; and afterwards every replica holds the
same committed records and key-value store.

Budget: FUZZ_EXAMPLES examples per operation (default 25); the long run is
``FUZZ_EXAMPLES=2000 python -m pytest tests/security -k fuzz -s``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import requests
import schemathesis
from fuzz_support import FUZZ_EXAMPLES, TALLY, assert_replicas_consistent, report
from hypothesis import HealthCheck, settings
from schemathesis.checks import load_all_checks
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)
from secured_cluster import InProcessCluster, plain_configs

from quorum_node.node.api.openapi import openapi_document
from quorum_node.node.errors import ErrorCode

if TYPE_CHECKING:  # a name schemathesis defines for type checkers only
    from schemathesis.specs.openapi.schemas import OpenApiCase

load_all_checks()
# Invalid data is also rightly refused as too large (413: a key over 1 KiB), too slow (408) or
# out of range (416: an offset below the log start).
SCHEMA = schemathesis.openapi.from_dict(openapi_document(), config=SchemathesisConfig.from_dict(
    {"checks": {"negative_data_rejection": {"expected-statuses": [
        400, 401, 403, 404, 405, 406, 408, 409, 413, 415, 416, 422, 428, 429, "5xx"]}}}))
# A read waits up to wait_ms for a record past the end: long waits only slow the fuzz down.
MAX_FUZZ_WAIT_MS = 100
CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance,
          negative_data_rejection]
# Answers that say "retry" or "unknown outcome" (a 1 ms timeout_ms times out): documented.
RETRY_CODES = {"NO_LEADER", "TIMEOUT", "REQUEST_TIMED_OUT", "APPEND_LOST", "OUTCOME_UNKNOWN"}
# The one error body of every endpoint (quorum_node.node.api.http).
ERROR_SCHEMA_REF = "#/components/schemas/Error"
_ERROR_CODE = re.compile(r"[A-Z][A-Z0-9]*(_[A-Z0-9]+)*")


def assert_error_body(status: int, content_type: str, body: bytes) -> None:
    """``{"code", "message"}``, plus ``leader: {id, url}`` on NOT_LEADER and NO_LEADER only."""
    media_type = content_type.partition(";")[0].strip()
    assert media_type == "application/json", (status, content_type, body)
    document = json.loads(body)
    assert isinstance(document, dict), (status, document)
    code, message = document.get("code"), document.get("message")
    assert isinstance(code, str) and _ERROR_CODE.fullmatch(code), (status, document)
    assert code in {str(known) for known in ErrorCode}, (status, document)
    assert isinstance(message, str) and message and "\n" not in message, (status, document)
    if code in ("NOT_LEADER", "NO_LEADER"):
        assert set(document) == {"code", "message", "leader"}, (status, document)
        leader = document["leader"]
        assert isinstance(leader, dict) and set(leader) == {"id", "url"}, (status, document)
        assert leader["id"] is None or isinstance(leader["id"], int), (status, document)
        assert leader["url"] is None or isinstance(leader["url"], str), (status, document)
    else:
        assert set(document) == {"code", "message"}, (status, document)


def test_every_declared_error_is_the_one_error_body() -> None:
    """Every non-2xx answer the description declares, of every operation, is the Error schema
    (JSON only: plain text is the HTTP parser's own 400 for an oversized request line)."""
    document = openapi_document()
    declared = 0
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if method == "parameters":
                continue
            for status, answer in operation["responses"].items():
                if status.startswith("2"):
                    continue
                content = dict(answer["content"])
                if status == "400":
                    content.pop("text/plain", None)
                assert content == {"application/json": {"schema": {"$ref": ERROR_SCHEMA_REF}}}, (
                    method, path, status, answer)
                declared += 1
    assert declared > 50
    error = document["components"]["schemas"]["Error"]
    assert error["required"] == ["code", "message"] and error["additionalProperties"] is False
    assert set(error["properties"]) == {"code", "message", "leader"}
    assert error["properties"]["code"]["enum"] == [str(code) for code in ErrorCode]


@pytest.fixture(scope="module")
def quorum(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessCluster]:
    cluster = InProcessCluster(plain_configs(tmp_path_factory.mktemp("fuzz"), 3,
                                             http_max_long_polls=4))
    try:
        yield cluster
    finally:
        cluster.stop()


def _leader_url(quorum: InProcessCluster) -> str:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        leader = quorum.leader()
        if leader is not None and leader.core.accepts_writes:
            return leader.config.client_url
        time.sleep(0.05)
    raise AssertionError("no leader")


def test_the_description_is_published(quorum: InProcessCluster) -> None:
    url = _leader_url(quorum)
    assert requests.get(f"{url}/v1/openapi.json", timeout=5).json() == openapi_document()
    docs = Path(__file__).parents[2] / "docs" / "openapi.json"
    assert json.loads(docs.read_text()) == openapi_document(), (
        "docs/openapi.json is out of date: "
        "python -m quorum_node.node.api.openapi > docs/openapi.json")


@SCHEMA.parametrize()
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=False,
          suppress_health_check=list(HealthCheck))
def test_fuzz_api(case: OpenApiCase, quorum: InProcessCluster) -> None:
    url = _leader_url(quorum)
    leader = quorum.leader()
    before = leader.log_dir.log.end_offset if leader is not None else None
    # A new epoch appends its LeaderChange (and a re-elected leader is the same node): only a
    # request refused within one leader's epoch must leave the log as it was.
    epoch = leader.core.epoch if leader is not None else None
    wait_ms = (case.query or {}).get("wait_ms")
    if case.path == "/v1/records" and isinstance(wait_ms, int) and wait_ms > MAX_FUZZ_WAIT_MS:
        case.query["wait_ms"] = MAX_FUZZ_WAIT_MS
    response = case.call(base_url=url, timeout=70)
    TALLY["requests"] += 1
    TALLY[f"status {response.status_code // 100}xx"] += 1
    assert response.status_code != 500, response.text
    content_type = (response.headers.get("content-type") or [""])[0]  # lower-cased, listed
    if response.status_code == 400 and content_type.startswith("text/plain"):
        # The one answer no handler gives: aiohttp's parser refuses a request line or header
        # over 8 KiB before any middleware runs (declared so in the description).
        assert b"Got more than 8190 bytes" in response.content, response.content
        TALLY["oversized request lines"] += 1
    elif not 200 <= response.status_code < 300:
        assert_error_body(response.status_code, content_type, response.content)
        TALLY["error bodies checked"] += 1
    if response.status_code >= 500 and case.path not in ("/healthz", "/readyz"):
        assert response.json().get("code") in RETRY_CODES, response.text
    case.validate_response(response, checks=CHECKS)
    assert all(node.failure is None for node in quorum.nodes.values())
    if (400 <= response.status_code < 500 and leader is not None
            and quorum.leader() is leader and leader.core.epoch == epoch):
        assert leader.log_dir.log.end_offset == before, (
            f"{case.method} {case.path} was refused ({response.status_code}) but the log grew")


def test_replicas_agree_after_the_fuzz(quorum: InProcessCluster) -> None:
    nodes = list(quorum.nodes.values())
    # The client API's application is the last one a node starts (the only one here).
    stores = [node.state_machine.store for node in nodes]
    high_watermark = assert_replicas_consistent(nodes, stores)
    TALLY["high watermark"] = high_watermark
    report("API fuzz")
