"""The leader's voter-change handler on its own (KIP-853/856): given the leader's state and the
voter set, it says what to append and when a change is settled; the core only carries that out
(its behaviour through the core is in test_raft_reconfig.py)."""

from __future__ import annotations

import uuid

import pytest

from quorum_node.raft.leader import LeaderState, ReplicaProgress, VoterChangeDone
from quorum_node.raft.types import Errors, ReplicaKey, VoterChangeError
from quorum_node.raft.voter_change import VoterChangeHandler, VoterChangeStep

FETCH_TIMEOUT_MS = 2000


def key(node_id: int, directory: int) -> ReplicaKey:
    return ReplicaKey(node_id, uuid.UUID(int=directory))


LEADER, FOLLOWER, LOST = key(1, 11), key(2, 12), key(3, 13)
REPLACEMENT = key(3, 23)  # node 3 on a new disk
VOTERS = (LEADER, FOLLOWER, LOST)


def leader_state() -> LeaderState:
    state = LeaderState(4, LEADER, 10, 1_000_000, {k: ReplicaProgress() for k in VOTERS})
    state.high_watermark = 12
    state.observers[REPLACEMENT] = ReplicaProgress(end_offset=20, last_fetch_ms=900,
                                                   last_caught_up_ms=900)
    return state


def handler(local: ReplicaKey = LEADER) -> VoterChangeHandler:
    return VoterChangeHandler(local_key=local, static_ids=frozenset({1, 2, 3}),
                              fetch_timeout_ms=FETCH_TIMEOUT_MS)


def test_add_then_remove_a_replaced_directory() -> None:
    changes, state = handler(), leader_state()
    ticket = changes.add(1000, state, VOTERS, REPLACEMENT, timeout_ms=5000)
    assert changes.adding == REPLACEMENT  # its observer entry is kept while it waits
    with pytest.raises(VoterChangeError, match="another voter change is in progress"):
        changes.remove(1000, VOTERS, LOST, 5000, decommission=False)
    step = changes.advance(1000, state, VOTERS, bootstrapped=True, latest_voters_offset=5)
    assert step == VoterChangeStep(append=(LEADER, FOLLOWER, LOST, REPLACEMENT))
    changes.appended(20)
    assert changes.advance(1001, state, VOTERS, bootstrapped=True,
                           latest_voters_offset=20) == VoterChangeStep()  # not committed yet
    state.high_watermark = 21
    assert changes.advance(1002, state, VOTERS, bootstrapped=True,
                           latest_voters_offset=20) == VoterChangeStep(
        done=VoterChangeDone(ticket, Errors.NONE, f"add {REPLACEMENT}: committed"))
    assert changes.pending is None and changes.adding is None


def test_a_change_waits_for_the_previous_one_to_commit_until_its_deadline() -> None:
    changes, state = handler(), leader_state()
    ticket = changes.remove(1000, VOTERS, FOLLOWER, timeout_ms=500, decommission=True)
    waiting = changes.advance(1000, state, VOTERS, bootstrapped=True, latest_voters_offset=12)
    assert waiting == VoterChangeStep()
    timed_out = changes.advance(1500, state, VOTERS, bootstrapped=True, latest_voters_offset=12)
    assert timed_out.done == VoterChangeDone(
        ticket, Errors.REQUEST_TIMED_OUT,
        f"remove {FOLLOWER}: timed out waiting for the previous voter change to commit")


def test_a_leader_that_removed_itself_resigns_once_it_commits() -> None:
    changes, state = handler(), leader_state()
    changes.remove(1000, VOTERS, LEADER, timeout_ms=5000, decommission=True)
    step = changes.advance(1000, state, VOTERS, bootstrapped=True, latest_voters_offset=None)
    assert step.append == (FOLLOWER, LOST)
    changes.appended(12)
    state.high_watermark = 13
    assert changes.advance(1001, state, VOTERS, bootstrapped=True,
                           latest_voters_offset=12).resign


def test_refusals_and_a_lost_leadership() -> None:
    changes, state = handler(), leader_state()
    with pytest.raises(VoterChangeError, match="already a voter"):
        changes.add(0, state, VOTERS, FOLLOWER, 1000)
    with pytest.raises(VoterChangeError, match="has not fetched from the leader"):
        changes.add(0, state, VOTERS, key(2, 99), 1000)
    with pytest.raises(VoterChangeError, match="would remove node 2 from the voters"):
        changes.remove(0, VOTERS, FOLLOWER, 1000, decommission=False)
    with pytest.raises(VoterChangeError, match=r"not in controller\.quorum\.voters"):
        changes.add(0, state, VOTERS, key(7, 7), 1000)
    assert changes.abandon(4) is None
    ticket = changes.add(0, state, VOTERS, REPLACEMENT, 1000)
    assert changes.abandon(4) == VoterChangeDone(
        ticket, Errors.NOT_LEADER_OR_FOLLOWER,
        "node 1 lost the leadership of epoch 4; the change may or may not commit")
