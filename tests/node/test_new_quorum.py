"""A new quorum whose third voter has not come up: its first leader, elected and with its
LeaderChange committed by the other two, takes no write until it has heard from every voter
(it writes the voter set, with their directory ids, first: KIP-856). A client is told that, not
that no leader is known, and the leader's log says which voter it waits for; once the voter
starts, writes are taken. Real node processes."""

from __future__ import annotations

import json
import time
import urllib.error
from pathlib import Path

import pytest
from proc_cluster import FAST, ProcessCluster, http_json

from quorum_node.client import QuorumClient, QuorumClientError

WAITING = ("takes no writes until voter 3 has fetched from it: a new quorum's first leader "
           "writes the voter set, with every voter's directory id, before any record")


def test_a_new_quorums_leader_says_it_waits_for_the_missing_voter(tmp_path: Path) -> None:
    cluster = ProcessCluster.create(tmp_path, 3, proxied=False, **FAST)
    cluster.start(1)
    cluster.start(2)
    try:
        leader = cluster.wait_for_leader(timeout_s=30)
        bootstrap = ",".join(cluster.nodes[i].url for i in (1, 2))
        with QuorumClient(bootstrap, timeout_s=2) as client, \
                pytest.raises(QuorumClientError) as refused:
            client.put("colour", "blue")
        assert f"node {leader} leads epoch" in str(refused.value), refused.value
        assert WAITING in str(refused.value), refused.value
        with pytest.raises(urllib.error.HTTPError) as answered:
            http_json("PUT", f"{cluster.nodes[leader].url}/v1/kv/colour?timeout_ms=500",
                      {"value": "blue"})
        body = json.loads(answered.value.read())
        assert answered.value.code == 503 and body["code"] == "NO_LEADER", body
        assert WAITING in body["message"], body
        assert http_json("GET", f"{cluster.nodes[leader].url}/v1/node")["voters_unheard"] == [3]
        said = cluster.nodes[leader].log_path.read_text()
        assert WAITING in said and "; serving" not in said, cluster.logs()

        cluster.start(3)
        with QuorumClient(bootstrap, timeout_s=30) as client:
            assert client.put("colour", "blue").applied
        assert http_json("GET", f"{cluster.nodes[leader].url}/v1/node")["voters_unheard"] == []
        deadline = time.monotonic() + 10
        while "; serving" not in cluster.nodes[leader].log_path.read_text():
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.05)
    finally:
        cluster.stop_all()
