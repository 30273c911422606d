"""Configurations that mix PLAINTEXT and SSL listeners: a node that asks anyone for a credential
(an SSL listener, or auth.token.file) refuses to start with a PLAINTEXT controller listener
that has no peer secret, in one line (exit 2), since anyone reaching that port could speak as a
peer. With the secret, or with SSL on the controller listener, or with nothing secured at all
(a local quorum), it starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from certs import CertificateAuthority

from quorum_node.node.config import ConfigError, NodeConfig, load_config

BASE = {
    "node.id": "1",
    "cluster.id": "MkU3OEVBNTcwNTJENDM2Qg",
    "log.dir": "/tmp/quorum-mixed",
    "controller.quorum.voters": "1@127.0.0.1:9094",
    "controller.quorum.client.endpoints": "1@127.0.0.1:9093",
}
REFUSAL = ("controller.listener.secret.file (from default): required with {why} on the "
           "PLAINTEXT controller listener {listener}: otherwise anyone who can reach it could "
           "speak as a peer without a credential (set it, or make the controller listener SSL)")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("mixed")
    ca = CertificateAuthority.create()
    cert, key = ca.issue(directory, "quorum-node-1")
    secret = directory / "secret"
    secret.write_text("the-secret-of-the-quorum\n")
    tokens = directory / "tokens"
    tokens.write_text("token-of-the-operator-0123 quorum-operator admin\n")
    return {"ssl.certificate.location": str(cert), "ssl.key.location": str(key),
            "ssl.ca.location": str(ca.write_ca(directory / "ca.crt")), "secret": str(secret),
            "tokens": str(tokens)}


def config(files: dict[str, str], client: str, controllers: str, *, secret: bool = False,
           tokens: bool = False) -> dict[str, str]:
    """Settings with a CLIENT listener of protocol ``client`` and controller listeners of the
    protocols in ``controllers`` ("PLAINTEXT", "SSL", or both: a move between them)."""
    names = {"PLAINTEXT": "CONTROLLER", "SSL": "CONTROLLER_SSL"}
    ports = {"PLAINTEXT": 9094, "SSL": 9095}
    chosen = controllers.split(",")
    settings = {
        **BASE,
        "listeners": ",".join(["CLIENT://127.0.0.1:9093",
                               *(f"{names[p]}://127.0.0.1:{ports[p]}" for p in chosen)]),
        "listener.security.protocol.map": ",".join(
            [f"CLIENT:{client}", *(f"{names[p]}:{p}" for p in chosen)]),
        "controller.listener.names": ",".join(names[p] for p in chosen),
    }
    if "SSL" in (client, *chosen):
        settings.update({key: value for key, value in files.items() if key.startswith("ssl.")})
    if secret:
        settings["controller.listener.secret.file"] = files["secret"]
    if tokens:
        settings["auth.token.file"] = files["tokens"]
    return settings


@pytest.mark.parametrize(("client", "controllers", "tokens", "why"), [
    # The operator's TLS switch stages of today: SSL clients, peers on PLAINTEXT.
    ("SSL", "PLAINTEXT", False, "an SSL listener"),
    ("SSL", "PLAINTEXT,SSL", False, "an SSL listener"),
    ("SSL", "SSL,PLAINTEXT", False, "an SSL listener"),
    ("PLAINTEXT", "PLAINTEXT,SSL", False, "an SSL listener"),
    ("PLAINTEXT", "SSL,PLAINTEXT", False, "an SSL listener"),
    ("PLAINTEXT", "PLAINTEXT", True, "auth.token.file"),
    ("SSL", "PLAINTEXT", True, "auth.token.file"),
])
def test_a_plaintext_controller_listener_without_the_secret_is_refused(
        files: dict[str, str], client: str, controllers: str, tokens: bool, why: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(None, config(files, client, controllers, tokens=tokens), {})
    assert str(refused.value) == REFUSAL.format(why=why,
                                                listener="CONTROLLER://127.0.0.1:9094")


@pytest.mark.parametrize(("client", "controllers", "secret", "tokens"), [
    ("SSL", "PLAINTEXT", True, False),  # what every stage of a switch must carry
    ("SSL", "PLAINTEXT,SSL", True, True),
    ("SSL", "SSL,PLAINTEXT", True, False),
    ("PLAINTEXT", "PLAINTEXT", True, True),
    ("SSL", "SSL", False, True),  # the deployment mode
    ("PLAINTEXT", "SSL", False, False),  # peers by certificate; clients warned as ever
    ("PLAINTEXT", "PLAINTEXT", False, False),  # nothing secured: open, with a warning
])
def test_what_stays_accepted(files: dict[str, str], client: str, controllers: str,
                             secret: bool, tokens: bool) -> None:
    loaded = load_config(None, config(files, client, controllers, secret=secret,
                                      tokens=tokens), {})
    assert isinstance(loaded, NodeConfig)


def test_quorum_node_run_refuses_in_one_line(files: dict[str, str], tmp_path: Path) -> None:
    properties = tmp_path / "node.properties"
    settings = {**config(files, "SSL", "PLAINTEXT"), "log.dir": str(tmp_path / "log")}
    properties.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
    result = subprocess.run(
        [sys.executable, "-m", "quorum_node.cli.node", "run", "--config", str(properties)],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert lines == ["quorum-node run: error: " + REFUSAL.format(
        why="an SSL listener", listener="CONTROLLER://127.0.0.1:9094")], result.stderr
    assert not (tmp_path / "log").exists()  # nothing was formatted or written
