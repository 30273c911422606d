"""The operator on a real Kubernetes control plane built from source (``e2e/kube/build.sh``), with
process kubelets (``cluster.py``). Every test module here is marked ``slow`` (minutes): ``.ci/run``
runs them in a step of their own, after building the control plane, with ``E2E_KUBE_REQUIRED=1``,
so that nothing skips there (a missing part fails the tests). Elsewhere they skip, in one line, when
the binaries are not built or the machine cannot make network namespaces (root and iproute2 are
needed).

    bash e2e/kube/build.sh && python -m pytest -m slow -s tests/kube
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "operator"))

from cluster import Cluster, helm_binary  # noqa: E402
from kq_real import create_namespace, install_operator  # noqa: E402
from netns import available  # noqa: E402

BUILD = "bash e2e/kube/build.sh"


def _binaries() -> tuple[Path | None, str]:
    done = subprocess.run(["bash", str(ROOT / "e2e" / "kube" / "build.sh"), "--locate"],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return None, f"the control plane is not built (run: {BUILD})"
    return Path(done.stdout.strip()), ""


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "pods' network namespaces need root"
    reason = available()
    if reason is not None:
        return reason
    binaries, why = _binaries()
    if binaries is None:
        return why
    if helm_binary() is None:
        return "helm is not installed (python helm/fetch_helm.py .venv/bin)"
    return None


MISSING = _missing()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip here when the cluster cannot be made; never in CI (E2E_KUBE_REQUIRED=1), where
    the fixture fails instead, with the reason."""
    if MISSING is None or os.environ.get("E2E_KUBE_REQUIRED") == "1":
        return
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.skip(reason=f"real control plane: {MISSING}"))


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def kube_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[Cluster]:
    assert MISSING is None, f"real control plane: {MISSING}"
    binaries, _ = _binaries()
    assert binaries is not None
    cluster = Cluster(binaries, tmp_path_factory.mktemp("kube"), helm_binary=helm_binary())
    # A SIGTERM (CI's timeout, a job cancelled) tears the cluster down as Ctrl-C does: its
    # processes live in sessions of their own and would outlive pytest.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    cluster.start()
    try:
        yield cluster
    finally:
        if request.session.testsfailed:
            print(f"\n[kube] logs under {cluster.root}\n{cluster.describe()}")
        cluster.stop()
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture(scope="session")
def operator_installed(kube_cluster: Cluster) -> Iterator[None]:
    """The quorum's namespace (restricted Pod Security) with the operator installed by ``helm
    install`` of the chart, its defaults."""
    create_namespace(kube_cluster)
    install_operator(kube_cluster)
    yield
