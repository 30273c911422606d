"""``meta.properties``: the identity of a log directory (cluster, node and directory id).

Written once by formatting, then only read: at start-up the node checks that the directory belongs
to the configured cluster and node id, so a disk moved to the wrong node, or a node pointed at
another cluster's disk, refuses to start instead of voting with someone else's log. The directory id
(KIP-856) tells a replaced, empty disk apart from the one that held the log.
"""

from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

from quorum_node.storage import kafka_uuid
from quorum_node.storage.errors import MetaPropertiesError, NotFormattedError
from quorum_node.storage.fsutil import atomic_write, ensure_directory

META_PROPERTIES = "meta.properties"
VERSION = 1  # version 1 is the KRaft layout (version 0 was ZooKeeper mode)

_VERSION_KEY = "version"
_CLUSTER_ID_KEY = "cluster.id"
_NODE_ID_KEY = "node.id"
_DIRECTORY_ID_KEY = "directory.id"
_KEYS = (_VERSION_KEY, _CLUSTER_ID_KEY, _NODE_ID_KEY, _DIRECTORY_ID_KEY)

# Kafka's cluster ids are base64url uuids; any non-empty id from that alphabet is accepted, which
# also keeps it clear of the properties syntax (no separators, escapes or whitespace).
_CLUSTER_ID = re.compile(r"[A-Za-z0-9_-]+")
_NODE_ID = re.compile(r"[0-9]+")


@dataclass(frozen=True, slots=True)
class MetaProperties:
    cluster_id: str
    node_id: int
    directory_id: uuid.UUID
    version: int = VERSION

    def to_properties(self) -> str:
        return (
            f"{_VERSION_KEY}={self.version}\n"
            f"{_CLUSTER_ID_KEY}={self.cluster_id}\n"
            f"{_NODE_ID_KEY}={self.node_id}\n"
            f"{_DIRECTORY_ID_KEY}={kafka_uuid.to_kafka_string(self.directory_id)}\n"
        )


def random_cluster_id() -> str:
    """A new cluster id in Kafka's form (22 base64url characters, like ``kafka-storage
    random-uuid``)."""
    return kafka_uuid.to_kafka_string(kafka_uuid.random_uuid())


def validate_cluster_id(cluster_id: str) -> None:
    if not _CLUSTER_ID.fullmatch(cluster_id):
        raise ValueError(
            f"invalid cluster id {cluster_id!r}: expected a non-empty string of base64url "
            "characters (A-Z a-z 0-9 - _), such as random_cluster_id() produces"
        )


def validate_node_id(node_id: int) -> None:
    if isinstance(node_id, bool) or not isinstance(node_id, int) or node_id < 0:
        raise ValueError(f"invalid node id {node_id!r}: expected an integer >= 0")


def format_log_dir(
    log_dir: str | os.PathLike[str],
    cluster_id: str,
    node_id: int,
    ignore_formatted: bool = False,
    *,
    directory_id: uuid.UUID | None = None,
) -> MetaProperties:
    """Write ``meta.properties`` into ``log_dir`` (created if missing) and return it.

    A fresh random directory id is generated unless ``directory_id`` is given (re-formatting a
    replaced disk under the id recorded for it, as ``--initial-controllers`` does). An existing file
    is never overwritten: without ``ignore_formatted`` that is an error; with it the file is left
    untouched and returned, after checking it belongs to this cluster and node.

    The caller holds the directory's lock (``dir_lock.lock_directory``), or one that covers it
    (``quorum-node local``'s data directory lock), so that no node opens it meanwhile.
    """
    validate_cluster_id(cluster_id)
    validate_node_id(node_id)
    if directory_id is None:
        directory_id = kafka_uuid.random_uuid()
    elif kafka_uuid.is_reserved(directory_id):
        raise ValueError(f"directory id {directory_id} is reserved")
    directory = Path(log_dir)
    path = directory / META_PROPERTIES
    if path.exists():
        return _already_formatted(directory, cluster_id, node_id, ignore_formatted)
    ensure_directory(directory)
    props = MetaProperties(cluster_id=cluster_id, node_id=node_id, directory_id=directory_id)
    try:
        atomic_write(path, props.to_properties().encode("ascii"), replace=False)
    except FileExistsError:  # formatted concurrently since the check above
        return _already_formatted(directory, cluster_id, node_id, ignore_formatted)
    return props


def load_meta_properties(
    log_dir: str | os.PathLike[str], expected_cluster_id: str, expected_node_id: int
) -> MetaProperties:
    """Read ``meta.properties`` and check it against the node's configuration."""
    path = Path(log_dir) / META_PROPERTIES
    props = read_meta_properties(path)
    if props.node_id != expected_node_id:
        raise MetaPropertiesError(
            f"{path}: node.id {props.node_id} does not match the configured node id "
            f"{expected_node_id}"
        )
    if props.cluster_id != expected_cluster_id:
        raise MetaPropertiesError(
            f"{path}: cluster.id {props.cluster_id!r} does not match the configured cluster id "
            f"{expected_cluster_id!r}"
        )
    return props


def read_meta_properties(path: Path) -> MetaProperties:
    """Parse one ``meta.properties`` file without comparing it to any configuration."""
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        raise NotFormattedError(
            f"{path}: not found; the log directory has not been formatted"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MetaPropertiesError(f"{path}: unreadable: {exc}") from exc
    values = _parse_properties(path, text)
    missing = [key for key in _KEYS if key not in values]
    if missing:
        raise MetaPropertiesError(f"{path}: missing {', '.join(missing)}")
    if values[_VERSION_KEY] != str(VERSION):
        raise MetaPropertiesError(
            f"{path}: unsupported version {values[_VERSION_KEY]!r} (expected {VERSION})"
        )
    cluster_id = values[_CLUSTER_ID_KEY]
    if not _CLUSTER_ID.fullmatch(cluster_id):
        raise MetaPropertiesError(f"{path}: invalid cluster.id {cluster_id!r}")
    if not _NODE_ID.fullmatch(values[_NODE_ID_KEY]):
        raise MetaPropertiesError(f"{path}: invalid node.id {values[_NODE_ID_KEY]!r}")
    try:
        directory_id = kafka_uuid.parse_uuid(values[_DIRECTORY_ID_KEY])
    except ValueError as exc:
        raise MetaPropertiesError(f"{path}: invalid directory.id: {exc}") from exc
    if kafka_uuid.is_reserved(directory_id):
        raise MetaPropertiesError(f"{path}: directory.id {directory_id} is reserved")
    return MetaProperties(
        cluster_id=cluster_id, node_id=int(values[_NODE_ID_KEY]), directory_id=directory_id
    )


def _already_formatted(
    directory: Path, cluster_id: str, node_id: int, ignore_formatted: bool
) -> MetaProperties:
    path = directory / META_PROPERTIES
    if not ignore_formatted:
        raise MetaPropertiesError(
            f"{path}: log directory is already formatted (use ignore_formatted to keep it)"
        )
    return load_meta_properties(directory, cluster_id, node_id)


def _parse_properties(path: Path, text: str) -> dict[str, str]:
    """The subset of Java's properties syntax that Kafka writes: ``key=value`` lines and ``#``/``!``
    comments. Anything else (continuations, escapes, duplicate keys) is refused, not guessed at."""
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        key, separator, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not separator or not key or "\\" in line:
            raise MetaPropertiesError(f"{path}: line {number} is not a key=value pair: {raw!r}")
        if key in values:
            raise MetaPropertiesError(f"{path}: line {number} repeats the key {key!r}")
        values[key] = value
    return values
