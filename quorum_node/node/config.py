"""A node's configuration: Kafka-style keys from a properties file, environment variables and
command-line flags, validated with pydantic.

Every key has three spellings, e.g. ``controller.quorum.election.timeout.ms`` in the properties
file, ``--controller-quorum-election-timeout-ms`` on the command line and
``QUORUM_CONTROLLER_QUORUM_ELECTION_TIMEOUT_MS`` in the environment (containers and Kubernetes pass
configuration that way). Precedence: flag > environment > file > default. Every value is carried
with where it came from, so that a bad one is reported as a single line naming the key and that
source, e.g. ``node.id (from /etc/quorum/node.properties, line 3): expected an integer, got 'x'``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from quorum_node.addresses import host_port
from quorum_node.raft.config import QuorumConfig, VoterEndpoint, parse_quorum_voters
from quorum_node.security.peer_identity import (
    DEFAULT_PEER_PRINCIPAL_TEMPLATE,
    validate_peer_principal_template,
)
from quorum_node.security.roles import parse_principal_grants
from quorum_node.storage.meta_properties import validate_cluster_id
from quorum_node.storage.segment_log import DEFAULT_SEGMENT_BYTES

ENV_PREFIX = "QUORUM_"
# The clients' variables (quorum-client, quorum-admin): a shell may hold them for both.
CLIENT_ENV_PREFIX = "QUORUM_CLIENT_"
CLIENT_ENV_VARS = frozenset({"QUORUM_BOOTSTRAP_SERVER"})


class ConfigError(Exception):
    """The configuration cannot be used; the message is one line naming the key and its source."""


def _cluster_id(value: str) -> str:
    validate_cluster_id(value)
    return value


_LISTENER_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
PROTOCOLS = ("PLAINTEXT", "SSL")


class Listener(BaseModel):
    """One entry of ``listeners``: ``NAME://host:port``; ``tls`` from the name's protocol. An
    empty host (``NAME://:port``, Kafka's default interface) listens on every interface, IPv6
    and IPv4 (``addresses.every_interface_socket``); an address given is listened on as given
    (``0.0.0.0``: every IPv4 interface only)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=_LISTENER_NAME.pattern)
    host: str
    port: int = Field(ge=1, le=65535)
    tls: bool = False

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def address(self) -> str:
        return host_port(self.host, self.port)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}"

    @property
    def protocol(self) -> str:
        return "SSL" if self.tls else "PLAINTEXT"

    def __str__(self) -> str:
        return f"{self.name}://{self.address}"


def _controllers(listeners: tuple[Listener, ...], names: str) -> tuple[Listener, ...]:
    """The controller listeners in the order ``names`` gives them (the first one alone when
    ``names`` is empty: it serves everything)."""
    if not names:
        return listeners[:1]
    by_name = {listener.name: listener for listener in listeners}
    return tuple(by_name[name] for name in names.split(","))


def _any_tls(info: ValidationInfo) -> bool:
    listeners: tuple[Listener, ...] = info.data.get("listeners") or ()
    return any(listener.tls for listener in listeners)


def _controllers_of(info: ValidationInfo) -> tuple[Listener, ...] | None:
    listeners: tuple[Listener, ...] | None = info.data.get("listeners")
    names = info.data.get("controller_listener_names")
    if not listeners or names is None:
        return None
    return _controllers(listeners, names)


class NodeConfig(BaseModel):
    """Everything a node needs to start. Build it with ``load_config`` (or directly in code)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node_id: int = Field(ge=0)
    cluster_id: Annotated[str, AfterValidator(_cluster_id)]
    log_dir: Path
    # Kafka's name of the same directory (a controller's metadata log): Kafka's tools read it
    # (kafka-metadata-quorum add-controller finds meta.properties there). Always log_dir's.
    metadata_log_dir: Path | None = None
    # Kafka's process.roles: a node of this quorum is a controller, and only that.
    process_roles: str = "controller"
    # Declared before listeners: parsing a listener's name reads it.
    listener_security_protocol_map: str = Field("", validate_default=True)
    # The controller listener serves the peer RPCs only, the others the client and admin APIs,
    # probes and metrics; a single listener without controller.listener.names serves them all.
    listeners: tuple[Listener, ...] = Field(min_length=1)
    controller_listener_names: str = Field("", validate_default=True)
    voters: tuple[VoterEndpoint, ...] = Field(min_length=1)
    # Where each voter serves clients: a node that is not the leader redirects clients there.
    client_endpoints: tuple[VoterEndpoint, ...] | None = Field(None, validate_default=True)
    quorum: QuorumConfig = Field(default_factory=QuorumConfig)
    segment_bytes: int = Field(DEFAULT_SEGMENT_BYTES, ge=1)
    format_if_empty: bool = False
    # About 20 MB of 100-byte records: Kafka snapshots every 20 MiB of metadata log by default.
    snapshot_interval_records: int = Field(200_000, ge=0)
    snapshot_retained_log_records: int = Field(0, ge=0)
    # At least one largest change (a 1 KiB key and a 1 MiB value), so that a watch that keeps up
    # is never told its next change was dropped.
    kv_history_retention_bytes: int = Field(64 * 1024 * 1024, ge=2 * 1024 * 1024)
    # GET /v1/backup: a reader may stall while it uploads what it read to object storage.
    backup_write_timeout_ms: int = Field(60_000, ge=100)
    backup_max_streams: int = Field(2, ge=1)
    # Security (docs/security.md). Declared after listeners: their checks read them.
    ssl_certificate_location: Path | None = Field(None, validate_default=True)
    ssl_key_location: Path | None = Field(None, validate_default=True)
    ssl_ca_location: Path | None = Field(None, validate_default=True)
    ssl_endpoint_identification_algorithm: Literal["https", ""] = "https"
    auth_token_file: Path | None = None
    auth_certificate_roles: str = Field("", validate_default=True)
    auth_peer_principal_template: Annotated[
        str, AfterValidator(validate_peer_principal_template)] = DEFAULT_PEER_PRINCIPAL_TEMPLATE
    # Declared after auth_token_file: a token file makes it required on a PLAINTEXT controller.
    controller_listener_secret_file: Path | None = Field(None, validate_default=True)
    security_reload_interval_ms: int = Field(10_000, ge=100)
    # Hostile clients.
    http_read_timeout_ms: int = Field(30_000, ge=100)
    http_max_long_polls: int = Field(1024, ge=1)
    http_stream_max_unsent_bytes: int = Field(1024 * 1024, ge=1)
    http_stream_write_timeout_ms: int = Field(30_000, ge=100)
    max_connections: int = Field(1000, ge=1)
    max_connections_per_ip: int = Field(100, ge=1)
    max_connections_per_principal: int = Field(250, ge=1)

    @field_validator("listener_security_protocol_map")
    @classmethod
    def _protocol_map(cls, value: str) -> str:
        parse_protocol_map(value)
        return value

    @field_validator("listeners", mode="before")
    @classmethod
    def _parse_listeners(cls, value: object, info: ValidationInfo) -> object:
        if not isinstance(value, str):
            return value
        protocols = parse_protocol_map(info.data.get("listener_security_protocol_map", ""))
        return parse_listeners(value, protocols)

    @field_validator("listeners")
    @classmethod
    def _distinct_listeners(cls, value: tuple[Listener, ...]) -> tuple[Listener, ...]:
        names = [listener.name for listener in value]
        ports = [listener.port for listener in value]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"listener name {name} appears twice")
        for port in ports:
            if ports.count(port) > 1:
                raise ValueError(f"port {port} appears twice (each listener needs its own)")
        return value

    @field_validator("controller_listener_names")
    @classmethod
    def _controller_listener(cls, value: str, info: ValidationInfo) -> str:
        listeners: tuple[Listener, ...] | None = info.data.get("listeners")
        names = [name.strip().upper() for name in value.split(",") if name.strip()]
        if listeners is None:
            return value  # listeners is bad: reported on its own
        if not names:
            if len(listeners) > 1:
                raise ValueError("required with more than one listener: name the one that "
                                 "serves the peers (the others serve clients), e.g. CONTROLLER")
            return ""
        if len(names) > 2:
            raise ValueError(f"{value!r}: name one listener, or two while the peers move from "
                             "one to the other (the first is the one this node connects to)")
        if len(names) == 2 and names[0] == names[1]:
            raise ValueError(f"{names[0]} is named twice")
        known = [listener.name for listener in listeners]
        for name in names:
            if name not in known:
                raise ValueError(f"{name} is not among the listeners ({', '.join(known)})")
        clients = [listener for listener in listeners if listener.name not in names]
        if not clients:
            raise ValueError(f"{' and '.join(names)} would serve the peers only, so the client "
                             "and admin APIs would be served nowhere: add a client listener, or "
                             "leave controller.listener.names unset to serve everything on one")
        if len({listener.tls for listener in clients}) > 1:
            raise ValueError("the client listeners mix PLAINTEXT and SSL; use one protocol "
                             "for all of them")
        return ",".join(names)

    @field_validator("voters", mode="before")
    @classmethod
    def _parse_voters(cls, value: object) -> object:
        return parse_quorum_voters(value) if isinstance(value, str) else value

    @field_validator("client_endpoints", mode="before")
    @classmethod
    def _parse_client_endpoints(cls, value: object) -> object:
        if isinstance(value, str):
            if not value.strip():
                return None
            try:
                return parse_quorum_voters(value)
            except ValueError as error:
                raise ValueError(str(error).removeprefix("controller.quorum.voters: ")
                                 .removeprefix("controller.quorum.voters ")) from None
        return value

    @field_validator("client_endpoints")
    @classmethod
    def _client_endpoints(cls, value: tuple[VoterEndpoint, ...] | None,
                          info: ValidationInfo) -> tuple[VoterEndpoint, ...] | None:
        voters: tuple[VoterEndpoint, ...] | None = info.data.get("voters")
        separate = bool(info.data.get("controller_listener_names"))
        if value is None:
            if separate:
                raise ValueError("required with a separate controller listener: each voter's "
                                 "client listener, id@host:port,... (where clients are "
                                 "redirected to the leader)")
            return None
        if voters is not None:
            missing = sorted({v.id for v in voters} - {e.id for e in value})
            if missing:
                raise ValueError(f"no client endpoint for voter {missing[0]}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _one_log_dir(cls, data: Any) -> Any:
        """log.dir and metadata.log.dir name one directory: either sets both."""
        if not isinstance(data, dict):
            return data
        given = {name: data.get(name) for name in ("log_dir", "metadata_log_dir")
                 if data.get(name) is not None and str(data.get(name)).strip()}
        if len(given) == 2 and Path(str(given["log_dir"])) != Path(
                str(given["metadata_log_dir"])):
            raise ValueError(f"log.dir ({given['log_dir']}) and metadata.log.dir "
                             f"({given['metadata_log_dir']}) differ: they name the one "
                             "directory of the node's log; set one of them")
        if len(given) == 1:
            value = next(iter(given.values()))
            data = {**data, "log_dir": value, "metadata_log_dir": value}
        return data

    @field_validator("process_roles")
    @classmethod
    def _controller_only(cls, value: str) -> str:
        roles = {role.strip() for role in value.split(",") if role.strip()}
        if roles != {"controller"}:
            raise ValueError(f"expected 'controller', got {value!r}: a node of this quorum is a "
                             "KRaft controller only (no broker role)")
        return "controller"

    @field_validator("log_dir", mode="before")
    @classmethod
    def _non_empty_log_dir(cls, value: object) -> object:
        # Path("") is ".", which would quietly put the log wherever the node was started from.
        if isinstance(value, str) and not value.strip():
            raise ValueError("expected a directory path, got ''")
        return value

    @field_validator("ssl_certificate_location", "ssl_key_location", "ssl_ca_location",
                     "auth_token_file", mode="before")
    @classmethod
    def _empty_path_is_none(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("ssl_certificate_location", "ssl_key_location", "ssl_ca_location")
    @classmethod
    def _tls_files_with_tls_listener(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        tls = _any_tls(info)
        if tls and value is None:
            raise ValueError("required with an SSL listener (a PEM file)")
        if not tls and value is not None:
            raise ValueError("only used with an SSL listener: set listeners=SSL://host:port "
                             "(a PLAINTEXT listener would silently ignore it)")
        return value

    @field_validator("auth_certificate_roles")
    @classmethod
    def _certificate_roles(cls, value: str, info: ValidationInfo) -> str:
        grants = parse_principal_grants(value)
        tls = _any_tls(info)
        if grants and not tls:
            raise ValueError("certificate principals need an SSL listener")
        return value

    @field_validator("controller_listener_secret_file", mode="before")
    @classmethod
    def _empty_secret_is_none(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("controller_listener_secret_file")
    @classmethod
    def _peer_secret(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        controllers = _controllers_of(info)
        if controllers is None:
            return value  # listeners or controller.listener.names is bad: reported on its own
        plaintext = [listener for listener in controllers if not listener.tls]
        if not plaintext and value is not None:
            raise ValueError(f"only used with a PLAINTEXT controller listener ({controllers[0]} "
                             "is SSL: peers prove who they are with their certificates)")
        if plaintext and value is None:
            # A node that asks its clients for a credential (a token, or TLS) must not leave
            # its peer RPCs open to anyone who reaches a PLAINTEXT controller listener.
            secured = ("auth.token.file" if info.data.get("auth_token_file")
                       else "an SSL listener" if _any_tls(info) else None)
            if secured is not None:
                raise ValueError(f"required with {secured} on the PLAINTEXT controller "
                                 f"listener {plaintext[0]}: otherwise anyone who can reach it "
                                 "could speak as a peer without a credential (set it, or make "
                                 "the controller listener SSL)")
        return value

    @property
    def controller_listeners(self) -> tuple[Listener, ...]:
        """The listeners that serve the peer RPCs: one, or two while the peers move from one
        protocol (or port) to another (the only listener, when it serves everything)."""
        return _controllers(self.listeners, self.controller_listener_names)

    @property
    def controller_listener(self) -> Listener:
        """The controller listener this node connects to its peers on, as Kafka uses the first
        of controller.listener.names: controller.quorum.voters names the voters' ports of it,
        and this node speaks its protocol to them."""
        return self.controller_listeners[0]

    @property
    def combined_listener(self) -> bool:
        """One listener serves peers, clients and admin (no controller.listener.names)."""
        return not self.controller_listener_names

    @property
    def client_listeners(self) -> tuple[Listener, ...]:
        """The listeners that serve the client and admin APIs, probes and metrics."""
        if self.combined_listener:
            return self.listeners
        controllers = self.controller_listeners
        return tuple(listener for listener in self.listeners if listener not in controllers)

    @property
    def url_scheme(self) -> str:
        """The scheme of the client listeners (they all have the same protocol)."""
        return self.client_listeners[0].scheme

    @property
    def client_url(self) -> str:
        """Where this node serves clients (its first client listener)."""
        return self.client_listeners[0].url

    @property
    def any_tls(self) -> bool:
        return any(listener.tls for listener in self.listeners)

    @property
    def voter_client_endpoints(self) -> tuple[VoterEndpoint, ...]:
        """Where each voter serves clients: controller.quorum.client.endpoints, or with one
        listener for everything the voters' own addresses."""
        return self.client_endpoints if self.client_endpoints is not None else self.voters

    def to_properties(self) -> str:
        """The Kafka-style properties file that ``load_config`` reads back into this config,
        every key written out with its help as a comment. Only the settings that have a key are
        written (``QuorumConfig``'s fetch sizes and long-poll wait are fixed)."""
        lines = ["# quorum-node configuration; `quorum-node run --help` lists every key."]
        for key in CONFIG_KEYS:
            lines += ["", f"# {key.help}", f"{key.name}={_escape(_render(key, self))}"]
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ConfigKey:
    """One configuration key, and the NodeConfig field(s) it sets (dotted for nested ones)."""

    name: str
    fields: tuple[str, ...]
    help: str
    # False for the keys that identify a node (``quorum-node local`` sets those itself).
    shared: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace(".", "-")

    @property
    def env_var(self) -> str:
        return ENV_PREFIX + re.sub(r"[.-]", "_", self.name).upper()

    @property
    def required(self) -> bool:
        return _field_info(self.fields[0]).is_required()

    @property
    def default(self) -> str | None:
        """The default in properties syntax; None for a required key."""
        if self.required:
            return None
        return _format_value(_field_info(self.fields[0]).get_default(call_default_factory=True))


_QUORUM_TIMING = "controller.quorum."
CONFIG_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("node.id", ("node_id",), "This node's id: an integer >= 0, unique in the cluster."),
    ConfigKey("cluster.id", ("cluster_id",),
              "The cluster id (base64url, as `quorum-node random-cluster-id` prints); must match "
              "meta.properties."),
    ConfigKey("log.dir", ("log_dir",),
              "The log directory, formatted by `quorum-node format` (or format.if.empty)."),
    ConfigKey("metadata.log.dir", ("metadata_log_dir",),
              "Kafka's name of log.dir (a controller's metadata log directory), where Kafka's "
              "kafka-metadata-quorum add-controller reads meta.properties: either key sets "
              "both (unset: log.dir's)."),
    ConfigKey("process.roles", ("process_roles",),
              "Kafka's roles of a node: controller, the only one (Kafka's tools check for it)."),
    ConfigKey("listeners", ("listeners",),
              "Where to listen: NAME://host:port,... (PLAINTEXT and SSL name their protocol, "
              "others are mapped by listener.security.protocol.map; [::1] for IPv6; a bare "
              "host:port is PLAINTEXT; NAME://:port listens on every interface, IPv6 and IPv4, "
              "0.0.0.0 on IPv4's only). One of them serves the peers: controller.listener.names."),
    ConfigKey("listener.security.protocol.map", ("listener_security_protocol_map",),
              "The protocol of each listener name other than PLAINTEXT and SSL: "
              "NAME:PROTOCOL,... (PLAINTEXT or SSL), e.g. CONTROLLER:SSL,CLIENT:SSL."),
    ConfigKey("controller.listener.names", ("controller_listener_names",),
              "The listener that serves the peer RPCs, and only those; the others serve the "
              "client and admin APIs, probes and metrics. Two names (A,B) while the peers move "
              "to another protocol or port: both serve the peers, and this node connects to "
              "its peers on the first one's protocol. Unset: the only listener serves "
              "everything (a warning)."),
    ConfigKey("controller.quorum.voters", ("voters",),
              "The voters, id@host:port,... (each voter's port of the first controller "
              "listener: this node speaks that listener's protocol to them)."),
    ConfigKey("controller.quorum.client.endpoints", ("client_endpoints",),
              "Each voter's client listener, id@host:port,..., where a node that is not the "
              "leader redirects clients; required with a controller listener of its own "
              "(unset: the voters' addresses)."),
    ConfigKey(_QUORUM_TIMING + "election.timeout.ms", ("quorum.election_timeout_ms",),
              "Election timeout; each timer is drawn from [T, 2T).", shared=True),
    ConfigKey(_QUORUM_TIMING + "fetch.timeout.ms", ("quorum.fetch_timeout_ms",),
              "A follower that has not heard from its leader for this long starts an election "
              "(at once when the leader's address refuses connections: its process is gone). "
              "Kafka's default is 2000: this one is etcd's election timeout.",
              shared=True),
    ConfigKey(_QUORUM_TIMING + "election.backoff.max.ms", ("quorum.election_backoff_max_ms",),
              "Cap of the back-off before a resigned leader's successors campaign.", shared=True),
    ConfigKey(_QUORUM_TIMING + "request.timeout.ms", ("quorum.request_timeout_ms",),
              "Timeout of a request to a peer (above the fetch long-poll: 500 ms, at most a "
              "quarter of the fetch timeout).", shared=True),
    ConfigKey(_QUORUM_TIMING + "retry.backoff.ms", ("quorum.retry_backoff_ms",),
              "Wait before retrying a failed request to a peer.", shared=True),
    ConfigKey(_QUORUM_TIMING + "append.linger.ms", ("quorum.append_linger_ms",),
              "Longest the leader holds appends back to batch them behind a running fsync.",
              shared=True),
    ConfigKey(_QUORUM_TIMING + "high.watermark.linger.ms", ("quorum.high_watermark_linger_ms",),
              "Longest a follower's fetch waits for records to carry a new high watermark (0: "
              "answer at once, as Kafka does); commits never wait for it.", shared=True),
    ConfigKey(_QUORUM_TIMING + "leader.flush.delay.ms", ("quorum.leader_flush_delay_ms",),
              "Longest a leader leaves a lone write unflushed while the voters fetching from "
              "it commit it without it, or holds it back from the parked followers its commit "
              "does not need (0: flush at once and send to every follower, as Kafka does); "
              "records still uncommitted by then are flushed.", shared=True),
    ConfigKey("log.segment.bytes", ("segment_bytes",), "Size at which a log segment rolls.",
              shared=True),
    ConfigKey("snapshot.interval.records", ("snapshot_interval_records",),
              "Write a snapshot of the key-value store after this many committed records, and "
              "no sooner than a quarter as many as it has keys (0: never).", shared=True),
    ConfigKey("snapshot.retained.log.records", ("snapshot_retained_log_records",),
              "Records of log kept below the latest snapshot; whole segments older than that "
              "are deleted.", shared=True),
    ConfigKey("kv.history.retention.bytes", ("kv_history_retention_bytes",),
              "Most bytes of the key-value store's change history, which watches read from "
              "(keys and values of the latest changes, at most 100000 of them); a watch from an "
              "older offset gets 410 COMPACTED.", shared=True),
    ConfigKey("backup.write.timeout.ms", ("backup_write_timeout_ms",),
              "Longest a GET /v1/backup reader may leave a chunk of the archive untaken; a "
              "slower one is cut off, and what the backup held open is released.", shared=True),
    ConfigKey("backup.max.streams", ("backup_max_streams",),
              "Most backups (GET /v1/backup) streamed at once; more get 503 BACKUP_UNAVAILABLE.",
              shared=True),
    ConfigKey("format.if.empty", ("format_if_empty",),
              "Format an empty log.dir at start-up with a new directory id (for containers)."),
    ConfigKey("ssl.certificate.location", ("ssl_certificate_location",),
              "This node's certificate chain (PEM), for its SSL listener and towards its peers; "
              "it must allow server and client authentication. Reloaded when it changes."),
    ConfigKey("ssl.key.location", ("ssl_key_location",),
              "The certificate's private key (PEM, unencrypted). Reloaded when it changes."),
    ConfigKey("ssl.ca.location", ("ssl_ca_location",),
              "The CA bundle (PEM) that peers' and clients' certificates must chain to. "
              "Reloaded when it changes."),
    ConfigKey("ssl.endpoint.identification.algorithm",
              ("ssl_endpoint_identification_algorithm",),
              "https: a peer's certificate must name the host it is reached at; empty: any "
              "certificate of the CA will do.", shared=True),
    ConfigKey("auth.token.file", ("auth_token_file",),
              "Bearer tokens, one per line: TOKEN PRINCIPAL ROLES (read, write, admin). "
              "Setting it requires a credential for the client and admin APIs."),
    ConfigKey("controller.listener.secret.file", ("controller_listener_secret_file",),
              "A file holding the quorum's shared secret (one line, 16+ printable characters): "
              "on a PLAINTEXT controller listener every peer RPC must carry it (header "
              "X-Quorum-Peer-Secret), and the node sends it to its peers. Required there with "
              "auth.token.file or any SSL listener. Reloaded when it changes: the connections "
              "let in with the old one are closed."),
    ConfigKey("auth.certificate.roles", ("auth_certificate_roles",),
              "Roles of client certificates by subject common name: PATTERN:ROLE[,ROLE];... "
              "(globs; roles read, write, admin), e.g. quorum-operator:admin;app-*:read. Peers "
              "are not granted here: see auth.peer.principal.template."),
    ConfigKey("auth.peer.principal.template", ("auth_peer_principal_template",),
              "Over SSL, the one subject common name of node N's certificate, {id} standing for "
              "N: a peer may speak only as the node its certificate names.", shared=True),
    ConfigKey("security.reload.interval.ms", ("security_reload_interval_ms",),
              "How often the certificate, key, CA and token files are checked for changes.",
              shared=True),
    ConfigKey("http.read.timeout.ms", ("http_read_timeout_ms",),
              "Longest a client may take for its TLS handshake, to send a request's head or "
              "body, or stay idle between requests, and a peer stream may stay silent with "
              "none of its requests parked; slower ones are disconnected.", shared=True),
    ConfigKey("http.max.long.polls", ("http_max_long_polls",),
              "Most record reads waiting for new records (wait_ms) at once; more get 429.",
              shared=True),
    ConfigKey("http.stream.max.unsent.bytes", ("http_stream_max_unsent_bytes",),
              "Most bytes of a client stream's answers the node holds until the client reads "
              "them; beyond it the stream reads no request and sends no answer until the "
              "client has read its answers down.", shared=True),
    ConfigKey("http.stream.write.timeout.ms", ("http_stream_write_timeout_ms",),
              "Longest a client stream may leave more than http.stream.max.unsent.bytes of its "
              "answers unread; the stream is then closed.", shared=True),
    ConfigKey("max.connections", ("max_connections",),
              "Most connections a listener keeps open at once, counted from their accept (TLS "
              "handshakes too); one beyond it is closed at once, except on a client listener, "
              "where a small reserve still takes the probes (GET /healthz, /readyz).",
              shared=True),
    ConfigKey("max.connections.per.ip", ("max_connections_per_ip",),
              "Most connections of one client address on a listener (at most max.connections); "
              "one beyond it is closed at once (or kept for one probe, as above).", shared=True),
    ConfigKey("max.connections.per.principal", ("max_connections_per_principal",),
              "Most connections of one authenticated principal (a token's, a certificate's) on "
              "a listener; a connection whose first authenticated request goes beyond it is "
              "closed unanswered.", shared=True),
)
KEYS_BY_NAME: Mapping[str, ConfigKey] = {key.name: key for key in CONFIG_KEYS}
_KEYS_BY_ENV: Mapping[str, ConfigKey] = {key.env_var: key for key in CONFIG_KEYS}
_KEYS_BY_FIELD: Mapping[str, ConfigKey] = {f: key for key in CONFIG_KEYS for f in key.fields}
# Model-level checks of a nested model, attributed to the one key a user can change to fix them:
# QuorumConfig's long-poll wait is fixed, so only the request timeout can make room for it.
_KEYS_BY_MODEL_CHECK: Mapping[str, ConfigKey] = {
    "quorum": KEYS_BY_NAME[_QUORUM_TIMING + "request.timeout.ms"]
}


class Setting(NamedTuple):
    """A raw value and where it came from (``path, line N``, ``--flag`` or ``ENV_VAR``)."""

    value: str
    source: str


def load_config(
    config_file: Path | None, flags: Mapping[str, str], environ: Mapping[str, str]
) -> NodeConfig:
    """Read the properties file (if any), the ``QUORUM_*`` variables of ``environ`` and ``flags``
    (keyed by key name, e.g. ``{"node.id": "1"}``), flags winning over the environment over the
    file, and validate the result. Raises ConfigError, one line, on an unknown key anywhere, a
    syntax error in the file, a missing required key or a bad value."""
    settings: dict[str, Setting] = {}
    if config_file is not None:
        settings.update(read_properties(config_file))
    settings.update(settings_from_environ(environ))
    settings.update(settings_from_flags(flags))
    return config_from_settings(settings)


def settings_from_flags(flags: Mapping[str, str]) -> dict[str, Setting]:
    settings = {}
    for name, value in flags.items():
        key = KEYS_BY_NAME.get(name)
        if key is None:
            raise ConfigError(f"unknown key {name!r}{_suggest(name, KEYS_BY_NAME)}")
        settings[name] = Setting(value, key.flag)
    return settings


def settings_from_environ(environ: Mapping[str, str]) -> dict[str, Setting]:
    """The ``QUORUM_*`` variables; any other variable is ignored, an unknown ``QUORUM_*`` one is
    an error (a misspelt variable would otherwise be silently dropped), except Kubernetes'
    service links and the clients' variables."""
    settings = {}
    for var in sorted(environ):
        if not var.startswith(ENV_PREFIX) or _is_service_link(var, environ[var]) \
                or var in CLIENT_ENV_VARS or var.startswith(CLIENT_ENV_PREFIX):
            continue
        key = _KEYS_BY_ENV.get(var)
        if key is None:
            raise ConfigError(
                f"{var}: unknown environment variable; QUORUM_* variables are configuration "
                f"keys{_suggest(var, _KEYS_BY_ENV)}"
            )
        settings[key.name] = Setting(environ[var], var)
    return settings


# Kubernetes gives every pod variables for each service of its namespace (unless the pod sets
# enableServiceLinks: false): a service "quorum" or "quorum-node" yields QUORUM_SERVICE_HOST,
# QUORUM_NODE_PORT=tcp://10.0.0.7:9093, QUORUM_PORT_9093_TCP_ADDR and so on. They are recognised
# by their shape (and a bare *_PORT by its tcp:// value, so QUORUM_LISTEN_PORT=9093 is still
# refused as unknown).
_SERVICE_LINK = re.compile(
    r"QUORUM_(?:\w+_)?(?:SERVICE_HOST|SERVICE_PORT(?:_\w+)?|PORT_\d+_(?:TCP|UDP|SCTP)"
    r"(?:_(?:PROTO|PORT|ADDR))?)"
)
_SERVICE_LINK_PORT = re.compile(r"QUORUM_(?:\w+_)?PORT")
_SERVICE_URL = re.compile(r"(?:tcp|udp|sctp)://\S+")


def _is_service_link(var: str, value: str) -> bool:
    if _SERVICE_LINK.fullmatch(var):
        return True
    return bool(_SERVICE_LINK_PORT.fullmatch(var) and _SERVICE_URL.fullmatch(value))


def keys_markdown_table() -> str:
    """The keys as a Markdown table (key, flag, environment variable, default, meaning), for the
    README."""
    rows = ["| key | flag | environment | default | meaning |", "| --- | --- | --- | --- | --- |"]
    for key in CONFIG_KEYS:
        default = ("(required)" if key.default is None
                   else f"`{key.default}`" if key.default else "(none)")
        rows.append(f"| `{key.name}` | `{key.flag}` | `{key.env_var}` | {default} | {key.help} |")
    return "\n".join(rows) + "\n"


def read_properties(path: Path) -> dict[str, Setting]:
    """Read a properties file of known keys; ConfigError names the file and line of a problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path}: unreadable: {exc}") from None
    settings: dict[str, Setting] = {}
    first_line: dict[str, int] = {}
    for name, value, line in parse_properties(text):
        where = f"{path}, line {line}"
        if name not in KEYS_BY_NAME:
            raise ConfigError(f"{where}: unknown key {name!r}{_suggest(name, KEYS_BY_NAME)}")
        if name in settings:
            # Java keeps the last one; a key set twice is more likely a mistake than an override.
            raise ConfigError(f"{where}: {name} is set twice (first on line {first_line[name]})")
        settings[name] = Setting(value, where)
        first_line[name] = line
    return settings


def config_from_settings(settings: Mapping[str, Setting]) -> NodeConfig:
    """Validate raw settings (from any mix of sources) into a NodeConfig."""
    data: dict[str, Any] = {}
    for name, (raw, source) in settings.items():
        key = KEYS_BY_NAME.get(name)
        if key is None:
            raise ConfigError(f"unknown key {name!r} (from {source})")
        value = raw.strip()  # no key's value can begin or end with whitespace
        parent, _, leaf = key.fields[0].rpartition(".")
        (data.setdefault(parent, {}) if parent else data)[leaf] = value
    try:
        return NodeConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, settings)) from None


def parse_protocol_map(value: str) -> dict[str, bool]:
    """``listener.security.protocol.map``: listener name -> whether it is SSL. PLAINTEXT and
    SSL map to themselves unless mapped otherwise."""
    protocols = {"PLAINTEXT": False, "SSL": True}
    for entry in (part.strip() for part in value.split(",")):
        if not entry:
            continue
        name, colon, protocol = (part.strip() for part in entry.partition(":"))
        name = name.upper()
        if not colon or not _LISTENER_NAME.fullmatch(name):
            raise ValueError(f"{entry!r} is not of the form NAME:PROTOCOL (NAME in capitals)")
        if protocol.upper() not in PROTOCOLS:
            raise ValueError(f"{entry!r}: protocol {protocol!r} is not supported (PLAINTEXT or "
                             "SSL; no SASL)")
        protocols[name] = protocol.upper() == "SSL"
    return protocols


def parse_listeners(value: str, protocols: Mapping[str, bool]) -> tuple[Listener, ...]:
    """``listeners``: ``NAME://host:port,...``; a bare ``host:port`` is PLAINTEXT."""
    entries = [entry.strip() for entry in value.split(",")]
    if not any(entries):
        raise ValueError("expected NAME://host:port,...")
    return tuple(parse_listener(entry, protocols) for entry in entries)


def parse_listener(value: str, protocols: Mapping[str, bool] | None = None) -> Listener:
    """One listener, ``NAME://host:port``, ``host:port``, ``[::1]:port`` or ``NAME://:port``
    (every interface)."""
    protocols = protocols if protocols is not None else parse_protocol_map("")
    name, separator, address = value.partition("://")
    if not separator:
        name, address = "PLAINTEXT", value
    name = name.upper()  # as Kafka normalises listener names
    if not _LISTENER_NAME.fullmatch(name):
        raise ValueError(f"{value!r}: a listener name is in capitals, letters, digits and _ "
                         "(e.g. CONTROLLER://host:port)")
    if name not in protocols and name.startswith("SASL"):
        raise ValueError(f"{value!r}: only PLAINTEXT and SSL listeners are supported (no SASL)")
    if name not in protocols:
        raise ValueError(f"{value!r}: listener {name} has no protocol: map it in "
                         f"listener.security.protocol.map (e.g. {name}:SSL)")
    host, colon, port = address.rpartition(":")
    # An empty host: every interface, named only as NAME://:port (Kafka's own form).
    every_interface = not host and bool(separator)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]  # an IPv6 literal
    elif ":" in host:
        raise ValueError(f"{value!r}: put an IPv6 address in brackets, as in [::1]:9093")
    if not colon or (not host and not every_interface) or \
            any(c.isspace() or c in "/[]" for c in host):
        raise ValueError(
            f"{value!r} is not of the form NAME://host:port, host:port or [::1]:port "
            "(NAME://:port listens on every interface, IPv6 and IPv4)"
        )
    if not port.isdigit():
        raise ValueError(f"{value!r}: port: expected an integer, got {port!r}")
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"{value!r}: port: must be from 1 to 65535, got {port!r}")
    return Listener(name=name, host=host, port=int(port), tls=protocols[name])


def parse_properties(text: str) -> list[tuple[str, str, int]]:
    """Java's properties syntax: ``key=value``, ``key: value`` or ``key value`` lines, ``#``/``!``
    comments, blank lines, backslash escapes (``\\t``, ``\\n``, ``\\uXXXX``, ``\\=``, ...) and
    lines continued by a trailing backslash. Returns (key, value, line number) in file order."""
    entries: list[tuple[str, str, int]] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        start = index
        line = lines[index].lstrip()
        index += 1
        if not line or line[0] in "#!":
            continue  # a comment ending in a backslash is not continued, as in Java
        while _continues(line) and index < len(lines):
            line = line[:-1] + lines[index].lstrip()
            index += 1
        if _continues(line):
            line = line[:-1]  # a continuation at the end of the file continues into nothing
        key_end = _key_end(line)
        rest = line[key_end:].lstrip()
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip()
        entries.append((_unescape(line[:key_end]), _unescape(rest), start + 1))
    return entries


def _continues(line: str) -> bool:
    trailing = len(line) - len(line.rstrip("\\"))
    return trailing % 2 == 1


def _key_end(line: str) -> int:
    position = 0
    while position < len(line):
        char = line[position]
        if char == "\\":
            position += 2
            continue
        if char in "=:" or char.isspace():
            return position
        position += 1
    return len(line)


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_UNICODE_ESCAPE = re.compile(r"[0-9a-fA-F]{4}")


def _unescape(text: str) -> str:
    out: list[str] = []
    position = 0
    while position < len(text):
        char = text[position]
        position += 1
        if char != "\\" or position == len(text):
            out.append(char)
            continue
        code = text[position]
        position += 1
        if code == "u" and _UNICODE_ESCAPE.fullmatch(text, position, position + 4):
            out.append(chr(int(text[position : position + 4], 16)))
            position += 4
        else:
            out.append(_ESCAPES.get(code, code))  # \= \: \# \! \\ and any other: the char itself
    return "".join(out)


def _escape(value: str) -> str:
    # Surrounding whitespace needs no escape: every value is trimmed when read.
    return (
        value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
        .replace("\t", "\\t").replace("\f", "\\f")
    )


def _render(key: ConfigKey, config: NodeConfig) -> str:
    if key.name == "metadata.log.dir":
        return str(config.log_dir)
    if key.name == "listeners":
        return ",".join(str(listener) for listener in config.listeners)
    if key.name == "controller.quorum.voters":
        return ",".join(str(voter) for voter in config.voters)
    if key.name == "controller.quorum.client.endpoints":
        return ",".join(str(e) for e in config.client_endpoints or ())
    value: Any = config
    for part in key.fields[0].split("."):
        value = getattr(value, part)
    return _format_value(value)


def _format_value(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _field_info(field: str) -> FieldInfo:
    parent, _, leaf = field.rpartition(".")
    model: type[BaseModel] = QuorumConfig if parent == "quorum" else NodeConfig
    return model.model_fields[leaf]


def _suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _describe(error: ValidationError, settings: Mapping[str, Setting]) -> str:
    """One line for a ValidationError: the first bad value with its key and source (what was
    given comes first), or else every missing required key."""
    problems = error.errors()
    missing = _unique(
        _KEYS_BY_FIELD[_loc(p)]
        for p in problems
        if p["type"] == "missing" and _loc(p) in _KEYS_BY_FIELD
    )
    bad = [p for p in problems if p["type"] != "missing"]
    if missing and not bad:
        names = ", ".join(key.name for key in missing)
        flags = ", ".join(key.flag for key in missing)
        envs = ", ".join(key.env_var for key in missing)
        plural = "s" if len(missing) > 1 else ""
        return (
            f"missing required setting{plural} {names}: set {'them' if plural else 'it'} in the "
            f"config file, with {flags} or with {envs}"
        )
    first = bad[0]
    loc = _loc(first)
    key = _KEYS_BY_FIELD.get(loc) or _KEYS_BY_MODEL_CHECK.get(loc)
    if key is None:  # not reachable from the known keys; report pydantic's view of it
        return f"invalid configuration: {loc}: {first['msg']}"
    setting = settings.get(key.name)
    source = setting.source if setting is not None else "default"
    problem = _problem(first)
    if len(key.fields) > 1:  # say which part of a compound value is wrong
        problem = f"{loc.rpartition('_')[2]}: {problem}"
    if loc in _KEYS_BY_MODEL_CHECK and setting is not None:
        problem += f", got {setting.value.strip()!r}"
    more = ""
    if len(bad) > 1:
        more += f" (and {len(bad) - 1} more bad value{'s' if len(bad) > 2 else ''})"
    if missing:
        more += f"; also missing {', '.join(k.name for k in missing)}"
    return f"{key.name} (from {source}): {problem}{more}"


def _loc(problem: Mapping[str, Any]) -> str:
    return ".".join(str(part) for part in problem["loc"])


def _unique(keys: Iterable[ConfigKey]) -> list[ConfigKey]:
    return list(dict.fromkeys(keys))


def _problem(problem: Mapping[str, Any]) -> str:
    kind: str = problem["type"]
    context: Mapping[str, Any] = problem.get("ctx") or {}
    got = f", got {problem['input']!r}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return "expected an integer" + got
    if kind in ("bool_parsing", "bool_type"):
        return "expected true or false" + got
    if kind == "greater_than_equal":
        return f"must be at least {context['ge']}" + got
    if kind == "greater_than":
        return f"must be greater than {context['gt']}" + got
    if kind == "less_than_equal":
        return f"must be at most {context['le']}" + got
    if kind == "value_error":
        reason = str(context.get("error", problem["msg"]))
        # parse_quorum_voters names the key itself; it is already at the start of the line.
        return reason.removeprefix("controller.quorum.voters: ").removeprefix(
            "controller.quorum.voters "
        )
    message: str = problem["msg"]
    return message[:1].lower() + message[1:] + got
