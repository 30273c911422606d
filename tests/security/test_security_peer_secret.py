"""The peer secret of a PLAINTEXT controller listener: its file's rules, and a node that takes a
rotated secret without a restart (it is reloaded like the token file)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import aiohttp
import pytest
from proc_cluster import free_port
from secured_cluster import split_listeners

from quorum_node.node.config import NodeConfig
from quorum_node.node.wiring import build_node
from quorum_node.raft.config import VoterEndpoint
from quorum_node.security.peer_secret import PEER_SECRET_HEADER, PeerSecretError, load_peer_secret
from quorum_node.storage.meta_properties import format_log_dir, random_cluster_id


@pytest.mark.parametrize(("text", "problem"), [
    ("", "found 0 non-empty lines"),
    ("one-secret-of-the-quorum\nanother-line-of-text\n", "found 2 non-empty lines"),
    ("short\n", "at least 16 printable ASCII characters"),
    ("with a space in the middle\n", "without spaces"),
])
def test_bad_secret_files_are_refused(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "secret"
    path.write_text(text)
    with pytest.raises(PeerSecretError, match=problem) as caught:
        load_peer_secret(path)
    assert str(caught.value).startswith(str(path)) and "\n" not in str(caught.value)
    assert load_peer_secret(_write(path, "  a-good-secret-of-16+\n\n")) == "a-good-secret-of-16+"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_rotated_secret_is_used_without_a_restart(tmp_path: Path) -> None:
    secret = _write(tmp_path / "secret", "the-first-secret-of-it\n")
    port, peer_port = free_port(), free_port()
    cluster_id = random_cluster_id()
    config = NodeConfig(node_id=1, cluster_id=cluster_id, log_dir=tmp_path / "node-1",
                        **split_listeners(port, peer_port, tls=False),
                        voters=(VoterEndpoint(id=1, host="127.0.0.1", port=peer_port),),
                        client_endpoints=(VoterEndpoint(id=1, host="127.0.0.1", port=port),),
                        controller_listener_secret_file=secret, security_reload_interval_ms=100)
    format_log_dir(config.log_dir, cluster_id, 1)
    url = f"http://127.0.0.1:{peer_port}/raft/v1/stream"

    async def handshake(session: aiohttp.ClientSession, offered: str) -> int:
        try:
            async with session.ws_connect(url, headers={PEER_SECRET_HEADER: offered}):
                return 101
        except aiohttp.WSServerHandshakeError as error:
            return error.status

    async def scenario() -> list[int]:
        node = build_node(config)
        await node.start()
        try:
            async with aiohttp.ClientSession() as session:
                statuses = [await handshake(session, "the-first-secret-of-it"),
                            await handshake(session, "the-second-secret-of-it")]
                _write(secret, "the-second-secret-of-it\n")
                os.utime(secret, ns=(time.time_ns() + 10**9,) * 2)  # a change, whatever the clock
                deadline = time.monotonic() + 5
                while node.security.current_peer_secret() != "the-second-secret-of-it":
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
                statuses += [await handshake(session, "the-first-secret-of-it"),
                             await handshake(session, "the-second-secret-of-it")]
                return statuses
        finally:
            await node.shutdown(timeout_s=0.5)

    assert asyncio.run(scenario()) == [101, 401, 401, 101]
