"""What the monitoring tests share: the chart rendered with its monitoring objects, the metric
names a PromQL expression reads, and the names a node and the operator export."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

# Registers the operator's metrics in the registry its metrics server serves.
from kafka_quorum_operator import opmetrics  # noqa: F401
from prometheus_client import REGISTRY
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

# The chart's renderer and helm, as the chart's own tests load them (tests/operator).
from test_kq_helm import HELM, render_install

ROOT = Path(__file__).resolve().parents[2]
# What Prometheus itself adds to every target (the alerts use it: a node that does not answer).
PROMETHEUS_SERIES = frozenset({"up"})


def chart_objects(*values: str) -> list[dict[str, Any]]:
    """The chart rendered with ``--set`` ``values``."""
    assert HELM is not None
    args = [a for value in values for a in ("--set", value)]
    return [d for d in yaml.safe_load_all(render_install.render(HELM, *args)) if d]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, [o["kind"] for o in objects]
    return found[0]


# PromQL words that are not metric names: keywords and operators (functions are followed by a
# parenthesis and dropped before this list is consulted).
_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                       "and", "or", "unless", "offset", "inf", "nan"})
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def metric_names(expression: str) -> set[str]:
    """The metric names an expression (PromQL, or a Grafana variable's ``label_values``) reads:
    every identifier outside label matchers, strings, ranges, grouping clauses and Grafana
    variables that is not a function or a keyword."""
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', expression)  # strings
    text = re.sub(r"label_values\((.*),\s*\w+\s*\)", r"(\1)", text)  # Grafana's: (series, label)
    text = re.sub(r"\$\{?\w+\}?", "", text)  # Grafana variables ($namespace, $__rate_interval)
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in _NAME.finditer(text):
        rest = text[match.end():].lstrip()
        if rest.startswith("(") or match.group() in _KEYWORDS:
            continue
        if match.start() > 0 and (text[match.start() - 1].isdigit()
                                  or text[match.start() - 1] == "."):
            continue  # 1e3, 0.99
        names.add(match.group())
    return names


def exposed_names(families: Iterable[Metric]) -> set[str]:
    """The series names a family is exposed as (also when it has no sample yet: a labelled
    metric nothing has set, a leader-only gauge on a follower)."""
    names: set[str] = set()
    for family in families:
        suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count",
                                                                     "_created"),
                    "summary": ("", "_sum", "_count", "_created"), "info": ("_info",),
                    "gaugehistogram": ("_bucket", "_gsum", "_gcount")}.get(family.type, ("",))
        names.update(family.name + suffix for suffix in suffixes)
        names.update(sample.name for sample in family.samples)
    return names


def scrape(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        return str(response.read().decode())


def node_names(url: str) -> set[str]:
    """The names a running node exports."""
    return exposed_names(text_string_to_metric_families(scrape(url)))


def operator_names() -> set[str]:
    """The names the operator's code exports (kafka_quorum_operator.opmetrics, in the registry
    its metrics server serves)."""
    return {name for name in exposed_names(REGISTRY.collect())
            if name.startswith("kafka_quorum_operator_")}
