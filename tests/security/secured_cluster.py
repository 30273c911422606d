"""A quorum of in-process nodes with TLS, mutual TLS between them and authorization, on an event
loop of its own in a background thread (so tests can use blocking clients and the CLIs), and the
certificates and tokens of its callers."""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from certs import CertificateAuthority
from proc_cluster import free_port

from quorum_node.node.app import build_app
from quorum_node.node.config import Listener, NodeConfig
from quorum_node.node.runtime import QuorumNode
from quorum_node.node.wiring import build_node
from quorum_node.raft.config import QuorumConfig, VoterEndpoint
from quorum_node.security.client_credentials import ClientCredentials
from quorum_node.storage.meta_properties import format_log_dir, random_cluster_id

_T = TypeVar("_T")

FAST = QuorumConfig(election_timeout_ms=300, fetch_timeout_ms=600, request_timeout_ms=500,
                    fetch_max_wait_ms=100, append_linger_ms=2)
ROLES = "quorum-operator:admin;app-writer:write;app-reader:read"
# Client certificate common names; "stranger" has a certificate of the CA but no role.
CLIENT_NAMES = ("quorum-operator", "app-writer", "app-reader", "stranger")
TOKEN_ROLES = {"admin": "admin", "writer": "write", "reader": "read"}


@dataclass
class Pki:
    """The CA, the nodes' and clients' certificates, the tokens, and a foreign CA's certificate."""

    directory: Path
    ca: CertificateAuthority
    ca_path: Path
    certificates: dict[str, tuple[Path, Path]] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)
    token_file: Path | None = None

    @classmethod
    def create(cls, directory: Path, node_ids: range) -> Pki:
        ca = CertificateAuthority.create()
        pki = cls(directory, ca, ca.write_ca(directory / "ca.crt"))
        for name in [f"quorum-node-{i}" for i in node_ids] + list(CLIENT_NAMES):
            pki.certificates[name] = ca.issue(directory, name)
        foreign = CertificateAuthority.create("another-ca")
        pki.certificates["foreign"] = foreign.issue(directory / "foreign", "quorum-node-9")
        pki.tokens = {name: secrets.token_urlsafe(24) for name in TOKEN_ROLES}
        pki.token_file = directory / "tokens"
        pki.token_file.write_text("".join(f"{token} {name} {TOKEN_ROLES[name]}\n"
                                          for name, token in pki.tokens.items()))
        for name, token in pki.tokens.items():
            (directory / f"{name}.token").write_text(token + "\n")
        return pki

    def token_path(self, name: str) -> Path:
        return self.directory / f"{name}.token"

    def credentials(self, *, token: str | None = None, certificate: str | None = None
                    ) -> ClientCredentials:
        cert, key = self.certificates[certificate] if certificate else (None, None)
        return ClientCredentials(self.tokens[token] if token else None, self.ca_path, cert, key)

    def node_settings(self, node_id: int, *, clients: bool = True) -> dict[str, object]:
        """A node process's keys: its certificate and the CA, and with ``clients`` the token
        file and the client certificates' roles."""
        cert, key = self.certificates[f"quorum-node-{node_id}"]
        settings: dict[str, object] = {"ssl.certificate.location": cert, "ssl.key.location": key,
                                       "ssl.ca.location": self.ca_path}
        if clients:
            settings.update({"auth.token.file": self.token_file, "auth.certificate.roles": ROLES})
        return settings


def split_listeners(client_port: int, peer_port: int, *, tls: bool) -> dict[str, Any]:
    """NodeConfig fields for a client listener and a controller listener of its own."""
    return {"listeners": (Listener(name="CLIENT", host="127.0.0.1", port=client_port, tls=tls),
                          Listener(name="CONTROLLER", host="127.0.0.1", port=peer_port, tls=tls)),
            "controller_listener_names": "CONTROLLER"}


def secured_configs(directory: Path, pki: Pki, size: int, **overrides: Any) -> list[NodeConfig]:
    """SSL on a client listener and a controller listener of its own on every node."""
    cluster_id = random_cluster_id()
    ports = {i: free_port() for i in range(1, size + 1)}
    peer_ports = {i: free_port() for i in range(1, size + 1)}
    voters = tuple(VoterEndpoint(id=i, host="127.0.0.1", port=port)
                   for i, port in peer_ports.items())
    clients = tuple(VoterEndpoint(id=i, host="127.0.0.1", port=port)
                    for i, port in ports.items())
    configs = []
    for i, port in ports.items():
        cert, key = pki.certificates[f"quorum-node-{i}"]
        settings: dict[str, Any] = {
            "ssl_certificate_location": cert, "ssl_key_location": key,
            "ssl_ca_location": pki.ca_path, "auth_token_file": pki.token_file,
            "auth_certificate_roles": ROLES, "security_reload_interval_ms": 200, **overrides}
        config = NodeConfig(node_id=i, cluster_id=cluster_id, log_dir=directory / f"node-{i}",
                            **split_listeners(port, peer_ports[i], tls=True),
                            voters=voters, client_endpoints=clients, quorum=FAST, **settings)
        format_log_dir(config.log_dir, cluster_id, i)
        configs.append(config)
    return configs


def secret_configs(directory: Path, secret: Path, voters: int, running: int,
                   **overrides: Any) -> list[NodeConfig]:
    """PLAINTEXT on a client listener and a controller listener of its own, the peers sharing the
    secret in ``secret``: the configurations of voters 1 to ``running`` of 1 to ``voters``."""
    cluster_id = random_cluster_id()
    ports = {i: (free_port(), free_port()) for i in range(1, voters + 1)}
    peers = tuple(VoterEndpoint(id=i, host="127.0.0.1", port=peer_port)
                  for i, (_, peer_port) in ports.items())
    clients = tuple(VoterEndpoint(id=i, host="127.0.0.1", port=port)
                    for i, (port, _) in ports.items())
    configs = []
    for i in range(1, running + 1):
        config = NodeConfig(node_id=i, cluster_id=cluster_id, log_dir=directory / f"node-{i}",
                            **split_listeners(*ports[i], tls=False), voters=peers,
                            client_endpoints=clients, controller_listener_secret_file=secret,
                            **{"quorum": FAST, **overrides})
        format_log_dir(config.log_dir, cluster_id, i)
        configs.append(config)
    return configs


def plain_configs(directory: Path, size: int, **overrides: Any) -> list[NodeConfig]:
    """A quorum without security, one PLAINTEXT listener serving everything on each node (the
    combined listener), with slower timers: fuzzing loads the CPUs."""
    cluster_id = random_cluster_id()
    ports = {i: free_port() for i in range(1, size + 1)}
    voters = tuple(VoterEndpoint(id=i, host="127.0.0.1", port=port) for i, port in ports.items())
    timing = FAST.model_copy(update={"election_timeout_ms": 1000, "fetch_timeout_ms": 2000,
                                     "request_timeout_ms": 1000})
    configs = [NodeConfig(node_id=i, cluster_id=cluster_id, log_dir=directory / f"node-{i}",
                          listeners=f"127.0.0.1:{port}", voters=voters,
                          quorum=timing, **overrides)
               for i, port in ports.items()]
    for config in configs:
        format_log_dir(config.log_dir, cluster_id, config.node_id)
    return configs


class InProcessCluster:
    """Nodes with every API, on an event loop in a background thread."""

    def __init__(self, configs: list[NodeConfig]) -> None:
        self.configs = configs
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.nodes: dict[int, QuorumNode] = {}
        self.run(self._start())

    async def _start(self) -> None:
        for config in self.configs:
            node = build_node(config)
            await node.start(build_app(node))
            self.nodes[config.node_id] = node

    def run(self, coroutine: Coroutine[Any, Any, _T], timeout_s: float = 20) -> _T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def address(self, node_id: int) -> str:
        """The node's client listener."""
        return self.nodes[node_id].config.client_listeners[0].address

    def peer_address(self, node_id: int) -> str:
        """The node's controller listener."""
        return self.nodes[node_id].config.controller_listener.address

    @property
    def bootstrap(self) -> str:
        return ",".join(self.address(i) for i in self.nodes)

    def leader(self) -> QuorumNode | None:
        return next((n for n in self.nodes.values() if n.core.leader_has_committed), None)

    def stop(self) -> None:
        async def shutdown() -> None:
            await asyncio.gather(*(node.shutdown(0.5) for node in self.nodes.values()),
                                 return_exceptions=True)

        try:
            self.run(shutdown())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
