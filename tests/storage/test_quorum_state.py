from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from quorum_node.raft.state import ElectionState
from quorum_node.raft.types import ReplicaKey
from quorum_node.storage import kafka_uuid
from quorum_node.storage.errors import QuorumStateError
from quorum_node.storage.fsutil import StepHook, WriteStep
from quorum_node.storage.quorum_state import FILE_SIZE, QUORUM_STATE, QuorumStateStore

DIRECTORY_ID = uuid.UUID("27c6803d-c7cb-42dd-9baa-cd494ffacc81")


class SimulatedCrash(Exception):
    pass


def crash_after(step: WriteStep) -> StepHook:
    def hook(current: WriteStep) -> None:
        if current is step:
            raise SimulatedCrash(step.value)

    return hook


def test_absent_file_reads_as_none(tmp_path: Path) -> None:
    assert QuorumStateStore(tmp_path).read() is None


@pytest.mark.parametrize(
    "state",
    [
        ElectionState(epoch=0),
        ElectionState(epoch=5, leader_id=2),
        ElectionState(epoch=6, voted_key=ReplicaKey(1)),
        ElectionState(epoch=7, voted_key=ReplicaKey(1, DIRECTORY_ID)),
        ElectionState(epoch=7, leader_id=1, voted_key=ReplicaKey(1, DIRECTORY_ID)),
    ],
)
def test_round_trip(tmp_path: Path, state: ElectionState) -> None:
    store = QuorumStateStore(tmp_path)
    store.write(state)
    assert QuorumStateStore(tmp_path).read() == state
    raw = (tmp_path / QUORUM_STATE).read_text()
    assert raw.endswith("\n") and raw.count("\n") == 1 and len(raw) == FILE_SIZE
    spare = tmp_path / (QUORUM_STATE + ".tmp")  # room for the next write, taken by the first
    assert spare.stat().st_size == FILE_SIZE and not spare.samefile(tmp_path / QUORUM_STATE)


def test_rewrites_take_turns_between_two_files_and_free_none(tmp_path: Path) -> None:
    """Each write goes over the spare and keeps the file it replaces as the next spare: the same
    two inodes, whatever the state, so a full disk does not stop a vote."""
    path, spare = tmp_path / QUORUM_STATE, tmp_path / (QUORUM_STATE + ".tmp")
    store = QuorumStateStore(tmp_path)
    store.write(ElectionState(epoch=1))
    pair = {path.stat().st_ino, spare.stat().st_ino}
    assert len(pair) == 2
    for epoch, state in enumerate([ElectionState(epoch=2, leader_id=1),
                                   ElectionState(epoch=3, voted_key=ReplicaKey(1, DIRECTORY_ID)),
                                   ElectionState(epoch=4), ElectionState(epoch=5, leader_id=2)]):
        before = path.stat().st_ino
        store.write(state)
        assert QuorumStateStore(tmp_path).read() == state, epoch
        assert path.stat().st_ino != before and spare.stat().st_ino == before
        assert {path.stat().st_ino, spare.stat().st_ino} == pair
        assert path.stat().st_size == spare.stat().st_size == FILE_SIZE
    assert sorted(p.name for p in tmp_path.iterdir()) == [QUORUM_STATE, QUORUM_STATE + ".tmp"]


def test_file_format(tmp_path: Path) -> None:
    QuorumStateStore(tmp_path).write(ElectionState(epoch=7, voted_key=ReplicaKey(1, DIRECTORY_ID)))
    assert json.loads((tmp_path / QUORUM_STATE).read_text()) == {
        "data_version": 1,
        "leaderEpoch": 7,
        "leaderId": -1,
        "votedId": 1,
        "votedDirectoryId": kafka_uuid.to_kafka_string(DIRECTORY_ID),
    }


def test_canonical_uuid_form_is_accepted(tmp_path: Path) -> None:
    (tmp_path / QUORUM_STATE).write_text(
        '{"data_version":1,"leaderEpoch":3,"leaderId":-1,"votedId":2,'
        f'"votedDirectoryId":"{DIRECTORY_ID}"}}\n'
    )
    assert QuorumStateStore(tmp_path).read() == ElectionState(
        epoch=3, voted_key=ReplicaKey(2, DIRECTORY_ID)
    )


GOOD = {"data_version": 1, "leaderEpoch": 3, "leaderId": -1, "votedId": 2,
        "votedDirectoryId": None}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "Invalid JSON"),
        (b'{"data_version":1,"leaderEp', "Invalid JSON"),
        (b"\xff\xfe", "Invalid JSON"),
        (b"[1, 2]", "Input should be an object"),
        (json.dumps({**GOOD, "data_version": 2}).encode(), "unsupported data_version 2"),
        (json.dumps({**GOOD, "data_version": True}).encode(), "data_version: Input should be"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "votedId"}).encode(),
         "votedId: Field required"),
        (json.dumps({**GOOD, "extra": 1}).encode(), "extra: Extra inputs"),
        (json.dumps({**GOOD, "leaderEpoch": -1}).encode(), "leaderEpoch: Input should be greater"),
        # MAX_EPOCH: no epoch could follow it (a node restarting from it would be wedged)
        (json.dumps({**GOOD, "leaderEpoch": 2**31 - 1}).encode(), "leaderEpoch: Input should"),
        (json.dumps({**GOOD, "leaderId": "1"}).encode(), "leaderId: Input should be a valid int"),
        (json.dumps({**GOOD, "votedId": -2}).encode(), "votedId: Input should be greater"),
        (json.dumps({**GOOD, "votedDirectoryId": "zzz"}).encode(), "votedDirectoryId"),
        (json.dumps({**GOOD, "votedId": -1, "votedDirectoryId": str(DIRECTORY_ID)}).encode(),
         "votedDirectoryId without votedId"),
    ],
)
def test_unusable_file_is_refused_not_reset(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / QUORUM_STATE
    path.write_bytes(content)
    with pytest.raises(QuorumStateError, match=message) as info:
        QuorumStateStore(tmp_path).read()
    assert str(path) in str(info.value)
    assert path.read_bytes() == content


OLD = ElectionState(epoch=4, leader_id=1)
NEW = ElectionState(epoch=5, voted_key=ReplicaKey(2, DIRECTORY_ID))


@pytest.mark.parametrize("step", list(WriteStep))
@pytest.mark.parametrize("earlier_writes", [0, 1, 2])  # the last two: without and with a spare
def test_crash_after_each_step_keeps_old_or_new(
    tmp_path: Path, step: WriteStep, earlier_writes: int
) -> None:
    had_old_state = earlier_writes > 0
    for epoch in range(earlier_writes):
        QuorumStateStore(tmp_path).write(ElectionState(epoch=epoch) if epoch + 1 < earlier_writes
                                         else OLD)
    crashing = QuorumStateStore(tmp_path, after_step=crash_after(step))
    with pytest.raises(SimulatedCrash):
        crashing.write(NEW)

    # A fresh process reads either the state before the write or the one it wrote.
    expected_old = OLD if had_old_state else None
    assert QuorumStateStore(tmp_path).read() == (
        NEW if step in (WriteStep.RENAMED, WriteStep.DIR_FSYNCED) else expected_old
    )
    tmp = tmp_path / (QUORUM_STATE + ".tmp")
    if step is WriteStep.TMP_WRITTEN:
        # Not yet fsynced: a power loss may leave any prefix of it. Still ignored.
        tmp.write_bytes(tmp.read_bytes()[:7])
        assert QuorumStateStore(tmp_path).read() == expected_old

    # The next write goes over a leftover tmp file and wins; what it replaced is the spare.
    later = ElectionState(epoch=6, leader_id=3)
    QuorumStateStore(tmp_path).write(later)
    assert QuorumStateStore(tmp_path).read() == later
    path = tmp_path / QUORUM_STATE
    assert not tmp.exists() or not tmp.samefile(path)
    assert not (tmp_path / (QUORUM_STATE + ".old")).exists()
