"""The node's composition root: ``build_node`` makes every part of a replica from its
``NodeConfig`` (security, the log directory, the state machine, the Raft core, the driver's
host, the peers' transport, the listeners) and wires them into a ``QuorumNode``. Nothing else
makes these parts; each takes the others it needs, made here.

The order is the one their contracts need: the security settings first (a bad one is a
ConfigError before anything is opened); the log directory, locked until the node closes it; the
state machine before the core, as it loads the latest snapshot before the core's clock starts,
so that a long load is not a leader's silence; the core on the directory's log, election state
and snapshots; then its driver's host, and what serves and calls the peers.
"""

from __future__ import annotations

import logging
import os
import random

from quorum_node.addresses import host_port
from quorum_node.kv.machine import check_snapshot_records
from quorum_node.node.clock import now_ms
from quorum_node.node.config import ConfigError, NodeConfig
from quorum_node.node.driver_host import NodeDriverHost
from quorum_node.node.listener import NodeListeners
from quorum_node.node.runtime import NodeParts, QuorumNode
from quorum_node.node.state_machine import KvStateMachine
from quorum_node.node.story import NodeStory
from quorum_node.node.transport import PeerClient, PeerServer, max_response_bytes
from quorum_node.raft.core import RaftCore
from quorum_node.raft.state import RaftState
from quorum_node.raft.types import ReplicaKey
from quorum_node.raft.voters import VoterSet
from quorum_node.security.node_security import NodeSecurity, SecuritySetupError
from quorum_node.storage.dir_lock import LOCK_FILE, DirectoryLock, lock_directory
from quorum_node.storage.errors import NotFormattedError
from quorum_node.storage.kafka_uuid import to_kafka_string
from quorum_node.storage.log_dir import LogDirectory
from quorum_node.storage.meta_properties import format_log_dir

logger = logging.getLogger(__name__)


def build_node(config: NodeConfig) -> QuorumNode:
    """A replica made from ``config``, not started yet (``await node.start()``). Raises
    ConfigError on bad security settings, StorageError (NotFormattedError, a held lock) when the
    log directory cannot be opened."""
    try:
        security = NodeSecurity(config)
    except SecuritySetupError as error:
        raise ConfigError(str(error)) from None
    log_dir = open_log_directory(config)
    store_host = _StateMachineHost(config, log_dir)
    try:
        # The key-value store the committed log is applied to, with its snapshots: run with
        # the node, whatever it serves.
        state_machine = KvStateMachine(store_host)
        core = _new_core(config, log_dir)
    except BaseException:
        log_dir.close()  # and its lock, for whoever opens it next
        raise
    # Where each voter serves clients: a non-leader redirects clients to the leader's.
    client_endpoints = {endpoint.id: (endpoint.host, endpoint.port)
                        for endpoint in config.voter_client_endpoints}
    story = NodeStory(lambda: core.status(now_ms()), config.node_id,
                      [voter.id for voter in config.voters],
                      ",".join(host_port(host, port) for host, port in client_endpoints.values()),
                      fetch_timeout_ms=config.quorum.fetch_timeout_ms)
    idle_timeout_s = config.http_read_timeout_ms / 1000
    endpoints = {voter.id: (voter.host, voter.port) for voter in config.voters}
    host: NodeDriverHost

    def peer_lost(node_id: int) -> None:
        host.peer_lost(node_id)  # the host is made next, with the client that calls this

    peers = PeerClient(endpoints, config.quorum.request_timeout_ms,
                       tls=security.peer_tls, peer_secret=security.current_peer_secret,
                       on_peer_lost=peer_lost,
                       max_response_bytes=max_response_bytes(config.quorum),
                       idle_timeout_s=idle_timeout_s)
    host = NodeDriverHost(config, log_dir=log_dir, core=core, story=story,
                          state_machine=state_machine, peers=peers)
    # One per controller listener: each checks peers by its own protocol (certificates on an
    # SSL one, the secret on a PLAINTEXT one).
    peer_servers = [
        PeerServer(host.handle_peer_request, authorizer=security.peer_authorizer(listener),
                   idle_timeout_s=idle_timeout_s,
                   max_unsent_bytes=max_response_bytes(config.quorum))
        for listener in config.controller_listeners]
    listeners = NodeListeners(config, security, peer_servers, peers, client_endpoints)
    node = QuorumNode(NodeParts(
        config=config, security=security, log_dir=log_dir, core=core, host=host,
        state_machine=state_machine, story=story, peers=peers, listeners=listeners,
        endpoints=endpoints, client_endpoints=client_endpoints))
    store_host.node = node
    # The core may have changed state (and asked to persist) at start-up.
    host.driver.after_step()
    return node


def _new_core(config: NodeConfig, log_dir: LogDirectory) -> RaftCore:
    """The Raft core on the directory's log, election state and snapshots; its clock starts."""
    return RaftCore(
        node_id=config.node_id,
        directory_id=log_dir.meta.directory_id,
        cluster_id=config.cluster_id,
        voters=[ReplicaKey(voter.id) for voter in config.voters],
        log=log_dir.log,
        election_state=log_dir.quorum_state.read(),
        config=config.quorum,
        random=random.Random(int.from_bytes(os.urandom(8), "big")),
        now_ms=now_ms(),
        snapshots=log_dir.snapshots,
        check_snapshot_records=check_snapshot_records,
    )


class _StateMachineHost:
    """The state machine's ``StateMachineHost``: the node, once it is made. The state machine
    is made before the core, so before the node; until then (while it loads its snapshot) it
    reads only the settings and the log directory."""

    def __init__(self, config: NodeConfig, log_dir: LogDirectory) -> None:
        self.config = config
        self.log_dir = log_dir
        self.node: QuorumNode | None = None

    def _made(self) -> QuorumNode:
        assert self.node is not None, "the state machine runs only once its node is made"
        return self.node

    @property
    def failure(self) -> BaseException | None:
        return self._made().failure

    @property
    def state(self) -> RaftState:
        return self._made().state

    @property
    def high_watermark(self) -> int | None:
        return self._made().high_watermark

    def voters_at(self, offset: int) -> VoterSet:
        return self._made().voters_at(offset)

    async def wait_for_high_watermark(self, offset: int, timeout_s: float) -> bool:
        return await self._made().wait_for_high_watermark(offset, timeout_s)


def open_log_directory(config: NodeConfig) -> LogDirectory:
    """Open the node's log directory, holding its lock until it is closed; with
    ``format.if.empty``, format an empty one first (a new directory id, so that a replaced disk
    comes back as a new replica, never the old one)."""
    def open_with(lock: DirectoryLock | None) -> LogDirectory:
        return LogDirectory.open(config.log_dir, cluster_id=config.cluster_id,
                                 node_id=config.node_id, segment_bytes=config.segment_bytes,
                                 lock=lock)

    try:
        return open_with(None)
    except NotFormattedError:
        if not config.format_if_empty or _has_entries(config.log_dir):
            raise
    # Locked (created if missing) before it is formatted, and held until it is closed: no other
    # process can format or open the directory in between.
    lock = lock_directory(config.log_dir, create=True)
    try:
        try:
            return open_with(lock)  # formatted by another process since the check above
        except NotFormattedError:
            if _has_entries(config.log_dir):
                raise
        meta = format_log_dir(config.log_dir, config.cluster_id, config.node_id)
        logger.warning("formatted empty log directory %s with new directory id %s",
                       config.log_dir, to_kafka_string(meta.directory_id))
        return open_with(lock)
    except BaseException:
        lock.release()
        raise


def _has_entries(path: os.PathLike[str]) -> bool:
    """Whether the directory holds anything but its lock file."""
    try:
        with os.scandir(path) as entries:
            return any(entry.name != LOCK_FILE for entry in entries)
    except FileNotFoundError:
        return False
