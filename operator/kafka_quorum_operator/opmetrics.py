"""The operator's own Prometheus metrics (served on ``KQ_OPERATOR_METRICS_PORT``, see
``handlers``).

The gauges by quorum (namespace, name) are exported by the Lease's holder only: a replica that
loses the Lease, or stops managing a quorum, drops them (``forget_quorums``, ``forget_quorum``),
so that a scrape of every replica shows each quorum's figures once, and current."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter("kafka_quorum_operator_reconciles",
                     "Reconciliation passes, by result (ok, error).", ["result"])
RECONCILE_SECONDS = Histogram("kafka_quorum_operator_reconcile_duration_seconds",
                              "Duration of one reconciliation pass.")
ACTIONS = Counter("kafka_quorum_operator_actions",
                  "Changes made, by kind (CreatePod, AddVoter, ...) and result.",
                  ["kind", "result"])
REMEDIATIONS = Counter("kafka_quorum_operator_remediations",
                       "Replaced-volume remediations, by result (started, succeeded).",
                       ["result"])
REMEDIATION_SECONDS = Histogram(
    "kafka_quorum_operator_remediation_duration_seconds",
    "From detecting a replaced volume to the old directory's removal.",
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800))
REMEDIATION_IN_PROGRESS = Gauge(
    "kafka_quorum_operator_remediation_in_progress",
    "1 while a KafkaQuorum's status.lastRemediation is InProgress (a replaced volume's voter "
    "not yet replaced), else 0.", ["namespace", "name"])
QUORUM_LOST = Gauge("kafka_quorum_operator_quorum_lost",
                    "1 while a KafkaQuorum has lost a majority of its voters' volumes.",
                    ["namespace", "name"])
BACKUPS = Counter("kafka_quorum_operator_backups",
                  "Scheduled backups, by result (ok, failed).", ["result"])
LAST_BACKUP = Gauge("kafka_quorum_operator_last_backup_timestamp_seconds",
                    "When a KafkaQuorum's last successful backup was taken (Unix time).",
                    ["namespace", "name"])
LAST_BACKUP_END_OFFSET = Gauge("kafka_quorum_operator_last_backup_end_offset",
                               "The end offset of a KafkaQuorum's last successful backup.",
                               ["namespace", "name"])


def export_remediation(namespace: str, name: str, last: Mapping[str, Any] | None) -> None:
    """REMEDIATION_IN_PROGRESS from a KafkaQuorum's status.lastRemediation."""
    in_progress = last is not None and last.get("result") == "InProgress"
    REMEDIATION_IN_PROGRESS.labels(namespace, name).set(1 if in_progress else 0)


QUORUM_GAUGES = (REMEDIATION_IN_PROGRESS, QUORUM_LOST, LAST_BACKUP, LAST_BACKUP_END_OFFSET)


def forget_quorums() -> None:
    """Drop every quorum's gauges (this replica lost the Lease: the holder exports them)."""
    for gauge in QUORUM_GAUGES:
        gauge.clear()


def forget_quorum(namespace: str, name: str) -> None:
    """Drop one quorum's gauges (deleted, or no longer managed here)."""
    for gauge in QUORUM_GAUGES:
        with contextlib.suppress(KeyError):  # never set
            gauge.remove(namespace, name)
