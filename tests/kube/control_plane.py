"""A Kubernetes control plane of processes built from source (``e2e/kube/build.sh``): etcd,
kube-apiserver, kube-controller-manager and kube-scheduler, started on the test's own addresses
and stopped after; their logs stay in the test's directory (``logs/``) and are shown when a test
fails.

- etcd on loopback, one member, its data in the test's directory.
- kube-apiserver on the bridge's address (``netns.GATEWAY``:6443, so that pods reach it) with
  its own serving certificate from the cluster CA, client certificates for every component,
  ``--authorization-mode=Node,RBAC``, the default admission plugins with ``NodeRestriction`` and
  ``OwnerReferencesPermissionEnforcement`` (as OpenShift runs it), and
  ServiceAccount tokens signed by a key of the test's. There is no kube-proxy: the in-cluster
  ``KUBERNETES_SERVICE_HOST`` the process kubelet gives pods is this address itself.
- kube-controller-manager with every default controller, each with its own ServiceAccount's
  credentials (``--use-service-account-credentials``), as kubeadm runs it; the node lifecycle
  and taint eviction timings shortened so that a lost node is seen in seconds.
- kube-scheduler.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from netns import GATEWAY
from pki import ClusterCA, Credential, kubeconfig, service_account_keys

API_PORT = 6443
SERVICE_RANGE = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"  # the ``kubernetes`` Service's cluster IP (first of the range)
CLUSTER_DOMAIN = "cluster.local"
# Seconds: a node that stops renewing its Lease is NotReady after the grace period, and its pods
# are evicted once their default toleration of not-ready/unreachable runs out.
NODE_MONITOR_GRACE_S = 16
EVICTION_TOLERATION_S = 10


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Component:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


@dataclass
class ControlPlane:
    """The control plane's processes, credentials and kubeconfigs, under ``root``."""

    binaries: Path
    root: Path
    components: list[Component] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.pki = self.root / "pki"
        self.logs = self.root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.server = f"https://{GATEWAY}:{API_PORT}"
        self.ca = ClusterCA(self.pki)
        self.admin = self._kubeconfig("admin", "kubernetes-admin", ["system:masters"])

    def _kubeconfig(self, name: str, user: str, groups: list[str]) -> Path:
        credential = self.ca.issue(name, user, groups=groups)
        return kubeconfig(self.pki / f"{name}.kubeconfig", self.server, self.ca.cert,
                          credential, user)

    def kubelet_serving(self, node: str, address: str) -> Credential:
        """A kubelet's serving certificate (its API: container logs)."""
        return self.ca.issue(f"kubelet-serving-{node}", node, hosts=(address, node))

    def node_kubeconfig(self, node: str) -> Path:
        """A kubelet's credentials: ``system:node:NODE`` in ``system:nodes`` (what the Node
        authorizer and NodeRestriction admit)."""
        return self._kubeconfig(f"kubelet-{node}", f"system:node:{node}", ["system:nodes"])

    def start(self) -> None:
        try:
            self._start_etcd()
            self._start_api_server()
            self._start_controllers()
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, *args: str) -> Component:
        log = self.logs / f"{name}.log"
        with log.open("ab") as out:
            popen = subprocess.Popen([str(self.binaries / name), *args],
                                     stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        component = Component(name, popen, log)
        self.components.append(component)
        return component

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._spawn("etcd", "--name", "kq", "--data-dir", str(self.root / "etcd"),
                    "--listen-client-urls", self.etcd_url, "--advertise-client-urls",
                    self.etcd_url, "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                    "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                    "--initial-cluster", f"kq=http://127.0.0.1:{peer}",
                    "--unsafe-no-fsync", "--log-level", "warn")
        self._wait("etcd", lambda: _get(f"{self.etcd_url}/health", None) == 200)

    def _start_api_server(self) -> None:
        serving = self.ca.issue("apiserver", "kube-apiserver", hosts=(
            GATEWAY, SERVICE_IP, "kubernetes", "kubernetes.default", "kubernetes.default.svc",
            f"kubernetes.default.svc.{CLUSTER_DOMAIN}"))
        self.service_account = service_account_keys(self.pki)
        kubelet_client = self.ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet",
                                       groups=["kubeadm:cluster-admins"])
        self._spawn(
            "kube-apiserver",
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={GATEWAY}", f"--advertise-address={GATEWAY}",
            f"--secure-port={API_PORT}",
            f"--tls-cert-file={serving.cert}", f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={self.ca.cert}",
            f"--kubelet-client-certificate={kubelet_client.cert}",
            # Kubelets by their address: a node's host name is in no DNS here.
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-key={kubelet_client.key}",
            f"--service-account-issuer=https://kubernetes.default.svc.{CLUSTER_DOMAIN}",
            f"--service-account-key-file={self.service_account.cert}",
            f"--service-account-signing-key-file={self.service_account.key}",
            f"--service-cluster-ip-range={SERVICE_RANGE}",
            "--authorization-mode=Node,RBAC",
            # Besides the defaults: the kubelets' limits, and the check OpenShift makes that
            # whoever sets blockOwnerDeletion may update the owner's finalizers.
            "--enable-admission-plugins=NodeRestriction,OwnerReferencesPermissionEnforcement",
            f"--default-not-ready-toleration-seconds={EVICTION_TOLERATION_S}",
            f"--default-unreachable-toleration-seconds={EVICTION_TOLERATION_S}",
            # Watches from an old resourceVersion expire (410 Gone) as on a busy cluster.
            "--etcd-compaction-interval=1m",
            "--profiling=false", "--v=1")
        self._wait("kube-apiserver", lambda: self.get("/readyz") == 200, timeout_s=120)

    def _start_controllers(self) -> None:
        manager = self._kubeconfig("controller-manager", "system:kube-controller-manager", [])
        scheduler = self._kubeconfig("scheduler", "system:kube-scheduler", [])
        self._spawn(
            "kube-controller-manager",
            f"--kubeconfig={manager}", f"--authentication-kubeconfig={manager}",
            f"--authorization-kubeconfig={manager}",
            "--controllers=*", "--use-service-account-credentials",
            f"--service-account-private-key-file={self.service_account.key}",
            f"--root-ca-file={self.ca.cert}",
            f"--cluster-signing-cert-file={self.ca.cert}",
            f"--cluster-signing-key-file={self.ca.key}",
            "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            "--node-monitor-period=2s", f"--node-monitor-grace-period={NODE_MONITOR_GRACE_S}s",
            "--v=1")
        self._spawn(
            "kube-scheduler",
            f"--kubeconfig={scheduler}", f"--authentication-kubeconfig={scheduler}",
            f"--authorization-kubeconfig={scheduler}",
            "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            "--v=1")

    def _wait(self, what: str, ready: Callable[[], bool], timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for component in self.components:
                if component.popen.poll() is not None:
                    raise RuntimeError(f"{component.name} exited ({component.popen.returncode}):"
                                       f"\n{tail(component.log)}")
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"{what} not ready within {timeout_s} s:\n{self.describe()}")

    def context(self) -> ssl.SSLContext:
        """TLS to the API server as the administrator."""
        context = ssl.create_default_context(cafile=str(self.ca.cert))
        admin = Credential(self.pki / "admin.crt", self.pki / "admin.key")
        context.load_cert_chain(str(admin.cert), str(admin.key))
        return context

    def get(self, path: str) -> int | None:
        """The status of a GET as the administrator (None: no answer)."""
        return _get(self.server + path, self.context())

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None,
                timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(self.binaries / "kubectl"), f"--kubeconfig={self.admin}",
                               *args], capture_output=True, text=True, input=stdin,
                              timeout=timeout_s, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} -> {done.returncode}\n"
                                 f"{done.stdout}\n{done.stderr}")
        return done

    def rss_mib(self) -> dict[str, float]:
        """Each component's resident memory."""
        found = {}
        for component in self.components:
            with contextlib.suppress(OSError):
                status = Path(f"/proc/{component.popen.pid}/status").read_text()
                kib = next(int(line.split()[1]) for line in status.splitlines()
                           if line.startswith("VmRSS:"))
                found[component.name] = kib / 1024
        return found

    def describe(self) -> str:
        return "\n".join(f"--- {c.name} (exit {c.popen.poll()})\n{tail(c.log)}"
                         for c in self.components)

    def stop(self) -> None:
        """Each component in the reverse order of its start (the API server before etcd)."""
        for component in reversed(self.components):
            if component.popen.poll() is None:
                component.popen.terminate()
            try:
                component.popen.wait(15)
            except subprocess.TimeoutExpired:
                component.popen.kill()
                component.popen.wait(5)
        self.components.clear()


def _get(url: str, context: ssl.SSLContext | None) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def tail(path: Path, size: int = 4000) -> str:
    try:
        with path.open("rb") as file:
            file.seek(max(0, path.stat().st_size - size))
            return file.read().decode(errors="replace")
    except OSError:
        return ""

