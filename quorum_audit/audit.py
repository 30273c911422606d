"""The audit jobs on Spark: consistency of the replicas, and the quorum's history.

Batches first (see ``_Audit``): one pass reads every file as a row per batch, its CRC32C checked
but its records not parsed (the expensive part, in Python workers), which Spark keeps (memory,
then disk) for the small aggregations that follow:

- per replica: its log's first and last offset and epoch;
- per (cluster, base offset): do all copies of the batch have the same epoch, record count and
  CRC32C? Only batches where they do not (or that are damaged, or do not line up) are decoded
  record by record, and compared per offset below the cluster's committed high watermark;
- control batches (the history) and snapshots (a digest of their records, compared between
  replicas) are decoded record by record too;
- damaged batches, epochs and per-second write counts, gathered to the driver.

The high watermark is not stored on disk (Kafka does not store it either), so it is taken as what
the logs prove committed: the end offset held by a majority of the latest voter set's replicas,
and at least the end of any snapshot (only committed records are snapshotted). A backup's manifest
states it: every record below its ``end_offset`` is committed. ``--high-watermark`` overrides it.

Backups (directories with ``backup.json``, see ``backup``) are replicas like the others, each
named by its path, so several backups of one node taken over time are several replicas; they
never outvote the other nodes: where copies disagree, each node counts once per value it holds.
Each backup's files are checked against its manifest (size and SHA-256) on the executors.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from quorum_audit.backup import BACKUP_MANIFEST, FileCheck, file_problem
from quorum_audit.decode import DAMAGE_TORN_TAIL
from quorum_audit.discover import Discovery, Replica, ReplicaFile, discover, resolve
from quorum_audit.history import ControlRow, EpochSeen, History, build_history, uuid_text
from quorum_audit.source import (
    BATCHES,
    FORMAT,
    MANIFEST_OPTION,
    RECORDS,
    QuorumDataSource,
    all_files,
    manifest,
)

COLUMNS = ("file_index,offset,epoch,timestamp_ms,is_control,control_type,value_size,checksum,"
           "checksum_ok,position,damage,error,control_value")
BATCH_COLUMNS = ("file_index,position,size,base_offset,last_offset,epoch,timestamp_ms,"
                 "record_count,is_control,batch_crc,checksum_ok,damage,error")
ERROR, WARNING = "error", "warning"
# Divergent offsets beyond this are counted, not listed one by one (a whole replica gone astray).
MAX_LISTED_DIVERGENCES = 100_000


@dataclass(frozen=True)
class Finding:
    severity: str  # "error" fails the audit, "warning" does not
    kind: str
    cluster_id: str
    detail: str
    node_id: int | None = None
    directory_id: str | None = None
    first_offset: int | None = None
    last_offset: int | None = None
    root: str | None = None  # the replica's directory or backup, where one is concerned


@dataclass(frozen=True)
class ReplicaSummary:
    cluster_id: str
    node_id: int
    directory_id: str
    root: str
    segments: int
    snapshots: int
    bytes: int
    log_start_offset: int | None
    log_end_offset: int | None
    last_epoch: int | None
    records: int  # read from its files (log and snapshots)
    newest_ms: int | None  # timestamp of its newest batch
    latest_snapshot: str | None
    state_epoch: int | None  # from quorum-state
    state_leader_id: int | None
    state_voted_id: int | None


@dataclass(frozen=True)
class Divergence:
    cluster_id: str
    offset: int
    node_id: int
    directory_id: str
    epoch: int | None
    checksum: int | None
    checksum_ok: bool
    agrees_with_majority: bool
    root: str | None = None  # the replica's directory or backup


@dataclass(frozen=True)
class WriteRate:
    cluster_id: str
    second_ms: int
    records: int
    bytes: int


@dataclass
class AuditResult:
    replicas: list[ReplicaSummary]
    high_watermarks: dict[str, int]
    findings: list[Finding]
    divergences: list[Divergence]
    history: History
    rates: list[WriteRate]
    rows_read: int
    records_compared: int
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not any(f.severity == ERROR for f in self.findings)

    def tables(self) -> dict[str, list[dict[str, object]]]:
        """Every result as rows, for Parquet and the report."""
        return {
            "replicas": [asdict(r) for r in self.replicas],
            "findings": [asdict(f) for f in self.findings],
            "divergences": [asdict(d) for d in self.divergences],
            "leadership": [asdict(e) for e in self.history.leadership],
            "membership": [asdict(m) for m in self.history.membership],
            "write_rates": [asdict(r) for r in self.rates],
        }


def load(spark: SparkSession, discovery: Discovery, granularity: str, columns: str,
         only: Mapping[int, frozenset[int] | None] | None = None) -> DataFrame:
    """The files of ``discovery`` through the ``quorum`` data source (registered if needed),
    numbered as ``all_files`` numbers them: the driver's list is handed over rather than listed
    again, which could differ on a live directory. ``only``: see ``source.manifest``."""
    spark.dataSource.register(QuorumDataSource)
    return (spark.read.format(FORMAT).option("granularity", granularity)
            .option("columns", columns)
            .option(MANIFEST_OPTION, manifest(discovery.replicas, only, discovery.endpoint_url))
            .load())


def run_audit(spark: SparkSession, paths: Sequence[str], high_watermark: int | None = None,
              s3_endpoint_url: str | None = None) -> AuditResult:
    """``s3_endpoint_url``: an S3-compatible server's (default: ``AWS_ENDPOINT_URL``)."""
    discovery = discover(paths, s3_endpoint_url)
    files = all_files(discovery.replicas)
    if not files:
        raise ValueError(f"no log directories with files under {', '.join(paths)}")
    return _Audit(spark, discovery, files).run(high_watermark)


class _Lookup:
    """A per-file value looked up by ``file_index`` in a literal array (no join)."""

    def __init__(self, index: Column) -> None:
        self.index = index

    def __call__(self, values: Sequence[object]) -> Column:
        return F.element_at(F.array(*[F.lit(v) for v in values]), self.index + 1)


class _Audit:
    """Batches first: a row per batch (its CRC32C checked, its records not parsed) is all the
    bulk of the data needs, since replicas holding a batch with the same base offset, epoch,
    record count and CRC32C hold the same records. Records are decoded only where that is not
    enough: batches whose copies differ, are damaged or do not line up, control batches (the
    history) and snapshots (written by each node in its own order)."""

    def __init__(self, spark: SparkSession, discovery: Discovery,
                 files: list[tuple[Replica, ReplicaFile]]) -> None:
        self.spark = spark
        self.discovery = discovery
        self.replicas = discovery.replicas
        self.files = files
        self.clusters = sorted({r.cluster_id for r in self.replicas})
        index = {id(r): i for i, r in enumerate(self.replicas)}
        self.replica_of = [index[id(r)] for r, _ in files]

    def with_ids(self, frame: DataFrame) -> DataFrame:
        """Adds each row's replica and cluster (indexes) and whether it is a snapshot's."""
        by_file = _Lookup(F.col("file_index"))
        return frame.select(
            "*", by_file(self.replica_of).alias("replica"),
            by_file([self.clusters.index(r.cluster_id) for r, _ in self.files]).alias("cluster"),
            by_file([f.kind == "snapshot" for _, f in self.files]).alias("in_snapshot"))

    def run(self, high_watermark: int | None) -> AuditResult:
        batches = load(self.spark, self.discovery, BATCHES, BATCH_COLUMNS).persist(
            StorageLevel.MEMORY_AND_DISK)
        try:
            return self._run(self.with_ids(batches), high_watermark)
        finally:
            batches.unpersist()

    def _run(self, batches: DataFrame, high_watermark: int | None) -> AuditResult:
        log = batches.where(~F.col("in_snapshot"))
        intact = F.col("epoch").isNotNull()  # the header parsed
        log_batch = ~F.col("in_snapshot") & intact
        # The first job fills the cache; the small ones after it run side by side (each is mostly
        # scheduling latency on small inputs, and they share the executors on large ones).
        stats = {row["replica"]: row for row in batches.groupBy("replica").agg(
            F.min(F.when(log_batch, F.col("base_offset"))).alias("first"),
            F.max(F.when(log_batch, F.col("last_offset"))).alias("last"),
            F.max(F.when(log_batch, F.col("epoch"))).alias("epoch"),
            F.max(F.when(log_batch, F.col("timestamp_ms"))).alias("newest_ms"),
            F.sum(F.coalesce(F.col("record_count"),
                             F.col("last_offset") - F.col("base_offset") + 1)).alias("records"),
        ).collect()}
        summaries = [_summary(r, stats.get(i)) for i, r in enumerate(self.replicas)]
        with ThreadPoolExecutor(5) as pool:
            seen_job = pool.submit(lambda: log.where(intact).groupBy("cluster", "epoch").agg(
                F.min("base_offset").alias("first"), F.min("timestamp_ms").alias("first_ms"))
                .collect())
            damage_job = pool.submit(_damage_findings, batches, self.files)
            rates_job = pool.submit(_write_rates, log)
            control_job = pool.submit(lambda: log.where(intact & F.col("is_control")).select(
                "file_index", "position").collect())
            backup_job = pool.submit(_backup_file_findings, self.spark, self.discovery)
            suspect_job = pool.submit(self._suspects, log, summaries)
            selected: dict[int, set[int]] = defaultdict(set)
            for row in [*control_job.result(), *suspect_job.result()]:
                selected[row["file_index"]].add(row["position"])
            only: dict[int, frozenset[int] | None] = {
                index: frozenset(positions) for index, positions in selected.items()}
            only.update({i: None for i, (_, f) in enumerate(self.files) if f.kind == "snapshot"})
            records = self.with_ids(load(self.spark, self.discovery, RECORDS, COLUMNS, only)) \
                .persist(StorageLevel.MEMORY_AND_DISK) if only else None
            try:
                return self._finish(batches, records, summaries=summaries,
                                    high_watermark=high_watermark, pool=pool, jobs=(
                    seen_job.result(), damage_job.result() + backup_job.result(),
                    rates_job.result()))
            finally:
                if records is not None:
                    records.unpersist()

    def _finish(self, batches: DataFrame, records: DataFrame | None, *,
                summaries: list[ReplicaSummary], high_watermark: int | None,
                pool: ThreadPoolExecutor, jobs: tuple[list[Row], list[Finding], list[Row]]
                ) -> AuditResult:
        seen_rows, damage, rate_rows = jobs
        clusters = self.clusters
        controls: list[Row] = []
        snapshot_job = None
        if records is not None:
            snapshot_job = pool.submit(_snapshot_findings, records, self.files)
            controls = records.where("is_control").select(
                "file_index", "offset", "epoch", "timestamp_ms", "control_type",
                "control_value").collect()
        last_ms: dict[str, int] = {}
        for summary in summaries:
            if summary.newest_ms is not None:
                last_ms[summary.cluster_id] = max(last_ms.get(summary.cluster_id, 0),
                                                  summary.newest_ms)
        history = build_history(
            [_control_row(r, self.files) for r in controls if r["control_value"] is not None],
            last_ms, [EpochSeen(clusters[r["cluster"]], r["epoch"], r["first"], r["first_ms"])
                      for r in seen_rows])
        findings = _conflict_findings(history)
        hws = _high_watermarks(summaries, self.replicas, history, high_watermark, findings)
        compared_job = pool.submit(self._compared, batches, hws)
        divergences: list[Divergence] = []
        if records is not None:
            divergences = _divergences(records.where(~F.col("in_snapshot")), self.replicas,
                                       clusters, hws)
        findings += _divergence_findings(divergences)
        findings += damage + _state_findings(summaries, self.replicas)
        findings += _backup_findings(summaries, self.replicas, self.discovery)
        # A directory without a readable meta.properties cannot be attributed to a replica.
        findings += [Finding(ERROR, "unreadable_directory", "", problem)
                     for problem in self.discovery.problems]
        if snapshot_job is not None:
            findings += snapshot_job.result()
        rates = [WriteRate(clusters[r["cluster"]], r["second"] * 1000, r["records"], r["bytes"])
                 for r in rate_rows]
        return AuditResult(summaries, hws, findings, divergences, history, rates,
                           sum(s.records for s in summaries), compared_job.result(),
                           self.discovery.problems)

    def _suspects(self, log: DataFrame, summaries: list[ReplicaSummary]) -> list[Row]:
        """The batches whose records must be compared one by one: where the copies of a batch
        (by base offset) differ in epoch, record count or CRC32C, one is damaged, or fewer
        replicas start a batch there than hold the offset (batches that do not line up)."""
        holders = F.lit(0)
        for summary in summaries:
            if summary.log_start_offset is not None and summary.log_end_offset is not None:
                cluster = self.clusters.index(summary.cluster_id)
                holders = holders + F.when(
                    (F.col("cluster") == cluster)
                    & (F.col("base_offset") >= summary.log_start_offset)
                    & (F.col("base_offset") < summary.log_end_offset), 1).otherwise(0)
        groups = log.where(F.col("epoch").isNotNull()).groupBy("cluster", "base_offset").agg(
            F.count("*").alias("copies"),
            (F.countDistinct("epoch", "record_count", "batch_crc") > 1).alias("differ"),
            F.max(F.col("damage").isNotNull()).alias("damaged"),
            F.collect_list(F.struct("file_index", "position")).alias("batches"))
        suspects = groups.where(F.col("differ") | F.col("damaged")
                                | (F.col("copies") != holders))
        return [batch for row in suspects.select("batches").limit(MAX_LISTED_DIVERGENCES)
                .collect() for batch in row["batches"]]

    def _compared(self, batches: DataFrame, hws: dict[str, int]) -> int:
        """Record copies below the high watermark whose batch CRC32C was checked."""
        hw = F.element_at(F.array(*[F.lit(hws.get(c, 0)) for c in self.clusters]),
                          F.col("cluster") + 1)
        below = F.greatest(F.lit(0), F.least(F.col("last_offset") + 1, hw) - F.col("base_offset"))
        row = batches.where(~F.col("in_snapshot") & F.col("checksum_ok")).agg(
            F.sum(below).alias("compared")).collect()[0]
        return int(row["compared"] or 0)


def _control_row(row: Row, files: list[tuple[Replica, ReplicaFile]]) -> ControlRow:
    replica, file = files[row["file_index"]]
    return ControlRow(replica.cluster_id, replica.node_id, replica.directory_id,
                      row["offset"], row["epoch"], row["timestamp_ms"],
                      row["control_type"], row["control_value"], file.snapshot_end_offset)


def _summary(replica: Replica, stats: Row | None) -> ReplicaSummary:
    values = stats.asDict() if stats is not None else {}
    snapshots = [f for f in replica.files if f.kind == "snapshot"]
    latest = max(snapshots, key=lambda f: (f.snapshot_end_offset, f.snapshot_epoch), default=None)
    state = replica.quorum_state
    return ReplicaSummary(
        cluster_id=replica.cluster_id, node_id=replica.node_id,
        directory_id=replica.directory_id, root=replica.root,
        segments=sum(f.kind == "log" for f in replica.files), snapshots=len(snapshots),
        bytes=sum(f.size for f in replica.files),
        log_start_offset=values.get("first"),
        log_end_offset=values["last"] + 1 if values.get("last") is not None else None,
        last_epoch=values.get("epoch"), records=values.get("records") or 0,
        newest_ms=values.get("newest_ms"),
        latest_snapshot=None if latest is None
        else f"{latest.snapshot_end_offset}-{latest.snapshot_epoch}",
        state_epoch=None if state is None else state.epoch,
        state_leader_id=None if state is None else state.leader_id,
        state_voted_id=None if state is None or state.voted_key is None else state.voted_key.id)


def _conflict_findings(history: History) -> list[Finding]:
    findings = [Finding(ERROR, "leader_conflict", c.cluster_id,
                        f"epoch {c.epoch} has {len(c.leaders)} leaders: " + "; ".join(
                            f"{leader} according to {', '.join(who)}"
                            for leader, who in sorted(c.leaders.items())))
                for c in history.conflicts]
    findings += [Finding(ERROR, "unreadable_control_record", "", detail)
                 for detail in history.unreadable]
    return findings


def _high_watermarks(summaries: list[ReplicaSummary], replicas: list[Replica], history: History,
                     forced: int | None, findings: list[Finding]) -> dict[str, int]:
    marks: dict[str, int] = {}
    by_cluster: dict[str, list[ReplicaSummary]] = defaultdict(list)
    stated: dict[str, int] = {}  # the most the backups' manifests state committed
    for summary, replica in zip(summaries, replicas, strict=True):
        if replica.manifest is not None:
            stated[summary.cluster_id] = max(stated.get(summary.cluster_id, 0),
                                             replica.manifest.end_offset)
        elif not replica.is_backup:  # a backup without a readable manifest proves nothing
            by_cluster[summary.cluster_id].append(summary)
    for cluster in stated.keys() - by_cluster.keys():
        marks[cluster] = stated[cluster]
    for cluster, members in by_cluster.items():
        snapshot_end = max((int(s.latest_snapshot.split("-")[0]) for s in members
                            if s.latest_snapshot), default=0)
        voters = history.voters.get(cluster)
        # Kafka's string form, as the replicas' directory ids are kept.
        keys = {f"{k.id}:{uuid_text(k)}" for k in voters} if voters else None
        majority = len(voters) // 2 + 1 if voters else len(members) // 2 + 1
        ends = sorted((s.log_end_offset or 0 for s in members
                       if keys is None or f"{s.node_id}:{s.directory_id}" in keys), reverse=True)
        if len(ends) >= majority:
            marks[cluster] = max(snapshot_end, ends[majority - 1], stated.get(cluster, 0))
        elif cluster in stated:  # the backups' manifests state the committed range
            marks[cluster] = max(snapshot_end, stated[cluster])
        else:
            marks[cluster] = snapshot_end
            findings.append(Finding(
                WARNING, "no_majority", cluster,
                f"only {len(ends)} of the voters' replicas were given (a majority is "
                f"{majority}): checked up to the latest snapshot ({snapshot_end}) only"))
    if forced is not None:
        marks = dict.fromkeys(marks, forced)
    return marks


def _damage_findings(batches: DataFrame, files: list[tuple[Replica, ReplicaFile]]
                     ) -> list[Finding]:
    damaged = batches.where(F.col("damage").isNotNull()).select(
        "file_index", "position", "damage", "error", "base_offset", "last_offset").orderBy(
        "file_index", "position").collect()
    findings = []
    for row in damaged:
        replica, file = files[row["file_index"]]
        where = file.uri.rsplit("/", 1)[-1]
        findings.append(Finding(
            WARNING if row["damage"] == DAMAGE_TORN_TAIL else ERROR, row["damage"],
            replica.cluster_id, f"{where} byte {row['position']}: {row['error']}",
            replica.node_id, replica.directory_id, row["base_offset"], row["last_offset"],
            replica.root))
    return findings


def _check_backup_file(check: FileCheck) -> tuple[FileCheck, str | None]:
    """Runs on an executor: one backup file read and hashed where it is."""
    filesystem, base = resolve(check.root, check.endpoint_url)
    try:
        return check, file_problem(check, filesystem, base)
    except OSError as error:
        return check, f"unreadable: {error}"


def _backup_file_findings(spark: SparkSession, discovery: Discovery) -> list[Finding]:
    """Every file a backup's manifest lists, checked (size, SHA-256) on the executors, one task
    per file; and files a backup holds that its manifest does not list."""
    checks = [FileCheck(r.root, f.path, f.size, f.sha256, discovery.endpoint_url)
              for r in discovery.replicas if r.manifest is not None for f in r.manifest.files]
    by_root = {r.root: r for r in discovery.replicas}
    findings = []
    if checks:
        results = spark.sparkContext.parallelize(checks, len(checks)).map(
            _check_backup_file).collect()
        for check, problem in sorted(results, key=lambda result: (result[0].root,
                                                                  result[0].path)):
            if problem is not None:
                replica = by_root[check.root]
                findings.append(Finding(
                    ERROR, "backup_file", replica.cluster_id,
                    f"{check.path}: {problem}", replica.node_id,
                    replica.directory_id, root=replica.root))
    for replica in discovery.replicas:
        if replica.manifest is not None:
            listed = {f.path for f in replica.manifest.files}
            findings += [Finding(
                ERROR, "backup_file", replica.cluster_id,
                f"{path}: not listed in its {BACKUP_MANIFEST}",
                replica.node_id, replica.directory_id, root=replica.root)
                for path in replica.backup_files if path not in listed]
    return findings


def _backup_findings(summaries: list[ReplicaSummary], replicas: list[Replica],
                     discovery: Discovery) -> list[Finding]:
    """A backup's manifest against what its files hold; incomplete backups."""
    findings = [Finding(WARNING, "incomplete_backup", "",
                        f"{root}: no {BACKUP_MANIFEST} (a backup is written manifest last), "
                        "not audited", root=root)
                for root in discovery.incomplete_backups]
    for summary, replica in zip(summaries, replicas, strict=True):
        def problem(detail: str, replica: Replica = replica) -> Finding:
            return Finding(ERROR, "backup_manifest", replica.cluster_id, detail,
                           replica.node_id, replica.directory_id, root=replica.root)

        if replica.manifest_problem is not None:
            findings.append(problem(replica.manifest_problem))
        manifest = replica.manifest
        if manifest is None:
            continue
        identity = (manifest.cluster_id, manifest.node_id, manifest.directory_id)
        if identity != (replica.cluster_id, replica.node_id, replica.directory_id):
            findings.append(problem(
                f"the manifest is for cluster {manifest.cluster_id} node {manifest.node_id} "
                f"directory {manifest.directory_id}, meta.properties says cluster "
                f"{replica.cluster_id} node {replica.node_id} directory {replica.directory_id}"))
        # The log must end exactly at end_offset: past it would be records not known committed,
        # short of it records missing (unless a snapshot covers them).
        snapshot_end = 0 if manifest.snapshot is None else manifest.snapshot.end_offset
        held = summary.log_end_offset if summary.log_end_offset is not None else snapshot_end
        if held != manifest.end_offset:
            findings.append(problem(
                f"holds records up to offset {held} (exclusive), the manifest's end_offset is "
                f"{manifest.end_offset}"))
    return findings


def _state_findings(summaries: list[ReplicaSummary], replicas: list[Replica]) -> list[Finding]:
    findings = []
    for summary, replica in zip(summaries, replicas, strict=True):
        if replica.problem is not None:
            findings.append(Finding(ERROR, "quorum_state", replica.cluster_id, replica.problem,
                                    replica.node_id, replica.directory_id, root=replica.root))
        elif summary.state_epoch is not None and summary.last_epoch is not None \
                and summary.state_epoch < summary.last_epoch:
            findings.append(Finding(
                ERROR, "quorum_state", replica.cluster_id,
                f"quorum-state epoch {summary.state_epoch} is older than the log's last epoch "
                f"{summary.last_epoch}", replica.node_id, replica.directory_id,
                root=replica.root))
    return findings


def _divergences(log: DataFrame, replicas: list[Replica], clusters: list[str],
                 hws: dict[str, int]) -> list[Divergence]:
    """Offsets below the high watermark whose replicas disagree, with every replica's copy."""
    hw = F.element_at(F.array(*[F.lit(hws.get(c, 0)) for c in clusters]), F.col("cluster") + 1)
    checked = log.where(F.col("checksum").isNotNull() & (F.col("offset") < hw))
    per_offset = checked.groupBy("cluster", "offset").agg(
        F.count("*").alias("copies"), F.min("epoch").alias("e0"), F.max("epoch").alias("e1"),
        F.min("checksum").alias("c0"), F.max("checksum").alias("c1"))
    disagree = per_offset.where((F.col("e0") != F.col("e1")) | (F.col("c0") != F.col("c1")))
    listed = disagree.select("cluster", "offset").orderBy("cluster", "offset").limit(
        MAX_LISTED_DIVERGENCES)
    copies = checked.join(F.broadcast(listed), ["cluster", "offset"]).select(
        "cluster", "offset", "replica", "epoch", "checksum", "checksum_ok").collect()
    by_offset: dict[tuple[int, int], list[Row]] = defaultdict(list)
    for copy in copies:
        by_offset[(copy["cluster"], copy["offset"])].append(copy)
    divergences: list[Divergence] = []
    for (cluster, offset), held in sorted(by_offset.items()):
        # A node counts once per value it holds, however many of its backups hold it.
        votes = Counter(value for _, value in {
            (_node_key(replicas[c["replica"]]), (c["epoch"], c["checksum"])) for c in held})
        (top, top_count), *rest = votes.most_common()
        majority = top if not rest or rest[0][1] < top_count else None
        for copy in held:
            replica = replicas[copy["replica"]]
            divergences.append(Divergence(
                clusters[cluster], offset, replica.node_id, replica.directory_id,
                copy["epoch"], copy["checksum"], copy["checksum_ok"],
                (copy["epoch"], copy["checksum"]) == majority, replica.root))
    return divergences


def _node_key(replica: Replica) -> tuple[str, int, str]:
    return replica.cluster_id, replica.node_id, replica.directory_id


def _divergence_findings(divergences: list[Divergence]) -> list[Finding]:
    """One finding per replica and run of consecutive offsets where it dissents."""
    dissent: dict[tuple[str, int, str, str], list[int]] = defaultdict(list)
    for d in divergences:
        if not d.agrees_with_majority:
            dissent[(d.cluster_id, d.node_id, d.directory_id, d.root or "")].append(d.offset)
    findings = []
    for (cluster, node, directory, root), offsets in sorted(dissent.items()):
        for first, last in _runs(sorted(offsets)):
            count = last - first + 1
            findings.append(Finding(
                ERROR, "divergence", cluster,
                f"{count} record{'s differ' if count > 1 else ' differs'} from the majority of the "
                "replicas (epoch or checksum)", node, directory, first, last, root or None))
    return findings


def _runs(offsets: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for offset in offsets:
        if runs and runs[-1][1] == offset - 1:
            runs[-1] = (runs[-1][0], offset)
        else:
            runs.append((offset, offset))
    return runs


def _snapshot_findings(rows: DataFrame, files: list[tuple[Replica, ReplicaFile]]
                       ) -> list[Finding]:
    """Snapshots with the same id must hold the same records (in any order: each replica
    writes its own from its state machine)."""
    digests = rows.where(F.col("in_snapshot") & ~F.col("is_control")
                         & F.col("checksum").isNotNull()).groupBy("file_index").agg(
        F.count("*").alias("records"),
        F.bit_xor(F.xxhash64("checksum", "value_size")).alias("digest")).collect()
    by_id: dict[tuple[str, str], dict[tuple[int, int], list[str]]] = defaultdict(
        lambda: defaultdict(list))
    for row in digests:
        replica, file = files[row["file_index"]]
        snapshot = f"{file.snapshot_end_offset}-{file.snapshot_epoch}"
        by_id[(replica.cluster_id, snapshot)][(row["records"], row["digest"])].append(
            f"{replica.node_id}:{replica.directory_id}")
    return [Finding(ERROR, "snapshot_mismatch", cluster,
                    f"snapshot {snapshot} differs between replicas: " + "; ".join(
                        f"{', '.join(who)} hold {records} records (digest {digest:#x})"
                        for (records, digest), who in sorted(versions.items())))
            for (cluster, snapshot), versions in sorted(by_id.items()) if len(versions) > 1]


def _write_rates(log: DataFrame) -> list[Row]:
    """Data records per second; per cluster, the replica holding most of each second (replicas
    hold the same records, minus what a replica has compacted or not yet fetched)."""
    per_replica = log.where(~F.col("is_control") & F.col("timestamp_ms").isNotNull()).groupBy(
        "cluster", "replica", F.floor(F.col("timestamp_ms") / 1000).alias("second")).agg(
        F.sum("record_count").alias("records"), F.sum("size").alias("bytes"))
    best = per_replica.groupBy("cluster", "second").agg(
        F.max_by(F.struct("records", "bytes"), "records").alias("best"))
    return best.select("cluster", "second", "best.records", "best.bytes").orderBy(
        "cluster", "second").collect()


def to_json(result: AuditResult) -> str:
    return json.dumps({"passed": result.passed, "high_watermarks": result.high_watermarks,
                       "rows_read": result.rows_read, "records_compared": result.records_compared,
                       "findings": [asdict(f) for f in result.findings]}, indent=2)
