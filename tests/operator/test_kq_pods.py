"""The quorum's pods on a real cluster's day two: resources, the startup probe, spreading over
zones and hosts, image pull secrets, and whether the production example's placement rules can
place five voters on three zones of two hosts each.

The placement check is a small pure model of kube-scheduler's filters (node selector, taints,
required pod anti-affinity, DoNotSchedule spread constraints, resource requests) applied to the
pods the operator renders; it refuses any rule it does not model rather than ignore it. It is not
the scheduler: it shows the rules admit a placement whatever feasible node the scheduler picks at
each step, which is what required zone anti-affinity for five voters on three zones never did.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kafka_quorum_operator import KIND
from kafka_quorum_operator import resources as r
from kafka_quorum_operator.spec import DEFAULT_RESOURCES, SpecError, parse_spec

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "crds" / "kafkaquorums.kraft.quorum.dev.yaml").read_text())
SPEC_SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
PRODUCTION = ROOT / "manifests" / "examples" / "kafkaquorum-production.yaml"
K8S_VERSION = "1.33.0"
OWNER = r.Owner("kq", "default", "0b6f2a52-7c1e-4c43-8d43-1ac39b0d2d3e")


def pod_spec(spec: Mapping[str, Any], node_id: int = 1) -> dict[str, Any]:
    rendered: dict[str, Any] = r.pod(OWNER, parse_spec(spec), node_id, "h")["spec"]
    return rendered


def container(spec: Mapping[str, Any], node_id: int = 1) -> dict[str, Any]:
    found: dict[str, Any] = pod_spec(spec, node_id)["containers"][0]
    return found


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


# --- placement ----------------------------------------------------------------------------------

DEDICATED = {"key": "dedicated", "value": "metadata", "effect": "NoSchedule"}
_QUANTITY = re.compile(r"^([0-9.]+)(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")
_FACTORS = {None: 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
            "Ki": 2.0 ** 10, "Mi": 2.0 ** 20, "Gi": 2.0 ** 30, "Ti": 2.0 ** 40}


def quantity(value: str | int) -> float:
    match = _QUANTITY.match(str(value))
    assert match is not None, value
    return float(match.group(1)) * _FACTORS[match.group(2)]


@dataclass(frozen=True)
class Node:
    name: str
    zone: str
    cpu: float = 4
    memory: float = 16 * 2.0 ** 30
    taints: tuple[Mapping[str, str], ...] = ()

    @property
    def labels(self) -> dict[str, str]:
        return {r.HOSTNAME_KEY: self.name, r.ZONE_KEY: self.zone}


def nodes(zones: int, per_zone: int, **changes: Any) -> list[Node]:
    return [Node(f"node-{z}{h}", f"zone-{z}", **changes)
            for z in "abcdefgh"[:zones] for h in range(1, per_zone + 1)]


def _selects(selector: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    assert set(selector) <= {"matchLabels"}, f"not modelled: {selector}"
    pod_labels = pod["metadata"]["labels"]
    return all(pod_labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _tolerated(taint: Mapping[str, str], tolerations: Sequence[Mapping[str, str]]) -> bool:
    return any((t.get("key") == taint["key"] or (not t.get("key") and
                                                 t.get("operator") == "Exists")) and
               (t.get("operator") == "Exists" or t.get("value") == taint["value"]) and
               t.get("effect") in (None, "", taint["effect"]) for t in tolerations)


def _fits(pod: Mapping[str, Any], node: Node, placed: Sequence[tuple[Mapping[str, Any], Node]],
          every: Sequence[Node]) -> bool:
    spec = pod["spec"]
    affinity = spec.get("affinity") or {}
    assert set(affinity) <= {"podAntiAffinity"}, f"not modelled: {sorted(affinity)}"
    anti = affinity.get("podAntiAffinity") or {}
    assert set(anti) <= {"requiredDuringSchedulingIgnoredDuringExecution",
                         "preferredDuringSchedulingIgnoredDuringExecution"}, sorted(anti)
    if any(node.labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    if not all(_tolerated(t, spec.get("tolerations") or []) for t in node.taints):
        return False
    for term in anti.get("requiredDuringSchedulingIgnoredDuringExecution") or []:
        # Every pod of the quorum has the same terms: checking the new pod's against the placed
        # ones is the check of theirs against it too.
        key = term["topologyKey"]
        if any(other.labels.get(key) == node.labels.get(key) and
               _selects(term["labelSelector"], placed_pod) for placed_pod, other in placed):
            return False
    for constraint in spec.get("topologySpreadConstraints") or []:
        assert not {"matchLabelKeys", "nodeAffinityPolicy", "nodeTaintsPolicy"} & \
            set(constraint), f"not modelled: {constraint}"
        if constraint["whenUnsatisfiable"] != "DoNotSchedule":
            continue  # ScheduleAnyway only scores
        key = constraint["topologyKey"]
        if key not in node.labels:
            return False
        counts = {n.labels[key]: 0 for n in every if key in n.labels}
        for placed_pod, other in placed:
            if key in other.labels and _selects(constraint["labelSelector"], placed_pod):
                counts[other.labels[key]] += 1
        least = 0 if len(counts) < constraint.get("minDomains", 1) else min(counts.values())
        if counts[node.labels[key]] + 1 - least > constraint["maxSkew"]:
            return False
    on_node = [p for p, n in placed if n == node] + [pod]
    for resource, capacity in (("cpu", node.cpu), ("memory", node.memory)):
        asked = sum(quantity(c.get("resources", {}).get("requests", {}).get(resource, 0))
                    for p in on_node for c in p["spec"]["containers"])
        if asked > capacity:
            return False
    return True


def placements(pods: Sequence[Mapping[str, Any]], every: Sequence[Node],
               placed: tuple[tuple[Mapping[str, Any], Node], ...] = ()
               ) -> Iterator[tuple[tuple[Mapping[str, Any], Node], ...] | str]:
    """Every way the pods can be placed one after the other, each on any node the filters
    leave: a complete placement, or a description of where it got stuck."""
    if len(placed) == len(pods):
        yield placed
        return
    pod = pods[len(placed)]
    fitting = [n for n in every if _fits(pod, n, placed, every)]
    if not fitting:
        where = ", ".join(f"{p['metadata']['name']} on {n.name}" for p, n in placed)
        yield f"{pod['metadata']['name']} fits no node after {where}"
    for node in fitting:
        yield from placements(pods, every, (*placed, (pod, node)))


def example_quorum() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The production example's KafkaQuorum (defaulted as the API server does) and the other
    objects it creates."""
    docs = [d for d in yaml.safe_load_all(PRODUCTION.read_text()) if d]
    quorum = next(d for d in docs if d["kind"] == KIND)
    defaulted = dict(quorum["spec"])
    for key, schema in SPEC_SCHEMA["properties"].items():
        if key not in defaulted and "default" in schema:
            defaulted[key] = schema["default"]
    return {**quorum, "spec": defaulted}, [d for d in docs if d["kind"] != KIND]


def rendered_pods(name: str, spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    parsed = parse_spec(spec)
    owner = replace(OWNER, name=name)
    return [r.pod(owner, parsed, i, "h") for i in range(1, parsed.replicas + 1)]


def test_the_production_example_places_five_voters_on_three_zones_of_two_hosts() -> None:
    quorum, _ = example_quorum()
    pods = rendered_pods(quorum["metadata"]["name"], quorum["spec"])
    assert len(pods) == 5
    cluster = nodes(3, 2, taints=(DEDICATED,))
    outcomes = list(placements(pods, cluster))
    stuck = [o for o in outcomes if isinstance(o, str)]
    assert stuck == [] and outcomes, stuck[:3]
    for placement in outcomes:
        assert not isinstance(placement, str)
        zones = [node.zone for _, node in placement]
        # Losing any one zone leaves a majority of the five voters; no host holds two.
        assert max(zones.count(z) for z in set(zones)) == 2
        assert len({node.name for _, node in placement}) == 5


def test_required_zone_anti_affinity_could_not_place_five_voters_on_three_zones() -> None:
    """What the production example asked for before: the check is able to fail."""
    quorum, _ = example_quorum()
    spec = {**quorum["spec"], "template": {**quorum["spec"]["template"], "affinity": {
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "topologyKey": r.ZONE_KEY,
            "labelSelector": {"matchLabels": r.labels(quorum["metadata"]["name"])}}]}}}}
    outcomes = list(placements(rendered_pods(quorum["metadata"]["name"], spec),
                               nodes(3, 2, taints=(DEDICATED,))))
    assert outcomes and all(isinstance(o, str) and "-4 fits no node" in o for o in outcomes)


def test_the_production_example_brings_its_own_priority_class() -> None:
    """Managed clusters keep system-cluster-critical (and system-node-critical) to
    kube-system: the example's class is one it creates."""
    quorum, others = example_quorum()
    wanted = quorum["spec"]["template"].get("priorityClassName")
    assert wanted is None or not wanted.startswith("system-")
    if wanted is not None:
        classes = [d for d in others if d["kind"] == "PriorityClass"]
        assert [c["metadata"]["name"] for c in classes] == [wanted]
        assert classes[0].get("globalDefault") is False


@pytest.mark.parametrize(("zones", "per_zone"), [(1, 1), (2, 1), (3, 2)])
def test_the_default_spreading_never_keeps_a_pod_from_being_placed(zones: int,
                                                                   per_zone: int) -> None:
    """ScheduleAnyway only ranks nodes: five voters run on one host if that is all there is."""
    pods = rendered_pods("kq", {"replicas": 5})
    assert all(not isinstance(o, str) for o in placements(pods, nodes(zones, per_zone)))
