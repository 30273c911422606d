"""A whole cluster of processes: the bridge (``netns``), the control plane (``control_plane``),
the add-ons (``addons.py``: DNS records, the hostPath provisioner) and three process kubelets
(``kubelet.py``) in zones a, b and c; ``kubectl`` and ``helm`` as its administrator. While it
runs, the test process resolves the cluster's DNS names from the add-ons' records, as a pod
does. A test that needs more nodes adds them for its own time (``Cluster.more_nodes``)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from control_plane import API_PORT, CLUSTER_DOMAIN, ControlPlane, tail
from netns import GATEWAY, HostNetwork, node_address

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ZONES = ("zone-a", "zone-b", "zone-c")
STORAGE_CLASS = "standard"


@dataclass
class Cluster:
    binaries: Path
    root: Path
    nodes: int = 3
    helm_binary: str | None = None
    kubelets: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    addons: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.network = HostNetwork(self.nodes)
        self.control_plane = ControlPlane(self.binaries, self.root / "control-plane")
        self.hosts_file = self.root / "dns" / "hosts"
        self.volumes = self.root / "volumes"

    # -- start and stop --

    def start(self) -> None:
        started = time.monotonic()
        self.network.create()
        try:
            self.control_plane.start()
            self._bootstrap()
            self._start_addons()
            for index in range(1, self.nodes + 1):
                self._start_kubelet(index, ZONES[(index - 1) % len(ZONES)])
            self._wait_nodes_ready(list(self.kubelets))
        except BaseException:
            print(self.describe())
            self.stop()
            raise
        _RESOLVERS.append(self)
        print(f"\n[kube] cluster up in {time.monotonic() - started:.1f} s", flush=True)

    def _bootstrap(self) -> None:
        storage_class = {
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": STORAGE_CLASS, "annotations": {
                "storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": "quorum.test/hostpath", "reclaimPolicy": "Delete",
            "volumeBindingMode": "WaitForFirstConsumer"}
        self.kubectl("apply", "-f", "-", stdin=json.dumps(storage_class))

    def _start_addons(self) -> None:
        self.hosts_file.parent.mkdir(parents=True, exist_ok=True)
        self.hosts_file.write_text("127.0.0.1 localhost\n")
        config = {"kubeconfig": str(self.control_plane.admin), "hosts_file": str(self.hosts_file),
                  "volumes": str(self.volumes), "cluster_domain": CLUSTER_DOMAIN}
        path = self.root / "addons.json"
        path.write_text(json.dumps(config))
        self.addons = self._python("addons", HERE / "addons.py", path)

    def _start_kubelet(self, index: int, zone: str) -> None:
        node = f"node-{index}"
        directory = self.root / "nodes" / node
        directory.mkdir(parents=True, exist_ok=True)
        serving = self.control_plane.kubelet_serving(node, node_address(index))
        config = {"node": node, "zone": zone, "index": index,
                  "host_ip": node_address(index), "serving_cert": str(serving.cert),
                  "serving_key": str(serving.key), "client_ca": str(self.control_plane.ca.cert),
                  "kubeconfig": str(self.control_plane.node_kubeconfig(node)),
                  "root": str(directory), "api_host": GATEWAY, "api_port": API_PORT,
                  "hosts_file": str(self.hosts_file), "venv": sys.prefix}
        path = directory / "kubelet.json"
        path.write_text(json.dumps(config))
        self.kubelets[node] = self._python(f"kubelet-{node}", HERE / "kubelet.py", path)

    def _python(self, name: str, script: Path, config: Path) -> subprocess.Popen[bytes]:
        log = self.control_plane.logs / f"{name}.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(HERE), str(ROOT / "tests" / "operator"), str(ROOT / "operator")])}
        with log.open("ab") as out:
            return subprocess.Popen([sys.executable, str(script), str(config)], stdout=out,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def _wait_nodes_ready(self, names: Sequence[str], timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            nodes = json.loads(self.kubectl("get", "nodes", "-o", "json"))["items"]
            ready = {n["metadata"]["name"] for n in nodes if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in n["status"].get("conditions") or [])}
            if ready.issuperset(names):
                return
            for name in names:
                popen = self.kubelets[name]
                if popen.poll() is not None:
                    raise RuntimeError(f"kubelet {name} exited: {popen.returncode}")
            time.sleep(0.5)
        raise RuntimeError(f"nodes {', '.join(names)} not Ready within {timeout_s} s")

    # -- nodes added for one test --

    @contextlib.contextmanager
    def more_nodes(self, *zones: str) -> Iterator[list[str]]:
        """Nodes beyond the first ones, one per zone given (``node-4``, ``node-5``, ...), Ready
        when this yields their names; on exit their kubelets stop and their Nodes, Leases and
        addresses go, so that the tests after see the cluster they saw before. Whatever still
        runs on them stops with their kubelets: the test removes its workload first."""
        added: list[str] = []
        try:
            for zone in zones:
                index = len(self.kubelets) + 1
                self.network.add_node(index)
                self._start_kubelet(index, zone)
                added.append(f"node-{index}")
            self._wait_nodes_ready(added)
            yield added
        finally:
            self.remove_nodes(added)

    def remove_nodes(self, names: Sequence[str]) -> None:
        """Added nodes removed, the last added first (``more_nodes`` numbers by count)."""
        for name in reversed(names):
            popen = self.kubelets.pop(name)
            if popen.poll() is None:
                popen.terminate()
            try:
                popen.wait(30)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait(5)
            # A process kubelet's Lease has no owner reference to its Node: both go here.
            self.kubectl("delete", "node", name, "--ignore-not-found")
            self.kubectl("--namespace", "kube-node-lease", "delete", "lease", name,
                         "--ignore-not-found")
            self.network.remove_node(int(name.removeprefix("node-")))

    def stop(self) -> None:
        with contextlib.suppress(ValueError):
            _RESOLVERS.remove(self)
        processes = [*self.kubelets.values(), *([self.addons] if self.addons else [])]
        for popen in processes:
            if popen.poll() is None:
                popen.terminate()  # a kubelet stops its pods' processes as it goes
        for popen in processes:
            try:
                popen.wait(30)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait(5)
        self.kubelets.clear()
        self.control_plane.stop()
        self.network.delete()

    # -- tools --

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True,
                timeout_s: float = 120) -> str:
        done = self.control_plane.kubectl(*args, stdin=stdin, check=check, timeout_s=timeout_s)
        return done.stdout

    def helm(self, *args: str, check: bool = True, timeout_s: float = 300
             ) -> subprocess.CompletedProcess[str]:
        assert self.helm_binary is not None, "helm is not installed"
        home = self.root / "helm"
        env = {**os.environ, "KUBECONFIG": str(self.control_plane.admin),
               "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
               "HELM_DATA_HOME": str(home / "data")}
        done = subprocess.run([self.helm_binary, *args], capture_output=True, text=True,
                              env=env, timeout=timeout_s, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} -> {done.returncode}\n{done.stdout}\n"
                                 f"{done.stderr}")
        return done

    def resolve(self, host: str) -> str | None:
        """The address the cluster's DNS gives ``host`` (None: not a cluster name)."""
        host = host.rstrip(".")
        with contextlib.suppress(OSError):
            for line in self.hosts_file.read_text().splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[1] == host and parts[0] != "127.0.0.1":
                    return parts[0]
        return None

    def pod_logs(self) -> Iterator[tuple[str, Path]]:
        """Every container log on every node: (pod uid and container, path)."""
        for log in sorted((self.root / "nodes").glob("*/pods/*/*.log")):
            yield f"{log.parent.name[:8]}/{log.stem}", log

    def describe(self) -> str:
        parts = [self.control_plane.describe()]
        for log in sorted(self.control_plane.logs.glob("*.log")):
            if log.stem.startswith(("kubelet", "addons")):
                parts.append(f"--- {log.stem}\n{tail(log, 3000)}")
        for name, log in self.pod_logs():
            parts.append(f"--- container {name}\n{tail(log, 2500)}")
        return "\n".join(parts)

    def rss_mib(self) -> dict[str, float]:
        """The resident memory of the control plane's processes, the kubelets and the
        add-ons."""
        found = self.control_plane.rss_mib()
        for name, popen in [*self.kubelets.items(), ("addons", self.addons)]:
            if popen is None:
                continue
            with contextlib.suppress(OSError, StopIteration):
                status = Path(f"/proc/{popen.pid}/status").read_text()
                found[name] = next(int(line.split()[1]) for line in status.splitlines()
                                   if line.startswith("VmRSS:")) / 1024
        return found


def helm_binary() -> str | None:
    found = shutil.which("helm")
    venv_helm = Path(sys.prefix) / "bin" / "helm"
    return found or (str(venv_helm) if venv_helm.exists() else None)


# The clusters running now: the test process resolves their names too.
_RESOLVERS: list[Cluster] = []
_getaddrinfo = socket.getaddrinfo


def _cluster_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    if isinstance(host, str) and host.rstrip(".").endswith((".svc", f".svc.{CLUSTER_DOMAIN}")):
        for cluster in _RESOLVERS:
            found = cluster.resolve(host)
            if found is not None:
                return _getaddrinfo(found, *args, **kwargs)
        # A cluster name with no record: NXDOMAIN, never a query to the machine's resolver.
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    return _getaddrinfo(host, *args, **kwargs)


socket.getaddrinfo = _cluster_getaddrinfo  # cluster names only while a cluster runs
