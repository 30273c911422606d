"""A node is made of parts, each with one concern: ``build_node`` (the composition root) wires
them; ``NodeDriverHost`` alone carries out the driver's effects; ``NodeListeners`` own the
listeners; ``QuorumNode`` is the client-facing Raft API over them."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from quorum_node.node.config import load_config
from quorum_node.node.driver_host import NodeDriverHost
from quorum_node.node.listener import NodeListeners
from quorum_node.node.runtime import QuorumNode
from quorum_node.node.wiring import build_node
from quorum_node.raft.driver import DriverHost
from quorum_node.storage.errors import StorageError
from quorum_node.storage.meta_properties import format_log_dir

CLUSTER_ID = "MkU3OEVBNTcwNTJENDM2Qg"


def _callbacks(protocol: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(protocol, inspect.isfunction)
            if not name.startswith("_")}


def test_the_driver_s_host_is_one_class_and_not_the_node() -> None:
    callbacks = _callbacks(DriverHost)
    assert callbacks >= {"persist", "send", "answer", "flush", "set_timer", "stepped"}
    assert callbacks <= set(dir(NodeDriverHost))
    assert not callbacks & set(dir(QuorumNode)), "QuorumNode hosts the driver again"


def test_the_node_neither_builds_its_parts_nor_serves_its_listeners() -> None:
    assert list(inspect.signature(QuorumNode).parameters) == ["parts"]
    for listening in ("_serve", "_close_connections", "_close_secret_connections",
                      "_where_clients_go"):
        assert hasattr(NodeListeners, listening)
        assert not hasattr(QuorumNode, listening)


def test_build_node_wires_one_driver_host_and_listeners_around_the_core(tmp_path: Path) -> None:
    log_dir = tmp_path / "node-1"
    format_log_dir(log_dir, CLUSTER_ID, 1)
    config = load_config(None, {"node.id": "1", "cluster.id": CLUSTER_ID,
                                "log.dir": str(log_dir),
                                "controller.quorum.voters": "1@127.0.0.1:1",
                                "listeners": "PLAINTEXT://127.0.0.1:1"}, {})
    node = build_node(config)
    try:
        assert node.host.driver is node.driver and node.driver.core is node.core
        assert node.host.peers is node.peers is node.listeners.peers
        assert node.waits is node.host.waits
        assert node.state_machine.node.state is node.state  # its host is the node, made
        # One node at a time holds the directory.
        with pytest.raises(StorageError):
            build_node(config)
    finally:
        node.log_dir.close()
