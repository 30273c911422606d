"""Fixtures of the Raft core tests.

``context.py`` is loaded by path under a private module name, so that it cannot clash with a
``context`` module of another test directory (the test directories are not packages).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


def _load_context() -> ModuleType:
    name = "_quorum_node_raft_test_context"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("context.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_context = _load_context()


@pytest.fixture
def make_ctx() -> Callable[..., Any]:
    """``make_ctx(local_id, voters, log_epochs=..., election_state=..., **config)`` builds a
    ``RaftTestContext`` around a fresh ``RaftCore`` (see ``context.py``)."""
    build: Callable[..., Any] = _context.RaftTestContext.build
    return build
