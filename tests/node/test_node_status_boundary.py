"""Only the runtime reaches the Raft core (with the driver's host, and the composition root that
makes the core): every other module of the node (its APIs, metrics, story, state machine,
backups, Kafka listener) reads the node's status (``QuorumNode.status``,
``quorum_node.raft.status``) or its few narrow accessors. The core's own package (with the driver)
and the simulator, the core's test bed, hold cores of their own."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "quorum_node"
# Where a ``.core`` attribute may be read: the runtime, the driver's host and the composition root
# that makes the core, the core's package (the driver) and the simulator.
ALLOWED = ("node/runtime.py", "node/driver_host.py", "node/wiring.py", "raft/", "sim/")


def core_reads(package: Path) -> list[str]:
    """Every ``<something>.core`` attribute read, and every import of ``RaftCore`` (to hold a
    core handed over), outside ``ALLOWED``, as ``path:line``."""
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative.startswith(ALLOWED):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            reads_core = isinstance(node, ast.Attribute) and node.attr == "core"
            imports_core = isinstance(node, ast.ImportFrom) and any(
                alias.name == "RaftCore" for alias in node.names)
            if reads_core or imports_core:
                assert isinstance(node, ast.expr | ast.stmt)  # an Attribute or an ImportFrom
                found.append(f"{relative}:{node.lineno}")
    return found


def test_nothing_outside_the_runtime_reaches_into_the_core() -> None:
    assert core_reads(PACKAGE) == []


def test_the_scan_sees_a_read_of_the_core(tmp_path: Path) -> None:
    (tmp_path / "node").mkdir()
    (tmp_path / "node" / "runtime.py").write_text("high = node.core.high_watermark\n")
    (tmp_path / "node" / "probe.py").write_text("core = node.core\nepoch = core.epoch\n")
    (tmp_path / "node" / "story.py").write_text(
        "from quorum_node.raft.core import QuorumDescription\n"
        "from quorum_node.raft.core import RaftCore\n")
    assert core_reads(tmp_path) == ["node/probe.py:1", "node/story.py:2"]
