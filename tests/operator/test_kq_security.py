"""The operator's side of security: the certificates and Secrets it generates (a certificate
verifies against the quorum's CA, names and roles as the node expects, renewal and CA rotation
by the clock), the cert-manager Certificates, the NetworkPolicy, the pods' mounts and
configuration, the pod security of everything the chart and the operator run; and, in the
harness (real node processes), a secured quorum that refuses clients without credentials,
accepts the operator's, and renews certificates that the nodes pick up without a restart; and a
quorum with security off, warned about.
"""

from __future__ import annotations

import asyncio
import datetime
import http.client
import itertools
import socket
import ssl
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import kubernetes_validate
import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID
from kafka_quorum_operator import KIND, certs
from kafka_quorum_operator import credentials as c
from kafka_quorum_operator import resources as r
from kafka_quorum_operator.keeper import Keeper, SecretNotOwned
from kafka_quorum_operator.kube import KubeError, path
from kafka_quorum_operator.nodes import NodeClient, Route, client_context
from kafka_quorum_operator.observe import TLS_SWITCH_STAGES, TlsSwitch
from kafka_quorum_operator.plan import plan
from kafka_quorum_operator.reconcile import CR_API
from kafka_quorum_operator.spec import SpecError, parse_spec
from kafka_quorum_operator.status import conditions
from kq_builders import healthy, with_spec
from kq_cluster import NAME, Cluster, create_ready
from kq_harness import NAMESPACE, condition, cr_path, quorum_object

from quorum_node.node.config import load_config
from quorum_node.security.peer_identity import PeerPrincipals
from quorum_node.security.roles import Role, parse_principal_grants, roles_of_principal
from quorum_node.security.tokens import TokenTable

K8S_VERSION = "1.33.0"
OWNER = r.Owner("kq", "prod", "0b6f2a52-7c1e-4c43-8d43-1ac39b0d2d3e")
NOW = datetime.datetime(2026, 3, 1, tzinfo=datetime.UTC)
DAY = datetime.timedelta(days=1)
DOMAIN = "cluster.local"
GRANTS = parse_principal_grants(r.CERTIFICATE_ROLES)


def authority(now: datetime.datetime = NOW) -> c.Authority:
    made, change = c.next_authority(None, "prod/kq CA", now)
    assert change == "CA generated"
    return made


def leaf(ca: c.Authority, wanted: certs.Wanted, now: datetime.datetime = NOW
         ) -> dict[str, bytes]:
    data, why = c.next_leaf(None, ca, wanted, now, validity=90 * DAY, renew_before=30 * DAY)
    assert data is not None and why == "issued (missing)"
    return data


def load(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


# --- certificates -------------------------------------------------------------------------------


def test_node_certificate_chains_to_the_ca_names_the_pod_and_is_a_peer() -> None:
    ca = authority()
    data = leaf(ca, c.node_wanted(OWNER, 2, DOMAIN))
    certificate = load(data["tls.crt"])
    certificate.verify_directly_issued_by(load(ca.signing.certificate))
    assert data["ca.crt"] == ca.bundle == ca.signing.certificate
    names = certificate.extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert names == ["kq-2.kq-nodes.prod.svc", "kq-2.kq-nodes.prod.svc.cluster.local",
                     "kq-nodes.prod.svc", "kq-nodes.prod.svc.cluster.local",
                     "kq", "kq.prod", "kq.prod.svc", "kq.prod.svc.cluster.local"]
    # The name the nodes and the operator reach it by (controller.quorum.voters).
    assert r.node_host("kq", "prod", 2) in names
    usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert not certificate.extensions.get_extension_for_class(
        x509.BasicConstraints).value.ca
    principal = certs.describe(certificate).common_name
    assert principal == "quorum-node-2"
    # The peer node 2 by the nodes' default auth.peer.principal.template, and nothing else.
    assert PeerPrincipals().node_id_of(principal) == 2
    assert roles_of_principal(GRANTS, principal) == frozenset()


def test_operator_certificate_is_an_admin_client_only() -> None:
    ca = authority()
    certificate = load(leaf(ca, c.OPERATOR_WANTED)["tls.crt"])
    certificate.verify_directly_issued_by(load(ca.signing.certificate))
    assert certs.describe(certificate) == certs.Wanted("quorum-operator", (), server=False)
    assert list(certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) \
        == [ExtendedKeyUsageOID.CLIENT_AUTH]
    roles = roles_of_principal(GRANTS, "quorum-operator")
    assert Role.ADMIN in roles and PeerPrincipals().node_id_of("quorum-operator") is None


def test_a_certificate_of_another_ca_does_not_verify() -> None:
    other = authority()
    data = leaf(authority(), c.node_wanted(OWNER, 1, DOMAIN))
    with pytest.raises(InvalidSignature):
        load(data["tls.crt"]).verify_directly_issued_by(load(other.signing.certificate))


def test_certificates_never_outlive_their_ca() -> None:
    ca = authority()
    late = NOW + 3640 * DAY
    issued = certs.issue(ca.signing, c.OPERATOR_WANTED, late, 90 * DAY)
    assert certs.not_after(issued.certificate) == certs.not_after(ca.signing.certificate)


def test_kept_while_valid_renewed_before_expiry() -> None:
    ca = authority()
    wanted = c.node_wanted(OWNER, 1, DOMAIN)
    data = leaf(ca, wanted)
    keep = {"validity": 90 * DAY, "renew_before": 30 * DAY}
    # Pass after pass: nothing changes.
    for later in (NOW, NOW + DAY, NOW + 59 * DAY):
        assert c.next_leaf(data, ca, wanted, later, **keep) == (None, None)
    renewed, why = c.next_leaf(data, ca, wanted, NOW + 61 * DAY, **keep)
    assert renewed is not None and why is not None and why.startswith("issued (expires")
    assert renewed["tls.key"] != data["tls.key"]
    assert certs.not_after(renewed["tls.crt"]) > certs.not_after(data["tls.crt"])


@pytest.mark.parametrize("damage", ["names", "other CA", "key", "garbage", "no key"])
def test_reissued_when_it_no_longer_fits(damage: str) -> None:
    ca = authority()
    wanted = c.node_wanted(OWNER, 1, DOMAIN)
    data = leaf(ca, wanted)
    if damage == "names":
        wanted = c.node_wanted(OWNER, 1, "example.internal")
    elif damage == "other CA":
        data = leaf(authority(), wanted)
    elif damage == "key":
        data = {**data, "tls.key": leaf(ca, wanted)["tls.key"]}
    elif damage == "garbage":
        data = {**data, "tls.crt": b"-----BEGIN CERTIFICATE-----\nAAAA\n"}
    else:
        data = {k: v for k, v in data.items() if k != "tls.key"}
    renewed, why = c.next_leaf(data, ca, wanted, NOW, validity=90 * DAY,
                               renew_before=30 * DAY)
    assert renewed is not None and why is not None and why.startswith("issued")
    assert certs.renewal_reason(certs.KeyPair(renewed["tls.crt"], renewed["tls.key"]),
                                ca.signing.certificate, wanted, NOW, 30 * DAY) is None


def test_a_new_bundle_keeps_the_certificate() -> None:
    ca = authority()
    wanted = c.node_wanted(OWNER, 1, DOMAIN)
    data = leaf(ca, wanted)
    successor = authority()
    wider = c.Authority(ca.signing, certs.bundle([ca.bundle, successor.signing.certificate]))
    updated, why = c.next_leaf(data, wider, wanted, NOW, validity=90 * DAY,
                               renew_before=30 * DAY)
    assert why == "CA bundle updated" and updated is not None
    assert (updated["tls.crt"], updated["tls.key"]) == (data["tls.crt"], data["tls.key"])
    assert updated["ca.crt"] == wider.bundle


def test_ca_rotation_trusts_the_successor_before_it_signs() -> None:
    ca = authority()
    assert c.next_authority(ca, "x", NOW + 3000 * DAY) == (ca, None)
    # A year before it expires: a successor, trusted (in the bundle) but not signing yet.
    step1, change = c.next_authority(ca, "x", NOW + 3300 * DAY)
    assert change is not None and change.startswith("successor CA generated")
    assert step1.signing == ca.signing and step1.next is not None
    assert len(x509.load_pem_x509_certificates(step1.bundle)) == 2
    assert c.Authority.from_data(step1.to_data()) == step1  # what the Secret keeps
    assert c.next_authority(step1, "x", NOW + 3300 * DAY + c.CA_PROPAGATION / 2) == \
        (step1, None)
    # Once every node had the time to trust it, the successor signs; both stay trusted.
    step2, change = c.next_authority(step1, "x", NOW + 3300 * DAY + c.CA_PROPAGATION)
    assert change == "CA rotated: the successor CA signs"
    assert step2.signing == step1.next and step2.next is None
    assert len(x509.load_pem_x509_certificates(step2.bundle)) == 2
    # Every certificate is issued again by the successor.
    old = leaf(ca, c.OPERATOR_WANTED)
    renewed, why = c.next_leaf(old, step2, c.OPERATOR_WANTED, NOW + 3301 * DAY,
                               validity=90 * DAY, renew_before=30 * DAY)
    assert renewed is not None and why == "issued (not signed by the current CA)"
    load(renewed["tls.crt"]).verify_directly_issued_by(load(step2.signing.certificate))
    # The old CA leaves the bundle when it expires.
    step3, change = c.next_authority(step2, "x", NOW + 3651 * DAY)
    assert change == "expired CA left the bundle"
    assert step3.bundle == step2.signing.certificate


def test_broken_ca_is_generated_anew() -> None:
    ca = authority()
    broken = c.Authority(certs.KeyPair(ca.signing.certificate, authority().signing.key),
                         ca.bundle)
    fresh, change = c.next_authority(broken, "x", NOW)
    assert change == "CA generated" and fresh.signing != ca.signing


def test_admin_token_is_the_nodes_token_file_entry() -> None:
    data = c.new_tokens()
    table = TokenTable.parse(data["tokens"].decode(), "tokens")
    holder = table.lookup(data["admin-token"].decode())
    assert holder is not None and holder.principal == "quorum-operator"
    assert Role.ADMIN in holder.roles
    assert len(data["admin-token"]) >= 40
    assert c.new_tokens()["admin-token"] != data["admin-token"]


def test_secrets_are_owned_valid_and_round_trip() -> None:
    data = leaf(authority(), c.node_wanted(OWNER, 1, DOMAIN))
    secret = c.secret(OWNER, r.node_secret_name("kq", 1), data)
    tokens = c.tokens_secret(OWNER)
    bundle = c.ca_bundle(OWNER, data["ca.crt"])
    for obj in (secret, tokens, bundle):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        assert obj["metadata"]["ownerReferences"] == [OWNER.reference()]
    assert secret["type"] == "kubernetes.io/tls" and tokens["type"] == "Opaque"
    assert c.decode(secret) == data
    assert "tls.key" not in bundle["data"] and bundle["data"]["ca.crt"] == data["ca.crt"].decode()


# --- the Keeper against an API that only stores ------------------------------------------------


class FakeKube:
    """get, create and merge-patch of Secrets, counted."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.writes: list[str] = []

    async def get(self, url: str) -> dict[str, Any] | None:
        return self.objects.get(url)

    async def create(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        key = f"{url}/{body['metadata']['name']}"
        if key in self.objects:
            raise KubeError(409, "exists")
        self.objects[key] = body
        self.writes.append(f"create {body['metadata']['name']}")
        return body

    async def patch(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        data = self.objects[url]["data"]
        for key, value in body["data"].items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        self.writes.append(f"patch {url.rsplit('/', 1)[1]}")
        return self.objects[url]


async def test_keeper_generates_once_and_renews_by_the_clock() -> None:
    kube = FakeKube()
    clock = [NOW.timestamp()]
    keeper = Keeper(kube, clock=lambda: clock[0])  # type: ignore[arg-type]
    spec = parse_spec({})
    secured = await keeper.secure(OWNER, spec, [1, 2, 3])
    assert sorted(kube.writes) == sorted(
        f"create {n}" for n in ("kq-peer", "kq-ca", "kq-tokens", "kq-operator", "kq-node-1",
                                "kq-node-2", "kq-node-3"))
    assert [o["kind"] for o in secured.objects] == ["ConfigMap"]  # the CA bundle
    assert len(secured.changes) == 7
    tokens = kube.objects[path("Secret", "prod", "kq-tokens")]["data"]
    peer = kube.objects[path("Secret", "prod", "kq-peer")]["data"]
    for _ in range(3):
        assert (await keeper.secure(OWNER, spec, [1, 2, 3])).changes == []
    assert len(kube.writes) == 7
    assert await keeper.client_tls(OWNER, spec) is not None
    # Scale-up: only the new node's certificate.
    await keeper.secure(OWNER, spec, [1, 2, 3, 4, 5])
    assert kube.writes[7:] == ["create kq-node-4", "create kq-node-5"]
    # 61 days on, within renewBeforeDays (30) of the 90 days: every certificate, in place.
    clock[0] += 61 * 86400
    keeper._cache.clear()  # as RECHECK_S later
    renewed = await keeper.secure(OWNER, spec, [1, 2, 3, 4, 5])
    assert kube.objects[path("Secret", "prod", "kq-peer")]["data"] == peer  # never
    assert sorted(kube.writes[9:]) == sorted(
        f"patch {n}" for n in ("kq-operator", *(f"kq-node-{i}" for i in range(1, 6))))
    assert all("expires" in change for change in renewed.changes)
    assert kube.objects[path("Secret", "prod", "kq-tokens")]["data"] == tokens  # never
    assert (await keeper.secure(OWNER, spec, [1, 2, 3, 4, 5])).changes == []


async def test_keeper_refuses_a_secret_it_does_not_own() -> None:
    """A ``NAME-ca`` Secret made by someone else (planted, or left by a KafkaQuorum of the same
    name before) is never adopted: nothing is signed with it, nothing is written."""
    kube = FakeKube()
    planted = c.secret(r.Owner("kq", "prod", "someone-else"), "kq-ca",
                       c.next_authority(None, "planted", NOW)[0].to_data())
    kube.objects[path("Secret", "prod", "kq-ca")] = planted
    keeper = Keeper(kube)  # type: ignore[arg-type]
    with pytest.raises(SecretNotOwned, match="not owned by KafkaQuorum kq"):
        await keeper.secure(OWNER, parse_spec({}), [1, 2, 3])
    assert not [w for w in kube.writes if "kq-ca" in w or "node" in w]
    assert kube.objects[path("Secret", "prod", "kq-ca")] is planted


async def test_keeper_with_security_off_or_cert_manager() -> None:
    kube = FakeKube()
    keeper = Keeper(kube)  # type: ignore[arg-type]
    off = parse_spec({"security": {"tls": {"enabled": False}}})
    assert (await keeper.secure(OWNER, off, [1, 2, 3])).objects == []
    # Without TLS: the peer secret only.
    assert await keeper.client_tls(OWNER, off) is None and kube.writes == ["create kq-peer"]
    managed = parse_spec({"security": {"tls": {"certManager": {"issuerRef": {"name": "ca"}}}}})
    secured = await keeper.secure(OWNER, managed, [1, 2, 3])
    assert kube.writes[1:] == ["create kq-tokens"]  # certificates are cert-manager's
    assert [o["kind"] for o in secured.objects] == ["Certificate"] * 4
    assert await keeper.client_tls(OWNER, managed) is None  # until cert-manager issued it


# --- cert-manager -------------------------------------------------------------------------------


def test_cert_manager_certificates() -> None:
    spec = parse_spec({"security": {"tls": {"certificateDays": 30, "renewBeforeDays": 10,
                                            "certManager": {"issuerRef": {
                                                "name": "quorum-ca", "kind": "ClusterIssuer"}}}}})
    found = {o["metadata"]["name"]: o for o in r.certificates(OWNER, spec, [1, 2, 3], DOMAIN)}
    assert sorted(found) == ["kq-node-1", "kq-node-2", "kq-node-3", "kq-operator"]
    node = found["kq-node-2"]
    assert node["apiVersion"] == "cert-manager.io/v1" and node["kind"] == "Certificate"
    assert node["metadata"]["ownerReferences"] == [OWNER.reference()]
    assert node["spec"]["secretName"] == r.node_secret_name("kq", 2)
    assert node["spec"]["commonName"] == "quorum-node-2"
    assert node["spec"]["dnsNames"] == list(r.node_dns_names("kq", "prod", 2, DOMAIN))
    assert node["spec"]["usages"] == ["digital signature", "server auth", "client auth"]
    assert node["spec"]["issuerRef"] == {"name": "quorum-ca", "kind": "ClusterIssuer",
                                         "group": "cert-manager.io"}
    assert (node["spec"]["duration"], node["spec"]["renewBefore"]) == ("720h", "240h")
    operator = found["kq-operator"]["spec"]
    assert operator["secretName"] == r.operator_secret_name("kq")
    assert operator["commonName"] == "quorum-operator" and "dnsNames" not in operator
    assert operator["usages"] == ["digital signature", "client auth"]
    assert PeerPrincipals().node_id_of(node["spec"]["commonName"]) is not None


# --- the objects: pods, configuration, NetworkPolicy ------------------------------------------


def secured_pod(spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
    parsed = parse_spec(spec)
    env = r.node_environment(OWNER, parsed, "MkU3OEVBNTcwNTJENDM2Qg", (1, 2, 3))
    return r.pod(OWNER, parsed, 2, r.config_hash(parsed, env))


def test_secured_pods_mount_their_own_secrets_read_only() -> None:
    pod = secured_pod()
    container = pod["spec"]["containers"][0]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert mounts["tls"] == {"name": "tls", "mountPath": "/etc/quorum/tls", "readOnly": True}
    assert mounts["auth"] == {"name": "auth", "mountPath": "/etc/quorum/auth", "readOnly": True}
    assert not any("subPath" in m for m in mounts.values())  # would never be updated
    assert volumes["tls"]["secret"] == {"secretName": "kq-node-2", "defaultMode": 0o440}
    assert volumes["auth"]["secret"] == {"secretName": "kq-tokens", "defaultMode": 0o440,
                                         "items": [{"key": "tokens", "path": "tokens"}]}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_the_node_accepts_the_secured_configuration() -> None:
    spec = parse_spec({})
    env = r.node_environment(OWNER, spec, "MkU3OEVBNTcwNTJENDM2Qg", (1, 2, 3))
    env["QUORUM_NODE_ID"] = "2"
    config = load_config(None, {}, env)
    # SSL on both listeners: clients on 9093, the peers on a controller listener of their own.
    assert [str(listener) for listener in config.listeners] == [
        "CLIENT://:9093", "CONTROLLER://:9094"]
    assert all(listener.tls for listener in config.listeners)
    assert config.controller_listener.name == "CONTROLLER"
    assert [v.port for v in config.voters] == [9094] * 3
    assert [e.port for e in config.voter_client_endpoints] == [9093] * 3
    assert str(config.ssl_certificate_location) == "/etc/quorum/tls/tls.crt"
    assert str(config.ssl_key_location) == "/etc/quorum/tls/tls.key"
    assert str(config.ssl_ca_location) == "/etc/quorum/tls/ca.crt"
    assert str(config.auth_token_file) == "/etc/quorum/auth/tokens"
    assert config.ssl_endpoint_identification_algorithm == "https"
    assert config.auth_certificate_roles == r.CERTIFICATE_ROLES


def test_security_off_is_plain_with_the_peer_secret_only() -> None:
    """Without TLS the peers still prove they are peers: every peer RPC carries the quorum's
    secret (the node refuses a PLAINTEXT controller listener without one beside an SSL one)."""
    spec = parse_spec({"security": {"tls": {"enabled": False}}})
    env = r.node_environment(OWNER, spec, "MkU3OEVBNTcwNTJENDM2Qg", (1, 2, 3))
    assert env["QUORUM_LISTENERS"] == "CLIENT://:9093,CONTROLLER://:9094"
    assert env["QUORUM_LISTENER_SECURITY_PROTOCOL_MAP"] == "CLIENT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    assert not any(k.startswith(("QUORUM_SSL_", "QUORUM_AUTH_")) for k in env)
    assert env["QUORUM_CONTROLLER_LISTENER_SECRET_FILE"] == "/etc/quorum/peer/secret"
    pod = r.pod(OWNER, spec, 1, r.config_hash(spec, env))
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["data", "peer"]
    assert pod["spec"]["volumes"][1]["secret"]["secretName"] == "kq-peer"
    assert pod["spec"]["containers"][0]["readinessProbe"]["httpGet"]["scheme"] == "HTTP"
    secured = r.node_environment(OWNER, parse_spec({}), "MkU3OEVBNTcwNTJENDM2Qg", (1, 2, 3))
    # Switching security rolls every pod.
    assert r.config_hash(spec, env) != r.config_hash(parse_spec({}), secured)


def _stages(to_tls: bool) -> list[TlsSwitch | None]:
    """A TLS switch's configurations in order: the steady one it starts from, its stages, the
    steady one it ends in (None: steady)."""
    return [None, *(TlsSwitch(to_tls, stage) for stage in range(1, TLS_SWITCH_STAGES + 1)), None]


def _node_config(spec: Any, switch: TlsSwitch | None, node_id: int) -> Any:
    env = r.node_environment(OWNER, spec, "MkU3OEVBNTcwNTJENDM2Qg", (1, 2, 3), switch)
    env["QUORUM_NODE_ID"] = str(node_id)
    return load_config(None, {}, env)


@pytest.mark.parametrize("to_tls", [True, False])
def test_every_stage_of_a_tls_switch_can_talk_to_its_neighbours(to_tls: bool) -> None:
    """A one-at-a-time roll from one stage to the next leaves nodes of both stages: each must
    connect to every peer on a listener the peer serves, in the protocol the peer serves there
    (the node accepts each stage's configuration). Pod and probe follow the client listener."""
    specs = [parse_spec({"security": {"tls": {"enabled": not to_tls}}}),
             *[parse_spec({"security": {"tls": {"enabled": to_tls}}})] * 5]
    configs = [_node_config(spec, switch, 1) for spec, switch in zip(
        specs, _stages(to_tls), strict=True)]
    assert [c.controller_listener.tls for c in configs] == [
        not to_tls, not to_tls, to_tls, to_tls, to_tls, to_tls]
    assert [c.client_listeners[0].tls for c in configs] == [
        not to_tls, not to_tls, not to_tls, to_tls, to_tls, to_tls]
    for before, after in itertools.pairwise(configs):
        for node, peer in ((before, after), (after, before)):
            served = {(listener.port, listener.tls) for listener in peer.controller_listeners}
            connects = {(voter.port, node.controller_listener.tls) for voter in node.voters}
            assert connects <= served, (node.controller_listener_names,
                                        peer.controller_listener_names)
    for spec, switch, config in zip(specs, _stages(to_tls), configs, strict=True):
        pod = r.pod(OWNER, spec, 1, "hash", switch=switch)
        container = pod["spec"]["containers"][0]
        assert container["readinessProbe"]["httpGet"]["scheme"] == (
            "HTTPS" if config.client_listeners[0].tls else "HTTP")
        assert sorted(p["containerPort"] for p in container["ports"]) == sorted(
            listener.port for listener in config.listeners)
        assert ("tls" in [v["name"] for v in pod["spec"]["volumes"]]) == config.any_tls
        # Every stage's peers authenticated: the peer secret on a PLAINTEXT controller
        # listener; tokens beside an SSL client listener (the operator presents its certificate).
        assert (config.auth_token_file is not None) == config.client_listeners[0].tls
        plaintext = not all(c.tls for c in config.controller_listeners)
        assert (config.controller_listener_secret_file is not None) == plaintext
        assert ("peer" in [v["name"] for v in pod["spec"]["volumes"]]) == plaintext
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_network_policy_lets_in_the_quorum_the_operator_and_its_clients_only() -> None:
    spec = parse_spec({"port": 9200, "security": {"networkPolicy": {"allowFrom": [
        {"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}]}}})
    operator = r.OperatorPods("kafka-quorum-system", {"app.kubernetes.io/name": "kqo",
                                                      "app.kubernetes.io/instance": "kqo"})
    policy = r.network_policy(OWNER, spec, operator)
    kubernetes_validate.validate(policy, K8S_VERSION, strict=True)
    assert policy["metadata"]["ownerReferences"] == [OWNER.reference()]
    assert policy["spec"]["podSelector"] == {"matchLabels": r.labels("kq")}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    rule, peers = policy["spec"]["ingress"]
    # The controller port (the peer RPCs), and a TLS switch's second one, from the quorum's own
    # pods only.
    assert peers == {"from": [{"podSelector": {"matchLabels": r.labels("kq")}}],
                     "ports": [{"protocol": "TCP", "port": 9094},
                               {"protocol": "TCP", "port": 9095}]}
    assert rule["ports"] == [{"protocol": "TCP", "port": 9200}]
    assert rule["from"] == [
        {"podSelector": {"matchLabels": r.labels("kq")}},
        {"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": "kafka-quorum-system"}},
         "podSelector": {"matchLabels": dict(operator.labels)}},
        {"podSelector": {"matchLabels": {"kraft.quorum.dev/client": "kq"}}},
        {"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}]
    kinds = [o["kind"] for o in r.owned_objects(OWNER, spec, {}, 3, operator)]
    assert "NetworkPolicy" in kinds
    off = parse_spec({"security": {"networkPolicy": {"enabled": False}}})
    assert "NetworkPolicy" not in [o["kind"] for o in r.owned_objects(OWNER, off, {}, 3,
                                                                        operator)]


@pytest.mark.parametrize(("raw", "error"), [
    ({"tls": {"certificateDays": 30, "renewBeforeDays": 30}}, "renewBeforeDays"),
    ({"tls": {"certManager": {"issuerRef": {"name": "x", "kind": "Vault"}}}}, "kind"),
    ({"tls": {"certManager": {"issuerRef": {}}}}, "name"),
    ({"networkPolicy": {"allowFrom": "everyone"}}, "allowFrom"),
])
def test_security_spec_errors(raw: dict[str, Any], error: str) -> None:
    with pytest.raises(SpecError, match=error):
        parse_spec({"security": raw})


def test_secured_condition() -> None:
    def secured(observed: Any) -> tuple[str, str]:
        found = {x["type"]: x for x in conditions(observed, plan(observed), [])}["Secured"]
        return found["status"], found["reason"]

    on = healthy()
    assert on.spec.security.tls and secured(on) == ("True", "MutualTLS")
    off = with_spec(on, security=parse_spec({"security": {"tls": {"enabled": False}}}).security)
    assert secured(off) == ("False", "TLSDisabled")
    missing = replace(on, security_problem="no client certificate")
    assert secured(missing) == ("False", "CredentialsMissing")


# --- pod security of everything that runs ------------------------------------------------------

RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]}}


def assert_restricted(pod_spec: Mapping[str, Any], what: str) -> None:
    """Non-root, seccomp RuntimeDefault, no privilege escalation, read-only root filesystem,
    every capability dropped: Pod Security "restricted", and a read-only root."""
    pod_context = pod_spec.get("securityContext") or {}
    assert pod_context.get("runAsNonRoot") is True, what
    assert pod_context.get("seccompProfile") == {"type": "RuntimeDefault"}, what
    assert pod_context.get("runAsUser", 1) != 0, what
    for container in [*pod_spec.get("initContainers", []), *pod_spec["containers"]]:
        context = container.get("securityContext") or {}
        for key, value in RESTRICTED_CONTAINER.items():
            assert context.get(key) == value, f"{what}/{container['name']}: {key}"
        assert context.get("runAsNonRoot", True) is True
        assert not context.get("privileged")


def test_node_pods_are_restricted() -> None:
    for spec in ({}, {"security": {"tls": {"enabled": False}}}):
        assert_restricted(secured_pod(spec)["spec"], f"node pod {spec}")


@pytest.mark.parametrize("broken", [("securityContext", "runAsNonRoot"),
                                    ("securityContext", "seccompProfile"),
                                    ("containers", "readOnlyRootFilesystem"),
                                    ("containers", "capabilities"),
                                    ("containers", "allowPrivilegeEscalation")])
def test_the_pod_security_check_can_fail(broken: tuple[str, str]) -> None:
    pod = secured_pod()["spec"]
    where, key = broken
    context = pod["securityContext"] if where == "securityContext" else \
        pod["containers"][0]["securityContext"]
    del context[key]
    with pytest.raises(AssertionError):
        assert_restricted(pod, "broken")


def test_chart_pods_are_restricted() -> None:
    test_helm = pytest.importorskip("test_kq_helm")
    if test_helm.HELM is None:
        pytest.skip("helm not installed (python helm/fetch_helm.py .venv/bin)")
    docs = test_helm.documents(test_helm.render_install.render(test_helm.HELM))
    pods = [(d["metadata"]["name"], d["spec"]["template"]["spec"])
            for d in docs if d["kind"] == "Deployment"]
    pods += [(d["metadata"]["name"], d["spec"]) for d in docs if d["kind"] == "Pod"]
    assert len(pods) == 2  # the operator, the helm test
    for name, spec in pods:
        assert_restricted(spec, name)
    # The operator's only writable place is an emptyDir /tmp.
    deployment = next(spec for name, spec in pods if "test" not in name)
    assert deployment["volumes"] == [{"name": "tmp", "emptyDir": {}}]
    [policy] = [d for d in docs if d["kind"] == "NetworkPolicy"]
    ports = {p["port"] for p in policy["spec"]["ingress"][0]["ports"]}
    assert ports == {8080, 9090} and policy["spec"]["policyTypes"] == ["Ingress"]
    env = {e["name"]: e.get("value") for e in
           deployment["containers"][0]["env"]}
    assert env["KQ_OPERATOR_POD_SELECTOR"] == ",".join(
        f"{k}={v}" for k, v in policy["spec"]["podSelector"]["matchLabels"].items())


# --- in the harness: real nodes ------------------------------------------------------------------


def call(address: str, method: str, target: str, context: ssl.SSLContext | None,
         headers: Mapping[str, str] | None = None) -> int | str:
    """The status of one request, or the error that stopped it."""
    host, port = address.rsplit(":", 1)
    connection: http.client.HTTPConnection = (
        http.client.HTTPSConnection(host, int(port), timeout=5, context=context)
        if context is not None else http.client.HTTPConnection(host, int(port), timeout=5))
    try:
        connection.request(method, target, body=b"v" if method == "PUT" else None,
                           headers=dict(headers or {}))
        return connection.getresponse().status
    except (OSError, http.client.HTTPException) as error:
        return type(error).__name__
    finally:
        connection.close()


def context(ca: bytes, pair: tuple[bytes, bytes] | None = None) -> ssl.SSLContext:
    """Trusting ``ca``, without checking names (the harness's nodes are at loopback IPs)."""
    if pair is not None:
        made = client_context(ca, *pair)
    else:
        made = ssl.create_default_context(cadata=ca.decode())
    made.check_hostname = False
    return made


def presented(address: str, ca: bytes) -> bytes:
    """The certificate (PEM) the node at ``address`` presents."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as raw, \
            context(ca).wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return ssl.DER_cert_to_PEM_cert(der).encode()


async def test_secured_quorum_refuses_strangers_and_renews_in_place(cluster: Cluster) -> None:
    await create_ready(cluster)
    body = await cluster.get()
    assert condition(body, "Secured") == "True"
    uid = body["metadata"]["uid"]
    names = ["kq-ca", "kq-tokens", "kq-operator", "kq-node-1", "kq-node-2", "kq-node-3"]
    secrets = {n: await cluster.kube.get(path("Secret", NAMESPACE, n)) for n in names}
    for name, secret in secrets.items():
        assert secret is not None, name
        assert [o["uid"] for o in secret["metadata"]["ownerReferences"]] == [uid], name
    policy = await cluster.kube.get(path("NetworkPolicy", NAMESPACE, NAME))
    assert policy is not None and policy["spec"]["podSelector"]["matchLabels"] == \
        r.labels(NAME)
    configs = await cluster.configs()
    assert len(configs) == 3
    assert all(c["QUORUM_LISTENER_SECURITY_PROTOCOL_MAP"] == "CLIENT:SSL,CONTROLLER:SSL"
               for c in configs.values())

    ca_secret = await cluster.secret("kq-ca")
    operator = await cluster.secret("kq-operator")
    node = await cluster.secret("kq-node-2")
    ca = operator["ca.crt"]
    token = (await cluster.secret("kq-tokens"))["admin-token"].decode()
    leader = cluster.kubelet.address(await cluster.leader())
    stranger = authority(datetime.datetime.now(datetime.UTC))
    strangers = certs.issue(stranger.signing, certs.Wanted("quorum-operator"),
                            datetime.datetime.now(datetime.UTC), DAY)
    nobody = certs.issue(certs.KeyPair(ca_secret["tls.crt"], ca_secret["tls.key"]),
                         certs.Wanted("some-app"), datetime.datetime.now(datetime.UTC), DAY)

    def status(method: str, target: str, tls: ssl.SSLContext | None,
               headers: Mapping[str, str] | None = None) -> Any:
        return asyncio.to_thread(call, leader, method, target, tls, headers)

    describe, put = ("GET", "/v1/quorum"), ("PUT", "/v1/kv/intruder")
    assert await status(*describe, None) != 200  # plain HTTP on the TLS listener
    assert await status(*describe, context(ca)) == 401
    assert await status(*put, context(ca)) == 401
    assert await status(*describe, context(ca), {"Authorization": "Bearer not-a-token-at-all"}) \
        == 401
    assert await status(*describe, context(ca), {"Authorization": f"Bearer {token}"}) == 200
    assert await status(*describe, context(ca, (node["tls.crt"], node["tls.key"]))) == 403
    assert await status(*put, context(ca, (nobody.certificate, nobody.key))) == 403
    refused = await status(*describe, context(ca, (strangers.certificate, strangers.key)))
    assert refused not in (200, 401, 403), refused  # the handshake fails
    assert await status(*describe, context(ca, (operator["tls.crt"], operator["tls.key"]))) \
        == 200

    # The operator's own way: the IP, verifying the node's DNS name.
    nodes = await cluster.node_client()
    assert await nodes.describe(leader) is not None
    own = await nodes.node(leader)
    assert own is not None and own.state == "leader" and not own.is_observer
    impostor = NodeClient()
    tls = client_context(ca, operator["tls.crt"], operator["tls.key"])
    impostor.route(leader, Route(r.node_host(NAME, NAMESPACE, 9), tls))
    assert await impostor.describe(leader) is None and await impostor.node(leader) is None
    await nodes.close()
    await impostor.close()

    # Kept, pass after pass (the operator runs every 0.5 s here).
    before = {n: (s or {}).get("data") for n, s in secrets.items()}
    await asyncio.sleep(3)
    after = {n: ((await cluster.kube.get(path("Secret", NAMESPACE, n))) or {}).get("data")
             for n in names}
    assert after == before

    # A renewal policy that the 90-day certificates no longer meet: every certificate issued
    # again, the nodes load theirs without a restart, and the operator goes on with its new one.
    pods = (await cluster.objects())[0]
    restarts = dict(cluster.kubelet.restarts)
    await cluster.kube.patch(cr_path(NAME), {"spec": {"security": {"tls": {
        "certificateDays": 365, "renewBeforeDays": 100}}}})

    async def renewed() -> bool:
        current = await cluster.secret("kq-node-2")
        return current["tls.crt"] != node["tls.crt"] and \
            await asyncio.to_thread(presented, cluster.kubelet.address(2), ca) == \
            current["tls.crt"]

    await cluster.wait("node 2 presenting its renewed certificate", renewed, 45)
    assert (await cluster.secret("kq-tokens"))["admin-token"].decode() == token

    async def operator_renewed() -> bool:
        body = await cluster.get()
        current = await cluster.secret("kq-operator")
        return current["tls.crt"] != operator["tls.crt"] and \
            condition(body, "Ready") == "True" and condition(body, "Secured") == "True"

    await cluster.wait("Ready with the operator's renewed certificate", operator_renewed, 30)
    assert (await cluster.objects())[0] == pods and cluster.kubelet.restarts == restarts
    reasons = [reason for reason, _ in await cluster.events()]
    assert reasons.count("CredentialsChanged") >= 6 + 4


async def test_security_off_is_plain_and_warned(cluster: Cluster) -> None:
    obj = quorum_object(NAME, 3, security={"tls": {"enabled": False}})
    await cluster.kube.create(path(KIND, NAMESPACE, api=CR_API), obj)
    await cluster.ready_with(3)
    body = await cluster.get()
    assert condition(body, "Secured") == "False"
    events = await cluster.events()
    warned = [message for reason, message in events if reason == "SecuredFalse"]
    assert len(warned) == 1 and "spec.security.tls.enabled is false" in warned[0]
    leader = cluster.kubelet.address(await cluster.leader())
    assert await asyncio.to_thread(call, leader, "GET", "/v1/quorum", None) == 200
    assert await cluster.kube.get(path("Secret", NAMESPACE, "kq-ca")) is None
    assert await cluster.kube.get(path("Secret", NAMESPACE, "kq-tokens")) is None
    # The peers still authenticate each other: the peer secret, which every node reads.
    assert await cluster.kube.get(path("Secret", NAMESPACE, "kq-peer")) is not None
    # The NetworkPolicy is separate from TLS: still there.
    assert await cluster.kube.get(path("NetworkPolicy", NAMESPACE, NAME)) is not None
