"""The timeline chart's membership labels: each add and remove of a voter is labelled where it
can be read, never over another label, however close the changes (a disk replacement's add and
remove come a second apart). Checked in the layout the chart computes (no Spark needed)."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("matplotlib")

import matplotlib.pyplot as plt
from matplotlib.text import Annotation

from quorum_audit.audit import AuditResult, ReplicaSummary, WriteRate
from quorum_audit.history import History, LeaderEpoch, MembershipChange
from quorum_audit.report import chart_figure, render_chart

CLUSTER = "MkU3OEVBNTcwNTJENDM2Qg"
START_MS = 1_790_000_000_000


def a_fleet_with_replacements() -> AuditResult:
    """60 s of a quorum with three epochs and three disk replacements (add the new directory,
    remove the old, 0.4-1 s apart), the last two within three seconds of each other."""
    epochs = [LeaderEpoch(CLUSTER, epoch, leader, "1,2,3", "1,2", offset, START_MS + start_s * 1000,
                          None if end_s is None else START_MS + end_s * 1000, 3)
              for epoch, leader, offset, start_s, end_s in ((1, 1, 0, 0, 20), (2, 2, 40, 20, 41),
                                                            (3, 3, 90, 41, None))]
    changes = [MembershipChange(CLUSTER, 0, START_MS, "initial", node, f"dir{node}-old-xxxxxxxxx",
                                "1,2,3") for node in (1, 2, 3)]
    offset = itertools.count(100)
    for node, at_s, gap_s in ((3, 10.0, 0.4), (2, 30.0, 1.0), (1, 32.0, 0.5)):
        changes.append(MembershipChange(CLUSTER, next(offset), START_MS + int(at_s * 1000), "add",
                                        node, f"dir{node}-new-xxxxxxxxx", "1,2,3,+"))
        changes.append(MembershipChange(CLUSTER, next(offset),
                                        START_MS + int((at_s + gap_s) * 1000), "remove", node,
                                        f"dir{node}-old-xxxxxxxxx", "1,2,3"))
    replicas = [ReplicaSummary(CLUSTER, node, f"dir{node}", f"/data/node-{node}", 1, 0, 1000, 0,
                               200, 3, 200, START_MS + 60_000, None, 3, 3, None)
                for node in (1, 2, 3)]
    rates = [WriteRate(CLUSTER, START_MS + second * 1000, 3, 300) for second in range(60)]
    return AuditResult(replicas, {CLUSTER: 200}, [], [],
                       History(epochs, changes, [], [], {}), rates, 600, 600)


def test_membership_labels_do_not_overlap() -> None:
    figure = chart_figure(a_fleet_with_replacements())
    try:
        renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
        labels = [text for axis in figure.axes for text in axis.texts
                  if isinstance(text, Annotation) and text.get_text()[:1] in "+-"]
        assert sorted(label.get_text() for label in labels) == sorted(
            f"{sign}{node}:dir{node}-{'n' if sign == '+' else 'o'}" for node in (1, 2, 3)
            for sign in "+-")
        boxes = [label.get_window_extent(renderer) for label in labels]
        overlapping = [(labels[i].get_text(), labels[j].get_text())
                       for i, j in itertools.combinations(range(len(boxes)), 2)
                       if boxes[i].overlaps(boxes[j])]
        assert overlapping == []
        # Each label stays inside its chart, beside its change's line.
        for label, box in zip(labels, boxes, strict=True):
            assert label.axes is not None
            assert label.axes.get_window_extent(renderer).contains(box.x0, box.y0)
    finally:
        plt.close(figure)


def test_the_chart_renders_as_png() -> None:
    assert render_chart(a_fleet_with_replacements())[:8] == b"\x89PNG\r\n\x1a\n"
