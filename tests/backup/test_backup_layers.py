"""Backups are a layer below the node's HTTP API: ``GET /v1/backup`` lives on the API's floor
(``quorum_node.node.api.backup``) and calls into ``quorum_node.backup``, which reads the node's
status, log directory and voter sets it is handed, never the API or the runtime itself."""

from __future__ import annotations

import ast
from pathlib import Path

BACKUP = Path(__file__).resolve().parents[2] / "quorum_node" / "backup"
ABOVE = ("quorum_node.node.api", "quorum_node.node.runtime", "quorum_node.node.app",
         "quorum_node.node.wiring", "quorum_node.node.driver_host")


def imports_from_above(package: Path) -> list[str]:
    """``path:line module`` of every import (anywhere, TYPE_CHECKING too) of ``ABOVE``."""
    found: list[str] = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            found.extend(f"{path.name}:{node.lineno} {name}" for name in names
                         if name.startswith(ABOVE))
    return found


def test_backups_do_not_reach_up_into_the_node_s_api_or_runtime() -> None:
    assert imports_from_above(BACKUP) == []


def test_the_scan_sees_an_import_from_above(tmp_path: Path) -> None:
    (tmp_path / "endpoint.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from quorum_node.node.api.http import ApiError\n"
        "if TYPE_CHECKING:\n"
        "    import quorum_node.node.runtime\n")
    assert imports_from_above(tmp_path) == ["endpoint.py:2 quorum_node.node.api.http",
                                            "endpoint.py:4 quorum_node.node.runtime"]
