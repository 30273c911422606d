"""The simulator drives its cores with the driver the node runs, so that its fault schedules test
the driving that production does (when state is persisted, messages leave, flushes and polls
happen, a failing core stops its node), and applies the committed log through the node's state
machine (applying, snapshotting, loading and compacting as the node does)."""

from __future__ import annotations

import random
from pathlib import Path

from quorum_node.kv.machine import KvMachine
from quorum_node.kv.store import KvStore
from quorum_node.node.config import load_config
from quorum_node.node.wiring import build_node
from quorum_node.raft.core import RaftCore
from quorum_node.raft.driver import CoreDriver
from quorum_node.sim.simulation import Simulation
from quorum_node.storage.meta_properties import format_log_dir

CLUSTER_ID = "MkU3OEVBNTcwNTJENDM2Qg"


def test_the_simulator_and_the_node_run_the_same_driver(tmp_path: Path) -> None:
    sim = Simulation(seed=3, scenario="test", rng=random.Random(3), voters=3, observers=0,
                     core_factory=RaftCore)
    sim.cluster.start_all()
    sim.workload.start()
    sim.end_ms = 2000
    sim.run()
    drivers = [node.driver for node in sim.cluster.nodes.values()]
    assert all(type(driver) is CoreDriver for driver in drivers)
    assert any(node.core is not None and node.core.high_watermark for node in
               sim.cluster.nodes.values())  # it drove them somewhere
    machines = [node.state_machine for node in sim.cluster.nodes.values()]
    assert all(type(machine) is KvMachine and type(machine.store) is KvStore
               for machine in machines)
    assert any(len(machine.store) for machine in machines)  # it applied the workload's writes

    log_dir = tmp_path / "node-1"
    format_log_dir(log_dir, CLUSTER_ID, 1)
    config = load_config(None, {"node.id": "1", "cluster.id": CLUSTER_ID,
                                "log.dir": str(log_dir),
                                "controller.quorum.voters": "1@127.0.0.1:1",
                                "listeners": "PLAINTEXT://127.0.0.1:1"}, {})
    node = build_node(config)
    try:
        assert type(node.driver) is CoreDriver and node.driver.core is node.core
        machine = node.state_machine.machine
        assert type(machine) is KvMachine and machine.store is node.state_machine.store
    finally:
        node.log_dir.close()
