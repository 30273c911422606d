"""Session fixtures for the audit tests: one SparkSession for all of them (its JVM takes ~10 s to
start), and one real quorum's data, written once by node processes and then stopped."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from audit_quorum import RealQuorum, make_real_quorum

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession  # noqa: PLC0415 (the extra may be missing)

    session = (SparkSession.builder.master("local[2]").appName("quorum-audit-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def real_quorum(tmp_path_factory: pytest.TempPathFactory) -> RealQuorum:
    return make_real_quorum(tmp_path_factory.mktemp("real-quorum"))
