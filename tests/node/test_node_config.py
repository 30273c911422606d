from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from quorum_node.node.config import (
    CONFIG_KEYS,
    KEYS_BY_NAME,
    ConfigError,
    Listener,
    NodeConfig,
    keys_markdown_table,
    load_config,
    parse_properties,
)
from quorum_node.raft.config import QuorumConfig, VoterEndpoint

REQUIRED = {
    "node.id": "1",
    "cluster.id": "MkU3OEVBNTcwNTJENDM2Qk",
    "log.dir": "/var/lib/quorum/node-1",
    "listeners": "PLAINTEXT://127.0.0.1:9091",
    "controller.quorum.voters": "1@127.0.0.1:9091,2@127.0.0.1:9092,3@127.0.0.1:9093",
}
ELECTION = "controller.quorum.election.timeout.ms"
ELECTION_ENV = "QUORUM_CONTROLLER_QUORUM_ELECTION_TIMEOUT_MS"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.properties"
    path.write_text(text, encoding="utf-8")
    return path


def error_of(config_file: Path | None = None, flags: dict[str, str] | None = None,
             environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(config_file, flags or {}, environ or {})
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_full_config_from_flags() -> None:
    config = load_config(None, REQUIRED, {})
    assert config == NodeConfig(
        node_id=1, cluster_id="MkU3OEVBNTcwNTJENDM2Qk", log_dir=Path("/var/lib/quorum/node-1"),
        listeners=(Listener(name="PLAINTEXT", host="127.0.0.1", port=9091),),
        voters=tuple(VoterEndpoint(id=i, host="127.0.0.1", port=9090 + i) for i in (1, 2, 3)),
    )
    assert config.quorum == QuorumConfig()  # Kafka's defaults
    assert (config.segment_bytes, config.format_if_empty) == (1 << 30, False)
    assert config.client_url == "http://127.0.0.1:9091"


@pytest.mark.parametrize(
    ("in_file", "in_env", "in_flag", "expected"),
    [
        (True, True, True, 1700),
        (True, True, False, 1600),
        (True, False, True, 1700),
        (True, False, False, 1500),
        (False, True, False, 1600),
        (False, False, False, 1000),
    ],
)
def test_precedence_flag_over_env_over_file_over_default(
    tmp_path: Path, in_file: bool, in_env: bool, in_flag: bool, expected: int
) -> None:
    lines = [f"{key}={value}" for key, value in REQUIRED.items()]
    if in_file:
        lines.append(f"{ELECTION}=1500")
    environ = {ELECTION_ENV: "1600", "PATH": "/bin"} if in_env else {}
    flags = {ELECTION: "1700"} if in_flag else {}
    config = load_config(write(tmp_path, "\n".join(lines)), flags, environ)
    assert config.quorum.election_timeout_ms == expected


def test_required_keys_can_come_from_a_mix_of_sources(tmp_path: Path) -> None:
    path = write(tmp_path, "node.id=1\ncluster.id=abc\n")
    config = load_config(
        path, {"log.dir": "/d", "node.id": "4"},
        {"QUORUM_LISTENERS": "h:1", "QUORUM_CONTROLLER_QUORUM_VOTERS": "4@h:1"},
    )
    assert (config.node_id, config.cluster_id, config.listeners[0].host) == (4, "abc", "h")


@pytest.mark.parametrize("missing", [key.name for key in CONFIG_KEYS if key.required])
def test_each_missing_required_key_is_named(missing: str) -> None:
    flags = {key: value for key, value in REQUIRED.items() if key != missing}
    message = error_of(flags=flags)
    key = KEYS_BY_NAME[missing]
    assert message.startswith(f"missing required setting {missing}:")
    assert key.flag in message and key.env_var in message


def test_all_missing_keys_are_named_on_one_line() -> None:
    message = error_of()
    assert message.startswith("missing required settings node.id, cluster.id, log.dir, "
                              "listeners, controller.quorum.voters:")


def test_bad_value_from_env_names_the_key_and_the_variable() -> None:
    environ = {"QUORUM_CONTROLLER_QUORUM_FETCH_TIMEOUT_MS": "abc"}
    assert error_of(flags=REQUIRED, environ=environ) == (
        "controller.quorum.fetch.timeout.ms (from QUORUM_CONTROLLER_QUORUM_FETCH_TIMEOUT_MS): "
        "expected an integer, got 'abc'"
    )


def test_bad_value_from_a_flag_names_the_flag() -> None:
    assert error_of(flags={**REQUIRED, "node.id": "-1"}) == (
        "node.id (from --node-id): must be at least 0, got '-1'"
    )


def test_bad_value_from_the_file_names_the_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "# a node\n\nlog.segment.bytes = lots\n")
    assert error_of(path, flags=REQUIRED) == (
        f"log.segment.bytes (from {path}, line 3): expected an integer, got 'lots'"
    )


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("format.if.empty", "maybe", "expected true or false, got 'maybe'"),
        ("cluster.id", "not a/valid id", "invalid cluster id 'not a/valid id'"),
        ("log.dir", "  ", "expected a directory path, got ''"),
        ("controller.quorum.fetch.timeout.ms", "1", "must be at least 2, got '1'"),
        ("controller.quorum.request.timeout.ms", "400",
         "fetch_max_wait_ms must be below request_timeout_ms"),
    ],
)
def test_bad_values(key: str, value: str, problem: str) -> None:
    message = error_of(flags={**REQUIRED, key: value})
    assert message.startswith(f"{key} (from {KEYS_BY_NAME[key].flag}): {problem}")


def test_values_are_trimmed_and_booleans_parsed() -> None:
    config = load_config(None, {**REQUIRED, "node.id": " 7 ", "format.if.empty": "TRUE"}, {})
    assert (config.node_id, config.format_if_empty) == (7, True)


def test_unknown_key_in_the_file_is_refused_with_a_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path, "node.id=1\nnode.idd=2\n")
    assert error_of(path) == f"{path}, line 2: unknown key 'node.idd' (did you mean node.id?)"


def test_unknown_quorum_variable_is_refused_and_others_ignored() -> None:
    message = error_of(flags=REQUIRED, environ={"QUORUM_NODE_IDD": "1", "HOME": "/root"})
    assert message.startswith("QUORUM_NODE_IDD: unknown environment variable")
    assert "did you mean QUORUM_NODE_ID?" in message
    load_config(None, REQUIRED, {"HOME": "/root", "QUORUMX": "1"})


def test_unknown_flag_key_is_refused() -> None:
    assert error_of(flags={**REQUIRED, "num.partitions": "3"}).startswith(
        "unknown key 'num.partitions'")


def test_a_key_set_twice_in_the_file_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "node.id=1\n\nnode.id=2\n")
    assert error_of(path) == f"{path}, line 3: node.id is set twice (first on line 1)"


def test_missing_config_file(tmp_path: Path) -> None:
    assert error_of(tmp_path / "nope.properties") == (
        f"config file {tmp_path / 'nope.properties'}: not found")


@pytest.mark.parametrize(
    ("listener", "host", "port"),
    [
        ("127.0.0.1:9092", "127.0.0.1", 9092),
        ("PLAINTEXT://node-1.quorum.svc:9093", "node-1.quorum.svc", 9093),
        ("plaintext://0.0.0.0:1", "0.0.0.0", 1),
        ("[::1]:9094", "::1", 9094),
        ("PLAINTEXT://[::]:65535", "::", 65535),
    ],
)
def test_listener_forms(listener: str, host: str, port: int) -> None:
    config = load_config(None, {**REQUIRED, "listeners": listener}, {})
    assert config.listeners == (Listener(name="PLAINTEXT", host=host, port=port),)
    assert config.combined_listener and config.controller_listener == config.client_listeners[0]


@pytest.mark.parametrize(
    ("listener", "problem"),
    [
        ("SASL_SSL://h:9093", "only PLAINTEXT and SSL listeners are supported"),
        ("h", "is not of the form NAME://host:port, host:port"),
        (":9093", "is not of the form NAME://host:port, host:port"),
        ("::1:9093", "put an IPv6 address in brackets"),
        ("h:1,h:2", "listener name PLAINTEXT appears twice"),
        ("h:99999", "port: must be from 1 to 65535, got '99999'"),
        ("h:0", "port: must be from 1 to 65535, got '0'"),
        ("h:http", "port: expected an integer, got 'http'"),
    ],
)
def test_bad_listeners(listener: str, problem: str) -> None:
    message = error_of(environ={"QUORUM_LISTENERS": listener}, flags={
        k: v for k, v in REQUIRED.items() if k != "listeners"})
    assert message.startswith("listeners (from QUORUM_LISTENERS): ")
    assert problem in message


@pytest.mark.parametrize(
    ("voters", "problem"),
    [
        ("1@h", "'1@h' is not of the form id@host:port"),
        ("1@h:1,1@h:2", "node id 1 appears twice"),
        (" , ", "is empty"),
        ("1@h:70000", "'1@h:70000': port"),
    ],
)
def test_voter_errors_name_the_key(tmp_path: Path, voters: str, problem: str) -> None:
    path = write(tmp_path, f"controller.quorum.voters={voters}\n")
    flags = {k: v for k, v in REQUIRED.items() if k != "controller.quorum.voters"}
    message = error_of(path, flags=flags)
    assert message.startswith(f"controller.quorum.voters (from {path}, line 1): ")
    assert problem in message


def test_properties_syntax() -> None:
    text = (
        "# comment\n"
        "! also a comment \\\n"
        "\n"
        "   a=1\n"
        "b : 2\n"
        "c 3\n"
        "d=x\\\n"
        "    y\\\n"
        "  z\n"
        "e=tab\\there \\u00e9\\\\\n"
        "f\\=g=h\n"
        "empty=\n"
        "url=PLAINTEXT://h:1 # not a comment\n"
    )
    assert parse_properties(text) == [
        ("a", "1", 4), ("b", "2", 5), ("c", "3", 6), ("d", "xyz", 7),
        ("e", "tab\there \u00e9\\", 10), ("f=g", "h", 11), ("empty", "", 12),
        ("url", "PLAINTEXT://h:1 # not a comment", 13),
    ]


@pytest.mark.parametrize(
    ("log_dir", "host"),
    [("/data/quorum", "127.0.0.1"), ("/odd dir\\with#chars\tand é", "::1")],
)
def test_properties_round_trip(tmp_path: Path, log_dir: str, host: str) -> None:
    config = NodeConfig(
        node_id=3, cluster_id="abc-_XYZ", log_dir=Path(log_dir),
        listeners=f"CLIENT://{'[::1]' if ':' in host else host}:9092,CONTROLLER://a:9093",
        listener_security_protocol_map="CLIENT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        controller_listener_names="CONTROLLER", controller_listener_secret_file="/s/secret",
        client_endpoints=(VoterEndpoint(id=1, host="a", port=1),
                          VoterEndpoint(id=3, host=host, port=9092)),
        voters=(VoterEndpoint(id=1, host="a", port=1), VoterEndpoint(id=3, host=host, port=9093)),
        quorum=QuorumConfig(election_timeout_ms=500, fetch_timeout_ms=1000,
                            election_backoff_max_ms=700, request_timeout_ms=1500,
                            retry_backoff_ms=5, append_linger_ms=1),
        segment_bytes=4096, format_if_empty=True,
    )
    text = config.to_properties()
    assert all(f"\n{key.name}=" in text for key in CONFIG_KEYS)
    assert load_config(write(tmp_path, text), {}, {}) == config


def test_key_spellings() -> None:
    key = KEYS_BY_NAME["controller.quorum.election.timeout.ms"]
    assert key.flag == "--controller-quorum-election-timeout-ms"
    assert key.env_var == ELECTION_ENV
    assert (key.default, key.required, key.shared) == ("1000", False, True)
    assert KEYS_BY_NAME["node.id"].default is None


def test_every_field_has_a_key() -> None:
    fields = {field for key in CONFIG_KEYS for field in key.fields}
    top = {field.partition(".")[0] for field in fields}
    assert top == set(NodeConfig.model_fields)
    assert all(key.help and key.help.endswith(".") for key in CONFIG_KEYS)


def test_a_bad_value_is_reported_before_missing_keys() -> None:
    message = error_of(flags={"node.id": "x", "log.segment.bytes": "y", "log.dir": "/d"})
    assert message == (
        "node.id (from --node-id): expected an integer, got 'x' (and 1 more bad value); also "
        "missing cluster.id, listeners, controller.quorum.voters"
    )


def test_kubernetes_service_links_are_not_taken_for_keys() -> None:
    links = {
        "QUORUM_SERVICE_HOST": "10.0.0.7", "QUORUM_SERVICE_PORT": "9093",
        "QUORUM_SERVICE_PORT_CLIENT": "9093", "QUORUM_PORT": "tcp://10.0.0.7:9093",
        "QUORUM_PORT_9093_TCP": "tcp://10.0.0.7:9093", "QUORUM_PORT_9093_TCP_ADDR": "10.0.0.7",
        "QUORUM_NODE_SERVICE_HOST": "10.0.0.8", "QUORUM_NODE_PORT": "tcp://10.0.0.8:9093",
        "QUORUM_NODE_PORT_9093_TCP_PROTO": "tcp",
    }
    assert load_config(None, REQUIRED, links) == load_config(None, REQUIRED, {})
    # Not a service link: a guessed key name is still refused.
    assert error_of(flags=REQUIRED, environ={"QUORUM_LISTEN_PORT": "9093"}).startswith(
        "QUORUM_LISTEN_PORT: unknown environment variable")


def test_keys_markdown_table() -> None:
    table = keys_markdown_table().splitlines()
    assert len(table) == 2 + len(CONFIG_KEYS)
    assert table[2] == ("| `node.id` | `--node-id` | `QUORUM_NODE_ID` | (required) | This node's "
                        "id: an integer >= 0, unique in the cluster. |")
    assert "| `log.segment.bytes` | `--log-segment-bytes` | `QUORUM_LOG_SEGMENT_BYTES` | "\
        "`1073741824` |" in keys_markdown_table()


def test_readme_lists_every_key() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert keys_markdown_table().strip() in readme, "README's key table is out of date"


SPLIT = {
    **REQUIRED,
    "listeners": "CLIENT://0.0.0.0:9092,CONTROLLER://0.0.0.0:9093",
    "listener.security.protocol.map": "CLIENT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "controller.listener.names": "CONTROLLER",
    "controller.quorum.voters": "1@n1:9093,2@n2:9093",
    "controller.quorum.client.endpoints": "1@n1:9092,2@n2:9092",
}


def test_a_controller_listener_of_its_own() -> None:
    config = load_config(None, SPLIT, {})
    assert not config.combined_listener
    assert config.controller_listener == Listener(name="CONTROLLER", host="0.0.0.0", port=9093)
    assert config.client_listeners == (Listener(name="CLIENT", host="0.0.0.0", port=9092),)
    assert config.client_url == "http://0.0.0.0:9092"
    assert [str(e) for e in config.voter_client_endpoints] == ["1@n1:9092", "2@n2:9092"]
    # Names are normalised to capitals, as Kafka does; PLAINTEXT and SSL need no mapping.
    mixed = load_config(None, {**SPLIT, "listeners": "plaintext://h:1,controller://h:2",
                               "listener.security.protocol.map": "Controller:plaintext",
                               "controller.listener.names": "controller"}, {})
    assert [str(listener) for listener in mixed.listeners] == [
        "PLAINTEXT://h:1", "CONTROLLER://h:2"]
    assert mixed.controller_listener.name == "CONTROLLER"


def test_one_listener_serves_everything_and_clients_are_sent_to_the_voters() -> None:
    config = load_config(None, REQUIRED, {})
    assert config.combined_listener and config.client_listeners == config.listeners
    assert config.voter_client_endpoints == config.voters


@pytest.mark.parametrize(
    ("change", "key", "problem"),
    [
        ({"listeners": "CLIENT://h:1,CLIENT://h:2"}, "listeners",
         "listener name CLIENT appears twice"),
        ({"listeners": "CLIENT://h:1,CONTROLLER://g:1"}, "listeners", "port 1 appears twice"),
        ({"listeners": "CLIENT://h:1,OTHER://h:2"}, "listeners",
         "listener OTHER has no protocol: map it in listener.security.protocol.map"),
        ({"listeners": "CLIENT://h:1,SASL_SSL://h:2"}, "listeners", "no SASL"),
        ({"listeners": "client-1://h:1"}, "listeners", "a listener name is in capitals"),
        ({"listener.security.protocol.map": "CLIENT:SASL_PLAINTEXT"},
         "listener.security.protocol.map", "is not supported (PLAINTEXT or SSL; no SASL)"),
        ({"listener.security.protocol.map": "CLIENT"}, "listener.security.protocol.map",
         "is not of the form NAME:PROTOCOL"),
        ({"controller.listener.names": "PEERS"}, "controller.listener.names",
         "PEERS is not among the listeners (CLIENT, CONTROLLER)"),
        ({"controller.listener.names": "CONTROLLER,CLIENT"}, "controller.listener.names",
         "would serve the peers only, so the client and admin APIs would be served nowhere"),
        ({"listeners": "CLIENT://h:1,CONTROLLER://h:2,PLAINTEXT://h:3,SSL://h:4",
          "controller.listener.names": "CONTROLLER,PLAINTEXT,SSL"}, "controller.listener.names",
         "name one listener, or two while the peers move from one to the other"),
        ({"controller.listener.names": "CONTROLLER,controller"}, "controller.listener.names",
         "CONTROLLER is named twice"),
        ({"controller.listener.names": "CONTROLLER,PEERS"}, "controller.listener.names",
         "PEERS is not among the listeners (CLIENT, CONTROLLER)"),
        ({"controller.listener.names": ""}, "controller.listener.names",
         "required with more than one listener"),
        ({"listeners": "CONTROLLER://h:1"}, "controller.listener.names",
         "CONTROLLER would serve the peers only, so the client and admin APIs would be served "
         "nowhere"),
        ({"listeners": "CLIENT://h:1,PLAINTEXT://h:3,CONTROLLER://h:2",
          "listener.security.protocol.map": "CLIENT:SSL,CONTROLLER:PLAINTEXT"},
         "controller.listener.names", "the client listeners mix PLAINTEXT and SSL"),
        ({"controller.quorum.client.endpoints": ""}, "controller.quorum.client.endpoints",
         "required with a separate controller listener"),
        ({"controller.quorum.client.endpoints": "1@n1:9092"}, "controller.quorum.client.endpoints",
         "no client endpoint for voter 2"),
        ({"controller.quorum.client.endpoints": "1@n1"}, "controller.quorum.client.endpoints",
         "'1@n1' is not of the form id@host:port"),
    ],
)
def test_bad_listener_settings(change: dict[str, str], key: str, problem: str) -> None:
    message = error_of(flags={**SPLIT, **change})
    assert message.startswith(f"{key} (from "), message
    assert problem in message, message


def test_peer_secret_rules(tmp_path: Path) -> None:
    tokens = str(tmp_path / "tokens")
    # A token file on a PLAINTEXT controller listener: peer RPCs must not stay open.
    for settings in (SPLIT, REQUIRED):
        message = error_of(flags={**settings, "auth.token.file": tokens})
        assert message.startswith("controller.listener.secret.file (from default): required "
                                  "with auth.token.file on the PLAINTEXT controller listener")
    config = load_config(None, {**SPLIT, "auth.token.file": tokens,
                                "controller.listener.secret.file": "/s/secret"}, {})
    assert config.controller_listener_secret_file == Path("/s/secret")
    # Over SSL the certificates identify the peers: a secret would be silently unused. (Checked
    # on its own: what an SSL listener needs besides is another key's business.)
    with pytest.raises(ValidationError) as caught:
        NodeConfig(node_id=1, cluster_id="abc", log_dir=Path("/d"),
                   listeners="CLIENT://h:1,CONTROLLER://h:2",
                   listener_security_protocol_map="CLIENT:PLAINTEXT,CONTROLLER:SSL",
                   controller_listener_names="CONTROLLER", voters="1@h:2",
                   client_endpoints="1@h:1", controller_listener_secret_file="/s/secret")
    assert any(error["loc"] == ("controller_listener_secret_file",)
               and "only used with a PLAINTEXT controller listener" in error["msg"]
               for error in caught.value.errors())


# A migration of the controller listener: the old one and the new one serve the peers at once.
MIGRATING = {
    **SPLIT,
    "listeners": "CLIENT://0.0.0.0:9092,CONTROLLER://0.0.0.0:9093,CONTROLLER_SSL://0.0.0.0:9094",
    "listener.security.protocol.map": "CLIENT:PLAINTEXT,CONTROLLER:PLAINTEXT,CONTROLLER_SSL:SSL",
    "controller.listener.names": "CONTROLLER,CONTROLLER_SSL",
    "ssl.certificate.location": "/s/cert.pem", "ssl.key.location": "/s/key.pem",
    "ssl.ca.location": "/s/ca.pem",
    # With an SSL listener, a PLAINTEXT controller listener needs the secret.
    "controller.listener.secret.file": "/s/secret",
}


def test_two_controller_listeners_serve_the_peers_and_the_first_connects_to_them() -> None:
    config = load_config(None, MIGRATING, {})
    assert config.controller_listener_names == "CONTROLLER,CONTROLLER_SSL"
    assert [str(listener) for listener in config.controller_listeners] == [
        "CONTROLLER://0.0.0.0:9093", "CONTROLLER_SSL://0.0.0.0:9094"]
    # The first is where the voters' ports are, and the protocol this node speaks to them.
    assert config.controller_listener.name == "CONTROLLER" and not config.controller_listener.tls
    assert [str(listener) for listener in config.client_listeners] == ["CLIENT://0.0.0.0:9092"]
    swapped = load_config(None, {**MIGRATING,
                                 "controller.listener.names": "controller_ssl, controller"}, {})
    assert swapped.controller_listener_names == "CONTROLLER_SSL,CONTROLLER"
    assert swapped.controller_listener.tls
    # Written out and read back as it was.
    assert "controller.listener.names=CONTROLLER_SSL,CONTROLLER" in swapped.to_properties()


def test_the_peer_secret_while_a_plaintext_controller_listener_is_one_of_two(
        tmp_path: Path) -> None:
    tokens = str(tmp_path / "tokens")
    # The PLAINTEXT one still needs the secret with a token file, first or second.
    for names in ("CONTROLLER,CONTROLLER_SSL", "CONTROLLER_SSL,CONTROLLER"):
        without = {k: v for k, v in MIGRATING.items() if k != "controller.listener.secret.file"}
        message = error_of(flags={**without, "controller.listener.names": names,
                                  "auth.token.file": tokens})
        assert message.startswith("controller.listener.secret.file (from default): required with "
                                  "auth.token.file on the PLAINTEXT controller listener "
                                  "CONTROLLER://0.0.0.0:9093"), message
        config = load_config(None, {**MIGRATING, "controller.listener.names": names,
                                    "auth.token.file": tokens,
                                    "controller.listener.secret.file": "/s/secret"}, {})
        assert config.controller_listener_secret_file == Path("/s/secret")
    # Two SSL controller listeners: nothing would use a secret.
    message = error_of(flags={
        **MIGRATING, "controller.listener.secret.file": "/s/secret",
        "listener.security.protocol.map": "CLIENT:PLAINTEXT,CONTROLLER:SSL,CONTROLLER_SSL:SSL"})
    assert "only used with a PLAINTEXT controller listener" in message, message


def test_kafkas_names_of_the_log_directory_and_the_role(tmp_path: Path) -> None:
    """metadata.log.dir (Kafka's name of a controller's log directory) sets log.dir, and either
    sets both; process.roles is controller only. Kafka's add-controller reads them."""
    without = {key: value for key, value in REQUIRED.items() if key != "log.dir"}
    config = load_config(None, {**without, "metadata.log.dir": "/data/m"}, {})
    assert config.log_dir == config.metadata_log_dir == Path("/data/m")
    assert load_config(None, REQUIRED, {}).metadata_log_dir == Path(REQUIRED["log.dir"])
    text = load_config(None, REQUIRED, {}).to_properties()
    assert f"\nmetadata.log.dir={REQUIRED['log.dir']}\n" in text
    assert "\nprocess.roles=controller\n" in text
    assert load_config(None, {**REQUIRED, "metadata.log.dir": REQUIRED["log.dir"]}, {})
    assert "log.dir (/var/lib/quorum/node-1) and metadata.log.dir (/elsewhere) differ" in \
        error_of(flags={**REQUIRED, "metadata.log.dir": "/elsewhere"})
    assert error_of(flags={**REQUIRED, "process.roles": "broker,controller"}).startswith(
        "process.roles (from --process-roles): expected 'controller', got 'broker,controller'")
