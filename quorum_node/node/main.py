"""The node's process: ``quorum-node run``'s entry point (``run_node``), serving a node with
its HTTP application until a signal or a failure (``serve``), and the process tuning that goes
with it (uvloop, the garbage collector). The outermost layer: it imports the composition root
(``wiring``, which makes the node), the application, which imports the APIs, and the Kafka
protocol, which import the runtime; nothing imports this module but the CLI."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal

import uvloop

from quorum_node.node.app import build_app
from quorum_node.node.config import NodeConfig
from quorum_node.node.kafka.server import kafka_protocol_of
from quorum_node.node.kv_service import KvService
from quorum_node.node.runtime import QuorumNode
from quorum_node.node.wiring import build_node

# Allocations between two collections of the youngest generation (Python's default: 700).
GC_YOUNG_THRESHOLD = 20_000


async def serve(config: NodeConfig) -> int:
    """Run a node until SIGTERM/SIGINT (graceful) or a fatal failure; return the exit code."""
    node = _build_frozen(config)
    # One service for every client transport: they share its bound on waiting calls.
    service = KvService(node)
    # The controller listener also speaks Kafka's protocol to Kafka's admin tools (KIP-919).
    await node.start(build_app(node, service), kafka_protocol_of(node))
    tune_garbage_collector()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    received: list[signal.Signals] = []

    def on_signal(signum: signal.Signals) -> None:
        received.append(signum)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    stopping = asyncio.ensure_future(stop.wait())
    failed = asyncio.ensure_future(node.wait_stopped())
    await asyncio.wait({stopping, failed}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    failed.cancel()
    if node.failure is None:
        node.story.stopping(f"{received[0].name} received" if received else "stopped")
    await node.shutdown()
    node.story.stopped(node.failure)
    return 1 if node.failure is not None else 0


def _build_frozen(config: NodeConfig) -> QuorumNode:
    """Build the node with the cyclic collector off, then freeze what it built. Loading a
    snapshot makes a tuple a key, none of them garbage and none in a cycle: the collector would
    walk them again and again as they pile up, and once more in each older generation, to free
    nothing."""
    gc.disable()
    try:
        return build_node(config)
    finally:
        gc.freeze()
        gc.enable()


def tune_garbage_collector() -> None:
    """Every request allocates a few hundred objects, nearly all freed by reference counting;
    at the default threshold (700) the cyclic collector runs every few requests and walks every
    young survivor, a noticeable share of a busy leader's CPU. What start-up built lives for
    good: frozen, the collector never walks it again."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def run_node(config: NodeConfig) -> int:
    """Blocking entry point of ``quorum-node run``."""
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # uvloop (libuv) runs the same asyncio code with a fraction of the event loop's overhead,
    # which is most of the time a commit takes on a fast disk.
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(serve(config))
