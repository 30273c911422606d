"""The controller listener's Kafka protocol (``quorum_node.node.kafka``) on a real node in this
process (loopback sockets, a real log directory): Kafka and HTTP on one port, the answers of
``quorum-admin --bootstrap-controller`` against the HTTP admin API's, what a malformed request
does (its connection closed with a log line, the node unharmed), SASL/PLAIN with bearer tokens
and the admin role, and the client tools pointed at the controller listener.

Kafka's own tool is run against a quorum in ``test_kafka_metadata_quorum.py`` (slow)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import socket
import struct
import time
from collections.abc import AsyncIterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kio.schema.api_versions.v0 import response as api_versions_v0
from kio.schema.api_versions.v4 import request as api_versions_request
from kio.schema.api_versions.v4 import response as api_versions_response
from kio.schema.errors import ErrorCode as KafkaError
from test_admin_api import FAST, free_port, shutdown

from quorum_node.cli import admin as admin_cli
from quorum_node.cli import client as client_cli
from quorum_node.kafka_admin_client import KafkaAdminError, KafkaQuorumAdmin
from quorum_node.node.app import build_app
from quorum_node.node.config import load_config
from quorum_node.node.kafka.codec import encode_request, read_response
from quorum_node.node.kafka.server import MAX_REQUEST_BYTES, SUPPORTED, kafka_protocol_of
from quorum_node.node.runtime import QuorumNode
from quorum_node.node.wiring import build_node
from quorum_node.raft.state import RaftState
from quorum_node.security.client_credentials import ClientCredentials
from quorum_node.storage.meta_properties import format_log_dir, random_cluster_id

ADMIN_TOKEN = "admin-token-0123456789abcdef"
READ_TOKEN = "read-token-0123456789abcdef"


@dataclass
class Node:
    node: QuorumNode
    client_port: int
    controller_port: int

    @property
    def controller(self) -> tuple[str, int]:
        return "127.0.0.1", self.controller_port


@contextlib.asynccontextmanager
async def one_node(tmp_path: Path, *, tokens: bool = False,
                   **more: str) -> AsyncIterator[Node]:
    """A one-voter quorum with a client listener and a controller listener of its own."""
    client_port, controller_port = free_port(), free_port()
    cluster_id = random_cluster_id()
    log_dir = tmp_path / "node-1"
    format_log_dir(log_dir, cluster_id, 1)
    settings = {
        "node.id": "1", "cluster.id": cluster_id, "metadata.log.dir": str(log_dir),
        "process.roles": "controller",
        "listeners": f"CLIENT://127.0.0.1:{client_port},CONTROLLER://127.0.0.1:{controller_port}",
        "listener.security.protocol.map": "CLIENT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "controller.quorum.client.endpoints": f"1@127.0.0.1:{client_port}",
    }
    if tokens:
        (tmp_path / "tokens").write_text(f"{ADMIN_TOKEN} operator admin\n"
                                         f"{READ_TOKEN} reader read\n")
        (tmp_path / "secret").write_text("a-peer-secret-of-the-quorum\n")
        settings |= {"auth.token.file": str(tmp_path / "tokens"),
                     "controller.listener.secret.file": str(tmp_path / "secret")}
    settings |= {key.replace("_", "."): value for key, value in more.items()}
    config = load_config(None, settings, {}).model_copy(update={"quorum": FAST})
    node = build_node(config)
    try:
        await node.start(build_app(node), kafka_protocol_of(node))
        deadline = asyncio.get_running_loop().time() + 10
        while node.core.state is not RaftState.LEADER or node.core.high_watermark is None:
            assert asyncio.get_running_loop().time() < deadline, "no leader"
            await asyncio.sleep(0.02)
        yield Node(node, client_port, controller_port)
    finally:
        await shutdown(node, timeout_s=0.5)


def exchange(server: tuple[str, int], frame: bytes) -> bytes:
    """Send ``frame``; the answer's bytes (without its size), or b"" when the server closed the
    connection instead."""
    with socket.create_connection(server, timeout=5) as sock:
        sock.sendall(frame)
        size = _read(sock, 4)
        if len(size) < 4:
            return b""
        return _read(sock, struct.unpack(">i", size)[0])


def _read(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            break
        data += chunk
    return data


async def http_get(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.json(content_type=None)


def run_cli(main: Any, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


async def test_kafka_and_http_share_the_controller_port(tmp_path: Path) -> None:
    async with one_node(tmp_path) as node:
        request = api_versions_request.ApiVersionsRequest(client_software_name="test",
                                                          client_software_version="1")
        answer = await asyncio.to_thread(exchange, node.controller,
                                         encode_request(7, "test", request))
        correlation, versions = read_response(api_versions_response.ApiVersionsResponse,
                                              answer)
        assert correlation == 7 and versions.error_code == KafkaError.none
        assert {(k.api_key, k.min_version, k.max_version) for k in versions.api_keys} == {
            (key, low, high) for key, (_, low, high) in SUPPORTED.items()}

        # Kafka's DescribeQuorum, as quorum-admin --bootstrap-controller asks it, is the HTTP
        # admin API's answer (one code path), endpoints in Kafka's form.
        admin = KafkaQuorumAdmin([node.controller], 5, ClientCredentials())
        over_kafka = await asyncio.to_thread(admin.describe)
        status, over_http = await http_get(f"http://127.0.0.1:{node.client_port}/v1/quorum")
        assert status == 200
        for quorum in (over_kafka, over_http):
            for row in quorum["voters"]:
                row.pop("endpoint")
                row.pop("last_fetch_timestamp")
                row.pop("last_caught_up_timestamp")
        assert over_kafka == over_http
        assert over_kafka["voters"][0]["directory_id"] is not None

        # HTTP on the same port: a client's request is told where clients go, in the one
        # error body.
        status, body = await http_get(
            f"http://127.0.0.1:{node.controller_port}/v1/kv/some-key")
        assert status == 421
        assert body["code"] == "WRONG_LISTENER"
        assert f"CLIENT://127.0.0.1:{node.client_port}" in body["message"]


async def test_quorum_admin_bootstrap_controller(tmp_path: Path) -> None:
    async with one_node(tmp_path) as node:
        controller = f"127.0.0.1:{node.controller_port}"
        code, out, err = await asyncio.to_thread(
            run_cli, admin_cli.main, "--bootstrap-controller", controller, "describe",
            "--status")
        assert code == 0, err
        assert f'"endpoints": ["CONTROLLER://{controller}"]' in out
        assert out.splitlines()[1] == f"{'LeaderId:':<24}1"

        # The HTTP admin API asked on the controller listener: told where it is served.
        code, out, err = await asyncio.to_thread(
            run_cli, admin_cli.main, "--bootstrap-server", controller, "describe", "--status")
        assert code == 1
        assert f"clients and the admin API are served on CLIENT://127.0.0.1:{node.client_port}" \
            in err
        # A client tool refuses the controller listeners.
        code, out, err = await asyncio.to_thread(
            run_cli, client_cli.main, "--bootstrap-controller", controller, "--json", "get",
            "k")
        assert code == 2
        assert json.loads(out)["code"] == "WRONG_LISTENER"


async def test_a_malformed_request_closes_its_connection_only(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "quorum_node.node.kafka.server")
    async with one_node(tmp_path) as node:
        trailing = encode_request(1, None, api_versions_request.ApiVersionsRequest(
            client_software_name="a", client_software_version="b")) + b"\0"
        bad = {
            # DescribeQuorum v2 whose body stops short
            "truncated": struct.pack(">ihhih", 10, 55, 2, 1, -1),
            "oversized": struct.pack(">i", MAX_REQUEST_BYTES + 1) + b"\0" * 64,
            "unserved api": struct.pack(">ihhih", 10, 3, 12, 1, -1),
            # an ApiVersions with a byte more than it holds (counted in the frame's size)
            "bytes after": struct.pack(">i", len(trailing) - 4) + trailing[4:],
        }
        for what, frame in bad.items():
            assert await asyncio.to_thread(exchange, node.controller, frame) == b"", what
        logged = [r.getMessage() for r in caplog.records
                  if r.name == "quorum_node.node.kafka.server"]
        assert len(logged) == len(bad), logged
        assert all("Kafka protocol: closing the connection of 127.0.0.1:" in line
                   for line in logged)
        # A newer client's ApiVersions gets Kafka's v0 answer listing what is served.
        answer = await asyncio.to_thread(exchange, node.controller,
                                         struct.pack(">ihhih", 10, 18, 99, 5, -1))
        _, versions = read_response(api_versions_v0.ApiVersionsResponse, answer)
        assert versions.error_code == KafkaError.unsupported_version
        assert any(k.api_key == 55 and k.max_version == 2 for k in versions.api_keys)
        # The node goes on serving both protocols.
        admin = KafkaQuorumAdmin([node.controller], 5, ClientCredentials())
        assert (await asyncio.to_thread(admin.describe))["leader_id"] == 1
        assert node.node.failure is None


async def test_credentials_over_the_kafka_protocol(tmp_path: Path) -> None:
    async with one_node(tmp_path, tokens=True) as node:
        def describe(token: str | None) -> dict[str, Any]:
            return KafkaQuorumAdmin([node.controller], 5,
                                    ClientCredentials(token=token)).describe()

        with pytest.raises(KafkaAdminError) as refused:
            await asyncio.to_thread(describe, None)
        assert refused.value.code == "CLUSTER_AUTHORIZATION_FAILED"
        assert "SASL/PLAIN with a bearer token" in str(refused.value)
        with pytest.raises(KafkaAdminError) as refused:
            await asyncio.to_thread(describe, "not-a-token-of-the-file")
        assert refused.value.code == "SASL_AUTHENTICATION_FAILED"
        with pytest.raises(KafkaAdminError) as refused:
            await asyncio.to_thread(describe, READ_TOKEN)
        assert refused.value.code == "CLUSTER_AUTHORIZATION_FAILED"
        assert "admin role" in str(refused.value)
        assert (await asyncio.to_thread(describe, ADMIN_TOKEN))["leader_id"] == 1
        # A voter change needs the admin role too.
        admin = KafkaQuorumAdmin([node.controller], 5, ClientCredentials(token=READ_TOKEN))
        with pytest.raises(KafkaAdminError) as refused:
            await asyncio.to_thread(admin.remove_voter, 1, "AAAAAAAAAAAAAAAAAAAAAQ")
        assert refused.value.code == "CLUSTER_AUTHORIZATION_FAILED"
        admin = KafkaQuorumAdmin([node.controller], 5, ClientCredentials(token=ADMIN_TOKEN))
        with pytest.raises(KafkaAdminError) as refused:
            await asyncio.to_thread(admin.remove_voter, 1, "AAAAAAAAAAAAAAAAAAAAAQ")
        assert refused.value.code == "VOTER_NOT_FOUND"


async def test_silent_and_idle_connections_are_closed(tmp_path: Path) -> None:
    """A connection that never says which protocol it speaks, and a Kafka connection idle
    after its answer, are closed after http.read.timeout.ms."""

    def seconds_until_closed(sock: socket.socket) -> float:
        started = time.monotonic()
        sock.settimeout(5)
        assert sock.recv(1) == b""
        return time.monotonic() - started

    async with one_node(tmp_path, http_read_timeout_ms="300") as node:
        with socket.create_connection(node.controller, timeout=5) as silent:
            assert await asyncio.to_thread(seconds_until_closed, silent) < 2
        with socket.create_connection(node.controller, timeout=5) as idle:
            def answered_then_closed() -> float:
                idle.sendall(encode_request(1, None, api_versions_request.ApiVersionsRequest(
                    client_software_name="a", client_software_version="b")))
                size = struct.unpack(">i", _read(idle, 4))[0]
                assert len(_read(idle, size)) == size
                return seconds_until_closed(idle)

            assert await asyncio.to_thread(answered_then_closed) < 2
