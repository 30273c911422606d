"""The audit jobs on Spark: consistency of the replicas, and the quorum's history.

One pass decodes every file (the expensive part, in Python workers) into the dozen columns the
jobs need, which Spark keeps (memory, then disk) for the few small aggregations that follow:

- per replica: its log's first and last offset and epoch;
- per (cluster, offset) below the cluster's committed high watermark: do all replicas holding it
  have the same epoch and record checksum? Only offsets where they do not are looked at again;
- per (replica, snapshot): a digest of its records, compared between replicas;
- the control records, damaged batches and per-second write counts, gathered to the driver.

The high watermark is not stored on disk (Kafka does not store it either), so it is taken as what
the logs prove committed: the end offset held by a majority of the latest voter set's replicas,
and at least the end of any snapshot (only committed records are snapshotted). ``--high-watermark``
overrides it.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from quorum_audit.decode import DAMAGE_TORN_TAIL
from quorum_audit.discover import Discovery, Replica, ReplicaFile, discover
from quorum_audit.history import ControlRow, EpochSeen, History, build_history, uuid_text
from quorum_audit.source import FORMAT, MANIFEST_OPTION, QuorumDataSource, all_files, manifest

COLUMNS = ("file_index,offset,epoch,timestamp_ms,is_control,control_type,value_size,checksum,"
           "checksum_ok,position,damage,error,control_value")
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


def load_records(spark: SparkSession, discovery: Discovery, columns: str = COLUMNS) -> DataFrame:
    """The files of ``discovery`` through the ``quorum`` data source (registered if needed),
    numbered as ``all_files`` numbers them: the driver's list is handed over rather than listed
    again, which could differ on a live directory."""
    spark.dataSource.register(QuorumDataSource)
    return (spark.read.format(FORMAT).option("columns", columns)
            .option(MANIFEST_OPTION, manifest(discovery.replicas)).load())


def run_audit(spark: SparkSession, paths: Sequence[str],
              high_watermark: int | None = None) -> AuditResult:
    discovery = discover(paths)
    files = all_files(discovery.replicas)
    if not files:
        raise ValueError(f"no log directories with files under {', '.join(paths)}")
    records = load_records(spark, discovery).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        return _audit(records, discovery, files, high_watermark)
    finally:
        records.unpersist()


def _audit(records: DataFrame, discovery: Discovery, files: list[tuple[Replica, ReplicaFile]],
           high_watermark: int | None) -> AuditResult:
    replicas = discovery.replicas
    clusters = sorted({r.cluster_id for r in replicas})
    replica_index = {id(r): i for i, r in enumerate(replicas)}
    by_file = _lookup(F.col("file_index"))
    rows = records.select(
        "*",
        by_file([replica_index[id(r)] for r, _ in files]).alias("replica"),
        by_file([clusters.index(r.cluster_id) for r, _ in files]).alias("cluster"),
        by_file([f.kind == "snapshot" for _, f in files]).alias("in_snapshot"))
    log = rows.where(~F.col("in_snapshot"))

    log_row = ~F.col("in_snapshot") & F.col("epoch").isNotNull()
    # The first job fills the cache; the small ones after it run side by side (each is mostly
    # scheduling latency on small inputs, and they share the executors on large ones).
    stats = {row["replica"]: row for row in rows.groupBy("replica").agg(
        F.min(F.when(log_row, F.col("offset"))).alias("first"),
        F.max(F.when(log_row, F.col("offset"))).alias("last"),
        F.max(F.when(log_row, F.col("epoch"))).alias("epoch"),
        F.max(F.when(log_row, F.col("timestamp_ms"))).alias("newest_ms"),
        F.count("*").alias("rows")).collect()}
    with ThreadPoolExecutor(5) as pool:
        controls_job = pool.submit(lambda: rows.where("is_control").select(
            "file_index", "offset", "epoch", "timestamp_ms", "control_type",
            "control_value").collect())
        seen_job = pool.submit(lambda: log.where(F.col("epoch").isNotNull()).groupBy(
            "cluster", "epoch").agg(F.min("offset").alias("first"),
                                    F.min("timestamp_ms").alias("first_ms")).collect())
        damage_job = pool.submit(_damage_findings, rows, files)
        snapshot_job = pool.submit(_snapshot_findings, rows, files)
        rates_job = pool.submit(_write_rates, log)
        controls = [_control_row(row, files) for row in controls_job.result()
                    if row["control_value"] is not None]
        seen = [EpochSeen(clusters[r["cluster"]], r["epoch"], r["first"], r["first_ms"])
                for r in seen_job.result()]
        last_ms: dict[str, int] = {}
        for index, row in stats.items():
            cluster = replicas[index].cluster_id
            if row["newest_ms"] is not None:
                last_ms[cluster] = max(last_ms.get(cluster, row["newest_ms"]), row["newest_ms"])
        history = build_history(controls, last_ms, seen)
        summaries = [_summary(replica, stats.get(i)) for i, replica in enumerate(replicas)]
        findings = _conflict_findings(history)
        hws = _high_watermarks(summaries, history, high_watermark, findings)
        divergences, compared = _divergences(log, replicas, clusters, hws, findings)
        findings += damage_job.result() + _state_findings(summaries, replicas)
        findings += snapshot_job.result()
        rates = [WriteRate(clusters[r["cluster"]], r["second"] * 1000, r["records"],
                           r["bytes"]) for r in rates_job.result()]
    total = sum(row["rows"] for row in stats.values())
    return AuditResult(summaries, hws, findings, divergences, history, rates, total, compared,
                       discovery.problems)


def _lookup(index: Column) -> _Lookup:
    return _Lookup(index)


class _Lookup:
    """A per-file value looked up by ``file_index`` in a literal array (no join)."""

    def __init__(self, index: Column) -> None:
        self.index = index

    def __call__(self, values: Sequence[object]) -> Column:
        return F.element_at(F.array(*[F.lit(v) for v in values]), self.index + 1)


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
        last_epoch=values.get("epoch"),
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


def _high_watermarks(summaries: list[ReplicaSummary], history: History, forced: int | None,
                     findings: list[Finding]) -> dict[str, int]:
    marks: dict[str, int] = {}
    by_cluster: dict[str, list[ReplicaSummary]] = defaultdict(list)
    for summary in summaries:
        by_cluster[summary.cluster_id].append(summary)
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
            marks[cluster] = max(snapshot_end, ends[majority - 1])
        else:
            marks[cluster] = snapshot_end
            findings.append(Finding(
                WARNING, "no_majority", cluster,
                f"only {len(ends)} of the voters' replicas were given (a majority is "
                f"{majority}): checked up to the latest snapshot ({snapshot_end}) only"))
        if forced is not None:
            marks[cluster] = forced
    return marks


def _damage_findings(rows: DataFrame, files: list[tuple[Replica, ReplicaFile]]
                     ) -> list[Finding]:
    damaged = rows.where(F.col("damage").isNotNull()).groupBy(
        "file_index", "position", "damage", "error").agg(
        F.min("offset").alias("first"), F.max("offset").alias("last")).orderBy(
        "file_index", "position").collect()
    findings = []
    for row in damaged:
        replica, file = files[row["file_index"]]
        torn = row["damage"] == DAMAGE_TORN_TAIL
        where = file.uri.rsplit("/", 1)[-1]
        findings.append(Finding(
            WARNING if torn else ERROR, row["damage"], replica.cluster_id,
            f"{where} byte {row['position']}: {row['error']}", replica.node_id,
            replica.directory_id, row["first"], row["last"]))
    return findings


def _state_findings(summaries: list[ReplicaSummary], replicas: list[Replica]) -> list[Finding]:
    findings = []
    for summary, replica in zip(summaries, replicas, strict=True):
        if replica.problem is not None:
            findings.append(Finding(ERROR, "quorum_state", replica.cluster_id, replica.problem,
                                    replica.node_id, replica.directory_id))
        elif summary.state_epoch is not None and summary.last_epoch is not None \
                and summary.state_epoch < summary.last_epoch:
            findings.append(Finding(
                ERROR, "quorum_state", replica.cluster_id,
                f"quorum-state epoch {summary.state_epoch} is older than the log's last epoch "
                f"{summary.last_epoch}", replica.node_id, replica.directory_id))
    return findings


def _divergences(log: DataFrame, replicas: list[Replica], clusters: list[str],
                 hws: dict[str, int], findings: list[Finding]
                 ) -> tuple[list[Divergence], int]:
    """Offsets below the high watermark whose replicas disagree, with every replica's copy."""
    hw = F.element_at(F.array(*[F.lit(hws.get(c, 0)) for c in clusters]), F.col("cluster") + 1)
    checked = log.where(F.col("checksum").isNotNull() & (F.col("offset") < hw))
    per_offset = checked.groupBy("cluster", "offset").agg(
        F.count("*").alias("copies"), F.min("epoch").alias("e0"), F.max("epoch").alias("e1"),
        F.min("checksum").alias("c0"), F.max("checksum").alias("c1"))
    # One job counts the comparisons and gathers the (few) offsets in disagreement.
    disagree = F.when((F.col("e0") != F.col("e1")) | (F.col("c0") != F.col("c1")),
                      F.struct("cluster", "offset"))
    totals = per_offset.agg(
        F.sum("copies").alias("compared"),
        F.slice(F.sort_array(F.collect_list(disagree)), 1, MAX_LISTED_DIVERGENCES)
        .alias("offsets")).collect()[0]
    copies: list[Row] = []
    if totals["offsets"]:
        listed = log.sparkSession.createDataFrame(
            [(o["cluster"], o["offset"]) for o in totals["offsets"]], "cluster int, offset long")
        copies = checked.join(F.broadcast(listed), ["cluster", "offset"]).select(
            "cluster", "offset", "replica", "epoch", "checksum", "checksum_ok").collect()
    by_offset: dict[tuple[int, int], list[Row]] = defaultdict(list)
    for copy in copies:
        by_offset[(copy["cluster"], copy["offset"])].append(copy)
    divergences: list[Divergence] = []
    for (cluster, offset), held in sorted(by_offset.items()):
        votes = Counter((c["epoch"], c["checksum"]) for c in held)
        (top, top_count), *rest = votes.most_common()
        majority = top if not rest or rest[0][1] < top_count else None
        for copy in held:
            replica = replicas[copy["replica"]]
            divergences.append(Divergence(
                clusters[cluster], offset, replica.node_id, replica.directory_id,
                copy["epoch"], copy["checksum"], copy["checksum_ok"],
                (copy["epoch"], copy["checksum"]) == majority))
    findings += _divergence_findings(divergences)
    return divergences, int(totals["compared"] or 0)


def _divergence_findings(divergences: list[Divergence]) -> list[Finding]:
    """One finding per replica and run of consecutive offsets where it dissents."""
    dissent: dict[tuple[str, int, str], list[int]] = defaultdict(list)
    for d in divergences:
        if not d.agrees_with_majority:
            dissent[(d.cluster_id, d.node_id, d.directory_id)].append(d.offset)
    findings = []
    for (cluster, node, directory), offsets in sorted(dissent.items()):
        for first, last in _runs(sorted(offsets)):
            count = last - first + 1
            findings.append(Finding(
                ERROR, "divergence", cluster,
                f"{count} record{'s' if count > 1 else ''} differ from the majority of the "
                "replicas (epoch or checksum)", node, directory, first, last))
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


def _write_rates(log: DataFrame) -> list[dict[str, int]]:
    """Data records per second; per cluster, the replica holding most of each second (replicas
    hold the same records, minus what a replica has compacted or not yet fetched)."""
    per_replica = log.where(~F.col("is_control") & F.col("timestamp_ms").isNotNull()).groupBy(
        "cluster", "replica", F.floor(F.col("timestamp_ms") / 1000).alias("second")).agg(
        F.count("*").alias("records"), F.sum("value_size").alias("bytes"))
    best = per_replica.groupBy("cluster", "second").agg(
        F.max_by(F.struct("records", "bytes"), "records").alias("best"))
    return [{"cluster": r["cluster"], "second": r["second"], "records": r["best"]["records"],
             "bytes": r["best"]["bytes"] or 0}
            for r in best.orderBy("cluster", "second").collect()]


def to_json(result: AuditResult) -> str:
    return json.dumps({"passed": result.passed, "high_watermarks": result.high_watermarks,
                       "rows_read": result.rows_read, "records_compared": result.records_compared,
                       "findings": [asdict(f) for f in result.findings]}, indent=2)
