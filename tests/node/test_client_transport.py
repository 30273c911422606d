"""QuorumClient over either transport: the arguments are checked once, before any transport
(nothing is sent for a bad one, whatever the protocol), and voter changes go over HTTP whatever
the protocol, their answer then being the client's ``last_answer``. Real sockets on loopback:
a node that serves the voters route alone, and a port nobody listens on."""

from __future__ import annotations

import http.server
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fake_nodes import closed_port, send_json, serving

from quorum_node.client import PROTOCOLS, QuorumClient

# A call whose checks were skipped may wait long (a read's wait_ms adds to its deadline).
pytestmark = pytest.mark.timeout(60)

VOTERS = {"voters": [{"id": 1, "directory_id": "AAAAAAAAAAAAAAAAAAAAAQ"},
                     {"id": 3, "directory_id": "AAAAAAAAAAAAAAAAAAAAAw"}]}


@pytest.fixture
def voters_node() -> Iterator[tuple[str, list[str]]]:
    """A node that answers a voter change and nothing else (no stream: 404); the requests it
    got."""
    seen: list[str] = []

    class Voters(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            seen.append(f"{self.command} {self.path.partition('?')[0]}")
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            found = self.command == "POST" and self.path.startswith("/v1/quorum/voters")
            document: dict[str, Any] = VOTERS if found else {"code": "NOT_FOUND",
                                                             "message": "no such route"}
            send_json(self, 200 if found else 404, document)

        do_GET = do_PUT = do_POST = do_DELETE = _answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    with serving(Voters) as port:
        yield f"127.0.0.1:{port}", seen


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_voter_changes_go_over_http_and_are_the_last_answer(
        voters_node: tuple[str, list[str]], protocol: str) -> None:
    node, seen = voters_node
    with QuorumClient(node, timeout_s=5, protocol=protocol) as client:
        voters = client.add_voter(3, "AAAAAAAAAAAAAAAAAAAAAw")
        assert [voter.id for voter in voters] == [1, 3]
        assert client.last_answer == VOTERS
    assert seen == ["POST /v1/quorum/voters"]  # never a stream, over either protocol


BAD_CALLS: list[tuple[str, Callable[[QuorumClient], object]]] = [
    ("an empty key", lambda client: client.put("", "v")),
    ("a key that is not UTF-8", lambda client: client.get("\udc80")),
    ("an empty key to delete", lambda client: client.delete("")),
    ("an empty key to cas", lambda client: client.cas("", None, "v")),
    ("a prefix that is not UTF-8", lambda client: client.list_keys("\udc80")),
    ("a negative limit", lambda client: client.list_keys("p", limit=-1)),
    ("neither a key nor a prefix", lambda client: client.watch(0)),
    ("a negative watch offset", lambda client: client.watch(-1, key="k")),
    ("nothing to append", lambda client: client.append([])),
    ("a negative read offset", lambda client: client.read(-1)),
    ("a wait beyond 32 bits", lambda client: client.read(0, wait_ms=2**32)),
    ("a window of none", lambda client: client.put_many([("k", "v")], window=0)),
    ("an empty key among many", lambda client: client.put_many([("k", "v"), ("", "v")])),
]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(("what", "call"), BAD_CALLS, ids=[what for what, _ in BAD_CALLS])
def test_a_bad_argument_is_refused_before_anything_is_sent(
        protocol: str, what: str, call: Callable[[QuorumClient], object]) -> None:
    # Nobody listens there: a call that reached its transport would wait out its timeout and
    # raise QuorumClientError UNAVAILABLE, not ValueError.
    with QuorumClient(f"127.0.0.1:{closed_port()}", timeout_s=0.3, protocol=protocol) as client, \
            pytest.raises(ValueError):
        call(client)
