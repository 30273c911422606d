"""The cluster's network, made of the test's own parts: a bridge (``kq0``, 10.77.0.1/16) that the
control plane listens on and that every pod's network namespace joins by a veth pair, each pod
with a private address of its node's range (10.77.N.0/24). Endpoints and EndpointSlices refuse
loopback addresses, so pods cannot live on 127.0.0.0/8. Nothing here routes beyond the bridge:
the namespaces have a default route to the bridge's address only, and the host does not forward.

Names are the test's own (``kq0``, ``kqp-*`` namespaces, ``kqv*`` links); ``HostNetwork.create``
removes what a killed earlier run left of them.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

BRIDGE = "kq0"
NETWORK = ipaddress.ip_network("10.77.0.0/16")
GATEWAY = "10.77.0.1"  # the bridge's own address: the API server and the kubelets' probes
NAMESPACE_PREFIX = "kqp-"
LINK_PREFIX = "kqv"


class NetworkError(RuntimeError):
    pass


def ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def available() -> str | None:
    """Why pod networks cannot be made here (None: they can)."""
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    done = subprocess.run(["ip", "netns", "add", "kqp-probe"], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        return f"network namespaces cannot be made: {done.stderr.strip()}"
    ip("netns", "del", "kqp-probe", check=False)
    return None


def node_address(index: int) -> str:
    """The host address of node ``index`` (1-based) on the bridge."""
    return str(NETWORK.network_address + 10 + index)


def pod_addresses(index: int) -> Iterator[str]:
    """Node ``index``'s pod addresses, each used once."""
    base = NETWORK.network_address + index * 256
    for host in range(2, 255):
        yield str(base + host)


class HostNetwork:
    """The bridge, and the addresses of the nodes on it."""

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes

    def create(self) -> None:
        self.delete()
        ip("link", "add", BRIDGE, "type", "bridge")
        ip("addr", "add", f"{GATEWAY}/{NETWORK.prefixlen}", "dev", BRIDGE)
        for index in range(1, self.nodes + 1):
            self.add_node(index)
        ip("link", "set", BRIDGE, "up")

    def add_node(self, index: int) -> None:
        """Node ``index``'s host address on the bridge (its pods' addresses come with their
        namespaces); a node added while the cluster runs gets it as the first nodes did."""
        ip("addr", "add", f"{node_address(index)}/32", "dev", BRIDGE)

    def remove_node(self, index: int) -> None:
        ip("addr", "del", f"{node_address(index)}/32", "dev", BRIDGE, check=False)

    def delete(self) -> None:
        """The bridge and every pod namespace of this network (a killed run's too)."""
        for name in ip("netns", "list", check=False).split():
            if name.startswith(NAMESPACE_PREFIX):
                PodSandbox(name, "").delete()
        ip("link", "del", BRIDGE, check=False)


@dataclass
class PodSandbox:
    """A pod's network namespace (``/run/netns/NAME``) with ``eth0`` at ``address``."""

    name: str
    address: str

    @property
    def path(self) -> str:
        return f"/run/netns/{self.name}"

    @classmethod
    def create(cls, uid: str, address: str) -> PodSandbox:
        sandbox = cls(f"{NAMESPACE_PREFIX}{uid[:8]}", address)
        host_link = f"{LINK_PREFIX}{uid[:8]}"
        sandbox.delete()
        ip("netns", "add", sandbox.name)
        try:
            ip("link", "add", host_link, "type", "veth", "peer", "name", "eth0", "netns",
               sandbox.name)
            ip("link", "set", host_link, "master", BRIDGE, "up")
            inside = ("-n", sandbox.name)
            ip(*inside, "link", "set", "lo", "up")
            ip(*inside, "addr", "add", f"{address}/{NETWORK.prefixlen}", "dev", "eth0")
            ip(*inside, "link", "set", "eth0", "up")
            ip(*inside, "route", "add", "default", "via", GATEWAY)
        except NetworkError:
            sandbox.delete()
            raise
        return sandbox

    def pids(self) -> list[int]:
        out = ip("netns", "pids", self.name, check=False)
        return [int(p) for p in out.split()]

    def delete(self) -> None:
        """The namespace and its veth pair (the pair goes with the namespace)."""
        ip("netns", "del", self.name, check=False)
