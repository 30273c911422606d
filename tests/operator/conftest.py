"""The ``cluster`` fixture of the operator's integration tests (kq_cluster.py)."""

from kq_cluster import cluster

__all__ = ["cluster"]
