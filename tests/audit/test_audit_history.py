"""The history job's interpretation of control records (no Spark), and ``quorum-node export``."""

from __future__ import annotations

import io
import tarfile
import uuid
from pathlib import Path

from quorum_audit.history import ControlRow, build_history
from quorum_audit.synthetic import write_quorum
from quorum_node.cli.export import export
from quorum_node.cli.node import main as node_main
from quorum_node.raft.messages import LeaderChangeMessage, ReplicaInfo
from quorum_node.raft.types import ControlRecordType, ReplicaKey
from quorum_node.raft.voters import voters_record
from quorum_node.storage.kafka_uuid import to_kafka_string
from quorum_node.storage.quorum_state import QUORUM_STATE

KEYS = [ReplicaKey(i, uuid.UUID(int=1000 + i)) for i in (1, 2, 3)]
NEW_3 = ReplicaKey(3, uuid.UUID(int=2000))


def leader_change(node: int, offset: int, epoch: int, leader: int, ms: int) -> ControlRow:
    message = LeaderChangeMessage(leader_id=leader, voters=tuple(ReplicaInfo.of(k) for k in KEYS),
                                  granting_voters=(ReplicaInfo.of(KEYS[leader - 1]),))
    return ControlRow("c", node, f"d{node}", offset, epoch, ms, ControlRecordType.LEADER_CHANGE,
                      message.model_dump_json(by_alias=True))


def voters(node: int, offset: int, keys: list[ReplicaKey], snapshot: int | None = None
           ) -> ControlRow:
    return ControlRow("c", node, f"d{node}", offset, 0, offset * 10,
                      ControlRecordType.KRAFT_VOTERS, voters_record(keys).value.decode(), snapshot)


def test_epochs_are_merged_across_replicas_and_conflicts_reported() -> None:
    rows = [leader_change(n, 0, 1, 1, 100) for n in (1, 2, 3)]
    rows += [leader_change(n, 50, 2, 2, 400) for n in (1, 2)]
    rows.append(leader_change(3, 50, 2, 3, 400))  # a second leader for epoch 2
    history = build_history(rows, {"c": 1000})
    assert [(e.epoch, e.leader_id, e.start_ms, e.end_ms) for e in history.leadership] == [
        (1, 1, 100, 400), (2, 2, 400, 1000)]
    assert [(c.epoch, sorted(c.leaders)) for c in history.conflicts] == [(2, [2, 3])]
    assert history.leadership[0].held_by == 3


def test_membership_changes_from_log_and_snapshot_voter_sets() -> None:
    replaced = [KEYS[0], KEYS[1], NEW_3]
    rows = [voters(1, 1, KEYS), voters(2, 1, KEYS),
            voters(1, 90, [*KEYS, NEW_3]), voters(1, 95, replaced),
            voters(3, 0, replaced, snapshot=120)]  # the same set again, from a snapshot header
    history = build_history(rows, {})
    changes = [(m.change, m.node_id, m.directory_id, m.offset) for m in history.membership]
    kafka = to_kafka_string
    assert changes == [
        ("initial", 1, kafka(KEYS[0].directory_id), 1),  # type: ignore[arg-type]
        ("initial", 2, kafka(KEYS[1].directory_id), 1),  # type: ignore[arg-type]
        ("initial", 3, kafka(KEYS[2].directory_id), 1),  # type: ignore[arg-type]
        ("add", 3, kafka(NEW_3.directory_id), 90),  # type: ignore[arg-type]
        ("remove", 3, kafka(KEYS[2].directory_id), 95),  # type: ignore[arg-type]
    ]
    assert history.voters["c"] == tuple(sorted(replaced))


def test_unreadable_control_records_are_listed_not_raised() -> None:
    row = ControlRow("c", 1, "d", 5, 1, 0, ControlRecordType.LEADER_CHANGE, "{not json")
    assert len(build_history([row], {}).unreadable) == 1


def test_export_streams_a_log_directory_that_audits_like_the_original(tmp_path: Path) -> None:
    quorum = write_quorum(tmp_path / "q", 2000, replicas=1, segment_bytes=16 * 1024,
                          snapshot_at=1002, records_per_batch=100)
    source = quorum.directories[1]
    stream = io.BytesIO()
    members = export(source, stream, "node-1")
    assert members[0] == "node-1/meta.properties" and members[-1].endswith(".checkpoint")
    stream.seek(0)
    with tarfile.open(fileobj=stream) as archive:
        archive.extractall(tmp_path / "copy", filter="data")
    spare = QUORUM_STATE + ".tmp"  # room for the next quorum-state write, not state
    for original in source.rglob("*"):
        if original.is_file() and original.name != spare:
            copy = tmp_path / "copy" / "node-1" / original.relative_to(source)
            assert copy.read_bytes() == original.read_bytes(), original
    # The command line: to a file, and refused on a directory that is not a log directory.
    assert node_main(["export", "--log-dir", str(source), "--output",
                      str(tmp_path / "n.tar")]) == 0
    with tarfile.open(tmp_path / "n.tar") as archive:
        assert archive.getnames() == members
    assert node_main(["export", "--log-dir", str(tmp_path)]) == 2
