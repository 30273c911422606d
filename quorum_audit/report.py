"""The audit's output: Parquet tables, a Markdown report and a PNG timeline chart.

The result tables are small (findings, timelines, per-second rates), so they are written from the
driver with pyarrow, to a local directory or an object-store URI alike.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
from collections import defaultdict
from datetime import UTC, datetime

import matplotlib

matplotlib.use("Agg")  # no display: render to files only

import matplotlib.pyplot as plt
import pyarrow as pa
import pyarrow.parquet as pq
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox

from quorum_audit.audit import (
    AuditResult,
    Divergence,
    Finding,
    ReplicaSummary,
    WriteRate,
)
from quorum_audit.discover import resolve
from quorum_audit.history import LeaderEpoch, MembershipChange

CHART = "timeline.png"
REPORT = "report.md"
_ROW_TYPES: dict[str, type] = {
    "replicas": ReplicaSummary, "findings": Finding, "divergences": Divergence,
    "leadership": LeaderEpoch, "membership": MembershipChange, "write_rates": WriteRate,
}
MAX_CHARTED_CLUSTERS = 8
MAX_LISTED = 50  # rows of a table shown in the report; the Parquet tables hold them all


def write_outputs(result: AuditResult, out: str, *, tables: set[str] | None = None,
                  endpoint_url: str | None = None) -> list[str]:
    """Write the chosen tables (all by default), the chart and the report under ``out``; return
    what was written. ``endpoint_url``: an S3-compatible server's, for an ``s3://`` ``out``."""
    filesystem, base = resolve(out, endpoint_url)
    filesystem.create_dir(base, recursive=True)
    written = []
    for name, rows in result.tables().items():
        if tables is not None and name not in tables:
            continue
        path = f"{base.rstrip('/')}/{name}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=_schema(_ROW_TYPES[name])), path,
                       filesystem=filesystem)
        written.append(path)
    for name, data in ((CHART, render_chart(result)), (REPORT, render_report(result).encode())):
        path = f"{base.rstrip('/')}/{name}"
        with filesystem.open_output_stream(path) as stream:
            stream.write(data)
        written.append(path)
    return written


def _schema(row_type: type) -> pa.Schema:
    """Arrow types from the dataclass's annotations, so that an empty table still has columns."""
    def arrow(annotation: str) -> pa.DataType:
        if annotation.startswith("str"):
            return pa.string()
        if annotation.startswith("bool"):
            return pa.bool_()
        return pa.int64()

    return pa.schema([(f.name, arrow(str(f.type))) for f in dataclasses.fields(row_type)])


def _time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _table(header: list[str], rows: list[list[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join("-" if v is None else str(v) for v in row) + " |"
              for row in rows[:MAX_LISTED]]
    if len(rows) > MAX_LISTED:
        lines.append(f"\n({len(rows) - MAX_LISTED} more rows in the Parquet table)")
    return [*lines, ""]


def render_report(result: AuditResult) -> str:
    errors = [f for f in result.findings if f.severity == "error"]
    verdict = "PASSED" if result.passed else f"FAILED ({len(errors)} errors)"
    lines = [
        "# Quorum audit", "",
        f"**{verdict}**: {result.rows_read:,} rows read from {len(result.replicas)} replicas; "
        f"{result.records_compared:,} record copies compared below the high watermark.", "",
        "## Replicas", "",
        *_table(["cluster", "node", "directory id", "path", "log", "last epoch", "snapshot",
                 "quorum-state epoch / leader"],
                [[r.cluster_id, r.node_id, r.directory_id, r.root,
                  f"{r.log_start_offset}-{r.log_end_offset}", r.last_epoch, r.latest_snapshot,
                  f"{r.state_epoch} / {r.state_leader_id}"] for r in result.replicas]),
        "High watermark checked up to (exclusive): " + ", ".join(
            f"{cluster} {hw}" for cluster, hw in sorted(result.high_watermarks.items())), "",
        "## Findings", "",
    ]
    if result.findings:
        lines += _table(["severity", "kind", "cluster", "replica", "offsets", "detail"],
                        [[f.severity, f.kind, f.cluster_id,
                          (None if f.node_id is None else f"{f.node_id}:{f.directory_id}")
                          if f.root is None else f"{f.node_id}:{f.directory_id} {f.root}"
                          if f.node_id is not None else f.root,
                          None if f.first_offset is None else f"{f.first_offset}-{f.last_offset}",
                          f.detail] for f in result.findings])
    else:
        lines += ["None: every replica holds the same epoch and checksum at every offset it "
                  "shares with the others, one leader per epoch, snapshots agree.", ""]
    lines += ["## Leadership", "", *_table(
        ["cluster", "epoch", "leader", "start", "duration (s)", "start offset", "granting voters",
         "voters"],
        [[e.cluster_id, e.epoch, e.leader_id, _time(e.start_ms),
          None if e.end_ms is None else f"{(e.end_ms - e.start_ms) / 1000:.3f}",
          e.start_offset, e.granting_voters, e.voters] for e in result.history.leadership])]
    lines += ["## Membership", "", *_table(
        ["cluster", "offset", "time", "change", "voter", "voters after"],
        [[m.cluster_id, m.offset, _time(m.timestamp_ms), m.change,
          f"{m.node_id}:{m.directory_id}", m.voters_after] for m in result.history.membership])]
    total = sum(r.records for r in result.rates)
    busiest = max(result.rates, key=lambda r: r.records, default=None)
    lines += ["## Writes", "", f"{total:,} data records in {len(result.rates)} seconds with "
              "writes" + (f"; busiest second {_time(busiest.second_ms)} with "
                          f"{busiest.records:,} records" if busiest else "") + ".", "",
              f"![timeline]({CHART})", ""]
    return "\n".join(lines)


def render_chart(result: AuditResult) -> bytes:
    """Per cluster: who led when (bars per leader, labelled with the epoch), membership changes
    (vertical lines, labelled in lanes that never overlap), and the write rate below."""
    figure = chart_figure(result)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=CHART_DPI)
    plt.close(figure)
    return buffer.getvalue()


CHART_DPI = 100


def chart_figure(result: AuditResult) -> Figure:
    """The timeline as a matplotlib figure, laid out as ``render_chart`` saves it."""
    clusters = sorted({r.cluster_id for r in result.replicas})[:MAX_CHARTED_CLUSTERS]
    figure, axes = plt.subplots(2 * len(clusters), 1, figsize=(11, 4.5 * len(clusters)),
                                squeeze=False, dpi=CHART_DPI,
                                gridspec_kw={"height_ratios": [2, 1] * len(clusters)})
    epochs: dict[str, list[LeaderEpoch]] = defaultdict(list)
    for epoch in result.history.leadership:
        epochs[epoch.cluster_id].append(epoch)
    charted: list[tuple[Axes, list[MembershipChange], int]] = []
    for index, cluster in enumerate(clusters):
        leaders, rates = axes[2 * index][0], axes[2 * index + 1][0]
        cluster_rates = [r for r in result.rates if r.cluster_id == cluster]
        changes = [m for m in result.history.membership
                   if m.cluster_id == cluster and m.change != "initial"]
        # Seconds from the cluster's first record: unix seconds are unreadable on an axis.
        origin = min([e.start_ms for e in epochs[cluster]]
                     + [r.second_ms for r in cluster_rates], default=0)
        _leadership_chart(leaders, cluster, epochs[cluster], changes, origin)
        _rate_chart(rates, cluster_rates, origin)
        rates.sharex(leaders)
        charted.append((leaders, changes, origin))
    figure.tight_layout()
    # Labelled once the axes have their final size: the lanes depend on where the labels land.
    for axis, changes, origin in charted:
        _label_membership_changes(axis, changes, origin)
    return figure


# A membership label's lanes run down from the top of the leadership chart, a line apart.
_LANE_POINTS = 10
_LABEL_FONT_SIZE = 7


def _label_membership_changes(axis: Axes, changes: list[MembershipChange],
                              origin: int) -> None:
    """One label a change ("+3:AbCdEf" added, "-3:AbCdEf" removed) beside its line, in the
    first lane (from the top) where it overlaps no label placed before it: a disk replacement's
    add and remove, a second apart, would otherwise print one over the other."""
    renderer = axis.figure.canvas.get_renderer()  # type: ignore[attr-defined]
    placed: list[Bbox] = []
    for change in sorted(changes, key=lambda m: (m.timestamp_ms, m.offset)):
        at = (change.timestamp_ms - origin) / 1000
        sign, colour = ("+", "green") if change.change == "add" else ("-", "red")
        for lane in itertools.count():
            label = axis.annotate(
                f"{sign}{change.node_id}:{change.directory_id[:6]}", (at, 1.0),
                xycoords=("data", "axes fraction"), xytext=(2, -2 - lane * _LANE_POINTS),
                textcoords="offset points", va="top", fontsize=_LABEL_FONT_SIZE, color=colour,
                bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none",
                      "alpha": 0.8})
            box = label.get_window_extent(renderer)
            if not any(box.overlaps(other) for other in placed):
                placed.append(box)
                break
            label.remove()


def _leadership_chart(axis: Axes, cluster: str, epochs: list[LeaderEpoch],
                      changes: list[MembershipChange], origin: int) -> None:
    colours = plt.get_cmap("tab10")
    for epoch in epochs:
        start = (epoch.start_ms - origin) / 1000
        width = max(((epoch.end_ms or epoch.start_ms) - epoch.start_ms) / 1000, 0.001)
        # An epoch whose LeaderChange was compacted away: its leader is unknown (row 0).
        row = epoch.leader_id if epoch.leader_id is not None else 0
        axis.barh(row, width, left=start, height=0.6, edgecolor="black", linewidth=0.5,
                  color=colours(row % 10) if epoch.leader_id is not None else "lightgrey")
        axis.annotate(f"e{epoch.epoch}", (start, row + 0.35), fontsize=7)
    for change in changes:
        colour = "green" if change.change == "add" else "red"
        axis.axvline((change.timestamp_ms - origin) / 1000, color=colour, linestyle="--",
                     linewidth=1)
    axis.set_ylabel("leader (node id)")
    axis.set_title(f"cluster {cluster}: leadership by epoch; voters added (+, green) and "
                   "removed (-, red)")
    rows = sorted({e.leader_id or 0 for e in epochs})
    axis.set_yticks(rows, [str(row) if row else "unknown" for row in rows])
    # Headroom above the top leader for the lanes of membership labels.
    if changes and rows:
        bottom, top = axis.get_ylim()
        axis.set_ylim(bottom, top + 0.25 * (top - bottom) + 0.5)


def _rate_chart(axis: Axes, rates: list[WriteRate], origin: int) -> None:
    axis.bar([(r.second_ms - origin) / 1000 for r in rates], [r.records for r in rates],
             width=1.0, align="edge")
    axis.set_ylabel("records / s")
    axis.set_xlabel(f"seconds since {_time(origin)} UTC")
