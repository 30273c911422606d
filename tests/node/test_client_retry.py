"""QuorumClient's retries during an election: while a node answers (sending the client to a
leader that is gone), the next try comes soon; only while no node answers at all does the
back-off double. Real sockets on loopback: a node that redirects, and ports nobody listens on."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator

import pytest
from fake_nodes import closed_port, send_json, serving

from quorum_node import client as client_module
from quorum_node.client import QuorumClient, QuorumClientError


@pytest.fixture
def redirecting_node() -> Iterator[tuple[str, int]]:
    """A node that sends every request to a leader whose port is closed (it was killed, and
    the node has not heard of a new one yet)."""
    dead = closed_port()

    class Redirect(http.server.BaseHTTPRequestHandler):
        def _redirect(self) -> None:
            send_json(self, 307, {"code": "NOT_LEADER", "message": "not the leader"},
                      {"Location": f"http://127.0.0.1:{dead}{self.path}"})

        do_GET = do_PUT = do_POST = do_DELETE = _redirect

        def log_message(self, format: str, *args: object) -> None:
            pass

    with serving(Redirect) as port:
        yield f"127.0.0.1:{port}", dead


def _slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The client's waits, not slept (it tries as fast as it can). ``time.sleep`` is one function
    for the whole process: another thread's sleeps (a server's, a library's) are slept as
    usual and not counted."""
    waits: list[float] = []
    real_sleep = time.sleep
    client_thread = threading.get_ident()

    def sleep(seconds: float) -> None:
        if threading.get_ident() == client_thread:
            waits.append(seconds)
        else:
            real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", sleep)  # the time module quorum_node.client sleeps with
    return waits


def test_a_node_that_answers_is_tried_again_soon(
        redirecting_node: tuple[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    node, dead = redirecting_node
    waits = _slept(monkeypatch)
    with QuorumClient([f"127.0.0.1:{dead}", node], timeout_s=0.5, protocol="http") as client, \
            pytest.raises(QuorumClientError) as raised:
        client.put("k", "v")
    assert raised.value.code == "UNAVAILABLE"
    assert len(waits) > 10
    # Never more than the first back-off: a doubled one would be slept after the new leader
    # took over.
    assert max(waits) <= client_module._FIRST_BACKOFF_S


def test_the_back_off_doubles_while_no_node_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    waits = _slept(monkeypatch)
    with QuorumClient([f"127.0.0.1:{closed_port()}"], timeout_s=0.3,
                      protocol="http") as client, pytest.raises(QuorumClientError):
        client.put("k", "v")
    assert len(waits) > 10
    assert max(waits) > 4 * client_module._FIRST_BACKOFF_S
