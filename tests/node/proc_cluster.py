"""A quorum of real node processes on loopback, with a fault proxy in front of each node's
controller listener, for the multi-process tests.

Every node has a client listener and a controller listener (peers only) of its own; the other
nodes reach its controller listener through a ``FaultProxy`` (so the voter list names proxy
ports), which can cut the node off (a silent partition: connections are accepted but nothing is
forwarded, like a blackholed route). Clients talk to the nodes' client listeners directly. On
PLAINTEXT the peers share a secret (``PEER_SECRET_FILE`` in the cluster's directory). Only
processes this module started are ever signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from quorum_node.storage.meta_properties import format_log_dir, random_cluster_id

PEER_SECRET_FILE = "peer-secret"
PEER_SECRET_HEADER = "X-Quorum-Peer-Secret"


class FastTimings(TypedDict):
    """``FAST``'s keys, typed: ``**FAST`` can then only fill ``create``'s ``**settings``."""

    controller_quorum_election_timeout_ms: int
    controller_quorum_fetch_timeout_ms: int
    controller_quorum_request_timeout_ms: int
    controller_quorum_append_linger_ms: int


# Timings that keep the multi-process tests quick.
FAST: FastTimings = {
    "controller_quorum_election_timeout_ms": 500,
    "controller_quorum_fetch_timeout_ms": 1000,
    "controller_quorum_request_timeout_ms": 1000,
    "controller_quorum_append_linger_ms": 2,
}


# Below the kernel's ephemeral range (net.ipv4.ip_local_port_range, 32768-60999 by default): a
# port picked with bind(("", 0)) comes from that range, and between the pick and a node's own
# bind any outgoing connection (a peer stream, a client) may be given it as its source port.
_PORTS_BELOW_EPHEMERAL = range(20000, 32768)
_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, never handed out before in this process."""
    for _ in range(1000):
        port = random.choice(_PORTS_BELOW_EPHEMERAL)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError("no free port found below the ephemeral range")


class FaultProxy:
    """A TCP proxy on its own event loop thread; ``cut()`` stops all forwarding both ways."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self._target = target_port
        self._cut = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(5)

    def cut(self) -> None:
        self._cut.set()
        # Established connections go silent too: drop them without a reset being forwarded.
        self._loop.call_soon_threadsafe(self._abort_all)

    def heal(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(5)
        self._thread.join(5)

    async def _shutdown(self) -> None:
        self._server.close()
        self._abort_all()
        await self._server.wait_closed()
        self._loop.call_soon(self._loop.stop)

    def _abort_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port)
        )
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut.is_set():
            await self._hold(reader, writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer),
                             return_exceptions=True)
        self._writers.difference_update((writer, up_writer))

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A cut link swallows everything until the peer gives up."""
        self._writers.add(writer)
        with contextlib.suppress(Exception):
            while await reader.read(65536):
                pass
        self._writers.discard(writer)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if self._cut.is_set():
                    break
                writer.write(data)
                await writer.drain()
        finally:
            writer.transport.abort()


@dataclass
class NodeProcess:
    node_id: int
    port: int  # the client listener
    peer_port: int  # the controller listener (the proxy forwards to it)
    proxy: FaultProxy
    config_path: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    scheme: str = "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def peer_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.peer_port}"


@dataclass
class ProcessCluster:
    directory: Path
    nodes: dict[int, NodeProcess] = field(default_factory=dict)
    cluster_id: str = field(default_factory=random_cluster_id)

    @classmethod
    def create(cls, directory: Path, size: int,
               node_settings: Callable[[int], Mapping[str, object]] | None = None,
               tls: bool = False, proxied: bool = True, **settings: int) -> ProcessCluster:
        """``settings`` apply to every node (``_`` for ``.`` in key names); ``node_settings(i)``
        adds node i's own keys (e.g. its certificate), by their real names; ``tls`` makes both
        listeners SSL (else the peers share a secret); ``proxied=False``: the voters are named
        by their own controller ports (no fault proxy between the nodes)."""
        cluster = cls(directory)
        ports = {i: free_port() for i in range(1, size + 1)}
        peer_ports = {i: free_port() for i in range(1, size + 1)}
        proxies = {i: FaultProxy(port) for i, port in peer_ports.items()}
        voter_ports = {i: proxies[i].port if proxied else peer_ports[i] for i in ports}
        voters = ",".join(f"{i}@127.0.0.1:{voter_ports[i]}" for i in ports)
        clients = ",".join(f"{i}@127.0.0.1:{port}" for i, port in ports.items())
        protocol = "SSL" if tls else "PLAINTEXT"
        security: dict[str, object] = {}
        if not tls:
            cluster.secret_path.write_text(f"{cluster.cluster_id}-peer-secret\n")
            security["controller.listener.secret.file"] = cluster.secret_path
        for i, port in ports.items():
            log_dir = directory / f"node-{i}"
            format_log_dir(log_dir, cluster.cluster_id, i)
            lines = {
                "node.id": i, "cluster.id": cluster.cluster_id, "log.dir": log_dir,
                "listeners": f"CLIENT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{peer_ports[i]}",
                "listener.security.protocol.map": f"CLIENT:{protocol},CONTROLLER:{protocol}",
                "controller.listener.names": "CONTROLLER",
                "controller.quorum.voters": voters,
                "controller.quorum.client.endpoints": clients,
                **security,
                **{key.replace("_", "."): value for key, value in settings.items()},
                **(node_settings(i) if node_settings is not None else {}),
            }
            config = directory / f"node-{i}.properties"
            config.write_text("".join(f"{key}={value}\n" for key, value in lines.items()))
            cluster.nodes[i] = NodeProcess(i, port, peer_ports[i], proxies[i], config,
                                           directory / f"node-{i}.log",
                                           scheme="https" if tls else "http")
        return cluster

    @property
    def secret_path(self) -> Path:
        return self.directory / PEER_SECRET_FILE

    @property
    def peer_secret(self) -> str:
        return self.secret_path.read_text().strip()

    def start(self, node_id: int) -> None:
        node = self.nodes[node_id]
        assert node.process is None or node.process.poll() is not None
        log = node.log_path.open("ab")
        command = [sys.executable, "-m", "quorum_node.cli.node", "run",
                   "--config", str(node.config_path)]
        node.process = subprocess.Popen(
            command,
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.close()

    def start_all(self) -> None:
        for node_id in self.nodes:
            self.start(node_id)

    def signal(self, node_id: int, signum: int) -> None:
        process = self.nodes[node_id].process
        assert process is not None and process.poll() is None
        os.kill(process.pid, signum)

    def kill(self, node_id: int) -> None:
        process = self.nodes[node_id].process
        assert process is not None
        process.kill()
        process.wait(10)

    def stop_all(self) -> None:
        for node in self.nodes.values():
            process = node.process
            if process is not None and process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGCONT)  # a paused node cannot exit
                process.terminate()
        for node in self.nodes.values():
            if node.process is not None:
                try:
                    node.process.wait(10)
                except subprocess.TimeoutExpired:
                    node.process.kill()
                    node.process.wait(10)
            node.proxy.close()

    def logs(self) -> str:
        return "\n".join(
            f"--- node {n.node_id}\n{n.log_path.read_text(errors='replace')[-3000:]}"
            for n in self.nodes.values() if n.log_path.exists()
        )

    def quorum(self, node_id: int) -> dict[str, Any] | None:
        """``GET /v1/quorum`` on a node (following no redirect); None if it does not answer 200."""
        try:
            status: dict[str, Any] = http_json("GET", f"{self.nodes[node_id].url}/v1/quorum",
                                               follow=False)
        except OSError:
            return None
        return status

    def wait_all_serving(self, timeout_s: float = 20) -> None:
        """Until every node answers (a leader can be elected while one node is still starting)."""
        deadline = time.monotonic() + timeout_s
        waiting = set(self.nodes)
        while waiting and time.monotonic() < deadline:
            waiting = {node_id for node_id in waiting if not self._alive(node_id)}
            if waiting:
                time.sleep(0.05)
        if waiting:
            raise AssertionError(f"nodes {sorted(waiting)} do not answer\n{self.logs()}")

    def _alive(self, node_id: int) -> bool:
        try:
            with urllib.request.urlopen(f"{self.nodes[node_id].url}/healthz", timeout=1):
                return True
        except OSError:  # refused, or an error status (urllib's HTTPError)
            return False

    def wait_for_leader(self, among: set[int] | None = None, timeout_s: float = 20) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for node_id in among or set(self.nodes):
                described = self.quorum(node_id)
                if described is not None and described.get("leader_id") == node_id:
                    return node_id
            time.sleep(0.05)
        raise AssertionError(f"no leader among {among or set(self.nodes)}\n{self.logs()}")


def http_json(method: str, url: str, body: Any = None, *, follow: bool = True,
              timeout_s: float = 5) -> Any:
    """One JSON request. Raises urllib.error.HTTPError for non-2xx (and, unless ``follow``, for
    redirects) and OSError when the node cannot be reached."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener() if follow else urllib.request.build_opener(_NoRedirect)
    with opener.open(request, timeout=timeout_s) as response:
        return json.loads(response.read() or b"null")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def is_http_error(error: BaseException) -> bool:
    return isinstance(error, urllib.error.HTTPError)
