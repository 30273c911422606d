"""The Kubernetes objects the operator owns for one KafkaQuorum, as plain dicts (pure).

Pods and volume claims are created one by one by the operator rather than by a StatefulSet
(see docs/operator-design.md): it decides when a member's pod comes back, in which order pods
restart, and which member is removed, none of which a StatefulSet lets it decide.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kafka_quorum_operator import (
    ANNOTATION_CLIENT_TLS,
    ANNOTATION_CLUSTER_ID,
    ANNOTATION_CONFIG_HASH,
    API_VERSION,
    APP_NAME,
    GROUP,
    KIND,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_NODE_ID,
    LABEL_VOTER,
    MANAGER,
)
from kafka_quorum_operator.observe import TlsSwitch
from kafka_quorum_operator.plan import majority
from kafka_quorum_operator.spec import DATA_MOUNT, LOG_DIR, Spec
from quorum_node.addresses import host_port
from quorum_node.node.config import KEYS_BY_NAME

NODE_USER = 10001  # the node image's user (Dockerfile)
# Who the pods run as. "fixed": the image's user and group (NODE_USER), and the volume's group
# (fsGroup) the same; "platform": none of the three set, for a platform that assigns them itself
# and refuses fixed ones (OpenShift's restricted SCC: a uid of the namespace's range, gid 0 and
# an fsGroup of its own). The operator's setting (KQ_OPERATOR_POD_IDS); a quorum's
# spec.template.securityContext replaces either.
POD_IDS = ("fixed", "platform")
FIXED_IDS = {"runAsUser": NODE_USER, "runAsGroup": NODE_USER, "fsGroup": NODE_USER}
ZONE_KEY = "topology.kubernetes.io/zone"
HOSTNAME_KEY = "kubernetes.io/hostname"
# How long a starting node may take to answer its health probe (replaying a long log), and how
# often the kubelet asks meanwhile.
STARTUP_SECONDS = 600
STARTUP_PROBE_PERIOD_SECONDS = 5
CONTAINER = "node"
# Where a node finds its certificate, key and CA (a kubernetes.io/tls Secret's layout) and its
# token file: whole Secrets mounted as directories, never with subPath (never updated).
TLS_MOUNT = "/etc/quorum/tls"
AUTH_MOUNT = "/etc/quorum/auth"
TOKENS_KEY = "tokens"
# The quorum's peer secret, which every peer RPC on a PLAINTEXT controller listener must carry
# (a TLS switch's stages, a quorum without TLS): without it anyone who reaches that port could
# speak as a peer.
PEER_MOUNT = "/etc/quorum/peer"
PEER_SECRET_KEY = "secret"
# Principals (certificate common names) and their roles on the nodes. Node N's certificate is
# quorum-node-N: the nodes' default auth.peer.principal.template, so it is the peer N and no
# other; the operator's is an administrator. Each quorum has its own CA, so no other quorum's
# node is a peer.
NODE_PRINCIPAL_PREFIX = "quorum-node-"
OPERATOR_PRINCIPAL = "quorum-operator"
CERTIFICATE_ROLES = f"{OPERATOR_PRINCIPAL}:admin"
MAX_COMMON_NAME = 64  # X.509's upper bound on a subject's common name (RFC 5280, ub-common-name)
# Pods in the quorum's namespace with this label (value: the quorum's name) may reach its client
# port.
LABEL_CLIENT = f"{GROUP}/client"
# The nodes' listeners: clients, admin, probes and metrics on spec.port; the peer RPCs, and only
# those, on spec.controllerPort, reachable from the quorum's own pods only.
CLIENT_LISTENER = "CLIENT"
CONTROLLER_LISTENER = "CONTROLLER"
# The second controller listener of a TLS switch, on ``migration_port``: the new protocol is
# served there while the first one still speaks the old (docs/operator-design.md, Switching TLS).
MIGRATION_LISTENER = "CONTROLLER_MIGRATION"


def migration_port(spec: Spec) -> int:
    """The second controller listener's port during a TLS switch: the one after
    spec.controllerPort (or the next, if that is spec.port)."""
    port = spec.controller_port + 1
    return port + 1 if port == spec.port else port


@dataclass(frozen=True)
class ControllerListener:
    name: str
    tls: bool
    port: int

    @property
    def protocol(self) -> str:
        return "SSL" if self.tls else "PLAINTEXT"


@dataclass(frozen=True)
class PodListeners:
    """What one revision of the pods serves: the client listener's protocol, and the controller
    listeners in controller.listener.names order (the first is the one nodes connect on, the
    voters name its port)."""

    client_tls: bool
    controllers: tuple[ControllerListener, ...]

    @property
    def any_tls(self) -> bool:
        return self.client_tls or any(c.tls for c in self.controllers)

    @property
    def plaintext_controller(self) -> bool:
        return any(not c.tls for c in self.controllers)


def pod_listeners(spec: Spec, switch: TlsSwitch | None) -> PodListeners:
    """The listeners of the steady configuration, or of a TLS switch's stage. Each stage differs
    from the one before in what a node may roll to while its peers run the other: 1 adds the new
    protocol on the migration port (peers still connect on the old); 2 connects there (every
    peer serves it since 1); 3 turns the first controller listener and the client listener to
    the new protocol (no peer connects to the first one during 3); 4 connects on the first one
    again (every peer serves the new protocol there since 3); the steady configuration then
    drops the migration listener (no peer connects to it since 4)."""
    port = spec.controller_port
    if switch is None:
        tls = spec.security.tls
        return PodListeners(tls, (ControllerListener(CONTROLLER_LISTENER, tls, port),))
    new, old, stage = switch.enabled, not switch.enabled, switch.stage
    first = ControllerListener(CONTROLLER_LISTENER, old if stage <= 2 else new, port)
    migration = ControllerListener(MIGRATION_LISTENER, new, migration_port(spec))
    controllers = (migration, first) if stage in (2, 3) else (first, migration)
    return PodListeners(client_tls=old if stage <= 2 else new, controllers=controllers)


@dataclass(frozen=True)
class Owner:
    """The KafkaQuorum the objects belong to."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {"apiVersion": API_VERSION, "kind": KIND, "name": self.name, "uid": self.uid,
                "controller": True, "blockOwnerDeletion": True}


def labels(name: str, component: str = "node") -> dict[str, str]:
    return {LABEL_NAME: APP_NAME, LABEL_INSTANCE: name, LABEL_COMPONENT: component,
            LABEL_MANAGED_BY: MANAGER}


def selector(name: str) -> str:
    """The label selector of a quorum's pods (status.selector, for the scale subresource)."""
    return ",".join(f"{k}={v}" for k, v in labels(name).items())


def pod_name(name: str, node_id: int) -> str:
    return f"{name}-{node_id}"


def claim_name(name: str, node_id: int) -> str:
    return f"data-{name}-{node_id}"


def headless_name(name: str) -> str:
    return f"{name}-nodes"


def config_map_name(name: str, revision: str) -> str:
    """The ConfigMap of one pod revision (``config_hash``): see ``config_map``."""
    return f"{name}-config-{revision}"


def service_account_name(name: str) -> str:
    return f"{name}-node"


def ca_secret_name(name: str) -> str:
    """The CA's certificate and key: read by the operator only."""
    return f"{name}-ca"


def node_secret_name(name: str, node_id: int) -> str:
    """A node's certificate, key and the CA bundle (kubernetes.io/tls)."""
    return f"{name}-node-{node_id}"


def operator_secret_name(name: str) -> str:
    """The operator's client certificate (admin) for this quorum, with the CA bundle."""
    return f"{name}-operator"


def peer_secret_name(name: str) -> str:
    """The peer secret (key ``secret``): the nodes only."""
    return f"{name}-peer"


def tokens_secret_name(name: str) -> str:
    """The nodes' token file (key ``tokens``) and the admin token alone (``admin-token``)."""
    return f"{name}-tokens"


def ca_bundle_name(name: str) -> str:
    """A ConfigMap with the CA bundle (``ca.crt``): what clients trust, public."""
    return f"{name}-ca-bundle"


def ca_subject(name: str, namespace: str) -> str:
    """The CA certificate's subject: NAMESPACE/NAME CA, or NAME CA where that exceeds the 64
    characters X.509 allows a common name (namespaces are up to 63)."""
    full = f"{namespace}/{name} CA"
    return full if len(full) <= MAX_COMMON_NAME else f"{name} CA"


def node_principal(node_id: int) -> str:
    return f"{NODE_PRINCIPAL_PREFIX}{node_id}"


def node_host(name: str, namespace: str, node_id: int) -> str:
    """A pod's stable DNS name (hostname + subdomain of the headless service)."""
    return f"{pod_name(name, node_id)}.{headless_name(name)}.{namespace}.svc"


def node_dns_names(name: str, namespace: str, node_id: int, cluster_domain: str
                   ) -> tuple[str, ...]:
    """The names a node's certificate holds: its own (peers reach it by the name in
    controller.quorum.voters, the operator verifies it), the headless service's and the client
    Service's (clients bootstrap through them and are redirected to a node's own name)."""
    own = node_host(name, namespace, node_id)
    headless = f"{headless_name(name)}.{namespace}.svc"
    client = f"{name}.{namespace}.svc"
    return (own, f"{own}.{cluster_domain}", headless, f"{headless}.{cluster_domain}",
            name, f"{name}.{namespace}", client, f"{client}.{cluster_domain}")


def env_var(key: str) -> str:
    return KEYS_BY_NAME[key].env_var


def node_environment(owner: Owner, spec: Spec, cluster_id: str, voter_ids: Sequence[int],
                     switch: TlsSwitch | None = None) -> dict[str, str]:
    """The configuration every node shares, as the node's QUORUM_* environment variables (of
    a TLS switch's stage, when one runs)."""
    hosts = {i: node_host(owner.name, owner.namespace, i) for i in voter_ids}
    listeners = pod_listeners(spec, switch)
    client_protocol = "SSL" if listeners.client_tls else "PLAINTEXT"
    connect = listeners.controllers[0]
    data = {
        env_var("cluster.id"): cluster_id,
        # The peers reach each other's (first) controller listener; clients are redirected to
        # the leader's client listener.
        env_var("controller.quorum.voters"): ",".join(
            f"{i}@{host_port(host, connect.port)}" for i, host in hosts.items()),
        env_var("controller.quorum.client.endpoints"): ",".join(
            f"{i}@{host_port(host, spec.port)}" for i, host in hosts.items()),
        env_var("log.dir"): LOG_DIR,
        # A new, empty volume is formatted with a new directory id and joins as an observer;
        # the operator then makes it a voter (KIP-856). The first bootstrap is the same.
        env_var("format.if.empty"): "true",
        # Every interface, IPv6 and IPv4: a pod of an IPv6-only cluster has no IPv4 address.
        env_var("listeners"): ",".join(
            [f"{CLIENT_LISTENER}://:{spec.port}",
             *(f"{c.name}://:{c.port}" for c in listeners.controllers)]),
        env_var("listener.security.protocol.map"): ",".join(
            [f"{CLIENT_LISTENER}:{client_protocol}",
             *(f"{c.name}:{c.protocol}" for c in listeners.controllers)]),
        env_var("controller.listener.names"): ",".join(c.name for c in listeners.controllers),
    }
    if listeners.any_tls:
        data.update({
            env_var("ssl.certificate.location"): f"{TLS_MOUNT}/tls.crt",
            env_var("ssl.key.location"): f"{TLS_MOUNT}/tls.key",
            env_var("ssl.ca.location"): f"{TLS_MOUNT}/ca.crt",
            env_var("auth.certificate.roles"): CERTIFICATE_ROLES,
        })
    if listeners.plaintext_controller:
        data[env_var("controller.listener.secret.file")] = f"{PEER_MOUNT}/{PEER_SECRET_KEY}"
    if listeners.client_tls:
        # Tokens only beside an SSL client listener: on a PLAINTEXT one (some stages of a
        # switch) the operator, which presents its certificate, could not authenticate.
        data[env_var("auth.token.file")] = f"{AUTH_MOUNT}/{TOKENS_KEY}"
    for key, value in sorted(spec.node_config.items()):
        data[env_var(key)] = str(value)
    return data


def config_hash(spec: Spec, environment: Mapping[str, str]) -> str:
    """What a pod must be recreated for when it changes."""
    template = spec.template
    inputs = {"env": dict(environment), "image": spec.image, "pull": spec.image_pull_policy,
              "resources": spec.resources, "port": spec.port,
              "controllerPort": spec.controller_port,
              "affinity": template.affinity, "tolerations": list(template.tolerations),
              "nodeSelector": dict(template.node_selector),
              "priorityClassName": template.priority_class_name,
              "labels": dict(template.labels), "annotations": dict(template.annotations),
              "imagePullSecrets": list(template.image_pull_secrets),
              "topologySpreadConstraints": None if template.topology_spread_constraints is None
              else list(template.topology_spread_constraints)}
    # Only when given: the pods of a quorum without one keep the hash they had.
    if template.security_context is not None:
        inputs["securityContext"] = dict(template.security_context)
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _meta(owner: Owner, name: str, component: str = "node", **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": owner.namespace, "labels": labels(owner.name, component),
            "ownerReferences": [owner.reference()], **extra}


def config_map(owner: Owner, spec: Spec, environment: Mapping[str, str]) -> dict[str, Any]:
    """The nodes' configuration for one revision of the pods, immutable: a pod reads the
    ConfigMap of the revision it was made for, so a container restarted in the middle of a roll
    never starts with a newer (or older) configuration than its pod's. The reconciler deletes
    those no pod refers to any more."""
    revision = config_hash(spec, environment)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _meta(owner, config_map_name(owner.name, revision), "config"),
            "immutable": True, "data": dict(environment)}


def headless_service(owner: Owner, spec: Spec) -> dict[str, Any]:
    # Peers find each other before they are ready (a new quorum elects no leader otherwise).
    # Each pod's name resolves through it, for its peers (controller port) and for clients
    # redirected to the leader (client port).
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta(owner, headless_name(owner.name)),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": labels(owner.name),
                     "ports": [{"name": "client", "port": spec.port, "targetPort": spec.port},
                               {"name": "controller", "port": spec.controller_port,
                                "targetPort": spec.controller_port}]}}


def client_service(owner: Owner, spec: Spec) -> dict[str, Any]:
    # The client port only: the peers find each other through the headless service.
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta(owner, owner.name, "client"),
            "spec": {"type": "ClusterIP", "selector": labels(owner.name),
                     "ports": [{"name": "client", "port": spec.port, "targetPort": spec.port}]}}


def disruption_budget(owner: Owner, voters: int) -> dict[str, Any] | None:
    """Over the voters' pods only (LABEL_VOTER), minAvailable = a majority of the voters: an
    integer, so that it does not re-base while members come and go (a percentage or
    maxUnavailable would). Observers are left out: a new member's pod, unready until the voters
    are rolled to know it, would otherwise hold the budget at none, and the roll, evicting, would
    wait for it for ever; a ready one would widen the budget past the voters' majority. None
    where the majority is every voter (one or two): any disruption stops that quorum, and a
    budget allowing none would block every drain, and the cluster autoscaler, for good."""
    if majority(voters) >= voters:
        return None
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": _meta(owner, owner.name, "node"),
            "spec": {"minAvailable": majority(voters),
                     "selector": {"matchLabels": {**labels(owner.name), LABEL_VOTER: "true"}}}}


def service_account(owner: Owner) -> dict[str, Any]:
    # The node never talks to the Kubernetes API.
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": _meta(owner, service_account_name(owner.name)),
            "automountServiceAccountToken": False}


def claim(owner: Owner, spec: Spec, node_id: int, cluster_id: str) -> dict[str, Any]:
    meta = _meta(owner, claim_name(owner.name, node_id),
                 annotations={ANNOTATION_CLUSTER_ID: cluster_id})
    meta["labels"][LABEL_NODE_ID] = str(node_id)
    if not spec.storage.delete_claims:
        del meta["ownerReferences"]  # the data outlives the KafkaQuorum unless asked otherwise
    body: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": spec.storage.size}}}
    if spec.storage.storage_class_name:
        body["storageClassName"] = spec.storage.storage_class_name
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": body}


def pod(owner: Owner, spec: Spec, node_id: int, hash_value: str, *,
        switch: TlsSwitch | None = None,
        init_containers: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    template = spec.template
    meta = _meta(owner, pod_name(owner.name, node_id),
                 annotations={**template.annotations, ANNOTATION_CONFIG_HASH: hash_value})
    meta["labels"] = {**template.labels, **meta["labels"], LABEL_NODE_ID: str(node_id)}
    probe_port = spec.port
    listeners = pod_listeners(spec, switch)
    meta["annotations"][ANNOTATION_CLIENT_TLS] = "true" if listeners.client_tls else "false"
    tls = listeners.any_tls
    # The kubelet does not verify the node's certificate; the probes need no credential. The
    # operator reads the scheme of a pod without ANNOTATION_CLIENT_TLS (an older operator's).
    scheme = "HTTPS" if listeners.client_tls else "HTTP"
    container: dict[str, Any] = {
        "name": CONTAINER, "image": spec.image, "imagePullPolicy": spec.image_pull_policy,
        "command": ["quorum-node", "run"],
        "envFrom": [{"configMapRef": {"name": config_map_name(owner.name, hash_value)}}],
        "env": [{"name": env_var("node.id"), "value": str(node_id)}],
        "ports": [{"name": "client", "containerPort": spec.port},
                  *({"name": "controller" if c.name == CONTROLLER_LISTENER else "migration",
                     "containerPort": c.port}
                    for c in sorted(listeners.controllers, key=lambda c: c.port))],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": probe_port,
                                       "scheme": scheme},
                           "periodSeconds": 2, "failureThreshold": 3},
        # A node that starts replays its log from the last snapshot before it serves: the
        # startup probe gives it up to STARTUP_SECONDS to answer, and only then does the
        # liveness probe (which restarts a node that stopped answering for a minute) begin.
        "startupProbe": {"httpGet": {"path": "/healthz", "port": probe_port, "scheme": scheme},
                         "periodSeconds": STARTUP_PROBE_PERIOD_SECONDS,
                         "failureThreshold": STARTUP_SECONDS // STARTUP_PROBE_PERIOD_SECONDS},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": probe_port,
                                      "scheme": scheme},
                          "periodSeconds": 10, "failureThreshold": 6},
        "volumeMounts": [{"name": "data", "mountPath": DATA_MOUNT}],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
    }
    volumes: list[dict[str, Any]] = [{"name": "data", "persistentVolumeClaim": {
        "claimName": claim_name(owner.name, node_id)}}]
    if tls:
        container["volumeMounts"] += [
            {"name": "tls", "mountPath": TLS_MOUNT, "readOnly": True},
            {"name": "auth", "mountPath": AUTH_MOUNT, "readOnly": True}]
        # Readable by the files' group only, the fsGroup (fixed ids, or the one OpenShift
        # assigns), else root's: under an arbitrary uid the image's group is 0. Of the tokens
        # Secret, the token file only.
        volumes += [
            {"name": "tls", "secret": {"secretName": node_secret_name(owner.name, node_id),
                                       "defaultMode": 0o440}},
            {"name": "auth", "secret": {"secretName": tokens_secret_name(owner.name),
                                        "defaultMode": 0o440,
                                        "items": [{"key": TOKENS_KEY, "path": TOKENS_KEY}]}}]
    if listeners.plaintext_controller:
        container["volumeMounts"].append({"name": "peer", "mountPath": PEER_MOUNT,
                                          "readOnly": True})
        volumes.append({"name": "peer", "secret": {"secretName": peer_secret_name(owner.name),
                                                   "defaultMode": 0o440}})
    if spec.resources:
        container["resources"] = copy.deepcopy(dict(spec.resources))
    pod_spec: dict[str, Any] = {
        "hostname": pod_name(owner.name, node_id), "subdomain": headless_name(owner.name),
        "serviceAccountName": service_account_name(owner.name),
        "automountServiceAccountToken": False, "enableServiceLinks": False,
        # The node resigns leadership on SIGTERM and waits up to 5 s for a successor.
        "terminationGracePeriodSeconds": 30,
        "securityContext": pod_security_context(spec),
        "containers": [container],
        **({"initContainers": [dict(c) for c in init_containers]} if init_containers else {}),
        "volumes": volumes,
        "affinity": dict(template.affinity) if template.affinity is not None else {
            # Spread voters over nodes where possible: losing a node then costs one voter.
            "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 100, "podAffinityTerm": {
                    "topologyKey": HOSTNAME_KEY,
                    "labelSelector": {"matchLabels": labels(owner.name)}}}]}},
    }
    pod_spec["topologySpreadConstraints"] = spread_constraints(owner, spec)
    if template.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in template.image_pull_secrets]
    if template.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in template.tolerations]
    if template.node_selector:
        pod_spec["nodeSelector"] = dict(template.node_selector)
    if template.priority_class_name:
        pod_spec["priorityClassName"] = template.priority_class_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def pod_security_context(spec: Spec) -> dict[str, Any]:
    """spec.template.securityContext as given, else the fixed ids (``POD_IDS``)."""
    given = spec.template.security_context
    if given is not None:
        return copy.deepcopy(dict(given))
    return {"runAsNonRoot": True, **FIXED_IDS, "seccompProfile": {"type": "RuntimeDefault"}}


def with_pod_ids(spec: Spec, pod_ids: str) -> Spec:
    """``spec`` under the operator's POD_IDS setting: "platform" gives a quorum without
    spec.template.securityContext one without the fixed ids (recorded in the spec, so its hash
    rolls the pods once when the setting changes)."""
    if pod_ids == "fixed" or spec.template.security_context is not None:
        return spec
    context = {k: v for k, v in pod_security_context(spec).items() if k not in FIXED_IDS}
    return replace(spec, template=replace(spec.template, security_context=context))


def spread_constraints(owner: Owner, spec: Spec) -> list[dict[str, Any]]:
    """spec.template.topologySpreadConstraints (one without a labelSelector counts the
    quorum's pods); by default, over zones and then hosts, as evenly as the scheduler can place
    them (ScheduleAnyway: a cluster of one zone, or of nodes without zone labels, still runs
    the quorum, and elsewhere losing a zone costs as few voters as the nodes allow)."""
    selector = {"matchLabels": labels(owner.name)}
    given = spec.template.topology_spread_constraints
    if given is None:
        return [{"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
                 "labelSelector": selector} for key in (ZONE_KEY, HOSTNAME_KEY)]
    return [{"labelSelector": selector, **copy.deepcopy(dict(c))} for c in given]


@dataclass(frozen=True)
class OperatorPods:
    """Where the operator runs, for the NetworkPolicy: its namespace and its pods' labels."""

    namespace: str
    labels: Mapping[str, str]


def network_policy(owner: Owner, spec: Spec, operator: OperatorPods) -> dict[str, Any]:
    """Ingress to the quorum's pods: the client port from the quorum's own pods, the operator,
    pods of the namespace labelled as the quorum's clients, and ``allowFrom``; the controller
    port (peer RPCs) from the quorum's own pods only. Everything else is dropped, other ports
    included. Egress stays open."""
    own_pods = {"podSelector": {"matchLabels": labels(owner.name)}}
    sources: list[dict[str, Any]] = [
        own_pods,
        {"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": operator.namespace}},
         "podSelector": {"matchLabels": dict(operator.labels)}},
        {"podSelector": {"matchLabels": {LABEL_CLIENT: owner.name}}},
        *(dict(peer) for peer in spec.security.allow_from),
    ]
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _meta(owner, owner.name),
            "spec": {"podSelector": {"matchLabels": labels(owner.name)},
                     "policyTypes": ["Ingress"],
                     "ingress": [{"from": sources,
                                  "ports": [{"protocol": "TCP", "port": spec.port}]},
                                 {"from": [own_pods],
                                  "ports": [{"protocol": "TCP",
                                             "port": spec.controller_port},
                                            # A TLS switch's second controller listener.
                                            {"protocol": "TCP",
                                             "port": migration_port(spec)}]}]}}


def certificate(owner: Owner, spec: Spec, secret_name: str, common_name: str,
                dns_names: Sequence[str] = ()) -> dict[str, Any]:
    """A cert-manager Certificate (spec.security.tls.certManager): cert-manager writes the
    kubernetes.io/tls Secret ``secret_name`` (with ``ca.crt``) and renews it. With DNS names, a
    node's (server and client authentication); without, a client's."""
    security = spec.security
    assert security.issuer is not None
    usages = ["digital signature", "client auth"]
    body: dict[str, Any] = {
        "secretName": secret_name, "commonName": common_name,
        "duration": f"{security.certificate_days * 24}h",
        "renewBefore": f"{security.renew_before_days * 24}h",
        "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
        "secretTemplate": {"labels": labels(owner.name, "credentials")},
        "issuerRef": {"name": security.issuer.name, "kind": security.issuer.kind,
                      "group": security.issuer.group},
    }
    if dns_names:
        body["dnsNames"] = list(dns_names)
        usages.insert(1, "server auth")
    body["usages"] = usages
    return {"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": _meta(owner, secret_name, "credentials"), "spec": body}


def certificates(owner: Owner, spec: Spec, node_ids: Sequence[int], cluster_domain: str
                 ) -> list[dict[str, Any]]:
    """The cert-manager Certificates of a quorum: one per node, and the operator's."""
    nodes = [certificate(owner, spec, node_secret_name(owner.name, i), node_principal(i),
                         node_dns_names(owner.name, owner.namespace, i, cluster_domain))
             for i in node_ids]
    return [*nodes, certificate(owner, spec, operator_secret_name(owner.name),
                                OPERATOR_PRINCIPAL)]


def owned_objects(owner: Owner, spec: Spec, environment: Mapping[str, str], voters: int,
                  operator: OperatorPods) -> list[dict[str, Any]]:
    """The objects kept as specified on every pass (besides pods, claims and credentials)."""
    objects = [service_account(owner), config_map(owner, spec, environment),
               headless_service(owner, spec), client_service(owner, spec)]
    budget = disruption_budget(owner, voters)
    if budget is not None:
        objects.append(budget)
    if spec.security.network_policy:
        objects.append(network_policy(owner, spec, operator))
    return objects


def withdrawn_objects(owner: Owner, voters: int) -> list[tuple[str, str]]:
    """(kind, name) of the objects of ``owned_objects`` not wanted now, deleted if present."""
    return [] if disruption_budget(owner, voters) is not None else \
        [("PodDisruptionBudget", owner.name)]


def differs(desired: Any, actual: Any) -> bool:
    """Whether ``actual`` lacks something of ``desired`` (fields the server adds are ignored)."""
    if isinstance(desired, Mapping):
        if not isinstance(actual, Mapping):
            return True
        return any(differs(v, actual.get(k)) for k, v in desired.items())
    if isinstance(desired, list):
        return not isinstance(actual, list) or len(desired) != len(actual) or any(
            differs(d, a) for d, a in zip(desired, actual, strict=True))
    return bool(desired != actual)
