"""Property-based fuzzing (hypothesis) of every decoder a hostile peer, client, file or operator
can reach: each either decodes or raises its own documented error, never anything else; and a
valid encoding with any bit flipped or any tail cut is refused, never read as something else.

Budget: FUZZ_EXAMPLES examples per property (default 25; FUZZ_EXAMPLES=2000 for a long run).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from fuzz_support import FUZZ_EXAMPLES, TALLY
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quorum_node import wire
from quorum_node.kv.machine import check_snapshot_records
from quorum_node.kv.ops import KV_RECORD_KEY, KvOpError, decode_op
from quorum_node.kv.snapshot_data import SNAPSHOT_ENTRIES_KEY, SNAPSHOT_HEADER_KEY
from quorum_node.kv.store import KvStore
from quorum_node.node.api import admin as admin_api
from quorum_node.node.api import client as client_api
from quorum_node.node.api.http import ApiError
from quorum_node.node.config import ConfigError, Setting, config_from_settings, parse_properties
from quorum_node.node.errors import ErrorCode, ServiceError
from quorum_node.node.transport import REQUEST_TYPES, RESPONSE_TYPES, FrameError, decode_frame
from quorum_node.raft.records import CorruptRecordError, Record, decode_batches, encode_batch
from quorum_node.raft.snapshot_format import check_snapshot, encode_snapshot, read_snapshot
from quorum_node.raft.snapshots import CorruptSnapshotError
from quorum_node.raft.types import ReplicaKey
from quorum_node.raft.voters import parse_voters_record
from quorum_node.security.roles import parse_principal_grants
from quorum_node.security.tokens import TokenFileError, TokenTable
from quorum_node.storage.errors import StorageError
from quorum_node.storage.kafka_uuid import parse_uuid
from quorum_node.storage.meta_properties import read_meta_properties
from quorum_node.storage.quorum_state import QuorumStateStore

FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
MESSAGE_TYPES = [*REQUEST_TYPES.values(), *RESPONSE_TYPES.values()]

# JSON values of every shape, for documents whose fields a decoder must check.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12)
records = st.lists(st.builds(Record, value=st.binary(max_size=64),
                             key=st.none() | st.binary(max_size=8)), min_size=1, max_size=5)


def tally(name: str) -> None:
    TALLY["decoder inputs"] += 1
    TALLY[f"decoder inputs: {name}"] += 1


# --- peer frames ------------------------------------------------------------------------------


@FUZZ
@given(cls=st.sampled_from(MESSAGE_TYPES), data=st.binary(max_size=300))
def test_frames_of_random_bytes(cls: Any, data: bytes) -> None:
    tally("frame")
    with contextlib.suppress(FrameError):
        decode_frame(cls, data)


@FUZZ
@given(cls=st.sampled_from(MESSAGE_TYPES),
       header=st.dictionaries(st.sampled_from(
           ["ClusterId", "ReplicaId", "ReplicaEpoch", "VoterId", "LeaderId", "LeaderEpoch",
            "FetchOffset", "LastFetchEpoch", "MaxWaitMs", "CurrentLeaderEpoch", "Position",
            "SnapshotId", "PreferredSuccessors", "ErrorCode", "HighWatermark", "MaxBytes",
            "VoterDirectoryId", "ReplicaDirectoryId", "LastOffsetEpoch", "LastOffset",
            "PreVote", "Unknown"]), json_values, max_size=10),
       records=st.binary(max_size=64))
def test_frames_of_random_fields(cls: Any, header: dict[str, Any], records: bytes) -> None:
    tally("frame")
    body = json.dumps(header).encode()
    with contextlib.suppress(FrameError):
        decode_frame(cls, len(body).to_bytes(4, "big") + body + records)


# --- the binary client protocol (quorum_node.wire) -------------------------------------------


@FUZZ
@given(op=st.sampled_from(list(wire.Op)), tail=st.binary(max_size=300))
def test_client_stream_messages_of_random_bytes(op: wire.Op, tail: bytes) -> None:
    tally("client stream message")
    for decode in (
            lambda: wire.decode_request_fields(op, wire.REQUEST_HEAD.pack(1, op, 0) + tail),
            lambda: wire.decode_response_fields(op, wire.RESPONSE_HEAD.pack(1, 0) + tail),
            lambda: wire.decode_error(wire.RESPONSE_HEAD.pack(1, 1) + tail),
            lambda: wire.decode_request_head(tail),
            lambda: wire.decode_response_head(tail)):
        with contextlib.suppress(wire.WireError):
            decode()


# --- record batches, snapshots, VotersRecord, KV operations ---------------------------------


@FUZZ
@given(data=st.binary(max_size=400))
def test_batches_of_random_bytes(data: bytes) -> None:
    tally("record batch")
    with contextlib.suppress(CorruptRecordError):
        decode_batches(data)


@FUZZ
@given(batch_records=records, base=st.integers(0, 2**40), epoch=st.integers(0, 2**31 - 1),
       control=st.booleans(), where=st.data())
def test_a_damaged_batch_is_refused(batch_records: list[Record], base: int, epoch: int,
                                    control: bool, where: st.DataObject) -> None:
    tally("record batch")
    encoded = encode_batch(base, epoch, batch_records, 1, is_control=control)
    assert decode_batches(encoded)[0].records == tuple(batch_records)
    cut = where.draw(st.integers(1, len(encoded) - 1), label="cut")
    with pytest.raises(CorruptRecordError):
        decode_batches(encoded[:cut])
    # Any bit of the CRC or of what it covers (from the CRC field on) flipped: refused.
    bit = where.draw(st.integers(17 * 8, len(encoded) * 8 - 1), label="bit")
    damaged = bytearray(encoded)
    damaged[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(CorruptRecordError):
        decode_batches(bytes(damaged))


@FUZZ
@given(data=st.binary(max_size=400))
def test_snapshots_of_random_bytes(data: bytes) -> None:
    tally("snapshot")
    for decode in (check_snapshot, read_snapshot):
        with contextlib.suppress(CorruptSnapshotError):
            decode(data)


@FUZZ
@given(snapshot_records=records, voters=st.booleans(), where=st.data())
def test_a_damaged_snapshot_is_refused(snapshot_records: list[Record], voters: bool,
                                       where: st.DataObject) -> None:
    tally("snapshot")
    keys = (ReplicaKey(1, uuid.UUID(int=1)), ReplicaKey(2, uuid.UUID(int=2)))
    encoded = encode_snapshot(keys if voters else None, 5, snapshot_records, records_per_batch=2)
    assert read_snapshot(encoded).records == snapshot_records
    cut = where.draw(st.integers(0, len(encoded) - 1), label="cut")
    with pytest.raises(CorruptSnapshotError):
        check_snapshot(encoded[:cut])
    bit = where.draw(st.integers(0, len(encoded) * 8 - 1), label="bit")
    damaged = bytearray(encoded)
    damaged[bit // 8] ^= 1 << (bit % 8)
    try:
        contents = read_snapshot(bytes(damaged))
    except CorruptSnapshotError:
        return
    # Only a flip the CRC does not cover and the format tolerates may pass: never other data.
    assert contents.records == snapshot_records


@FUZZ
@given(payload=st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode())
       | st.builds(lambda voters: json.dumps({"Version": 0, "Voters": voters}).encode(),
                   st.lists(st.dictionaries(st.sampled_from(["VoterId", "VoterDirectoryId"]),
                                            json_values), max_size=3)))
def test_voters_records(payload: bytes) -> None:
    tally("VotersRecord")
    try:
        voters = parse_voters_record(payload)
    except ValueError:
        return
    assert voters and all(key.directory_id is not None and key.id >= 0 for key in voters)


@FUZZ
@given(payload=st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode())
       | st.fixed_dictionaries({"op": st.sampled_from(["put", "delete", "cas", "x"])},
                               optional={"key": json_values, "value": json_values,
                                         "expected": json_values})
       .map(lambda d: json.dumps(d).encode()))
def test_kv_operations(payload: bytes) -> None:
    tally("KV op")
    with contextlib.suppress(KvOpError):
        decode_op(Record(value=payload, key=KV_RECORD_KEY))



@FUZZ
@given(payload=st.binary(max_size=300), header=st.binary(max_size=60)
       | json_values.map(lambda v: json.dumps(v).encode()), end_offset=st.integers(0, 2**63))
def test_kv_snapshot_records(payload: bytes, header: bytes, end_offset: int) -> None:
    """A snapshot's header and chunk of entries: loaded, or refused as a whole."""
    tally("KV snapshot records")
    good = Record(value=b'{"format":1,"versions_from":null}', key=SNAPSHOT_HEADER_KEY)
    for records in ([good, Record(value=payload, key=SNAPSHOT_ENTRIES_KEY)],
                    [Record(value=header, key=SNAPSHOT_HEADER_KEY)],
                    [Record(value=payload, key=KV_RECORD_KEY)]):
        with contextlib.suppress(CorruptSnapshotError):
            check_snapshot_records(iter(records))
        with contextlib.suppress(KvOpError):
            KvStore().load_snapshot(records, end_offset)

# --- the client and admin APIs' body and path parsers ----------------------------------------


@FUZZ
@given(body=st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()))
def test_append_bodies(body: bytes) -> None:
    tally("append body")
    for parse in (client_api.json_records, client_api.framed_records):
        try:
            values = parse(body)
        except ApiError as error:
            assert error.status in (400, 413)
        except ServiceError as error:
            assert error.code in (ErrorCode.BAD_REQUEST, ErrorCode.TOO_LARGE)
        else:
            assert all(isinstance(value, bytes) for value in values)


@FUZZ
@given(value=json_values | st.text(max_size=30))
def test_voter_keys(value: Any) -> None:
    tally("voter key")
    for parse in (admin_api._voter_id, admin_api._directory_id):
        with contextlib.suppress(ApiError):
            parse(value)
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            parse_uuid(value)


# --- files: config, meta.properties, quorum-state, tokens, certificate roles -----------------


@FUZZ
@given(text=st.text(max_size=300))
def test_properties_and_config(text: str) -> None:
    tally("config")
    entries = parse_properties(text)
    settings_ = {name: Setting(value, f"line {line}") for name, value, line in entries}
    try:
        config_from_settings(settings_)
    except ConfigError as error:
        assert "\n" not in str(error)


@FUZZ
@given(values=st.fixed_dictionaries({}, optional={
    "node.id": st.text(max_size=8), "cluster.id": st.text(max_size=24),
    "log.dir": st.text(max_size=8), "listeners": st.text(max_size=24),
    "controller.quorum.voters": st.text(max_size=24),
    "controller.quorum.election.timeout.ms": st.text(max_size=8),
    "auth.certificate.roles": st.text(max_size=24),
    "ssl.certificate.location": st.text(max_size=8),
    "http.max.long.polls": st.text(max_size=8)}))
def test_config_values(values: dict[str, str]) -> None:
    tally("config")
    try:
        config_from_settings({k: Setting(v, "fuzz") for k, v in values.items()})
    except ConfigError as error:
        assert "\n" not in str(error)


@FUZZ
@given(text=st.binary(max_size=300))
def test_meta_properties_and_quorum_state(tmp_path_factory: pytest.TempPathFactory,
                                          text: bytes) -> None:
    tally("meta.properties / quorum-state")
    directory = Path(tmp_path_factory.mktemp("files", numbered=True))
    (directory / "meta.properties").write_bytes(text)
    (directory / "quorum-state").write_bytes(text)
    with contextlib.suppress(StorageError):
        read_meta_properties(directory / "meta.properties")
    with contextlib.suppress(StorageError):
        QuorumStateStore(directory).read()


@FUZZ
@given(text=st.text(max_size=200))
def test_token_files_and_certificate_roles(text: str) -> None:
    tally("tokens / roles")
    with contextlib.suppress(TokenFileError):
        TokenTable.parse(text, "tokens")
    with contextlib.suppress(ValueError):
        parse_principal_grants(text)


@pytest.mark.parametrize(
    ("field", "value"),
    [("ReplicaEpoch", 2**31 - 1), ("ReplicaEpoch", 2**31), ("LastOffset", 2**63),
     ("ReplicaId", -(2**31) - 1)],
)
def test_numbers_beyond_the_wire_types_are_refused(field: str, value: int) -> None:
    """Epochs without a successor in an int32 (MAX_EPOCH), and numbers wider than Kafka's
    int32/int64, never reach the core (which would adopt such an epoch and later overflow a
    batch header)."""
    header = {"ClusterId": "c", "VoterId": 1, "ReplicaEpoch": 1, "ReplicaId": 2,
              "LastOffsetEpoch": 0, "LastOffset": 0, field: value}
    body = json.dumps(header).encode()
    with pytest.raises(FrameError):
        decode_frame(REQUEST_TYPES["Vote"], len(body).to_bytes(4, "big") + body)
