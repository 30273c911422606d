"""The Kubernetes objects the operator owns for one KafkaQuorum, as plain dicts (pure).

Pods and volume claims are created one by one by the operator rather than by a StatefulSet (see
docs/operator.md): it decides when a member's pod comes back, in which order pods restart, and
which member is removed, none of which a StatefulSet lets it decide.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kafka_quorum_operator import (
    ANNOTATION_CLUSTER_ID,
    ANNOTATION_CONFIG_HASH,
    API_VERSION,
    APP_NAME,
    KIND,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_NODE_ID,
    MANAGER,
)
from kafka_quorum_operator.plan import majority
from kafka_quorum_operator.spec import DATA_MOUNT, LOG_DIR, Spec
from quorum_node.node.config import KEYS_BY_NAME

NODE_USER = 10001  # the node image's user (Dockerfile)
CONTAINER = "node"


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


def config_map_name(name: str) -> str:
    return f"{name}-config"


def service_account_name(name: str) -> str:
    return f"{name}-node"


def node_host(name: str, namespace: str, node_id: int) -> str:
    """A pod's stable DNS name (hostname + subdomain of the headless service)."""
    return f"{pod_name(name, node_id)}.{headless_name(name)}.{namespace}.svc"


def env_var(key: str) -> str:
    return KEYS_BY_NAME[key].env_var


def node_environment(owner: Owner, spec: Spec, cluster_id: str, voter_ids: Sequence[int]
                     ) -> dict[str, str]:
    """The configuration every node shares, as the node's QUORUM_* environment variables."""
    voters = ",".join(f"{i}@{node_host(owner.name, owner.namespace, i)}:{spec.port}"
                      for i in voter_ids)
    data = {
        env_var("cluster.id"): cluster_id,
        env_var("controller.quorum.voters"): voters,
        env_var("log.dir"): LOG_DIR,
        # A new, empty volume is formatted with a new directory id and joins as an observer;
        # the operator then makes it a voter (KIP-856). The first bootstrap is the same.
        env_var("format.if.empty"): "true",
        env_var("listeners"): f"0.0.0.0:{spec.port}",
    }
    for key, value in sorted(spec.node_config.items()):
        data[env_var(key)] = str(value)
    return data


def config_hash(spec: Spec, environment: Mapping[str, str]) -> str:
    """What a pod must be recreated for when it changes."""
    template = spec.template
    inputs = {"env": dict(environment), "image": spec.image, "pull": spec.image_pull_policy,
              "resources": spec.resources, "port": spec.port,
              "affinity": template.affinity, "tolerations": list(template.tolerations),
              "nodeSelector": dict(template.node_selector),
              "priorityClassName": template.priority_class_name,
              "labels": dict(template.labels), "annotations": dict(template.annotations)}
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _meta(owner: Owner, name: str, component: str = "node", **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": owner.namespace, "labels": labels(owner.name, component),
            "ownerReferences": [owner.reference()], **extra}


def config_map(owner: Owner, environment: Mapping[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _meta(owner, config_map_name(owner.name), "config"),
            "data": dict(environment)}


def headless_service(owner: Owner, spec: Spec) -> dict[str, Any]:
    # Peers find each other before they are ready (a new quorum elects no leader otherwise).
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta(owner, headless_name(owner.name)),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": labels(owner.name),
                     "ports": [{"name": "quorum", "port": spec.port, "targetPort": spec.port}]}}


def client_service(owner: Owner, spec: Spec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta(owner, owner.name, "client"),
            "spec": {"type": "ClusterIP", "selector": labels(owner.name),
                     "ports": [{"name": "quorum", "port": spec.port, "targetPort": spec.port}]}}


def disruption_budget(owner: Owner, voters: int) -> dict[str, Any]:
    """minAvailable = a majority of the voters: an integer, so that it does not re-base while
    members come and go (a percentage or maxUnavailable would)."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": _meta(owner, owner.name, "node"),
            "spec": {"minAvailable": majority(voters),
                     "selector": {"matchLabels": labels(owner.name)}}}


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


def pod(owner: Owner, spec: Spec, node_id: int, hash_value: str) -> dict[str, Any]:
    template = spec.template
    meta = _meta(owner, pod_name(owner.name, node_id),
                 annotations={**template.annotations, ANNOTATION_CONFIG_HASH: hash_value})
    meta["labels"] = {**template.labels, **meta["labels"], LABEL_NODE_ID: str(node_id)}
    probe_port = spec.port
    container: dict[str, Any] = {
        "name": CONTAINER, "image": spec.image, "imagePullPolicy": spec.image_pull_policy,
        "command": ["quorum-node", "run"],
        "envFrom": [{"configMapRef": {"name": config_map_name(owner.name)}}],
        "env": [{"name": env_var("node.id"), "value": str(node_id)}],
        "ports": [{"name": "quorum", "containerPort": spec.port}],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": probe_port},
                           "periodSeconds": 2, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": probe_port},
                          "initialDelaySeconds": 10, "periodSeconds": 10,
                          "failureThreshold": 6},
        "volumeMounts": [{"name": "data", "mountPath": DATA_MOUNT}],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
    }
    if spec.resources:
        container["resources"] = dict(spec.resources)
    pod_spec: dict[str, Any] = {
        "hostname": pod_name(owner.name, node_id), "subdomain": headless_name(owner.name),
        "serviceAccountName": service_account_name(owner.name),
        "automountServiceAccountToken": False, "enableServiceLinks": False,
        # The node resigns leadership on SIGTERM and waits up to 5 s for a successor.
        "terminationGracePeriodSeconds": 30,
        "securityContext": {"runAsNonRoot": True, "runAsUser": NODE_USER,
                            "runAsGroup": NODE_USER, "fsGroup": NODE_USER,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [{"name": "data", "persistentVolumeClaim": {
            "claimName": claim_name(owner.name, node_id)}}],
        "affinity": dict(template.affinity) if template.affinity is not None else {
            # Spread voters over nodes where possible: losing a node then costs one voter.
            "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 100, "podAffinityTerm": {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": labels(owner.name)}}}]}},
    }
    if template.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in template.tolerations]
    if template.node_selector:
        pod_spec["nodeSelector"] = dict(template.node_selector)
    if template.priority_class_name:
        pod_spec["priorityClassName"] = template.priority_class_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def owned_objects(owner: Owner, spec: Spec, environment: Mapping[str, str], voters: int
                  ) -> list[dict[str, Any]]:
    """The objects kept as specified on every pass (besides pods and claims)."""
    return [service_account(owner), config_map(owner, environment),
            headless_service(owner, spec), client_service(owner, spec),
            disruption_budget(owner, voters)]


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
