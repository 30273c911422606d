"""Talking to the quorum's nodes' admin API: each node's ``GET /v1/node`` (who it is: its
directory id, state and leader) and the leader's DescribeQuorum, AddVoter and RemoveVoter.

Nodes are reached by pod IP, never through a redirect: a node redirects admin calls to the
leader's configured DNS name, and the operator picks the leader itself from the nodes' own
reports. A redirect therefore means the leader changed, and the call is retried on a later pass.

Over TLS, the connection goes to the pod IP but the node's certificate must name the pod's DNS
name (``Route.server_name``, also the TLS SNI): IP addresses are not in the certificates (a pod's
IP is known only once it runs, and changes with every new pod), and the operator does not depend
on cluster DNS. The operator presents its client certificate (CN ``quorum-operator``, admin).
Every address must have been given a route (``NodeClient.route``) from the pass's observation;
an address without one is not contacted.
"""

from __future__ import annotations

import json
import os
import ssl
import tempfile
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from kafka_quorum_operator.observe import (
    NodeView,
    QuorumView,
    parse_describe_quorum,
    parse_node_status,
)

NODE_PATH = "/v1/node"
QUORUM_PATH = "/v1/quorum"
VOTERS_PATH = QUORUM_PATH + "/voters"
# Long enough for an AddVoter whose observer is caught up; a slower one answers
# REQUEST_TIMED_OUT and is resumed on the next pass.
VOTER_CHANGE_TIMEOUT_MS = 15_000


@dataclass(frozen=True)
class ChangeResult:
    ok: bool
    code: str  # NONE, or Kafka's error name, or UNREACHABLE / NOT_LEADER
    message: str


@dataclass(frozen=True)
class Route:
    """How to reach the node at an address: the name its certificate must hold, and the
    operator's TLS context for its quorum (None: plain HTTP, a quorum with TLS off)."""

    server_name: str
    tls: ssl.SSLContext | None = None

    @property
    def scheme(self) -> str:
        return "http" if self.tls is None else "https"

    def options(self) -> dict[str, Any]:
        if self.tls is None:
            return {}
        return {"ssl": self.tls, "server_hostname": self.server_name}


def client_context(ca: bytes, certificate: bytes, key: bytes) -> ssl.SSLContext:
    """A TLS context trusting ``ca`` (PEM bundle) and presenting the certificate and key (PEM).
    The standard library loads a certificate chain only from files: they are written to a
    private temporary directory and removed once loaded."""
    context = ssl.create_default_context(cadata=ca.decode())
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="kq-tls-") as directory:
        os.chmod(directory, 0o700)
        files = {}
        for name, content in (("tls.crt", certificate), ("tls.key", key)):
            path = Path(directory) / name
            path.touch(0o600)
            path.write_bytes(content)
            files[name] = path
        context.load_cert_chain(files["tls.crt"], files["tls.key"])
    return context


class NodeClient:
    def __init__(self, timeout_s: float = 3.0) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._routes: dict[str, Route] = {}

    def route(self, address: str, route: Route) -> None:
        """Reach ``address`` (host:port) this way from now on."""
        self._routes[address] = route

    def forget(self, addresses: Iterable[str]) -> None:
        for address in addresses:
            self._routes.pop(address, None)

    def _target(self, address: str, path: str) -> tuple[str, dict[str, Any]] | None:
        route = self._routes.get(address)
        if route is None:
            return None
        return f"{route.scheme}://{address}{path}", route.options()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def node(self, address: str) -> NodeView | None:
        """The node's view of itself (any node answers, never redirected); None: no answer, or
        not a quorum node's."""
        found = await self._get_json(address, NODE_PATH)
        return parse_node_status(found) if found is not None else None

    async def describe(self, address: str) -> QuorumView | None:
        """The leader's DescribeQuorum; None from a node that does not lead (it redirects)."""
        found = await self._get_json(address, QUORUM_PATH)
        try:
            return parse_describe_quorum(found) if isinstance(found, dict) else None
        except ValueError:
            return None

    async def _get_json(self, address: str, path: str) -> Any:
        """The JSON a GET answers with 200; None for any other answer, or none."""
        target = self._target(address, path)
        if target is None:
            return None
        url, options = target
        try:
            async with self._client().get(url, allow_redirects=False, **options) as response:
                if response.status != 200:
                    return None
                return await response.json()
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return None

    async def add_voter(self, address: str, node_id: int, directory_id: str) -> ChangeResult:
        body = {"id": node_id, "directory_id": directory_id,
                "timeout_ms": VOTER_CHANGE_TIMEOUT_MS}
        return await self._change("POST", address, VOTERS_PATH, body)

    async def remove_voter(self, address: str, node_id: int, directory_id: str, *,
                           decommission: bool = False) -> ChangeResult:
        """RemoveVoter. ``decommission`` removes a node id's last directory (scale-down); without
        it the node refuses that, so a replaced directory is only removed after its successor
        was added."""
        quoted = urllib.parse.quote(directory_id, safe="")
        path = f"{VOTERS_PATH}/{node_id}/{quoted}?timeout_ms={VOTER_CHANGE_TIMEOUT_MS}"
        if decommission:
            path += "&decommission=true"
        return await self._change("DELETE", address, path, None)

    async def _change(self, method: str, address: str, path: str, body: Any) -> ChangeResult:
        timeout = aiohttp.ClientTimeout(total=VOTER_CHANGE_TIMEOUT_MS / 1000 + 5)
        target = self._target(address, path)
        if target is None:
            return ChangeResult(False, "UNREACHABLE", f"no route to {address} (not observed)")
        url, options = target
        try:
            async with self._client().request(method, url, json=body, allow_redirects=False,
                                              timeout=timeout, **options) as response:
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
