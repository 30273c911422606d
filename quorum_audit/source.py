"""The Spark data source ``quorum``: replicas' segment files and snapshots as rows.

    spark.dataSource.register(QuorumDataSource)
    spark.read.format("quorum").load(["/backups/quorum-a", "s3://bucket/fleet/"])
    spark.read.format("quorum").option("columns", "file_index,offset,epoch").load(path)

One input partition per file (segment or snapshot), so a fleet's files spread over the cluster's
executors; each partition yields Arrow batches (``decode.decode_file``). The driver lists the
files when the plan is made: load the DataFrame once and reuse it rather than loading again.

Spark does not prune the columns of a Python data source, and turning Arrow columns into rows is
most of its cost (strings above all), so the ``columns`` option selects the columns at the source.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from quorum_audit.decode import SCHEMA, SOURCE_LOG, SOURCE_SNAPSHOT, FileIdentity, decode_file
from quorum_audit.discover import Replica, ReplicaFile, discover, read_file

FORMAT = "quorum"
MANIFEST_OPTION = "manifest"


class FilePartition(InputPartition):
    """One file of one replica (picklable: it travels to the executors)."""

    def __init__(self, uri: str, identity: FileIdentity, first_offset: int,
                 schema: pa.Schema) -> None:
        super().__init__(uri)
        self.uri = uri
        self.identity = identity
        self.first_offset = first_offset
        self.schema = schema


def manifest(replicas: Sequence[Replica]) -> str:
    """The ``manifest`` option: the files to read, as JSON, instead of paths to list."""
    return json.dumps([{"uri": p.uri, "first_offset": p.first_offset, **asdict(p.identity)}
                       for p in partitions_of(replicas)])


def _from_manifest(text: str, schema: pa.Schema) -> list[FilePartition]:
    partitions = []
    for entry in json.loads(text):
        uri, first_offset = entry.pop("uri"), entry.pop("first_offset")
        partitions.append(FilePartition(uri, FileIdentity(**entry), first_offset, schema))
    return partitions


def paths_option(options: dict[str, str]) -> list[str]:
    """The paths given to ``load()``: Spark passes one as ``path``, several as ``paths`` (JSON)."""
    if "paths" in options:
        paths: list[str] = json.loads(options["paths"])
        return paths
    if "path" in options:
        return [options["path"]]
    raise ValueError("the quorum data source needs paths: .load(path) or .load([path, ...])")


def columns_option(options: dict[str, str]) -> pa.Schema:
    """The columns asked for (``columns``: names separated by commas), in ``SCHEMA``'s order."""
    if "columns" not in options:
        return SCHEMA
    wanted = {name.strip() for name in options["columns"].split(",") if name.strip()}
    unknown = wanted - set(SCHEMA.names)
    if unknown or not wanted:
        raise ValueError(f"unknown columns {sorted(unknown)}; the columns are {SCHEMA.names}")
    return pa.schema([f for f in SCHEMA if f.name in wanted])


def partitions_of(replicas: Sequence[Replica], schema: pa.Schema = SCHEMA
                  ) -> list[FilePartition]:
    """A partition per file, numbered (``file_index``) in the order of ``all_files``."""
    return [FilePartition(file.uri, FileIdentity(
                cluster_id=replica.cluster_id, node_id=replica.node_id,
                directory_id=replica.directory_id, file=file.uri, file_index=index,
                source=SOURCE_LOG if file.kind == "log" else SOURCE_SNAPSHOT,
                snapshot_end_offset=file.snapshot_end_offset,
                snapshot_epoch=file.snapshot_epoch), file.first_offset, schema)
            for index, (replica, file) in enumerate(all_files(replicas))]


def all_files(replicas: Sequence[Replica]) -> list[tuple[Replica, ReplicaFile]]:
    return [(replica, file) for replica in replicas for file in replica.files]


class QuorumDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return from_arrow_schema(columns_option(dict(self.options)))

    def reader(self, schema: StructType) -> QuorumReader:
        options = dict(self.options)
        return QuorumReader(options.get(MANIFEST_OPTION), columns_option(options),
                            [] if MANIFEST_OPTION in options else paths_option(options))


class QuorumReader(DataSourceReader):
    def __init__(self, manifest: str | None, schema: pa.Schema, paths: list[str]) -> None:
        self.manifest = manifest
        self.paths = paths
        self.arrow_schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        if self.manifest is not None:
            return _from_manifest(self.manifest, self.arrow_schema) or [InputPartition(None)]
        found = discover(self.paths)
        if found.problems:
            # A directory that cannot be attributed to a replica cannot be audited: say so
            # rather than audit the rest as if it were complete.
            raise ValueError("unreadable log directories:\n" + "\n".join(found.problems))
        return partitions_of(found.replicas, self.arrow_schema) or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, FilePartition):
            return  # no files at all: an empty result, not an error
        yield from decode_file(read_file(partition.uri), partition.identity,
                               partition.first_offset, partition.schema)
