"""Security settings: one-line refusals of a configuration that could not be secure or could
not work, roles and token files, and the files checked at start-up."""

from __future__ import annotations

from pathlib import Path

import pytest
from certs import CertificateAuthority

from quorum_node.node.config import ConfigError, load_config
from quorum_node.node.wiring import build_node
from quorum_node.security.peer_identity import PeerPrincipals
from quorum_node.security.roles import Role, parse_principal_grants, roles_of_principal
from quorum_node.security.tokens import TokenFileError, TokenTable
from quorum_node.storage.meta_properties import format_log_dir

REQUIRED = {
    "node.id": "1",
    "cluster.id": "MkU3OEVBNTcwNTJENDM2Qg",
    "log.dir": "/tmp/quorum-x",
    "controller.quorum.voters": "1@127.0.0.1:9091",
}


def tls_settings(directory: Path) -> dict[str, str]:
    ca = CertificateAuthority.create()
    cert, key = ca.issue(directory, "quorum-node-1")
    return {"listeners": "SSL://127.0.0.1:9091", "ssl.certificate.location": str(cert),
            "ssl.key.location": str(key), "ssl.ca.location": str(ca.write_ca(directory / "ca"))}


def error_of(flags: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(None, {**REQUIRED, **flags}, {})
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_tls_listener(tmp_path: Path) -> None:
    config = load_config(None, {**REQUIRED, **tls_settings(tmp_path)}, {})
    assert config.client_url == "https://127.0.0.1:9091"
    assert str(config.controller_listener) == "SSL://127.0.0.1:9091"
    assert config.controller_listener.tls and config.combined_listener
    # The properties file it writes reads back as the same configuration.
    path = tmp_path / "node.properties"
    path.write_text(config.to_properties())
    assert load_config(path, {}, {}) == config


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"ssl.key.location": ""}, "ssl.key.location (from default): required with an SSL "
                                   "listener"),
        ({"listeners": "127.0.0.1:9091"}, "only used with an SSL listener"),
        ({"auth.certificate.roles": "x:root"}, "unknown role 'root'"),
        ({"auth.certificate.roles": "justaname"}, "is not PATTERN:ROLE"),
        ({"ssl.endpoint.identification.algorithm": "dns"}, "ssl.endpoint.identification"),
    ],
)
def test_refused_security_settings(tmp_path: Path, change: dict[str, str], problem: str) -> None:
    settings = {**tls_settings(tmp_path), **change}
    settings = {k: v for k, v in settings.items() if v != ""}
    assert problem in error_of(settings)


@pytest.mark.parametrize("roles", ["quorum-node-*:peer", "quorum-operator:admin;quorum-node-*:peer",
                                   "x:read,peer"])
def test_granting_peer_is_refused_in_one_line(tmp_path: Path, roles: str) -> None:
    # Peers are the certificates named by auth.peer.principal.template, each for its node id
    # only; a glob granting peer would make any matching name one, for any node id.
    message = error_of({**tls_settings(tmp_path), "auth.certificate.roles": roles})
    assert message == ("auth.certificate.roles (from --auth-certificate-roles): peer is not a "
                       "role to grant: peers are identified by auth.peer.principal.template")


@pytest.mark.parametrize(
    ("template", "problem"),
    [("quorum-node", "must contain {id} exactly once"),
     ("n-{id}-{id}", "must contain {id} exactly once"),
     ("n-{id}-{x}", "no brace is allowed"),
     ("node {id}", "no whitespace")],
)
def test_bad_peer_principal_templates(tmp_path: Path, template: str, problem: str) -> None:
    message = error_of({**tls_settings(tmp_path), "auth.peer.principal.template": template})
    assert message.startswith("auth.peer.principal.template (from "
                              "--auth-peer-principal-template): ")
    assert problem in message


def test_peer_principals_name_one_node_each() -> None:
    peers = PeerPrincipals("kq-prod-{id}.nodes")
    assert peers.principal_of(7) == "kq-prod-7.nodes"
    assert peers.node_id_of("kq-prod-7.nodes") == 7
    for nobody in ("kq-prod-07.nodes", "kq-prod-x9.nodes", "kq-prod-.nodes", "kq-prod-7",
                   "kq-prod-7.nodes.evil", "kq-prod--1.nodes", "kq-prod-\u0667.nodes"):
        assert peers.node_id_of(nobody) is None, nobody


def test_plaintext_refuses_certificate_roles() -> None:
    assert "need an SSL listener" in error_of({"listeners": "127.0.0.1:9091",
                                                  "auth.certificate.roles": "a:read"})


def test_unloadable_files_are_refused_at_start(tmp_path: Path) -> None:
    settings = tls_settings(tmp_path)
    (tmp_path / "quorum-node-1.key").write_text("not a key")
    config = load_config(None, {**REQUIRED, **settings, "log.dir": str(tmp_path / "log")}, {})
    format_log_dir(config.log_dir, config.cluster_id, 1)
    with pytest.raises(ConfigError, match=r"^ssl: certificate .* with key .*"):
        build_node(config)
    (tmp_path / "tokens").write_text("short alice admin\n")
    (tmp_path / "secret").write_text("a-secret-of-the-quorum\n")
    plain = load_config(None, {**REQUIRED, "listeners": "127.0.0.1:9091",
                               "log.dir": str(tmp_path / "log"),
                               "auth.token.file": str(tmp_path / "tokens"),
                               "controller.listener.secret.file": str(tmp_path / "secret")}, {})
    with pytest.raises(ConfigError, match=r"^auth.token.file: .*tokens, line 1: the token"):
        build_node(plain)


def test_roles_ladder_and_globs() -> None:
    grants = parse_principal_grants("quorum-node-*:read; ops:admin ;app:read,write")
    assert roles_of_principal(grants, "quorum-node-2") == {Role.READ}
    assert roles_of_principal(grants, "ops") == {Role.READ, Role.WRITE, Role.ADMIN}
    assert roles_of_principal(grants, "app") == {Role.READ, Role.WRITE}
    assert roles_of_principal(grants, "quorum-node") == frozenset()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("tok alice admin", "shorter than 16"),
        ("0123456789abcdef alice", "expected TOKEN PRINCIPAL ROLES"),
        ("0123456789abcdef alice root", "unknown role"),
        ("0123456789abcdef node peer", "cannot have the peer role"),
        ("0123456789abcdef a read\n0123456789abcdef b read", "line 2: the token of 'b' is"),
    ],
)
def test_bad_token_files(text: str, problem: str) -> None:
    with pytest.raises(TokenFileError, match=problem):
        TokenTable.parse(text, "tokens")


def test_token_lookup() -> None:
    table = TokenTable.parse("# comment\n\n0123456789abcdef alice write\n", "tokens")
    holder = table.lookup("0123456789abcdef")
    assert holder is not None and holder.principal == "alice"
    assert holder.roles == {Role.READ, Role.WRITE}
    assert table.lookup("0123456789abcdeX") is None
