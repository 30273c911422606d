"""Fixtures of the Raft core tests.

``context.py`` and ``rooms.py`` are loaded by path under private module names, so that they cannot
clash with a module of the same name in another test directory (the test directories are not
packages).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


def _load(file_name: str) -> ModuleType:
    name = f"_quorum_node_raft_test_{file_name.removesuffix('.py')}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(file_name))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_context = _load("context.py")
_rooms = _load("rooms.py")


@pytest.fixture
def make_ctx() -> Callable[..., Any]:
    """``make_ctx(local_id, voters, log_epochs=..., election_state=..., **config)`` builds a
    ``RaftTestContext`` around a fresh ``RaftCore`` (see ``context.py``)."""
    build: Callable[..., Any] = _context.RaftTestContext.build
    return build


@pytest.fixture
def make_rooms() -> Callable[..., Any]:
    """``make_rooms(log_epochs=..., static_voters=...)`` builds the core's rooms on their own,
    wired as ``RaftCore`` wires them (see ``rooms.py``)."""
    build: Callable[..., Any] = _rooms.build
    return build
