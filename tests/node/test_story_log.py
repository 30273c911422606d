"""The node's story in its log: what ``NodeStory`` says about peers (the role changes, the
observer line and the shutdown are checked on real processes in test_node_cli)."""

from __future__ import annotations

import logging
import uuid

import pytest
from statuses import status

from quorum_node.node.story import STARTUP_GRACE_S, UNREACHABLE_REMINDER_S, NodeStory
from quorum_node.raft.core import QuorumDescription, ReplicaDescription
from quorum_node.raft.quorum_state import RoleChanged, TransitionCause
from quorum_node.raft.state import RaftState
from quorum_node.raft.status import NodeStatus
from quorum_node.raft.types import ReplicaKey


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


FOLLOWING_2 = status(state=RaftState.FOLLOWER, epoch=3, leader_id=2)


def story(clock: Clock) -> NodeStory:
    return NodeStory(lambda: FOLLOWING_2, 1, [1, 2, 3], "h:1", clock=clock)


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


def test_the_leader_says_when_a_voter_stops_fetching_and_comes_back(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="quorum_node.node")
    clock = Clock()
    wall_ms = [1_000_000]
    fetched = {2: 1_000_000, 3: 1_000_000}
    directory = uuid.UUID(int=7)

    def leading() -> NodeStatus:
        now_ms = wall_ms[0]
        voters = [ReplicaDescription(ReplicaKey(1, directory), 10, now_ms, now_ms)] + [
            ReplicaDescription(ReplicaKey(i, directory), 10, fetched[i], fetched[i])
            for i in (2, 3)]
        return status(as_of_ms=now_ms, state=RaftState.LEADER, epoch=4, leader_id=1,
                      quorum=QuorumDescription(1, 4, 10, tuple(voters), ()))

    now = [FOLLOWING_2]
    teller = NodeStory(lambda: now[0], 1, [1, 2, 3], "h:1", fetch_timeout_ms=2000, clock=clock)
    now[0] = leading()
    teller.role_changed(RoleChanged(RaftState.CANDIDATE, RaftState.LEADER, 4, 1,
                                    TransitionCause.ELECTED, 4, None))
    teller.after_step(leader_has_committed=False)
    assert messages(caplog) == ["node 1: candidate -> leader in epoch 4: won the election"]
    # The end of a failover is said once: the new leader's LeaderChange is committed.
    teller.after_step(leader_has_committed=True)
    teller.after_step(leader_has_committed=True)
    assert messages(caplog) == ["node 1: the LeaderChange of epoch 4 is committed; serving"]

    def later(seconds: float, *, alive: tuple[int, ...] = (2, 3)) -> list[str]:
        clock.now += seconds
        wall_ms[0] += int(seconds * 1000)
        for node_id in alive:
            fetched[node_id] = wall_ms[0]
        now[0] = leading()
        teller.after_step(leader_has_committed=True)
        return messages(caplog)

    assert later(3) == []
    assert later(1.5, alive=(2,)) == []  # within the fetch timeout
    assert later(1.5, alive=(2,)) == [
        "node 1: voter 3:AAAAAAAAAAAAAAAAAAAABw has not fetched for 3.0 s (down, or cut off?); "
        "the quorum needs a majority of the 3 voters"]
    assert later(30, alive=(2,)) == []  # said once
    assert later(1) == ["node 1: voter 3:AAAAAAAAAAAAAAAAAAAABw fetching again, at offset 10"]


def test_a_new_quorums_leader_says_which_voters_it_waits_for_before_it_serves(
        caplog: pytest.LogCaptureFixture) -> None:
    """Its LeaderChange committed by a majority, the first leader of a new quorum still takes no
    writes until it has heard from every voter: said once for each set of voters it waits for,
    and "serving" only once it serves."""
    caplog.set_level(logging.INFO, logger="quorum_node.node")
    unheard: list[tuple[int, ...]] = [(2, 3)]

    def leading() -> NodeStatus:
        return status(state=RaftState.LEADER, epoch=1, leader_id=1, voters_unheard=unheard[0])

    teller = NodeStory(leading, 1, [1, 2, 3], "h:1", clock=Clock())
    teller.role_changed(RoleChanged(RaftState.CANDIDATE, RaftState.LEADER, 1, 1,
                                    TransitionCause.ELECTED, 1, None))
    caplog.clear()
    teller.after_step(leader_has_committed=True)
    teller.after_step(leader_has_committed=True)
    assert messages(caplog) == [
        "node 1: leads epoch 1 but takes no writes until voters 2, 3 have fetched from it: a new "
        "quorum's first leader writes the voter set, with every voter's directory id, before any "
        "record (start them, or check that they reach node 1)"]
    unheard[0] = (3,)
    teller.after_step(leader_has_committed=True)
    assert messages(caplog) == [
        "node 1: leads epoch 1 but takes no writes until voter 3 has fetched from it: a new "
        "quorum's first leader writes the voter set, with every voter's directory id, before any "
        "record (start it, or check that it reaches node 1)"]
    unheard[0] = ()
    teller.after_step(leader_has_committed=True)
    teller.after_step(leader_has_committed=True)
    assert messages(caplog) == ["node 1: the LeaderChange of epoch 1 is committed; serving"]


def _said(teller: NodeStory, caplog: pytest.LogCaptureFixture, change: RoleChanged) -> str:
    teller.role_changed(change)
    (line,) = messages(caplog)
    return line


def test_role_changes_are_told_with_the_cause_the_core_gives(
        caplog: pytest.LogCaptureFixture) -> None:
    """The story says why from the core's cause, not from which call took the step: a follower
    whose leader resigned and that campaigns once its back-off runs out (in a poll) says so."""
    caplog.set_level(logging.INFO, logger="quorum_node.node")
    teller = story(Clock())
    follower, prospective = RaftState.FOLLOWER, RaftState.PROSPECTIVE
    assert _said(teller, caplog, RoleChanged(
        follower, prospective, 3, 2, TransitionCause.LEADER_RESIGNED, 3, 2)) == (
        "node 1: follower -> prospective in epoch 3: leader 2 resigned; starting an election")
    assert _said(teller, caplog, RoleChanged(
        follower, prospective, 3, 2, TransitionCause.FETCH_TIMEOUT, 3, 2)) == (
        "node 1: follower -> prospective in epoch 3: no word from leader 2 within the fetch "
        "timeout; starting an election")
    assert _said(teller, caplog, RoleChanged(
        RaftState.CANDIDATE, follower, 5, 3, TransitionCause.HIGHER_EPOCH, 4, None, peer=3)) == (
        "node 1: candidate -> follower in epoch 5 (was 4): following node 3 (learned from "
        "node 3)")
    assert _said(teller, caplog, RoleChanged(
        RaftState.LEADER, RaftState.RESIGNED, 5, 1, TransitionCause.CHECK_QUORUM, 5, 1)) == (
        "node 1: leader -> resigned in epoch 5: resigning: no fetch from a majority of the "
        "voters within the check-quorum timeout (cut off?)")
    assert _said(teller, caplog, RoleChanged(
        RaftState.LEADER, RaftState.RESIGNED, 5, 1, TransitionCause.SHUTDOWN, 5, 1)) == (
        "node 1: leader -> resigned in epoch 5: shutting down: resigning so that another voter "
        "leads")


@pytest.mark.parametrize("cause", list(TransitionCause))
@pytest.mark.parametrize("after", list(RaftState))
def test_every_cause_is_told_in_words(caplog: pytest.LogCaptureFixture, cause: TransitionCause,
                                      after: RaftState) -> None:
    caplog.set_level(logging.INFO, logger="quorum_node.node")
    line = _said(story(Clock()), caplog, RoleChanged(RaftState.FOLLOWER, after, 4, 2, cause, 3,
                                                     2, peer=2))
    assert line.startswith(f"node 1: follower -> {after} in epoch 4 (was 3): ")
    assert "None" not in line and "{" not in line
