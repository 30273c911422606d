"""Talking to the quorum's nodes: each node's ``/metrics`` (who it is: its directory id, state
and leader) and the leader's admin API (DescribeQuorum, AddVoter, RemoveVoter).

Nodes are reached by pod IP, never through a redirect: a node redirects admin calls to the
leader's configured DNS name, and the operator picks the leader itself from the nodes' own
reports. A redirect therefore means the leader changed, and the call is retried on a later pass.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass
from typing import Any

import aiohttp

from kafka_quorum_operator.observe import NodeView, QuorumView, parse_describe_quorum, parse_metrics

VOTERS_PATH = "/v1/quorum/voters"
# Long enough for an AddVoter whose observer is caught up; a slower one answers
# REQUEST_TIMED_OUT and is resumed on the next pass.
VOTER_CHANGE_TIMEOUT_MS = 15_000


@dataclass(frozen=True)
class ChangeResult:
    ok: bool
    code: str  # NONE, or Kafka's error name, or UNREACHABLE / NOT_LEADER
    message: str


class NodeClient:
    def __init__(self, timeout_s: float = 3.0) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def metrics(self, address: str) -> NodeView | None:
        try:
            async with self._client().get(f"http://{address}/metrics") as response:
                if response.status != 200:
                    return None
                return parse_metrics(await response.text())
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None

    async def describe(self, address: str) -> QuorumView | None:
        try:
            async with self._client().get(f"http://{address}/v1/quorum",
                                          allow_redirects=False) as response:
                if response.status != 200:
                    return None
                return parse_describe_quorum(await response.json())
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return None

    async def add_voter(self, address: str, node_id: int, directory_id: str) -> ChangeResult:
        body = {"id": node_id, "directory_id": directory_id,
                "timeout_ms": VOTER_CHANGE_TIMEOUT_MS}
        return await self._change("POST", f"http://{address}{VOTERS_PATH}", body)

    async def remove_voter(self, address: str, node_id: int, directory_id: str, *,
                           decommission: bool = False) -> ChangeResult:
        """RemoveVoter. ``decommission`` removes a node id's last directory (scale-down); without
        it the node refuses that, so a replaced directory is only removed after its successor
        was added."""
        quoted = urllib.parse.quote(directory_id, safe="")
        url = f"http://{address}{VOTERS_PATH}/{node_id}/{quoted}" \
              f"?timeout_ms={VOTER_CHANGE_TIMEOUT_MS}"
        if decommission:
            url += "&decommission=true"
        return await self._change("DELETE", url, None)

    async def _change(self, method: str, url: str, body: Any) -> ChangeResult:
        timeout = aiohttp.ClientTimeout(total=VOTER_CHANGE_TIMEOUT_MS / 1000 + 5)
        try:
            async with self._client().request(method, url, json=body, allow_redirects=False,
                                              timeout=timeout) as response:
                text = await response.text()
                status = response.status
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            return ChangeResult(False, "UNREACHABLE", str(error) or type(error).__name__)
        try:
            answer = json.loads(text) if text else {}
        except ValueError:
            answer = {}
        if not isinstance(answer, dict):
            answer = {}
        if status == 200:
            return ChangeResult(True, "NONE", "committed")
        if status in (307, 308):
            return ChangeResult(False, "NOT_LEADER", "the leader changed")
        code = str(answer.get("code") or f"HTTP_{status}")
        return ChangeResult(False, code, str(answer.get("message") or text[:200]))
