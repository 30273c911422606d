"""Listening on every interface, IPv6 and IPv4 (a listener NAME://:port), and host:port with an
IPv6 literal: bracketed wherever a port follows it."""

from __future__ import annotations

import re
import socket
import urllib.request
from pathlib import Path

import pytest
from proc_cluster import ProcessCluster

from quorum_node.addresses import address_url, host_port
from quorum_node.node.config import Listener, parse_listener, parse_protocol_map
from quorum_node.raft.config import VoterEndpoint

PROTOCOLS = parse_protocol_map("CLIENT:PLAINTEXT,CONTROLLER:PLAINTEXT")


@pytest.mark.parametrize(("host", "expected"), [
    ("fd00::5", "[fd00::5]:9093"), ("[fd00::5]", "[fd00::5]:9093"), ("::", "[::]:9093"),
    ("10.0.0.5", "10.0.0.5:9093"), ("kq-1.kq-nodes.ns.svc", "kq-1.kq-nodes.ns.svc:9093")])
def test_host_port_brackets_ipv6_literals(host: str, expected: str) -> None:
    assert host_port(host, 9093) == expected
    assert address_url("https", host, 9093, "/readyz") == f"https://{expected}/readyz"


def test_every_address_form_brackets_ipv6() -> None:
    assert str(VoterEndpoint(id=1, host="fd00::5", port=9094)) == "1@[fd00::5]:9094"
    listener = parse_listener("CLIENT://[fd00::5]:9093", PROTOCOLS)
    assert (listener.host, listener.url) == ("fd00::5", "http://[fd00::5]:9093")


@pytest.mark.parametrize(("text", "host"), [
    ("CLIENT://:9093", ""), ("CLIENT://0.0.0.0:9093", "0.0.0.0"), ("CLIENT://[::]:9093", "::"),
    ("CLIENT://[::1]:9093", "::1")])
def test_listener_hosts_are_kept_as_given(text: str, host: str) -> None:
    """Only an empty host means every interface of both families; an address is bound as
    given (0.0.0.0 stays IPv4's every interface)."""
    assert parse_listener(text, PROTOCOLS) == Listener(name="CLIENT", host=host, port=9093)
    assert str(parse_listener(text, PROTOCOLS)) == text


@pytest.mark.parametrize("text", ["CLIENT://[]:9093", ":9093", "CLIENT://:"])
def test_no_other_empty_host(text: str) -> None:
    with pytest.raises(ValueError, match=r"is not of the form|port"):
        parse_listener(text, PROTOCOLS)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@pytest.mark.skipif(not socket.has_dualstack_ipv6(), reason="this host has no IPv6")
def test_a_node_on_every_interface_answers_on_ipv6_and_ipv4_loopback(tmp_path: Path) -> None:
    """A real node process whose listeners name no host (as the operator configures its pods):
    one dual-stack socket per listener, reached at [::1] and at 127.0.0.1."""
    cluster = ProcessCluster.create(tmp_path, 1)
    node = cluster.nodes[1]
    config = node.config_path.read_text()
    config, changed = re.subn(r"(?m)^listeners=.*$",
                              f"listeners=CLIENT://:{node.port},CONTROLLER://:{node.peer_port}",
                              config)
    assert changed == 1
    node.config_path.write_text(config)
    try:
        cluster.start_all()
        cluster.wait_for_leader()  # its peers reach it through 127.0.0.1 (the fault proxy)
        assert answers(f"http://127.0.0.1:{node.port}/readyz")
        assert answers(f"http://[::1]:{node.port}/readyz"), cluster.logs()
        for host in ("::1", "127.0.0.1"):
            with socket.create_connection((host, node.peer_port), timeout=2):
                pass
    finally:
        cluster.stop_all()
