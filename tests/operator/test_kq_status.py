"""Status, conditions, the remediation record, parsing of what nodes report, the objects the
operator creates (checked against the node's own configuration loader)."""

from __future__ import annotations

import ssl
from dataclasses import replace
from typing import Any

import pytest
from kafka_quorum_operator import ANNOTATION_CLIENT_TLS, LABEL_VOTER
from kafka_quorum_operator import resources as r
from kafka_quorum_operator.nodes import NodeClient, Route
from kafka_quorum_operator.observe import (
    ActionKind,
    PodView,
    _NodeStatus,
    members_from_status,
    parse_describe_quorum,
    parse_node_status,
    pending_from_status,
    pod_view,
)
from kafka_quorum_operator.plan import Action, plan, tls_switch_started
from kafka_quorum_operator.spec import Security, Spec, SpecError, parse_spec
from kafka_quorum_operator.status import (
    conditions,
    iso,
    remediation_detected,
    remediation_step,
    status_patch,
)
from kq_builders import DIRS, HASH, NEW, NOW, healthy, pending, replaced, with_spec

from quorum_node.node.api.openapi import SCHEMAS
from quorum_node.node.config import load_config


def condition_map(observed_plan: tuple[object, ...]) -> dict[str, tuple[str, str]]:
    observed, decided = observed_plan
    return {c["type"]: (c["status"], c["reason"])
            for c in conditions(observed, decided, [])}  # type: ignore[arg-type]


def test_conditions_of_a_healthy_quorum() -> None:
    observed = healthy()
    found = condition_map((observed, plan(observed)))
    assert found == {
        "Ready": ("True", "QuorumReady"), "Quorate": ("True", "LeaderElected"),
        "AllMembersReady": ("True", "PodsReady"), "MemberReplacing": ("False", "NoReplacement"),
        "QuorumLost": ("False", "MajorityIntact"), "Paused": ("False", "Reconciling"),
        "ScalingBlocked": ("False", "NotBlocked"), "Secured": ("True", "MutualTLS"),
        "ClaimsRefused": ("False", "NoneRefused"),
        "VolumeResizeBlocked": ("False", "NotBlocked"), "CreateRefused": ("False", "NoneRefused")}


def test_conditions_while_replacing_and_when_lost_and_paused() -> None:
    observed = replaced(healthy(), 3, lag=9)
    found = condition_map((observed, plan(observed)))
    assert found["MemberReplacing"] == ("True", "VolumeReplaced")
    assert found["Ready"][0] == "False"
    lost = healthy(quorum=None, nodes={1: healthy().nodes[1],
                                       2: replace(healthy().nodes[2], directory_id=NEW[2]),
                                       3: replace(healthy().nodes[3], directory_id=NEW[3])})
    found = condition_map((lost, plan(lost)))
    assert found["QuorumLost"] == ("True", "MajorityOfVolumesLost")
    assert found["Quorate"] == ("False", "QuorumLost")
    paused = with_spec(healthy(), paused=True)
    assert condition_map((paused, plan(paused)))["Paused"] == ("True", "SpecPaused")


def test_quorum_lost_message_names_survivors_and_their_log_end() -> None:
    lost = healthy(quorum=None, nodes={1: healthy().nodes[1],
                                       2: replace(healthy().nodes[2], directory_id=NEW[2]),
                                       3: replace(healthy().nodes[3], directory_id=NEW[3])})
    message = next(c["message"] for c in conditions(lost, plan(lost), [])
                   if c["type"] == "QuorumLost")
    assert "voters 2, 3 of 3" in message and "node 1 (log end offset 100)" in message
    assert "docs/operator.md" in message


def test_transition_time_moves_only_with_the_status() -> None:
    observed = healthy()
    before = [{"type": "Ready", "status": "True", "lastTransitionTime": "2020-01-01T00:00:00Z"},
              {"type": "Quorate", "status": "False", "lastTransitionTime": "2020-01-01T00:00:00Z"}]
    found = {c["type"]: c for c in conditions(observed, plan(observed), before)}
    assert found["Ready"]["lastTransitionTime"] == "2020-01-01T00:00:00Z"
    assert found["Quorate"]["lastTransitionTime"] == iso(NOW)
    assert all(c["observedGeneration"] == 1 for c in found.values())


def test_status_round_trips_members_and_pending() -> None:
    observed = replace(replaced(healthy(), 3, since=NOW - 2),
                       pending=pending("AddVoter", 3, NEW[3], old=DIRS[3]))
    decided = plan(observed)
    status = status_patch(observed, decided, {}, "sel")
    assert status["voters"] == 3 and status["leaderId"] == 1 and status["replicas"] == 3
    assert status["pendingChange"]["directoryId"] == NEW[3]
    members = members_from_status(status)
    assert members[3].caught_up_since == NOW - 2
    assert members[3].directory_id == DIRS[3] and members[3].claim_uid == "claim-3"
    assert pending_from_status(status) == decided.pending
    entry = next(m for m in status["members"] if m["nodeId"] == 3)
    assert entry["currentDirectoryId"] == NEW[3] and entry["role"] == "observer"


@pytest.mark.parametrize("kind", ["CreatePod", "DeleteClaim", "Rename", 3])
def test_a_recorded_change_of_no_voter_change_kind_is_ignored(kind: object) -> None:
    """status.pendingChange names a voter change (``VOTER_CHANGES``); any other kind is not
    resumed as one (before kinds were typed, it was sent as a RemoveVoter)."""
    recorded = pending("AddVoter", 3, NEW[3]).to_status()
    assert pending_from_status({"pendingChange": recorded}) is not None
    assert pending_from_status({"pendingChange": {**recorded, "kind": kind}}) is None


def test_remediation_record_steps_and_duration() -> None:
    record = remediation_detected(None, 3, DIRS[3], NOW)
    assert record is not None and record["result"] == "InProgress"
    assert remediation_detected(record, 3, DIRS[3], NOW + 5) is None
    add = Action(ActionKind.ADD_VOTER, 3, "Remediation", NEW[3], DIRS[3])
    record = remediation_step(record, add, ok=True, message="committed", started=NOW + 10,
                              now=NOW + 11)
    assert record is not None
    assert [s["name"] for s in record["steps"]] == ["Detected", "CaughtUp", "AddVoter"]
    assert record["steps"][1]["durationSeconds"] == 10.0
    remove = Action(ActionKind.REMOVE_VOTER, 3, "Remediation", DIRS[3])
    record = remediation_step(record, remove, ok=True, message="committed", started=NOW + 12,
                              now=NOW + 12.5)
    assert record is not None and record["result"] == "Succeeded"
    assert record["durationSeconds"] == 12.5 and record["newDirectoryId"] == NEW[3]
    scale = Action(ActionKind.ADD_VOTER, 4, "ScaleUp", NEW[4])
    assert remediation_step(record, scale, ok=True, message="", started=NOW, now=NOW) is None


# --- parsing ------------------------------------------------------------------------------------

NODE_STATUS = {  # GET /v1/node of a follower (quorum_node.node.api.admin.node_status_json)
    "node_id": 2, "directory_id": "A" * 22, "cluster_id": "abc", "state": "follower",
    "epoch": 7, "leader_id": 1, "is_voter": True, "high_watermark": 41, "voters_unheard": [],
    "log_start_offset": 0,
    "log_end_offset": 42, "voters": [{"id": 1, "directory_id": "B" * 22}],
    "client_endpoints": [{"id": 1, "url": "https://kq-1:9093"}], "failure": None,
}


def test_parse_node_status() -> None:
    view = parse_node_status(NODE_STATUS)
    assert view is not None
    assert (view.node_id, view.directory_id, view.state, view.leader_id, view.epoch,
            view.log_end_offset, view.high_watermark, view.is_observer) == (
        2, "A" * 22, "follower", 1, 7, 42, 41, False)
    unknown = parse_node_status({**NODE_STATUS, "leader_id": None, "high_watermark": -1,
                                 "is_voter": False})
    assert unknown is not None and unknown.leader_id is None and unknown.high_watermark is None
    assert unknown.is_observer
    broken: object
    for broken in (None, [], {"some": "thing"}, {**NODE_STATUS, "node_id": "2"},
                   {k: v for k, v in NODE_STATUS.items() if k != "epoch"}):
        assert parse_node_status(broken) is None, broken


def test_the_node_status_read_is_what_the_node_describes() -> None:
    """The answer above is one the node's OpenAPI description allows, whole, and every field
    the operator reads of it is one the description requires."""
    schema = SCHEMAS["NodeStatus"]
    kinds = {"integer": int, "string": str, "boolean": bool, "array": list}
    assert set(NODE_STATUS) == set(schema["required"])
    for name, value in NODE_STATUS.items():
        described = schema["properties"][name]
        assert isinstance(value, kinds[described["type"]]) or \
            (value is None and described.get("nullable")), (name, value, described)
    assert set(_NodeStatus.model_fields) <= set(schema["required"])


def test_parse_describe_quorum() -> None:
    body = {"cluster_id": "c", "leader_id": 2, "leader_epoch": 4, "high_watermark": 9,
            "voters": [{"id": 2, "directory_id": "x", "log_end_offset": 9, "lag": 0,
                        "last_fetch_timestamp": 5, "last_caught_up_timestamp": 5}],
            "observers": [{"id": 3, "directory_id": None, "log_end_offset": -1, "lag": -1,
                           "last_fetch_timestamp": -1, "last_caught_up_timestamp": -1,
                           "could_be_voter": False}]}
    view = parse_describe_quorum(body)
    assert view.leader_id == 2 and view.now_ms == 5 and view.voters[0].key == (2, "x")
    assert view.observers[0].directory_id is None
    with pytest.raises(ValueError, match="malformed"):
        parse_describe_quorum({"voters": []})


def test_pod_view() -> None:
    owner = r.Owner("kq", "ns", "uid-1")
    body = r.pod(owner, Spec(), 2, "hash")
    body["status"] = {"phase": "Running", "podIP": "10.1.1.1",
                      "conditions": [{"type": "Ready", "status": "True"}]}
    view = pod_view(body)
    assert view is not None
    assert (view.node_id, view.ready, view.running, view.config_hash, view.claim_name) == (
        2, True, True, "hash", "data-kq-2")
    assert pod_view({"metadata": {"name": "other"}}) is None


def running_pod(node_id: int, spec: Spec) -> dict[str, Any]:
    """The pod the operator creates for ``node_id``, running and ready."""
    body = r.pod(r.Owner("kq", "ns", "uid-1"), spec, node_id, HASH)
    body["metadata"]["uid"] = f"pod-{node_id}"
    body["status"] = {"phase": "Running", "podIP": f"10.0.0.{node_id}",
                      "conditions": [{"type": "Ready", "status": "True"}]}
    return body


def istio_rewritten(body: dict[str, Any]) -> dict[str, Any]:
    """The pod as Istio's sidecar injector leaves it: its HTTP probes point at the agent's port,
    over plain HTTP, whatever the node's listener speaks."""
    container = body["spec"]["containers"][0]
    for probe, path in (("readinessProbe", "readyz"), ("livenessProbe", "healthz")):
        container[probe]["httpGet"] = {"path": f"/app-health/node/{path}", "port": 15020,
                                       "scheme": "HTTP"}
    return body


@pytest.mark.parametrize("tls", [True, False])
def test_a_pods_tls_mode_is_its_annotation_not_its_rewritten_probe(tls: bool) -> None:
    """A quorum whose probes a service mesh rewrote is not switched (nor rolled) for it."""
    spec = Spec(security=Security(tls=tls))
    views: dict[int, PodView] = {}
    for i in (1, 2, 3):
        view = pod_view(istio_rewritten(running_pod(i, spec)))
        assert view is not None and view.tls is tls
        views[i] = view
    observed = with_spec(replace(healthy(), pods=views), security=Security(tls=tls))
    assert tls_switch_started(observed, None) is None
    assert plan(observed).actions == ()


def test_an_ipv6_pod_is_reached_at_its_bracketed_address() -> None:
    """A pod of an IPv6-only cluster: the operator's URLs for it bracket its IP."""
    body = running_pod(1, Spec())
    body["status"]["podIP"] = "fd00::5"
    view = pod_view(body)
    assert view is not None
    address = view.address(9093)
    assert address == "[fd00::5]:9093"
    nodes = NodeClient()
    nodes.route(address, Route(r.node_host("kq", "ns", 1), ssl.create_default_context()))
    target = nodes._target(address, "/v1/node")
    assert target is not None and target[0] == "https://[fd00::5]:9093/v1/node"
    # Its node listens on every interface, IPv6 included.
    environment = r.node_environment(r.Owner("kq", "ns", "uid-1"), Spec(), "cluster", (1, 2, 3))
    assert all(listener.startswith(("CLIENT://:", "CONTROLLER://:"))
               for listener in environment[r.env_var("listeners")].split(","))


@pytest.mark.parametrize("tls", [True, False])
def test_a_pod_of_an_older_operator_has_its_tls_mode_read_from_its_probe(tls: bool) -> None:
    body = running_pod(1, Spec(security=Security(tls=tls)))
    del body["metadata"]["annotations"][ANNOTATION_CLIENT_TLS]
    view = pod_view(body)
    assert view is not None and view.tls is tls


# --- the objects ---------------------------------------------------------------------------------


def test_the_node_accepts_the_configuration_the_operator_writes() -> None:
    owner = r.Owner("kq", "prod", "uid")
    spec = parse_spec({"config": {"fetchTimeoutMs": 3000, "requestTimeoutMs": 2500,
                                  "snapshotIntervalRecords": 100}})
    env = r.node_environment(owner, spec, "MkU3OEVBNTcwNTJENDM2Qg", (1, 2, 3))
    pod = r.pod(owner, spec, 2, r.config_hash(spec, env))
    for item in pod["spec"]["containers"][0]["env"]:
        env[item["name"]] = item["value"]
    config = load_config(None, {}, env)
    assert config.node_id == 2
    # The peers on the controller port, clients redirected to the client port.
    assert [(v.id, v.host, v.port) for v in config.voters] == [
        (i, f"kq-{i}.kq-nodes.prod.svc", 9094) for i in (1, 2, 3)]
    assert [(e.id, e.host, e.port) for e in config.voter_client_endpoints] == [
        (i, f"kq-{i}.kq-nodes.prod.svc", 9093) for i in (1, 2, 3)]
    assert config.controller_listener.port == 9094 and config.client_listeners[0].port == 9093
    assert str(config.log_dir) == "/var/lib/quorum/data" and config.format_if_empty
    assert config.quorum.fetch_timeout_ms == 3000 and config.snapshot_interval_records == 100


def test_config_hash_follows_what_needs_a_restart() -> None:
    spec = Spec()
    env = {"A": "1"}
    assert r.config_hash(spec, env) == r.config_hash(Spec(), {"A": "1"})
    assert r.config_hash(spec, {"A": "2"}) != r.config_hash(spec, env)
    assert r.config_hash(replace(spec, image="other:1"), env) != r.config_hash(spec, env)
    assert r.config_hash(replace(spec, controller_port=9500), env) != r.config_hash(spec, env)
    assert r.config_hash(replace(spec, paused=True), env) == r.config_hash(spec, env)


@pytest.mark.parametrize(("voters", "min_available"), [(3, 2), (4, 3), (5, 3), (7, 4)])
def test_disruption_budget_is_a_majority(voters: int, min_available: int) -> None:
    owner = r.Owner("kq", "ns", "u")
    pdb = r.disruption_budget(owner, voters)
    assert pdb is not None and pdb["spec"]["minAvailable"] == min_available
    # The voters' pods only: a new member's unready pod would hold a scale-up's roll for ever.
    assert pdb["spec"]["selector"]["matchLabels"] == {**r.labels("kq"), LABEL_VOTER: "true"}
    assert pdb in r.owned_objects(owner, Spec(), {}, voters, r.OperatorPods("ns", {}))
    assert r.withdrawn_objects(owner, voters) == []


@pytest.mark.parametrize("voters", [1, 2])
def test_no_disruption_budget_where_a_majority_is_every_voter(voters: int) -> None:
    """One or two voters: any disruption stops the quorum, and a budget allowing none would
    block every drain for good; none is made, and one left from more voters is deleted."""
    owner = r.Owner("kq", "ns", "u")
    assert r.disruption_budget(owner, voters) is None
    kinds = {o["kind"] for o in r.owned_objects(owner, Spec(), {}, voters,
                                                 r.OperatorPods("ns", {}))}
    assert "PodDisruptionBudget" not in kinds
    assert r.withdrawn_objects(owner, voters) == [("PodDisruptionBudget", "kq")]


def test_pods_are_locked_down() -> None:
    pod = r.pod(r.Owner("kq", "ns", "u"), Spec(), 1, "h")
    container = pod["spec"]["containers"][0]["securityContext"]
    assert container == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                         "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["spec"]["automountServiceAccountToken"] is False


def test_claims_outlive_the_quorum_unless_asked() -> None:
    owner = r.Owner("kq", "ns", "u")
    assert "ownerReferences" not in r.claim(owner, Spec(), 1, "c")["metadata"]
    deleting = parse_spec({"storage": {"deleteClaims": True, "storageClassName": "fast"}})
    body = r.claim(owner, deleting, 1, "c")
    assert body["metadata"]["ownerReferences"][0]["uid"] == "u"
    assert body["spec"]["storageClassName"] == "fast"


def test_differs() -> None:
    assert not r.differs({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}, "d": 3})
    assert r.differs({"a": [1, 2]}, {"a": [1]})
    assert r.differs({"a": {"b": 1}}, {"a": {"b": 2}})


@pytest.mark.parametrize("bad", [{"replicas": 0}, {"replicas": "3"}, {"storage": []},
                                 {"config": {"bogus": 1}}, {"image": ""}])
def test_spec_errors(bad: dict[str, object]) -> None:
    with pytest.raises(SpecError):
        parse_spec(bad)
