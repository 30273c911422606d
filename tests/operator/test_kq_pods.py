"""The quorum's pods on a real cluster's day two: resources, the startup probe, spreading over
zones and hosts, image pull secrets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kubernetes_validate
import pytest
from kafka_quorum_operator import resources as r
from kafka_quorum_operator.spec import DEFAULT_RESOURCES, SpecError, parse_spec

K8S_VERSION = "1.33.0"
OWNER = r.Owner("kq", "default", "0b6f2a52-7c1e-4c43-8d43-1ac39b0d2d3e")


def container(spec: Mapping[str, Any], node_id: int = 1) -> dict[str, Any]:
    return r.pod(OWNER, parse_spec(spec), node_id, "h")["spec"]["containers"][0]


def pod_spec(spec: Mapping[str, Any], node_id: int = 1) -> dict[str, Any]:
    return r.pod(OWNER, parse_spec(spec), node_id, "h")["spec"]


# --- resources ----------------------------------------------------------------------------------


def test_default_resources_request_cpu_and_memory_and_limit_memory_only() -> None:
    """Burstable, not BestEffort (the kubelet's first to evict); no CPU limit (throttling would
    stall heartbeats)."""
    resources = container({})["resources"]
    assert resources == DEFAULT_RESOURCES
    assert set(resources["requests"]) == {"cpu", "memory"}
    assert set(resources["limits"]) == {"memory"}


def test_given_resources_replace_the_default_and_an_empty_object_asks_for_none() -> None:
    given = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}}
    assert container({"resources": given})["resources"] == given
    assert "resources" not in container({"resources": {}})


def test_the_rendered_resources_are_a_copy() -> None:
    first = container({})
    first["resources"]["requests"]["cpu"] = "9"
    assert container({})["resources"] == DEFAULT_RESOURCES


# --- probes -------------------------------------------------------------------------------------


@pytest.mark.parametrize("tls", [True, False])
def test_a_startup_probe_holds_the_liveness_probe_back_while_the_log_replays(tls: bool) -> None:
    node = container({"security": {"tls": {"enabled": tls}}})
    startup, liveness = node["startupProbe"], node["livenessProbe"]
    assert startup["httpGet"] == liveness["httpGet"]  # same endpoint, port and scheme
    assert startup["httpGet"]["scheme"] == ("HTTPS" if tls else "HTTP")
    allowed = startup["periodSeconds"] * startup["failureThreshold"]
    assert allowed == r.STARTUP_SECONDS >= 300
    # The liveness probe runs once the startup probe passed: no delay of its own.
    assert "initialDelaySeconds" not in liveness
    assert liveness["periodSeconds"] * liveness["failureThreshold"] < allowed


# --- spreading ----------------------------------------------------------------------------------


def test_pods_spread_over_zones_then_hosts_by_default_without_ever_blocking() -> None:
    own = {"matchLabels": r.labels("kq")}
    assert pod_spec({})["topologySpreadConstraints"] == [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
         "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": own},
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
         "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": own}]


def test_given_spread_constraints_replace_the_default() -> None:
    zone = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule", "minDomains": 3}
    selected = {"matchLabels": {"team": "metadata"}}
    rendered = pod_spec({"template": {"topologySpreadConstraints": [
        zone, {**zone, "topologyKey": "rack", "labelSelector": selected}]}})
    assert rendered["topologySpreadConstraints"] == [
        {**zone, "labelSelector": {"matchLabels": r.labels("kq")}},  # the quorum's pods
        {**zone, "topologyKey": "rack", "labelSelector": selected}]  # kept as given
    none = pod_spec({"template": {"topologySpreadConstraints": []}})
    assert none["topologySpreadConstraints"] == []


# --- image pull secrets -------------------------------------------------------------------------


def test_image_pull_secrets() -> None:
    rendered = pod_spec({"template": {"imagePullSecrets": [{"name": "registry"},
                                                           {"name": "mirror"}]}})
    assert rendered["imagePullSecrets"] == [{"name": "registry"}, {"name": "mirror"}]
    assert "imagePullSecrets" not in pod_spec({})


@pytest.mark.parametrize(("template", "error"), [
    ({"imagePullSecrets": "registry"}, "imagePullSecrets"),
    ({"imagePullSecrets": [{"name": ""}]}, "imagePullSecrets"),
    ({"topologySpreadConstraints": {"maxSkew": 1}}, "topologySpreadConstraints"),
    ({"topologySpreadConstraints": ["zone"]}, "topologySpreadConstraints"),
])
def test_bad_template_fields_are_one_line_errors(template: dict[str, Any], error: str) -> None:
    with pytest.raises(SpecError, match=f"^spec.template.{error}: "):
        parse_spec({"template": template})


# --- what the pods are made again for -----------------------------------------------------------


@pytest.mark.parametrize("change", [
    {"resources": {"requests": {"cpu": "1"}}},
    {"resources": {}},
    {"template": {"imagePullSecrets": [{"name": "registry"}]}},
    {"template": {"topologySpreadConstraints": []}},
])
def test_a_changed_pod_template_rolls_the_pods(change: dict[str, Any]) -> None:
    environment = {"A": "1"}
    assert r.config_hash(parse_spec(change), environment) != \
        r.config_hash(parse_spec({}), environment)


def test_a_pod_with_every_new_field_is_a_valid_kubernetes_object() -> None:
    spec = {"resources": {"requests": {"cpu": "500m", "memory": 512}},
            "template": {"imagePullSecrets": [{"name": "registry"}],
                         "topologySpreadConstraints": [
                             {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                              "whenUnsatisfiable": "DoNotSchedule", "minDomains": 3,
                              "nodeTaintsPolicy": "Honor"}]}}
    for body in (r.pod(OWNER, parse_spec(spec), 1, "h"), r.pod(OWNER, parse_spec({}), 1, "h")):
        kubernetes_validate.validate(body, K8S_VERSION, strict=True)
