"""``quorum-audit`` as a user runs it, a process of its own that starts its own Spark: its stderr
holds the audit's own lines only (no Spark start-up chatter, log lines or progress bars), and
``-v`` shows Spark's. Minutes on a busy machine (two JVM starts): CI's slow audit step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed")

from quorum_audit.synthetic import write_quorum

pytestmark = pytest.mark.slow


def audit(*argv: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    return subprocess.run([sys.executable, "-m", "quorum_audit.cli", *argv], capture_output=True,
                          text=True, timeout=600, check=False, env=environ)


def test_quiet_by_default_and_spark_said_with_v(tmp_path: Path) -> None:
    write_quorum(tmp_path / "data", 500)
    quiet = audit("run", str(tmp_path / "data"), "--out", str(tmp_path / "out"))
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.startswith("PASSED: ")
    assert [line for line in quiet.stderr.splitlines() if not line.startswith("wrote ")] == []
    assert (tmp_path / "out" / "timeline.png").exists()
    verbose = audit("consistency", str(tmp_path / "data"), "-v")
    assert verbose.returncode == 0, verbose.stderr
    assert "Spark" in verbose.stderr or "WARN" in verbose.stderr, verbose.stderr
