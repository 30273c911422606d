"""Who the pods run as: the fixed uid, gid and fsGroup 10001 by default; none of them where the
platform assigns its own (OpenShift's restricted SCC refuses fixed ones): the operator's
``KQ_OPERATOR_POD_IDS=platform`` for every quorum, a quorum's ``spec.template.securityContext``
for one; the chart's ``openshift.adaptSecurityContext`` for the operator's own pod and the
setting. On the real control plane, a quorum without the ids becomes Ready:
tests/kube/test_kube_plugin.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kafka_quorum_operator import resources as r
from kafka_quorum_operator.settings import OperatorSettings, SettingsError
from kafka_quorum_operator.spec import SpecError, parse_spec
from test_kq_security import assert_restricted

OWNER = r.Owner("kq", "ns", "uid-1")
ENV = {"QUORUM_NODE_ID": "1"}
K8S_VERSION = "1.33.0"
IDS = ("runAsUser", "runAsGroup", "fsGroup")
CRD = Path(__file__).resolve().parents[2] / "crds" / "kafkaquorums.kraft.quorum.dev.yaml"


def pod_of(spec: Any, pod_ids: str = "fixed") -> dict[str, Any]:
    parsed = r.with_pod_ids(parse_spec(spec), pod_ids)
    return r.pod(OWNER, parsed, 1, r.config_hash(parsed, ENV))


def test_fixed_ids_by_default() -> None:
    context = pod_of({})["spec"]["securityContext"]
    assert {k: context[k] for k in IDS} == dict.fromkeys(IDS, r.NODE_USER)


def test_platform_ids_leave_them_out_and_the_pod_stays_restricted() -> None:
    body = pod_of({}, "platform")
    assert body["spec"]["securityContext"] == {"runAsNonRoot": True,
                                               "seccompProfile": {"type": "RuntimeDefault"}}
    assert_restricted(body["spec"], "platform ids")
    kubernetes_validate.validate(body, K8S_VERSION, strict=True)
    # The Secrets stay readable by the files' group only: the fsGroup the platform assigns,
    # else root's, which is the image's group (gid 0).
    modes = {v["name"]: v["secret"]["defaultMode"] for v in body["spec"]["volumes"]
             if "secret" in v}
    assert modes and set(modes.values()) == {0o440}, modes


def test_a_given_security_context_replaces_the_operators_under_either_setting() -> None:
    given = {"runAsNonRoot": True, "runAsUser": 1000650000, "fsGroup": 1000650000,
             "seccompProfile": {"type": "RuntimeDefault"}}
    spec = {"template": {"securityContext": given}}
    for pod_ids in r.POD_IDS:
        assert pod_of(spec, pod_ids)["spec"]["securityContext"] == given
    kubernetes_validate.validate(pod_of(spec), K8S_VERSION, strict=True)


def test_pods_roll_when_the_ids_change_and_only_then() -> None:
    def hash_of(spec: Any, pod_ids: str = "fixed") -> str:
        return r.config_hash(r.with_pod_ids(parse_spec(spec), pod_ids), ENV)

    # A quorum of before this setting keeps its pods' hash: no roll on an operator upgrade.
    assert hash_of({}) == r.config_hash(parse_spec({}), ENV)
    assert hash_of({}, "platform") != hash_of({})
    given = {"template": {"securityContext": {"runAsNonRoot": True}}}
    assert hash_of(given) != hash_of({})
    assert hash_of(given, "platform") == hash_of(given)


@pytest.mark.parametrize("bad", ["10001", ["runAsUser"]])
def test_a_security_context_that_is_no_object_is_a_one_line_error(bad: Any) -> None:
    with pytest.raises(SpecError, match=r"^spec.template.securityContext: expected an object"):
        parse_spec({"template": {"securityContext": bad}})


def test_the_operator_setting() -> None:
    def pod_ids(value: str) -> str:
        return OperatorSettings.from_environment({"KQ_OPERATOR_POD_IDS": value}).pod_ids

    assert pod_ids("") == "fixed" and pod_ids("platform") == "platform"
    with pytest.raises(SettingsError, match=r"^KQ_OPERATOR_POD_IDS: expected one of fixed, "
                       r"platform, got 'openshift'$"):
        pod_ids("openshift")


def test_the_crd_takes_a_security_context_as_given() -> None:
    crd = yaml.safe_load(CRD.read_text())
    template = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"]["template"]["properties"]
    assert template["securityContext"]["type"] == "object"
    assert template["securityContext"]["x-kubernetes-preserve-unknown-fields"] is True


# --- the chart ------------------------------------------------------------------------------


def operator_pod(*extra: str) -> tuple[dict[str, Any], dict[str, str]]:
    test_helm = pytest.importorskip("test_kq_helm")
    if test_helm.HELM is None:
        pytest.skip("helm not installed (python helm/fetch_helm.py .venv/bin)")
    docs = test_helm.template(*extra)
    [deployment] = test_helm.by_kind(docs, "Deployment")
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    pod = deployment["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    return pod, env


@pytest.mark.parametrize(("extra", "platform"), [
    ((), False),
    (("--api-versions", "security.openshift.io/v1"), True),  # auto, on OpenShift
    (("--set", "openshift.adaptSecurityContext=force"), True),
    (("--set", "openshift.adaptSecurityContext=disabled", "--api-versions",
      "security.openshift.io/v1"), False),
])
def test_the_chart_leaves_the_ids_to_openshift(extra: tuple[str, ...], platform: bool) -> None:
    pod, env = operator_pod(*extra)
    context = pod["securityContext"]
    assert_restricted(pod, f"operator {extra}")
    if platform:
        assert not set(IDS) & set(context), context
        assert env["KQ_OPERATOR_POD_IDS"] == "platform"
    else:
        assert (context["runAsUser"], context["runAsGroup"]) == (10001, 10001)
        assert env["KQ_OPERATOR_POD_IDS"] == "fixed"
    assert not set(IDS) & set(pod["containers"][0]["securityContext"])


def test_the_chart_refuses_an_unknown_mode() -> None:
    with pytest.raises(RuntimeError, match="adaptSecurityContext"):
        operator_pod("--set", "openshift.adaptSecurityContext=maybe")
