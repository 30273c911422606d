from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from quorum_node.storage import kafka_uuid
from quorum_node.storage.errors import MetaPropertiesError, NotFormattedError
from quorum_node.storage.meta_properties import (
    META_PROPERTIES,
    MetaProperties,
    format_log_dir,
    load_meta_properties,
    random_cluster_id,
)

CLUSTER = "MkU3OEVBNTcwNTJENDM2Qk"


def test_format_then_load(tmp_path: Path) -> None:
    log_dir = tmp_path / "data" / "meta"  # missing directories are created
    formatted = format_log_dir(log_dir, CLUSTER, 3)
    loaded = load_meta_properties(log_dir, CLUSTER, 3)
    assert loaded == formatted
    assert loaded.version == 1 and loaded.node_id == 3 and loaded.cluster_id == CLUSTER
    assert loaded.directory_id.version == 4
    text = (log_dir / META_PROPERTIES).read_text()
    assert text.splitlines() == [
        "version=1",
        f"cluster.id={CLUSTER}",
        "node.id=3",
        f"directory.id={kafka_uuid.to_kafka_string(formatted.directory_id)}",
    ]
    assert not (log_dir / (META_PROPERTIES + ".tmp")).exists()


def test_format_with_a_given_directory_id(tmp_path: Path) -> None:
    directory_id = uuid.uuid4()
    assert format_log_dir(tmp_path, CLUSTER, 1, directory_id=directory_id).directory_id == (
        directory_id
    )
    assert load_meta_properties(tmp_path, CLUSTER, 1).directory_id == directory_id
    with pytest.raises(ValueError, match="reserved"):
        format_log_dir(tmp_path / "other", CLUSTER, 1, directory_id=uuid.UUID(int=0))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(NotFormattedError, match=re.escape(str(tmp_path / META_PROPERTIES))):
        load_meta_properties(tmp_path, CLUSTER, 1)


def test_wrong_node_id(tmp_path: Path) -> None:
    format_log_dir(tmp_path, CLUSTER, 1)
    with pytest.raises(MetaPropertiesError, match=r"node\.id 1 does not match .* node id 2"):
        load_meta_properties(tmp_path, CLUSTER, 2)


def test_wrong_cluster_id(tmp_path: Path) -> None:
    format_log_dir(tmp_path, CLUSTER, 1)
    with pytest.raises(MetaPropertiesError, match=r"cluster\.id .* does not match .*'other'"):
        load_meta_properties(tmp_path, "other", 1)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x00\xff\xfe garbage", "unreadable"),
        (b"this is not a properties file\n", "line 1 is not a key=value pair"),
        (b"version=1\ncluster.id=abc\nnode.id=1\n", "missing directory.id"),
        (b"cluster.id=abc\nnode.id=1\ndirectory.id=J8aAPcfLQt2bqs1JT_rMgQ\n", "missing version"),
        (b"version=0\ncluster.id=abc\nnode.id=1\ndirectory.id=J8aAPcfLQt2bqs1JT_rMgQ\n",
         "unsupported version"),
        (b"version=1\ncluster.id=abc\nnode.id=-1\ndirectory.id=J8aAPcfLQt2bqs1JT_rMgQ\n",
         "invalid node.id"),
        (b"version=1\ncluster.id=abc\nnode.id=1\ndirectory.id=nope\n", "invalid directory.id"),
        (b"version=1\ncluster.id=abc\nnode.id=1\ndirectory.id=AAAAAAAAAAAAAAAAAAAAAA\n",
         "reserved"),
        (b"version=1\nversion=1\n", "repeats the key"),
        (b"", "missing version"),
    ],
)
def test_unusable_file_is_refused_and_left_alone(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / META_PROPERTIES
    path.write_bytes(content)
    with pytest.raises(MetaPropertiesError, match=message) as info:
        load_meta_properties(tmp_path, "abc", 1)
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    assert path.read_bytes() == content


def test_kafka_written_file_with_comments_loads(tmp_path: Path) -> None:
    (tmp_path / META_PROPERTIES).write_text(
        "#\n#Sat Nov 22 02:21:00 UTC 2026\nnode.id=4\ndirectory.id=J8aAPcfLQt2bqs1JT_rMgQ\n"
        f"version=1\ncluster.id={CLUSTER}\n"
    )
    props = load_meta_properties(tmp_path, CLUSTER, 4)
    assert kafka_uuid.to_kafka_string(props.directory_id) == "J8aAPcfLQt2bqs1JT_rMgQ"


def test_refuse_reformat_without_ignore_flag(tmp_path: Path) -> None:
    first = format_log_dir(tmp_path, CLUSTER, 1)
    before = (tmp_path / META_PROPERTIES).read_bytes()
    with pytest.raises(MetaPropertiesError, match="already formatted"):
        format_log_dir(tmp_path, CLUSTER, 1)
    assert format_log_dir(tmp_path, CLUSTER, 1, ignore_formatted=True) == first
    with pytest.raises(MetaPropertiesError, match="does not match"):
        format_log_dir(tmp_path, CLUSTER, 2, ignore_formatted=True)
    assert (tmp_path / META_PROPERTIES).read_bytes() == before


def test_directory_ids_unique_across_formats(tmp_path: Path) -> None:
    ids = {format_log_dir(tmp_path / str(n), CLUSTER, 1).directory_id for n in range(20)}
    assert len(ids) == 20
    assert not any(kafka_uuid.is_reserved(directory_id) for directory_id in ids)


@pytest.mark.parametrize("cluster_id", ["", "has space", "a=b", "x\ny", "ü"])
def test_invalid_cluster_id_is_refused(tmp_path: Path, cluster_id: str) -> None:
    with pytest.raises(ValueError, match="invalid cluster id"):
        format_log_dir(tmp_path, cluster_id, 1)
    assert not (tmp_path / META_PROPERTIES).exists()


@pytest.mark.parametrize("node_id", [-1, True])
def test_invalid_node_id_is_refused(tmp_path: Path, node_id: int) -> None:
    with pytest.raises(ValueError, match="invalid node id"):
        format_log_dir(tmp_path, CLUSTER, node_id)


def test_random_cluster_id_has_kafka_form() -> None:
    ids = {random_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    for cluster_id in ids:
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", cluster_id) and cluster_id[0] != "-"
        assert kafka_uuid.to_kafka_string(kafka_uuid.parse_uuid(cluster_id)) == cluster_id


def test_uuid_forms() -> None:
    value = uuid.UUID("27c6803d-c7cb-42dd-9baa-cd494ffacc81")
    assert kafka_uuid.to_kafka_string(value) == "J8aAPcfLQt2bqs1JT_rMgQ"
    assert kafka_uuid.parse_uuid("J8aAPcfLQt2bqs1JT_rMgQ") == value
    assert kafka_uuid.parse_uuid(str(value)) == value
    for bad in ["J8aAPcfLQt2bqs1JT_rMgR", "J8aAPcfLQt2bqs1JT+rMgQ", "short", "=" * 22]:
        with pytest.raises(ValueError):
            kafka_uuid.parse_uuid(bad)


def test_meta_properties_value_round_trip() -> None:
    props = MetaProperties(cluster_id=CLUSTER, node_id=0, directory_id=uuid.uuid4())
    assert "node.id=0\n" in props.to_properties()


def test_leftover_tmp_from_a_crashed_format_is_replaced(tmp_path: Path) -> None:
    (tmp_path / (META_PROPERTIES + ".tmp")).write_bytes(b"half-written garbage")
    formatted = format_log_dir(tmp_path, CLUSTER, 1)
    assert load_meta_properties(tmp_path, CLUSTER, 1) == formatted
    assert sorted(path.name for path in tmp_path.iterdir()) == [META_PROPERTIES]
