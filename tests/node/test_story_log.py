"""The node's story in its log: what ``NodeStory`` says about peers (the role changes, the
observer line and the shutdown are checked on real processes in test_node_cli)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any, cast

import pytest

from quorum_node.node.story import STARTUP_GRACE_S, UNREACHABLE_REMINDER_S, NodeStory
from quorum_node.raft.core import RaftCore
from quorum_node.raft.state import RaftState


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def story(clock: Clock) -> NodeStory:
    core: Any = SimpleNamespace(state=RaftState.FOLLOWER, epoch=3, leader_id=2)
    return NodeStory(cast(RaftCore, core), 1, [1, 2, 3], "h:1", clock=clock)


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    said = [record.getMessage() for record in caplog.records]
    caplog.clear()
    return said


def test_peers_going_away_and_coming_back(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="quorum_node.node")
    clock = Clock()
    teller = story(clock)
    # At start-up a peer not heard from yet is not news...
    teller.peer_failed(3, "node 3 unreachable: Cannot connect to host h:3")
    assert messages(caplog) == []
    clock.now += STARTUP_GRACE_S
    teller.peer_failed(3, "node 3 unreachable: Cannot connect to host h:3")
    assert messages(caplog) == ["node 1: peer 3 unreachable: Cannot connect to host h:3"]
    teller.peer_answered(3)
    assert messages(caplog) == ["node 1: peer 3 reachable again after 5.0 s"]
    # ... one that answered before and goes away is, at once, then once a minute.
    teller.peer_failed(3, "node 3 unreachable: connection closed")
    clock.now += 1
    teller.peer_failed(3, "node 3 unreachable: connection closed")
    assert messages(caplog) == ["node 1: peer 3 unreachable: connection closed"]
    clock.now += UNREACHABLE_REMINDER_S
    teller.peer_failed(3, "node 3 unreachable: connection closed")
    assert messages(caplog) == ["node 1: peer 3 still unreachable after 61 s: connection closed"]
    clock.now += 2.5
    teller.peer_answered(3)
    assert messages(caplog) == ["node 1: peer 3 reachable again after 63.5 s"]
    teller.peer_answered(3)
    assert messages(caplog) == []
