"""TLS, mutual TLS between nodes and authorization, against a 3-node in-process quorum: a peer
without a valid certificate is refused, a caller without a credential (or without the role)
can neither write nor change voters, and with credentials the clients and CLIs work."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509
from secured_cluster import InProcessCluster, Pki, secured_configs
from test_client_shared import shared_client_workout

from quorum_node.cli.admin import main as admin_main
from quorum_node.cli.client import main as client_main
from quorum_node.client import PROTOCOLS, QuorumClient, QuorumClientError
from quorum_node.security.authorization import RAFT_PREFIX, ROUTE_ROLES, required_role
from quorum_node.security.client_credentials import ClientCredentials
from quorum_node.security.roles import Role

NODE_IDS = range(1, 4)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki.create(tmp_path_factory.mktemp("pki"), NODE_IDS)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[InProcessCluster]:
    cluster = InProcessCluster(secured_configs(tmp_path_factory.mktemp("nodes"), pki, 3))
    try:
        with QuorumClient(cluster.bootstrap, credentials=pki.credentials(token="writer")) as c:
            c.put("warm-up", "1")  # a leader is elected and accepts writes
        yield cluster
    finally:
        cluster.stop()


def request(cluster: InProcessCluster, node_id: int, method: str, path: str, *,
            credentials: ClientCredentials, body: Any = None, peer: bool = False
            ) -> tuple[int, dict[str, Any], dict[str, str]]:
    """One HTTPS request to one node's client listener (``peer``: its controller listener), no
    redirect followed: status, JSON body, headers."""
    address = cluster.peer_address(node_id) if peer else cluster.address(node_id)
    host, port = address.split(":")
    connection = http.client.HTTPSConnection(host, int(port), timeout=10,
                                             context=credentials.ssl_context())
    data = None if body is None else json.dumps(body).encode()
    try:
        connection.request(method, path, body=data, headers={
            "Content-Type": "application/json", **credentials.headers()})
        response = connection.getresponse()
        payload = response.read()
        return (response.status, json.loads(payload) if payload else {},
                {k.lower(): v for k, v in response.getheaders()})
    finally:
        connection.close()


def leader_id(cluster: InProcessCluster) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        leader = cluster.leader()
        if leader is not None:
            return leader.config.node_id
        time.sleep(0.05)
    raise AssertionError("no leader")


def state_of(cluster: InProcessCluster) -> tuple[Any, ...]:
    """What a refused request must not change: every node's log end and voter set."""
    return tuple((n.log_dir.log.end_offset, n.core.voters) for n in cluster.nodes.values())


def settled_state(cluster: InProcessCluster) -> tuple[Any, ...]:
    """``state_of`` once every node holds the same log end: the cluster is shared by the tests,
    and a follower may still be fetching an earlier test's writes."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        state = state_of(cluster)
        if len({end for end, _ in state}) == 1:
            return state
        time.sleep(0.05)
    raise AssertionError(f"the nodes' logs did not settle: {state_of(cluster)}")


# --- clients ---------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_clients_with_a_token_do_everything(cluster: InProcessCluster, pki: Pki,
                                            protocol: str) -> None:
    with QuorumClient(cluster.bootstrap, credentials=pki.credentials(token="writer"),
                      protocol=protocol) as client:
        assert client.servers[0].startswith("https://")
        client.put("colour", "blue")
        assert client.get("colour") == "blue"
        assert client.cas("colour", "blue", "red").applied
        assert client.delete("colour").applied
        first, _ = client.append([b"a", b"b"])
        assert [r.value for r in client.read(first, wait_ms=1000).records][:2] == [b"a", b"b"]
    with QuorumClient(cluster.bootstrap, credentials=pki.credentials(token="admin"),
                      protocol=protocol) as admin:
        admin.put("admin-may-write", "yes")  # admin implies write


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_threads_share_a_client_over_tls(cluster: InProcessCluster, pki: Pki,
                                         protocol: str) -> None:
    """Over TLS too, every thread gets its own answers."""
    with QuorumClient(cluster.bootstrap, credentials=pki.credentials(certificate="app-writer"),
                      protocol=protocol) as client:
        shared_client_workout(client, f"tls-shared-{protocol}", threads=8, rounds=4)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_clients_with_a_certificate_get_its_roles(cluster: InProcessCluster, pki: Pki,
                                                  protocol: str,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="quorum_node.audit")
    with QuorumClient(cluster.bootstrap, credentials=pki.credentials(certificate="app-writer"),
                      protocol=protocol) as writer:
        writer.put("by-certificate", "ok")
    with QuorumClient(cluster.bootstrap, credentials=pki.credentials(certificate="app-reader"),
                      protocol=protocol) as reader:
        assert reader.get("by-certificate") == "ok"
        before = settled_state(cluster)
        for write in (lambda: reader.put("by-certificate", "no"),
                      lambda: reader.delete("by-certificate"),
                      lambda: reader.cas("by-certificate", "ok", "no"),
                      lambda: reader.append([b"no"])):
            with pytest.raises(QuorumClientError) as refused:
                write()
            # Over the stream, the write on a stream its credential may open (read).
            assert (refused.value.code, refused.value.status) == (
                "FORBIDDEN", 403 if protocol == "http" else None)
            assert "needs the write role" in str(refused.value)
        assert state_of(cluster) == before
    denied = [r.getMessage() for r in caplog.records if "denied status=403" in r.getMessage()]
    assert len(denied) >= 4, denied  # each refused write audited, over either protocol


@pytest.mark.parametrize(("credential", "status"), [(None, 401), ("bad-token", 401),
                                                    ("cert:stranger", 403)])
def test_a_stream_without_a_good_credential_is_not_opened(
        cluster: InProcessCluster, pki: Pki, credential: str | None, status: int) -> None:
    if credential is None:
        credentials = ClientCredentials(ca_file=pki.ca_path)
    elif credential == "bad-token":
        credentials = ClientCredentials("not-a-token-of-this-quorum", pki.ca_path)
    else:
        credentials = pki.credentials(certificate=credential.removeprefix("cert:"))
    with pytest.raises(QuorumClientError) as refused, \
            QuorumClient(cluster.bootstrap, credentials=credentials, protocol="binary") as client:
        client.get("k", stale=True)
    assert refused.value.status == status
    assert refused.value.code == ("FORBIDDEN" if status == 403 else "UNAUTHENTICATED")


PROTECTED = [
    ("PUT", "/v1/kv/k", None),
    ("DELETE", "/v1/kv/k", None),
    ("POST", "/v1/kv/k/cas", {"expected": None, "value": "x"}),
    ("POST", "/v1/records", ["x"]),
    ("GET", "/v1/kv/k", None),
    ("GET", "/v1/records?offset=0", None),
    ("GET", "/v1/quorum", None),
    ("POST", "/v1/quorum/voters", {"id": 3, "directory_id": "AAAAAAAAAAAAAAAAAAAAAQ"}),
    ("DELETE", "/v1/quorum/voters/3/AAAAAAAAAAAAAAAAAAAAAQ", None),
]


@pytest.mark.parametrize("call", PROTECTED)
def test_no_credential_is_refused_and_changes_nothing(
        cluster: InProcessCluster, pki: Pki, caplog: pytest.LogCaptureFixture,
        call: tuple[str, str, Any]) -> None:
    method, path, body = call
    leader = leader_id(cluster)
    before = settled_state(cluster)
    with caplog.at_level(logging.WARNING, logger="quorum_node.audit"):
        status, answer, headers = request(cluster, leader, method, path, body=body,
                                          credentials=ClientCredentials(ca_file=pki.ca_path))
    assert status == 401
    assert answer["code"] == "UNAUTHENTICATED"
    assert "authentication required" in answer["message"]
    assert headers["www-authenticate"].startswith("Bearer")
    time.sleep(0.2)  # anything it had started would have reached the logs by now
    assert state_of(cluster) == before
    assert any("denied status=401" in r.getMessage() and f"method={method}" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize(
    "case",
    [
        ("reader", "PUT", "/v1/kv/k", None, 403),
        ("reader", "POST", "/v1/records", ["x"], 403),
        ("writer", "POST", "/v1/quorum/voters", {"id": 3,
                                                 "directory_id": "AAAAAAAAAAAAAAAAAAAAAQ"}, 403),
        ("writer", "DELETE", "/v1/quorum/voters/3/AAAAAAAAAAAAAAAAAAAAAQ", None, 403),
        ("writer", "GET", "/v1/quorum", None, 403),
        ("bad-token", "PUT", "/v1/kv/k", None, 401),
        ("cert:stranger", "PUT", "/v1/kv/k", None, 403),
        ("cert:app-writer", "DELETE", "/v1/quorum/voters/3/AAAAAAAAAAAAAAAAAAAAAQ", None, 403),
    ],
)
def test_wrong_credential_is_refused_and_changes_nothing(
        cluster: InProcessCluster, pki: Pki, caplog: pytest.LogCaptureFixture,
        case: tuple[str, str, str, Any, int]) -> None:
    credential, method, path, body, status = case
    if credential == "bad-token":
        credentials = ClientCredentials("not-a-token-of-this-quorum", pki.ca_path)
    elif credential.startswith("cert:"):
        credentials = pki.credentials(certificate=credential.removeprefix("cert:"))
    else:
        credentials = pki.credentials(token=credential)
    leader = leader_id(cluster)
    before = settled_state(cluster)
    with caplog.at_level(logging.WARNING, logger="quorum_node.audit"):
        answer_status, answer, _ = request(cluster, leader, method, path, body=body,
                                           credentials=credentials)
    assert answer_status == status, answer
    assert answer["code"] == ("FORBIDDEN" if status == 403 else "UNAUTHENTICATED")
    time.sleep(0.2)
    assert state_of(cluster) == before
    assert any(f"denied status={status}" in r.getMessage() for r in caplog.records)


def test_admin_requests_are_audited(cluster: InProcessCluster, pki: Pki,
                                    caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="quorum_node.audit"):
        status, answer, _ = request(cluster, leader_id(cluster), "GET", "/v1/quorum",
                                    credentials=pki.credentials(token="admin"))
    assert status == 200 and answer["leader_id"] == leader_id(cluster)
    assert any("allowed status=200 method=GET path=/v1/quorum" in r.getMessage()
               and "principal=admin via=token" in r.getMessage() for r in caplog.records)


def test_open_routes_need_no_credential(cluster: InProcessCluster, pki: Pki) -> None:
    for path in ("/healthz", "/readyz", "/metrics"):
        host, port = cluster.address(1).split(":")
        connection = http.client.HTTPSConnection(
            host, int(port), timeout=5, context=ClientCredentials(ca_file=pki.ca_path)
            .ssl_context())
        connection.request("GET", path)
        assert connection.getresponse().status in (200, 503), path
        connection.close()


def test_every_route_has_a_role(cluster: InProcessCluster) -> None:
    """Every route a node serves is in the role table or is a Raft RPC: a new route cannot be
    left open by omission (and one missing from the table needs admin)."""
    # One application per kind of listener: the controller listener's has the Raft RPCs only,
    # the client listener's none of them.
    peer_app, client_app = (runner.app for runner in cluster.nodes[1].listeners._runners)
    peer_patterns = {route.resource.canonical for route in peer_app.router.routes()
                     if route.resource is not None}
    assert peer_patterns and all(p.startswith(RAFT_PREFIX) for p in peer_patterns)
    for route in client_app.router.routes():
        pattern = route.resource.canonical if route.resource is not None else ""
        method = "GET" if route.method == "HEAD" else route.method
        assert (method, pattern) in ROUTE_ROLES, pattern
    assert required_role("PATCH", "/v1/new") is Role.ADMIN


# --- the CLIs ---------------------------------------------------------------------------------


def test_cli_take_the_same_credentials(cluster: InProcessCluster, pki: Pki,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--bootstrap-server", cluster.bootstrap, "--ca-file", str(pki.ca_path)]
    assert admin_main([*common, "--token-file", str(pki.token_path("admin")),
                       "describe", "--status"]) == 0
    assert "LeaderId:" in capsys.readouterr().out
    assert admin_main([*common, "describe", "--status"]) == 1
    assert "authentication required" in capsys.readouterr().err
    cert, key = pki.certificates["quorum-operator"]
    assert admin_main([*common, "--cert-file", str(cert), "--key-file", str(key),
                       "describe", "--replication"]) == 0
    capsys.readouterr()
    assert admin_main([*common, "--token-file", str(pki.token_path("writer")), "remove-voter",
                       "--id", "3", "--uuid", "AAAAAAAAAAAAAAAAAAAAAQ"]) == 1
    assert "FORBIDDEN" in capsys.readouterr().err
    assert client_main(["-b", cluster.bootstrap, "--ca-file", str(pki.ca_path),
                        "--token-file", str(pki.token_path("writer")), "put", "cli", "v"]) == 0
    assert client_main(["-b", cluster.bootstrap, "--ca-file", str(pki.ca_path),
                        "put", "cli", "w"]) == 1
    assert "authentication required" in capsys.readouterr().err
    assert client_main(["-b", cluster.bootstrap, "--ca-file", str(pki.ca_path),
                        "--token-file", str(pki.token_path("reader")), "get", "cli"]) == 0
    assert capsys.readouterr().out.strip().endswith("v")


def test_cli_credentials_from_the_environment(cluster: InProcessCluster, pki: Pki,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUORUM_BOOTSTRAP_SERVER", cluster.bootstrap)
    monkeypatch.setenv("QUORUM_CLIENT_CA_FILE", str(pki.ca_path))
    monkeypatch.setenv("QUORUM_CLIENT_TOKEN_FILE", str(pki.token_path("writer")))
    assert client_main(["put", "from-env", "1"]) == 0


# --- peers ------------------------------------------------------------------------------------


async def _open_stream(url: str, context: ssl.SSLContext | bool) -> int:
    """Open the peer stream; the HTTP status of a refusal, or 101 once upgraded."""
    async with aiohttp.ClientSession() as session:
        try:
            async with session.ws_connect(url, ssl=context, timeout=aiohttp.ClientWSTimeout(
                    ws_receive=5)) as socket:
                await socket.close()
                return 101
        except aiohttp.WSServerHandshakeError as error:
            return error.status


def _client_context(pki: Pki, certificate: str | None) -> ssl.SSLContext:
    return pki.credentials(certificate=certificate).ssl_context()


def test_peer_without_a_valid_certificate_is_refused(cluster: InProcessCluster,
                                                     pki: Pki) -> None:
    url = f"https://{cluster.peer_address(1)}/raft/v1/stream"
    run = cluster.run
    assert run(_open_stream(url, _client_context(pki, "quorum-node-2"))) == 101  # the control
    # Without a node's certificate the connection is closed once its handshake is done.
    for certificate in (None, "app-writer"):
        with pytest.raises((aiohttp.ClientError, OSError)):
            run(_open_stream(url, _client_context(pki, certificate)))
    # A certificate of another CA does not get past the handshake.
    with pytest.raises((aiohttp.ClientError, ssl.SSLError, OSError)):
        run(_open_stream(url, _client_context(pki, "foreign")))
    # Nor does plain HTTP reach the TLS listener.
    with pytest.raises((aiohttp.ClientError, OSError)):
        run(_open_stream(f"http://{cluster.peer_address(1)}/raft/v1/stream", False))
    # A token never makes a peer, whatever its role: the connection is closed unanswered.
    with pytest.raises(ConnectionError):
        request(cluster, 1, "POST", "/raft/v1/Fetch",
                credentials=pki.credentials(token="admin"), peer=True)


def test_node_with_a_foreign_certificate_cannot_join(tmp_path: Path, pki: Pki) -> None:
    """A whole node whose certificate is of another CA: no peer accepts its requests, so it
    never learns of a leader (and its votes count for nothing)."""
    configs = secured_configs(tmp_path, pki, 2)
    cert, key = pki.certificates["foreign"]
    configs[1] = configs[1].model_copy(update={"ssl_certificate_location": cert,
                                               "ssl_key_location": key})
    cluster = InProcessCluster(configs)
    try:
        time.sleep(2)
        assert all(node.core.leader_id is None for node in cluster.nodes.values())
    finally:
        cluster.stop()


# --- reloading --------------------------------------------------------------------------------


def _served_serial(address: str, ca: Path) -> int:
    host, port = address.split(":")
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection((host, int(port)), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def test_certificates_and_tokens_are_reloaded(cluster: InProcessCluster, pki: Pki) -> None:
    node = cluster.nodes[1]
    before = _served_serial(cluster.address(1), pki.ca_path)
    cert, _ = pki.certificates["quorum-node-1"]
    pki.ca.issue(cert.parent, "quorum-node-1")  # rewrites the same files
    new_token = "freshly-rotated-token-0123456789"
    assert pki.token_file is not None
    pki.token_file.write_text(pki.token_file.read_text() + f"{new_token} rotated write\n")
    deadline = time.monotonic() + 10
    while _served_serial(cluster.address(1), pki.ca_path) == before:
        assert time.monotonic() < deadline, "the new certificate was not served"
        time.sleep(0.1)
    assert node.security.tls is not None and node.security.tls.reloads >= 1
    credentials = ClientCredentials(new_token, pki.ca_path)
    while request(cluster, 1, "GET", "/v1/kv/colour?stale=true",
                  credentials=credentials)[0] == 401:
        assert time.monotonic() < deadline, "the new token was not accepted"
        time.sleep(0.1)
    # The peers still talk (they connect again with the node's new certificate when needed).
    with QuorumClient(cluster.bootstrap, credentials=pki.credentials(token="writer")) as client:
        client.put("after-rotation", "ok")
