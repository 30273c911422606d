"""Render manifests/install.yaml from the chart (``helm template`` with the values below), for
``kubectl apply -f``. tests/operator/test_kq_helm.py fails when the file is out of date.

    python helm/render_install.py [--check]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "kafka-quorum-operator"
INSTALL = ROOT / "manifests" / "install.yaml"
RELEASE, NAMESPACE = "kafka-quorum-operator", "kafka-quorum-system"
HEADER = """\
# The KafkaQuorum operator for kubectl: the CRD, namespace kafka-quorum-system, RBAC and the
# operator Deployment, managing the KafkaQuorums of namespace kafka-quorum-system (for others,
# use the chart's watchNamespaces). Generated from helm/kafka-quorum-operator by
# `python helm/render_install.py`; do not edit.
#
#   kubectl apply -f manifests/install.yaml
#
# Applying a newer one upgrades everything, the CRD included.
"""


def helm_binary() -> str | None:
    return os.environ.get("HELM") or shutil.which("helm")


def render(helm: str, *extra: str) -> str:
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "HELM_CACHE_HOME": home, "HELM_CONFIG_HOME": home,
               "HELM_DATA_HOME": home}
        done = subprocess.run([helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                               *extra], capture_output=True, text=True,
                              env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"helm template failed: {done.stderr.strip()}")
    return done.stdout


def install_yaml(helm: str) -> str:
    rendered = render(helm, "--set", "createNamespace=true")
    # helm test hooks are for helm only.
    documents = [d for d in rendered.split("\n---\n") if "helm.sh/hook: test" not in d]
    return HEADER + "---\n".join(d.strip("\n-") + "\n" for d in documents if d.strip("\n-"))


if __name__ == "__main__":
    binary = helm_binary()
    if binary is None:
        sys.exit("helm not found: python helm/fetch_helm.py .venv/bin")
    text = install_yaml(binary)
    if "--check" in sys.argv[1:]:
        sys.exit(0 if INSTALL.read_text() == text else f"{INSTALL} is out of date")
    INSTALL.write_text(text)
    print(INSTALL)
