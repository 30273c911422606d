"""The CRD and the install files, validated offline: kubernetes-validate --strict for Kubernetes'
own kinds, jsonschema (translated from the CRD's structural schema) for KafkaQuorum objects, and
cel-python for the CRD's CEL rules. The Helm chart is linted and rendered in test_kq_helm.py."""

from __future__ import annotations

import copy
import datetime
import inspect
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import pytest
import yaml
from celpy.adapter import json_to_cel
from kafka_quorum_operator import API_VERSION, GROUP, KIND, PLURAL, certs
from kafka_quorum_operator import credentials as c
from kafka_quorum_operator import resources as r
from kafka_quorum_operator.plan import plan
from kafka_quorum_operator.spec import (
    DEFAULT_RESOURCES,
    MAX_NAME_LENGTH,
    MAX_REPLICAS,
    NODE_CONFIG_KEYS,
    Spec,
    SpecError,
    check_name,
    parse_spec,
)
from kafka_quorum_operator.status import remediation_detected, status_patch
from kq_builders import DIRS, NOW, healthy, pending, replaced

from quorum_node.node.config import KEYS_BY_NAME

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / f"{PLURAL}.{GROUP}.yaml"
CHART_CRD = ROOT / "helm" / "kafka-quorum-operator" / "files" / CRD_PATH.name
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
K8S_VERSION = "1.33.0"


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


CRD = load_all(CRD_PATH)[0]
VERSION_SCHEMA = CRD["spec"]["versions"][0]
SCHEMA = VERSION_SCHEMA["schema"]["openAPIV3Schema"]


def to_jsonschema(node: Any) -> Any:
    """A structural schema as a strict Draft 4 schema (spikes.md): x-kubernetes-* keys dropped,
    int-or-string as anyOf, and no unknown fields where properties are listed."""
    if isinstance(node, list):
        return [to_jsonschema(item) for item in node]
    if not isinstance(node, Mapping):
        return node
    result = {k: to_jsonschema(v) for k, v in node.items()
              if not k.startswith("x-kubernetes-") and k != "default"}
    if node.get("x-kubernetes-int-or-string"):
        result["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        result.setdefault("additionalProperties", False)
    if node.get("format") == "date-time":
        del result["format"]
    return result


VALIDATOR = jsonschema.Draft4Validator(to_jsonschema(SCHEMA))


def schema_errors(obj: Mapping[str, Any]) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in VALIDATOR.iter_errors(obj)]


def apply_defaults(schema: Mapping[str, Any], value: Any) -> Any:
    """The API server's defaulting: fill absent fields with their defaults, recursively."""
    if not isinstance(value, dict):
        return value
    for key, sub in (schema.get("properties") or {}).items():
        if key not in value and "default" in sub:
            value[key] = copy.deepcopy(sub["default"])
        if key in value:
            value[key] = apply_defaults(sub, value[key])
    return value


def walk(node: Mapping[str, Any], where: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    yield where, node
    for key, sub in (node.get("properties") or {}).items():
        yield from walk(sub, f"{where}.{key}")
    if isinstance(node.get("items"), Mapping):
        yield from walk(node["items"], f"{where}[]")
    if isinstance(node.get("additionalProperties"), Mapping):
        yield from walk(node["additionalProperties"], f"{where}{{}}")


# --- the CRD itself -----------------------------------------------------------------------------


def test_crd_is_a_valid_strict_apiextensions_object() -> None:
    kubernetes_validate.validate(CRD, K8S_VERSION, strict=True)


def test_crd_schema_is_structural() -> None:
    """Every node has a type (or is int-or-string), and free-form subtrees are explicit."""
    for where, node in walk(SCHEMA):
        if node.get("x-kubernetes-int-or-string"):
            continue
        assert "type" in node, f"{where or '(root)'} has no type"
        if node["type"] == "object" and where.startswith(".spec"):
            assert "properties" in node or "additionalProperties" in node or \
                node.get("x-kubernetes-preserve-unknown-fields"), where


def test_crd_names_subresources_and_columns() -> None:
    spec = CRD["spec"]
    assert (spec["group"], spec["names"]["kind"], spec["names"]["plural"]) == (
        GROUP, KIND, PLURAL)
    assert f"{spec['group']}/{VERSION_SCHEMA['name']}" == API_VERSION
    assert VERSION_SCHEMA["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector"}
    columns = [c["name"] for c in VERSION_SCHEMA["additionalPrinterColumns"]
               if not c.get("priority")]
    assert columns == ["Ready", "Quorate", "Voters", "Leader", "Epoch", "HighWatermark", "Age"]


def test_chart_carries_the_same_crd() -> None:
    assert CHART_CRD.read_text() == CRD_PATH.read_text(), \
        f"copy {CRD_PATH.relative_to(ROOT)} to {CHART_CRD.relative_to(ROOT)}"


def test_crd_config_keys_are_the_nodes() -> None:
    """Every spec.config property is one the operator passes on, as a key the node knows."""
    properties = SPEC_SCHEMA["properties"]["config"]["properties"]
    assert set(properties) == set(NODE_CONFIG_KEYS)
    for name, node_key in NODE_CONFIG_KEYS.items():
        assert node_key in KEYS_BY_NAME, f"{name} -> {node_key}: not a node configuration key"


def test_crd_defaults_are_the_operators() -> None:
    defaulted = apply_defaults(SCHEMA["properties"]["spec"], {})
    assert parse_spec(defaulted) == parse_spec({}) == Spec()
    assert defaulted["replicas"] == 3 and defaulted["remediation"]["minCaughtUpSeconds"] == 10
    # The API server fills spec.resources, and the operator's own default is the same.
    assert defaulted["resources"] == DEFAULT_RESOURCES == Spec().resources
    # Given, spec.resources replaces the default whole; an empty object asks for none.
    given = apply_defaults(SPEC_SCHEMA, {"resources": {"limits": {"memory": "2Gi"}}})
    assert parse_spec(given).resources == {"limits": {"memory": "2Gi"}}
    assert parse_spec(apply_defaults(SPEC_SCHEMA, {"resources": {}})).resources == {}


# --- KafkaQuorum objects ----------------------------------------------------------------------


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid(example: Path) -> None:
    for doc in load_all(example):
        if doc["kind"] != KIND:  # what the example creates besides (a PriorityClass)
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            continue
        assert doc["apiVersion"] == API_VERSION
        assert schema_errors(apply_defaults(SCHEMA, doc)) == []
        parse_spec(apply_defaults(SCHEMA["properties"]["spec"], doc["spec"]))
        assert cel_errors(SCHEMA["properties"]["spec"], doc["spec"]) == []


def test_examples_exist() -> None:
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize(("change", "error"), [
    ({"replicas": "three"}, "is not of type 'integer'"),
    ({"replicas": 11}, "greater than the maximum"),
    ({"bogus": 1}, "Additional properties"),
    ({"imagePullPolicy": "Sometimes"}, "is not one of"),
    ({"storage": {"size": "lots"}}, "does not match"),
    ({"config": {"fetchTimeoutMs": "2s"}}, "is not of type 'integer'"),
    ({"remediation": {"minCaughtUpSeconds": -1}}, "less than the minimum"),
    ({"security": {"tls": {"enabled": "no"}}}, "is not of type 'boolean'"),
    ({"security": {"tls": {"certManager": {"issuerRef": {"name": "ca", "kind": "Vault"}}}}},
     "is not one of"),
    ({"security": {"tls": {"certManager": {}}}}, "'issuerRef' is a required property"),
    ({"security": {"networkPolicy": {"allowFrom": [{"ipBlock": {}}]}}},
     "'cidr' is a required property"),
    ({"template": {"imagePullSecrets": [{}]}}, "'name' is a required property"),
    ({"template": {"imagePullSecrets": ["regcred"]}}, "is not of type 'object'"),
    ({"template": {"topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
         "whenUnsatisfiable": "Sometimes"}]}}, "is not one of"),
    ({"template": {"topologySpreadConstraints": [
        {"maxSkew": 0, "topologyKey": "topology.kubernetes.io/zone",
         "whenUnsatisfiable": "DoNotSchedule"}]}}, "less than the minimum"),
    ({"template": {"topologySpreadConstraints": [{"maxSkew": 1}]}},
     "'topologyKey' is a required property"),
    ({"resources": {"requests": {"cpu": 0.5}}}, "is not valid under any of the given schemas"),
])
def test_bad_objects_are_refused(change: dict[str, Any], error: str) -> None:
    doc = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "x"},
           "spec": {"replicas": 3, **change}}
    errors = schema_errors(doc)
    assert any(error in e for e in errors), errors


def test_the_status_the_operator_writes_fits_the_schema() -> None:
    """Anything not in the schema would be pruned by the API server (kopf #574)."""
    for observed in (healthy(), replace(replaced(healthy(), 3, since=NOW - 1),
                                        pending=pending("AddVoter", 3, DIRS[3].lower()))):
        status = status_patch(observed, plan(observed), {}, r.selector("kq"))
        status["lastRemediation"] = remediation_detected(None, 3, DIRS[3], NOW)
        status = {k: v for k, v in status.items() if v is not None}
        doc = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "kq"},
               "spec": {"replicas": 3}, "status": status}
        assert schema_errors(doc) == []


# --- CEL rules ----------------------------------------------------------------------------------


def cel_rules(schema: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for where, node in walk(schema):
        for rule in node.get("x-kubernetes-validations") or []:
            yield where, rule


def cel_errors(schema: Mapping[str, Any], value: Any, old: Any = None) -> list[str]:
    """Evaluate every CEL rule of ``schema`` on ``value`` (and ``old``, for transition rules,
    which the API server runs on updates only)."""
    environment = celpy.Environment()
    errors = []
    for where, rule in cel_rules(schema):
        node, old_node = value, old
        for part in [p for p in where.split(".") if p]:
            node = node.get(part) if isinstance(node, Mapping) else None
            old_node = old_node.get(part) if isinstance(old_node, Mapping) else None
        if node is None or ("oldSelf" in rule["rule"] and old_node is None):
            continue
        activation = {"self": json_to_cel(node)}
        if old_node is not None:
            activation["oldSelf"] = json_to_cel(old_node)
        program = environment.program(environment.compile(rule["rule"]))
        if not bool(program.evaluate(activation)):
            errors.append(rule["message"])
    return errors


SPEC_SCHEMA = SCHEMA["properties"]["spec"]


def test_every_cel_rule_compiles() -> None:
    environment = celpy.Environment()
    rules = list(cel_rules(SPEC_SCHEMA))
    assert len(rules) == 4
    for _, rule in rules:
        environment.compile(rule["rule"])


@pytest.mark.parametrize(("replicas", "ok"), [(1, True), (3, True), (4, False), (5, True),
                                              (6, False)])
def test_cel_odd_voter_counts(replicas: int, ok: bool) -> None:
    errors = cel_errors(SPEC_SCHEMA, apply_defaults(SPEC_SCHEMA, {"replicas": replicas}))
    assert (errors == []) is ok


@pytest.mark.parametrize(("old", "new", "ok"), [
    ({"storageClassName": "a"}, {"storageClassName": "a"}, True),
    ({"storageClassName": "a"}, {"storageClassName": "b"}, False),
    ({}, {"storageClassName": "b"}, False),
    ({"storageClassName": "a"}, {}, False),
    ({"size": "1Gi"}, {"size": "2Gi"}, True),
])
def test_cel_storage_class_is_immutable(old: dict[str, Any], new: dict[str, Any],
                                        ok: bool) -> None:
    errors = cel_errors(SPEC_SCHEMA, {"replicas": 3, "storage": new},
                        {"replicas": 3, "storage": old})
    assert (errors == []) is ok


@pytest.mark.parametrize(("tls", "ok"), [({}, True), ({"renewBeforeDays": 89}, True),
                                         ({"renewBeforeDays": 90}, False),
                                         ({"certificateDays": 10, "renewBeforeDays": 20}, False)])
def test_cel_renewal_before_expiry(tls: dict[str, Any], ok: bool) -> None:
    spec = apply_defaults(SPEC_SCHEMA, {"replicas": 3, "security": {"tls": tls}})
    assert (cel_errors(SPEC_SCHEMA, spec) == []) is ok


@pytest.mark.parametrize(("timeout", "ok"), [(None, True), (501, True), (500, False)])
def test_cel_request_timeout_above_the_long_poll(timeout: int | None, ok: bool) -> None:
    config = {} if timeout is None else {"requestTimeoutMs": timeout}
    assert (cel_errors(SPEC_SCHEMA, {"replicas": 3, "config": config}) == []) is ok


# --- the objects the operator creates ----------------------------------------------------------


def test_operator_objects_are_valid_kubernetes_objects() -> None:
    owner = r.Owner("kq", "default", "0b6f2a52-7c1e-4c43-8d43-1ac39b0d2d3e")
    spec = parse_spec({"storage": {"storageClassName": "fast", "deleteClaims": True},
                       "resources": {"requests": {"cpu": "100m", "memory": 256}},
                       "template": {"priorityClassName": "high", "nodeSelector": {"a": "b"},
                                    "tolerations": [{"key": "k", "operator": "Exists"}]}})
    environment = r.node_environment(owner, spec, "cluster", (1, 2, 3))
    operator = r.OperatorPods("kafka-quorum-system", {"app.kubernetes.io/name": "kqo"})
    objects = [*r.owned_objects(owner, spec, environment, 3, operator),
               r.claim(owner, spec, 1, "c"),
               r.pod(owner, spec, 1, r.config_hash(spec, environment))]
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


# --- the quorum's name -------------------------------------------------------------------------

# Kubernetes' limits on what the operator names after the quorum: an object's name is a DNS
# subdomain; a Service's name a DNS-1035 label; a pod's hostname and subdomain, and a label's
# value, at most 63 characters; a certificate's DNS names RFC 1123 names.
SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
LABEL_MAX, SUBDOMAIN_MAX = 63, 253
LONGEST_NAMESPACE = "n" * LABEL_MAX
CLUSTER_DOMAIN = "cluster.local"


def name_functions() -> dict[str, Callable[..., str]]:
    """Every ``*_name`` function of resources.py: a new one is checked as soon as it exists."""
    return {name: f for name, f in vars(r).items()
            if name.endswith("_name") and inspect.isfunction(f)}


def label_maps(node: Any) -> Iterator[Mapping[str, str]]:
    if isinstance(node, list):
        for item in node:
            yield from label_maps(item)
    elif isinstance(node, Mapping):
        for key, value in node.items():
            if key in ("labels", "matchLabels", "selector") and isinstance(value, Mapping) \
                    and all(isinstance(v, str) for v in value.values()):
                yield value
            else:
                yield from label_maps(value)


def child_name_problems(name: str) -> list[str]:
    """What Kubernetes (or X.509) would refuse among the children of a quorum named ``name`` in
    the longest namespace: every name function with the longest arguments it is given (the
    highest node id, a configuration revision), and the objects the operator creates."""
    owner = r.Owner(name, LONGEST_NAMESPACE, "uid")
    spec = parse_spec({"security": {"tls": {"certManager": {"issuerRef": {"name": "ca"}}}}})
    ids = range(1, MAX_REPLICAS + 1)
    environment = r.node_environment(owner, spec, "cluster", ids)
    revision = r.config_hash(spec, environment)
    problems: list[str] = []

    def check(what: str, value: str, limit: int, pattern: re.Pattern[str]) -> None:
        if len(value) > limit or not pattern.fullmatch(value):
            problems.append(f"{what} {value!r}: more than {limit} characters or not "
                            f"{pattern.pattern}")

    arguments = {"node_id": MAX_REPLICAS, "revision": revision}
    for function_name, function in name_functions().items():
        extra = list(inspect.signature(function).parameters)[1:]
        check(function_name, function(name, *(arguments[p] for p in extra)), SUBDOMAIN_MAX,
              SUBDOMAIN)
    operator = r.OperatorPods("kafka-quorum-system", {"app.kubernetes.io/name": "kqo"})
    objects = [*r.owned_objects(owner, spec, environment, MAX_REPLICAS, operator),
               *(r.claim(owner, spec, i, "cluster") for i in ids),
               *(r.pod(owner, spec, i, revision) for i in ids),
               *r.certificates(owner, spec, ids, CLUSTER_DOMAIN),
               c.peer_secret(owner), c.tokens_secret(owner), c.ca_bundle(owner, b"")]
    for obj in objects:
        kind, meta = obj["kind"], obj["metadata"]
        check(f"{kind} name", meta["name"], SUBDOMAIN_MAX, SUBDOMAIN)
        if kind == "Service":
            check("Service name", meta["name"], LABEL_MAX, DNS_1035_LABEL)
        if kind == "Pod":
            check("pod hostname", obj["spec"]["hostname"], LABEL_MAX, DNS_LABEL)
            check("pod subdomain", obj["spec"]["subdomain"], LABEL_MAX, DNS_LABEL)
        if kind == "Certificate":
            for dns_name in obj["spec"].get("dnsNames", ()):
                check("certificate DNS name", dns_name, SUBDOMAIN_MAX, SUBDOMAIN)
                for part in dns_name.split("."):
                    check("certificate DNS label", part, LABEL_MAX, DNS_LABEL)
        for labels in label_maps(obj):
            for key, value in labels.items():
                check(f"{kind} label {key}", value, LABEL_MAX, LABEL_VALUE)
    ca = r.ca_subject(name, owner.namespace)
    check("CA common name", ca, r.MAX_COMMON_NAME, re.compile(".+"))
    return problems


def longest_working_name() -> int:
    return max(n for n in range(1, SUBDOMAIN_MAX + 1) if not child_name_problems("q" * n))


def test_the_longest_name_is_derived_from_every_child_name() -> None:
    """The limit the operator and the CRD enforce is the one every child's name allows: a new or
    longer child name fails here, not on a cluster."""
    longest = longest_working_name()
    assert child_name_problems("q" * (longest + 1)), "the limit must be the longest that works"
    assert longest == MAX_NAME_LENGTH, f"set spec.MAX_NAME_LENGTH and the CRD's rule to {longest}"
    root_rules = SCHEMA["x-kubernetes-validations"]
    assert any(rule["rule"] == f"size(self.metadata.name) <= {longest}"
               and str(longest) in rule["message"] for rule in root_rules)


def test_names_the_children_refuse() -> None:
    """A digit first or a dot makes the client Service's name invalid (what the CRD's pattern
    refuses); the node ids checked are the CRD's maximum of replicas."""
    assert SPEC_SCHEMA["properties"]["replicas"]["maximum"] == MAX_REPLICAS
    assert child_name_problems("1kq") and child_name_problems("kq.prod")
    assert child_name_problems("kq-0") == []


@pytest.mark.parametrize(("name", "refusal"), [
    ("kq", None),
    ("q", None),
    ("kq-0-a", None),
    ("q" * MAX_NAME_LENGTH, None),
    ("q" * (MAX_NAME_LENGTH + 1), f"at most {MAX_NAME_LENGTH} characters"),
    ("q" * 63, f"at most {MAX_NAME_LENGTH} characters"),
    ("1kq", "start with a letter"),
    ("kq.prod", "start with a letter"),
    ("kq-", "start with a letter"),
])
def test_cel_quorum_names(name: str, refusal: str | None) -> None:
    """The CRD's root rules, run by cel-python on the whole object, and the operator's own check
    (for a quorum created under an older CRD) refuse the same names, for the same reason."""
    doc = {"apiVersion": API_VERSION, "kind": KIND,
           "metadata": {"name": name, "namespace": "default"},
           "spec": apply_defaults(SPEC_SCHEMA, {"replicas": 3})}
    errors = cel_errors(SCHEMA, doc)
    if refusal is None:
        assert errors == []
        check_name(name)
    else:
        assert len(errors) == 1 and refusal in errors[0], errors
        with pytest.raises(SpecError) as refused:
            check_name(name)
        assert str(refused.value).startswith(f"{errors[0]}, got ")


def test_the_ca_of_a_long_name_in_a_long_namespace_can_be_generated() -> None:
    """X.509 allows a common name 64 characters: NAMESPACE/NAME CA exceeds it for long names."""
    name = "q" * MAX_NAME_LENGTH
    now = datetime.datetime.now(datetime.UTC)
    for namespace in ("default", LONGEST_NAMESPACE):
        common_name = r.ca_subject(name, namespace)
        certs.new_ca(common_name, now, datetime.timedelta(days=1))
    assert r.ca_subject("kq", "default") == "default/kq CA"
