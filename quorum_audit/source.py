"""The Spark data source ``quorum``: replicas' segment files and snapshots as rows.

    spark.dataSource.register(QuorumDataSource)
    spark.read.format("quorum").load(["/backups/quorum-a", "s3://bucket/fleet/"])
    spark.read.format("quorum").option("columns", "file_index,offset,epoch").load(path)
    spark.read.format("quorum").option("granularity", "batch").load(path)

A row per record (``decode.SCHEMA``), or with ``granularity=batch`` a row per batch
(``decode.BATCH_SCHEMA``: headers only, CRC32C checked, no record parsed). One input partition per
file (segment or snapshot), so a fleet's files spread over the cluster's executors; each partition
yields Arrow batches. The driver lists the files when the plan is made: load the DataFrame once
and reuse it rather than loading again.

Spark does not prune the columns of a Python data source, and turning Arrow columns into rows is
most of its cost (strings above all), so the ``columns`` option selects the columns at the source.
The ``manifest`` option (see ``manifest``) replaces the paths with the driver's list of files, and
can restrict a file to some of its batches. ``s3_endpoint_url`` names an S3-compatible server (by
default the driver's ``AWS_ENDPOINT_URL``); each partition carries it to the executors.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from quorum_audit.decode import (
    BATCH_SCHEMA,
    SCHEMA,
    SOURCE_LOG,
    SOURCE_SNAPSHOT,
    FileIdentity,
    decode_batches,
    decode_file,
)
from quorum_audit.discover import Replica, ReplicaFile, discover, read_file

FORMAT = "quorum"
MANIFEST_OPTION = "manifest"
ENDPOINT_OPTION = "s3_endpoint_url"
RECORDS, BATCHES = "record", "batch"


class FilePartition(InputPartition):
    """One file of one replica (picklable: it travels to the executors)."""

    def __init__(self, uri: str, identity: FileIdentity, first_offset: int, schema: pa.Schema,
                 *, granularity: str = RECORDS, only: frozenset[int] | None = None,
                 endpoint_url: str | None = None) -> None:
        super().__init__(uri)
        self.uri = uri
        self.identity = identity
        self.first_offset = first_offset
        self.schema = schema
        self.granularity = granularity
        self.only = only
        self.endpoint_url = endpoint_url


def all_files(replicas: Sequence[Replica]) -> list[tuple[Replica, ReplicaFile]]:
    """Every file of every replica; a file's place in this list is its ``file_index``."""
    return [(replica, file) for replica in replicas for file in replica.files]


def identities(replicas: Sequence[Replica]) -> list[tuple[FileIdentity, ReplicaFile]]:
    return [(FileIdentity(
        cluster_id=replica.cluster_id, node_id=replica.node_id,
        directory_id=replica.directory_id, file=file.uri, file_index=index,
        source=SOURCE_LOG if file.kind == "log" else SOURCE_SNAPSHOT,
        snapshot_end_offset=file.snapshot_end_offset, snapshot_epoch=file.snapshot_epoch), file)
        for index, (replica, file) in enumerate(all_files(replicas))]


def manifest(replicas: Sequence[Replica],
             only: Mapping[int, frozenset[int] | None] | None = None,
             endpoint_url: str | None = None) -> str:
    """The ``manifest`` option: the files to read, as JSON. With ``only`` (file index -> the
    positions of the batches wanted, None for all), the files it names and no others."""
    entries = []
    for identity, file in identities(replicas):
        if only is not None and identity.file_index not in only:
            continue
        positions = None if only is None else only[identity.file_index]
        entries.append({"uri": file.uri, "first_offset": file.first_offset,
                        "only": None if positions is None else sorted(positions),
                        "endpoint_url": endpoint_url, **asdict(identity)})
    return json.dumps(entries)


def _from_manifest(text: str, schema: pa.Schema, granularity: str) -> list[FilePartition]:
    partitions = []
    for entry in json.loads(text):
        uri, first_offset, only = entry.pop("uri"), entry.pop("first_offset"), entry.pop("only")
        endpoint_url = entry.pop("endpoint_url", None)
        partitions.append(FilePartition(
            uri, FileIdentity(**entry), first_offset, schema, granularity=granularity,
            only=None if only is None else frozenset(only), endpoint_url=endpoint_url))
    return partitions


def paths_option(options: Mapping[str, str]) -> list[str]:
    """The paths given to ``load()``: Spark passes one as ``path``, several as ``paths`` (JSON)."""
    if "paths" in options:
        paths: list[str] = json.loads(options["paths"])
        return paths
    if "path" in options:
        return [options["path"]]
    raise ValueError("the quorum data source needs paths: .load(path) or .load([path, ...])")


def granularity_option(options: Mapping[str, str]) -> str:
    granularity = options.get("granularity", RECORDS)
    if granularity not in (RECORDS, BATCHES):
        raise ValueError(f"granularity is {RECORDS!r} or {BATCHES!r}, not {granularity!r}")
    return granularity


def columns_option(options: Mapping[str, str]) -> pa.Schema:
    """The columns asked for (``columns``: names separated by commas), in the schema's order."""
    schema = BATCH_SCHEMA if granularity_option(options) == BATCHES else SCHEMA
    if "columns" not in options:
        return schema
    wanted = {name.strip() for name in options["columns"].split(",") if name.strip()}
    unknown = wanted - set(schema.names)
    if unknown or not wanted:
        raise ValueError(f"unknown columns {sorted(unknown)}; the columns are {schema.names}")
    return pa.schema([f for f in schema if f.name in wanted])


class QuorumDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return from_arrow_schema(columns_option(self.options))

    def reader(self, schema: StructType) -> QuorumReader:
        options = dict(self.options)
        return QuorumReader(options.get(MANIFEST_OPTION), columns_option(options),
                            granularity_option(options),
                            [] if MANIFEST_OPTION in options else paths_option(options),
                            options.get(ENDPOINT_OPTION))


class QuorumReader(DataSourceReader):
    def __init__(self, manifest: str | None, schema: pa.Schema, granularity: str,
                 paths: list[str], endpoint_url: str | None = None) -> None:
        self.manifest = manifest
        self.endpoint_url = endpoint_url
        self.paths = paths
        self.arrow_schema = schema
        self.granularity = granularity

    def partitions(self) -> Sequence[InputPartition]:
        if self.manifest is not None:
            return _from_manifest(self.manifest, self.arrow_schema, self.granularity) \
                or [InputPartition(None)]
        found = discover(self.paths, self.endpoint_url)
        if found.problems:
            # A directory that cannot be attributed to a replica cannot be audited: say so
            # rather than audit the rest as if it were complete.
            raise ValueError("unreadable log directories:\n" + "\n".join(found.problems))
        partitions = [FilePartition(file.uri, identity, file.first_offset, self.arrow_schema,
                                    granularity=self.granularity,
                                    endpoint_url=found.endpoint_url)
                      for identity, file in identities(found.replicas)]
        return partitions or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, FilePartition):
            return  # no files at all: an empty result, not an error
        data = read_file(partition.uri, partition.endpoint_url)
        if partition.granularity == BATCHES:
            yield from decode_batches(data, partition.identity, partition.first_offset,
                                      partition.schema)
        else:
            yield from decode_file(data, partition.identity, partition.first_offset,
                                   partition.schema, partition.only)
