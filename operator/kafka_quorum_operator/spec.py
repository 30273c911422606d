"""A KafkaQuorum's spec as typed, defaulted values.

The API server applies the CRD's defaults, but the operator defaults again from the same table:
an operator newer than the installed CRD (upgraded first) meets fields the CRD does not default.
``tests/operator/test_crd.py`` checks that these defaults and the CRD's agree.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from quorum_node.raft.config import QuorumConfig

DEFAULT_IMAGE = "ghcr.io/quorum-node/quorum-node:0.1.0"
DEFAULT_PORT = 9093  # the client listener: client and admin APIs, probes, metrics
DEFAULT_CONTROLLER_PORT = 9094  # the controller listener: peer RPCs only
DEFAULT_REPLICAS = 3
MAX_REPLICAS = 9  # the CRD's maximum of spec.replicas: node ids run from 1 to it
DEFAULT_STORAGE_SIZE = "1Gi"
DEFAULT_MIN_CAUGHT_UP_SECONDS = 10
# The node's log.dir: a subdirectory of the volume, so that a fresh volume (which may hold
# lost+found) counts as empty and format.if.empty formats it.
DATA_MOUNT = "/var/lib/quorum"
LOG_DIR = DATA_MOUNT + "/data"

# spec.config key -> the node's configuration key (quorum_node/node/config.py).
NODE_CONFIG_KEYS: Mapping[str, str] = {
    "electionTimeoutMs": "controller.quorum.election.timeout.ms",
    "fetchTimeoutMs": "controller.quorum.fetch.timeout.ms",
    "electionBackoffMaxMs": "controller.quorum.election.backoff.max.ms",
    "requestTimeoutMs": "controller.quorum.request.timeout.ms",
    "retryBackoffMs": "controller.quorum.retry.backoff.ms",
    "appendLingerMs": "controller.quorum.append.linger.ms",
    "highWatermarkLingerMs": "controller.quorum.high.watermark.linger.ms",
    "leaderFlushDelayMs": "controller.quorum.leader.flush.delay.ms",
    "logSegmentBytes": "log.segment.bytes",
    "snapshotIntervalRecords": "snapshot.interval.records",
    "snapshotRetainedLogRecords": "snapshot.retained.log.records",
}
# The node's default (one source of it); also the operator's "caught up" window.
DEFAULT_FETCH_TIMEOUT_MS = QuorumConfig().fetch_timeout_ms
# Certificates the operator issues: valid this long, issued again this long before they expire.
DEFAULT_CERTIFICATE_DAYS = 90
DEFAULT_RENEW_BEFORE_DAYS = 30
ISSUER_KINDS = ("Issuer", "ClusterIssuer")
DEFAULT_BACKUP_INTERVAL_SECONDS = 3600
DEFAULT_BACKUP_RETENTION = 7
DEFAULT_DRILL_NODES = 3
DEFAULT_DRILL_TIMEOUT_SECONDS = 600
# The node container's resources unless spec.resources says otherwise (an empty object: none).
# Requests near what a node uses, so that the scheduler places it where that is free and the
# kubelet, under memory pressure, evicts pods using more than they asked for first; a memory
# limit, so that a leak ends in the node's own restart rather than the machine's pressure. No
# CPU limit: the node is one Python process, and CFS throttling would stall its heartbeats and
# fetches long enough to cost elections, while a CPU request already guarantees its share
# (CloudNativePG's and Strimzi's advice too).
DEFAULT_RESOURCES: Mapping[str, Mapping[str, str]] = {
    "requests": {"cpu": "250m", "memory": "256Mi"},
    "limits": {"memory": "1Gi"},
}


# The longest KafkaQuorum name all of whose children have valid names: the headless Service,
# NAME-nodes, must be a DNS label (at most 63 characters). tests/operator/test_kq_manifests.py
# derives it from every name in resources.py and checks the CRD's rule says the same.
MAX_NAME_LENGTH = 57
# The client Service is named after the quorum: a DNS-1035 label (a letter first, no dots).
NAME_PATTERN = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


class SpecError(ValueError):
    """The spec cannot be used (the CRD's schema should have refused it)."""


def check_name(name: str) -> None:
    """Raises SpecError for a KafkaQuorum name its children cannot be named after (the CRD
    refuses it; an older CRD did not)."""
    if len(name) > MAX_NAME_LENGTH:
        raise SpecError(f"metadata.name must be at most {MAX_NAME_LENGTH} characters (the "
                        "headless Service, NAME-nodes, must be a DNS label of at most 63), got "
                        f"{len(name)}")
    if not NAME_PATTERN.fullmatch(name):
        raise SpecError("metadata.name must start with a letter and hold only lowercase letters, "
                        "digits and '-' (the client Service is named after it, a DNS-1035 "
                        f"label), got {name!r}")


@dataclass(frozen=True)
class Storage:
    size: str = DEFAULT_STORAGE_SIZE
    storage_class_name: str | None = None
    # Delete the volume claims with the KafkaQuorum (off: the data outlives the resource).
    delete_claims: bool = False


@dataclass(frozen=True)
class Remediation:
    enabled: bool = True
    # How long a replacement observer must have been caught up before it is made a voter.
    min_caught_up_seconds: int = DEFAULT_MIN_CAUGHT_UP_SECONDS


@dataclass(frozen=True)
class IssuerRef:
    """A cert-manager issuer: the operator then asks cert-manager for the certificates."""

    name: str
    kind: str = "Issuer"
    group: str = "cert-manager.io"


@dataclass(frozen=True)
class Security:
    # TLS on the nodes' listener, mutual TLS between nodes, credentials for clients.
    tls: bool = True
    certificate_days: int = DEFAULT_CERTIFICATE_DAYS
    renew_before_days: int = DEFAULT_RENEW_BEFORE_DAYS
    issuer: IssuerRef | None = None
    # A NetworkPolicy letting only the quorum's pods, the operator and allow_from reach it.
    network_policy: bool = True
    allow_from: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class PodTemplate:
    affinity: Mapping[str, Any] | None = None
    tolerations: tuple[Mapping[str, Any], ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    priority_class_name: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    # Names of Secrets of the registry credentials to pull the image with.
    image_pull_secrets: tuple[str, ...] = ()
    # None: the operator's default (spread over zones and hosts where possible); a list, even
    # an empty one, replaces it.
    topology_spread_constraints: tuple[Mapping[str, Any], ...] | None = None
    # The pods' PodSecurityContext; None: the operator's (resources.pod_security_context).
    security_context: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ObjectStore:
    """An S3 bucket (or an S3-compatible server's), and the Secret holding its credentials
    (keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; None: the operator's own)."""

    bucket: str
    prefix: str = ""
    endpoint: str | None = None
    region: str | None = None
    credentials_secret: str | None = None


@dataclass(frozen=True)
class RestoreDrill:
    """Scheduled restore drills of the newest backup (docs/backup.md, "Restore drills")."""

    interval_seconds: int
    nodes: int = DEFAULT_DRILL_NODES
    timeout_seconds: int = DEFAULT_DRILL_TIMEOUT_SECONDS


@dataclass(frozen=True)
class Backup:
    """Scheduled backups (docs/operator.md, "Backups")."""

    store: ObjectStore
    interval_seconds: int = DEFAULT_BACKUP_INTERVAL_SECONDS
    retention_count: int = DEFAULT_BACKUP_RETENTION
    restore_drill: RestoreDrill | None = None


@dataclass(frozen=True)
class Bootstrap:
    """Create the quorum from a backup: ``from_backup`` is its location (s3://bucket/...)."""

    from_backup: str
    endpoint: str | None = None
    region: str | None = None
    credentials_secret: str | None = None


@dataclass(frozen=True)
class Spec:
    replicas: int = DEFAULT_REPLICAS
    image: str = DEFAULT_IMAGE
    image_pull_policy: str = "IfNotPresent"
    port: int = DEFAULT_PORT
    controller_port: int = DEFAULT_CONTROLLER_PORT
    storage: Storage = field(default_factory=Storage)
    resources: Mapping[str, Any] = field(default_factory=lambda: DEFAULT_RESOURCES)
    # Node configuration overrides, by the node's key (controller.quorum.fetch.timeout.ms=...).
    node_config: Mapping[str, int] = field(default_factory=dict)
    template: PodTemplate = field(default_factory=PodTemplate)
    remediation: Remediation = field(default_factory=Remediation)
    security: Security = field(default_factory=Security)
    paused: bool = False
    backup: Backup | None = None
    bootstrap: Bootstrap | None = None

    @property
    def fetch_timeout_ms(self) -> int:
        return self.node_config.get(NODE_CONFIG_KEYS["fetchTimeoutMs"], DEFAULT_FETCH_TIMEOUT_MS)


def parse_spec(raw: Mapping[str, Any] | None) -> Spec:
    """The spec of a KafkaQuorum object (its ``spec`` field), defaulted. Raises SpecError."""
    raw = raw or {}
    replicas = _int(raw, "replicas", DEFAULT_REPLICAS, minimum=1)
    storage_raw = _mapping(raw, "storage")
    remediation_raw = _mapping(raw, "remediation")
    template_raw = _mapping(raw, "template")
    config_raw = _mapping(raw, "config")
    unknown = sorted(set(config_raw) - set(NODE_CONFIG_KEYS))
    if unknown:
        raise SpecError(f"spec.config.{unknown[0]}: unknown setting")
    node_config = {NODE_CONFIG_KEYS[k]: _int(config_raw, k, 0, minimum=0) for k in config_raw}
    affinity = template_raw.get("affinity")
    port = _int(raw, "port", DEFAULT_PORT, minimum=1)
    controller_port = _int(raw, "controllerPort", DEFAULT_CONTROLLER_PORT, minimum=1)
    if controller_port == port:
        raise SpecError(f"spec.controllerPort: must differ from spec.port ({port}): the peers "
                        "have a listener of their own")
    return Spec(
        replicas=replicas,
        image=_str(raw, "image", DEFAULT_IMAGE),
        image_pull_policy=_str(raw, "imagePullPolicy", "IfNotPresent"),
        port=port,
        controller_port=controller_port,
        storage=Storage(
            size=_str(storage_raw, "size", DEFAULT_STORAGE_SIZE),
            storage_class_name=storage_raw.get("storageClassName") or None,
            delete_claims=bool(storage_raw.get("deleteClaims", False)),
        ),
        resources=_mapping(raw, "resources") if raw.get("resources") is not None
        else DEFAULT_RESOURCES,
        node_config=node_config,
        template=PodTemplate(
            affinity=affinity if isinstance(affinity, Mapping) else None,
            tolerations=tuple(template_raw.get("tolerations") or ()),
            node_selector=dict(_mapping(template_raw, "nodeSelector")),
            priority_class_name=template_raw.get("priorityClassName") or None,
            labels=dict(_mapping(template_raw, "labels")),
            annotations=dict(_mapping(template_raw, "annotations")),
            image_pull_secrets=_pull_secrets(template_raw.get("imagePullSecrets")),
            topology_spread_constraints=_objects(
                template_raw, "topologySpreadConstraints", "spec.template."),
            security_context=_object(template_raw, "securityContext", "spec.template."),
        ),
        remediation=Remediation(
            enabled=bool(remediation_raw.get("enabled", True)),
            min_caught_up_seconds=_int(remediation_raw, "minCaughtUpSeconds",
                                       DEFAULT_MIN_CAUGHT_UP_SECONDS, minimum=0),
        ),
        security=_security(_mapping(raw, "security")),
        paused=bool(raw.get("paused", False)),
        backup=_backup(_mapping(raw, "backup")),
        bootstrap=_bootstrap(_mapping(raw, "bootstrap")),
    )


def _backup(raw: Mapping[str, Any]) -> Backup | None:
    if not raw:
        return None
    target = _mapping(raw, "target")
    return Backup(
        store=ObjectStore(bucket=_str(target, "bucket", ""),
                          prefix=str(target.get("prefix") or "").strip("/"),
                          endpoint=target.get("endpoint") or None,
                          region=target.get("region") or None,
                          credentials_secret=target.get("credentialsSecret") or None),
        interval_seconds=_int(raw, "intervalSeconds", DEFAULT_BACKUP_INTERVAL_SECONDS,
                              minimum=1),
        retention_count=_int(raw, "retentionCount", DEFAULT_BACKUP_RETENTION, minimum=1),
        restore_drill=_restore_drill(_mapping(raw, "restoreDrill")))


def _restore_drill(raw: Mapping[str, Any]) -> RestoreDrill | None:
    if not raw:
        return None
    return RestoreDrill(
        interval_seconds=_int(raw, "intervalSeconds", 0, minimum=60),
        nodes=_int(raw, "nodes", DEFAULT_DRILL_NODES, minimum=1),
        timeout_seconds=_int(raw, "timeoutSeconds", DEFAULT_DRILL_TIMEOUT_SECONDS, minimum=10))


def _bootstrap(raw: Mapping[str, Any]) -> Bootstrap | None:
    source = _mapping(raw, "fromBackup")
    if not source:
        return None
    location = _str(source, "location", "")
    if not location.startswith("s3://"):
        raise SpecError(f"spec.bootstrap.fromBackup.location: expected s3://BUCKET/PATH, got "
                        f"{location!r}")
    return Bootstrap(from_backup=location.rstrip("/"), endpoint=source.get("endpoint") or None,
                     region=source.get("region") or None,
                     credentials_secret=source.get("credentialsSecret") or None)


def _security(raw: Mapping[str, Any]) -> Security:
    tls = _mapping(raw, "tls")
    policy = _mapping(raw, "networkPolicy")
    days = _int(tls, "certificateDays", DEFAULT_CERTIFICATE_DAYS, minimum=1)
    renew = _int(tls, "renewBeforeDays", DEFAULT_RENEW_BEFORE_DAYS, minimum=1)
    if renew >= days:
        raise SpecError("spec.security.tls.renewBeforeDays: must be less than certificateDays")
    issuer = None
    cert_manager = _mapping(tls, "certManager")
    if cert_manager:
        ref = _mapping(cert_manager, "issuerRef")
        issuer = IssuerRef(_str(ref, "name", ""), _str(ref, "kind", "Issuer"),
                           _str(ref, "group", "cert-manager.io"))
        if issuer.kind not in ISSUER_KINDS:
            raise SpecError(f"spec.security.tls.certManager.issuerRef.kind: one of "
                            f"{', '.join(ISSUER_KINDS)}, got {issuer.kind!r}")
    allow_from = policy.get("allowFrom") or ()
    if not isinstance(allow_from, list | tuple) or \
            not all(isinstance(peer, Mapping) for peer in allow_from):
        raise SpecError("spec.security.networkPolicy.allowFrom: expected a list of objects")
    return Security(tls=bool(tls.get("enabled", True)), certificate_days=days,
                    renew_before_days=renew, issuer=issuer,
                    network_policy=bool(policy.get("enabled", True)),
                    allow_from=tuple(allow_from))


def _pull_secrets(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple) or not all(
            isinstance(ref, Mapping) and isinstance(ref.get("name"), str) and ref["name"]
            for ref in raw):
        raise SpecError(f"spec.template.imagePullSecrets: expected a list of {{name: ...}}, got "
                        f"{raw!r}")
    return tuple(ref["name"] for ref in raw)


def _object(raw: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any] | None:
    """An object, or None where the field is absent."""
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}{key}: expected an object, got {value!r}")
    return value


def _objects(raw: Mapping[str, Any], key: str, where: str
             ) -> tuple[Mapping[str, Any], ...] | None:
    """A list of objects, or None where the field is absent."""
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not all(isinstance(v, Mapping) for v in value):
        raise SpecError(f"{where}{key}: expected a list of objects, got {value!r}")
    return tuple(value)


def _mapping(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(f"spec.{key}: expected an object, got {value!r}")
    return value


def _int(raw: Mapping[str, Any], key: str, default: int, *, minimum: int) -> int:
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise SpecError(f"spec.{key}: expected an integer >= {minimum}, got {value!r}")
    return value


def _str(raw: Mapping[str, Any], key: str, default: str) -> str:
    value = raw.get(key, default)
    if not isinstance(value, str) or not value:
        raise SpecError(f"spec.{key}: expected a non-empty string, got {value!r}")
    return value
