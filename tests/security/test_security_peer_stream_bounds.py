"""What a peer's credential holds of a node over one stream: at most MAX_PARKED_PER_STREAM of
its requests wait for their answers at once, however many Fetches it sends without reading
(each parked one is a timer and a callback until the node answers it), and the stream is closed
once the peer stops reading."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from raw_clients import binary_frame, connect, seconds_until_closed, upgrade
from secured_cluster import FAST, InProcessCluster, secret_configs

from quorum_node.node.transport import (
    MAX_PARKED_PER_STREAM,
    REQUEST_TYPES,
    STREAM_PATH,
    encode_frame,
)
from quorum_node.raft.messages import FetchRequest
from quorum_node.security.peer_secret import PEER_SECRET_HEADER

SECRET = "the-secret-of-the-quorum"
_TAG = struct.Struct(">IB")
_FETCH = list(REQUEST_TYPES).index("Fetch")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[InProcessCluster]:
    """Voters 1, 2 and 3, of which 1 and 2 run: the flood fetches as voter 3."""
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    configs = secret_configs(tmp_path, secret, 3, 2, http_read_timeout_ms=2000,
                             quorum=FAST.model_copy(update={"fetch_max_wait_ms": 400}))
    cluster = InProcessCluster(configs)
    try:
        deadline = time.monotonic() + 10
        while (leader := cluster.leader()) is None or not leader.core.leader_has_committed:
            assert time.monotonic() < deadline, "no leader"
            time.sleep(0.05)
        yield cluster
    finally:
        cluster.stop()


def test_a_peer_that_floods_fetches_holds_a_few_parked(node: InProcessCluster) -> None:
    leader = node.leader()
    assert leader is not None
    core = leader.core
    port = leader.config.controller_listener.port
    stream = upgrade(connect(port), port, STREAM_PATH, {PEER_SECRET_HEADER: SECRET})
    # Fetches at the log's end, as voter 3's: each waits for records that do not come.
    fetch = encode_frame(FetchRequest(
        cluster_id=leader.config.cluster_id, replica_id=3, max_wait_ms=400,
        current_leader_epoch=core.epoch, fetch_offset=leader.log_dir.log.end_offset,
        last_fetch_epoch=core.epoch, high_watermark=core.high_watermark))
    flood = b"".join(binary_frame(_TAG.pack(i, _FETCH) + fetch) for i in range(500))
    stream.settimeout(10)
    stream.sendall(flood)  # never read: the answers, empty, pile up in the kernel's buffers
    most = 0
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        most = max(most, len(leader.host._inbound))
        time.sleep(0.01)
    # The flood's, and the running follower's own Fetch beside them.
    assert MAX_PARKED_PER_STREAM <= most <= MAX_PARKED_PER_STREAM + 1, most
    # A peer that reads nothing answers no ping either: the stream is closed.
    assert seconds_until_closed(stream, 10) is not None
    stream.close()
