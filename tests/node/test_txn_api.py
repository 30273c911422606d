"""Multi-key transactions through the client API against a real in-process node: ``POST
/v1/txn``, the binary protocol's TXN, ``QuorumClient.txn`` over both protocols and
``quorum-client txn``; a refused txn changes nothing."""

from __future__ import annotations

import io
import json
import sys
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from test_client_api import Cluster, call
from test_client_stream import answer, open_stream

from quorum_node import wire
from quorum_node.cli.client import main as client_main
from quorum_node.client import PROTOCOLS, QuorumClient, QuorumClientError
from quorum_node.kv.ops import MAX_TXN_OPS, MAX_VALUE_BYTES
from quorum_node.wire import Op


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("txn-single"), 1)
    try:
        cluster.leader()
        yield cluster
    finally:
        cluster.stop()


def put(key: str, value: str) -> dict[str, str]:
    return {"op": "put", "key": key, "value": value}


def get(url: str, path: str, **query: str) -> Any:
    reply = call(url, "GET", f"{path}?{urllib.parse.urlencode(query)}")
    assert reply.status == 200, reply.body
    return reply.body


def snapshot(url: str, prefix: str) -> list[Any]:
    return list(get(url, "/v1/kv", prefix=prefix)["entries"])


def test_http_txn_branches_compares_and_gets(single: Cluster) -> None:
    url = single.leader().url
    first = call(url, "POST", "/v1/txn", {"success": [put("h/a", "1"), put("h/b", "1")]})
    assert first.status == 200, first.body
    assert first.body["succeeded"] is True
    offset = first.body["offset"]
    assert first.body["responses"] == [{"op": "put", "key": "h/a", "existed": False},
                                       {"op": "put", "key": "h/b", "existed": False}]
    body = {"compare": [{"key": "h/a", "target": "value", "result": "=", "value": "1"},
                        {"key": "h/a", "target": "version", "result": "=", "version": 1},
                        {"key": "h/b", "target": "mod_offset", "result": "=",
                         "mod_offset": offset}],
            "success": [{"op": "get", "key": "h/a"}, put("h/a", "2"),
                        {"op": "delete", "key": "h/b"}, {"op": "get", "key": "h/a"}],
            "failure": [put("h/failed", "1")]}
    second = call(url, "POST", "/v1/txn", body)
    assert second.status == 200, second.body
    at = second.body["offset"]
    assert second.body["succeeded"] is True
    assert second.body["responses"] == [
        {"op": "get", "key": "h/a", "value": "1", "version": 1, "mod_offset": offset},
        {"op": "put", "key": "h/a", "existed": True},
        {"op": "delete", "key": "h/b", "deleted": True},
        {"op": "get", "key": "h/a", "value": "2", "version": 2, "mod_offset": at}]
    # The same compares fail now: the failure branch runs.
    third = call(url, "POST", "/v1/txn", body)
    assert third.body["succeeded"] is False
    assert third.body["responses"] == [{"op": "put", "key": "h/failed", "existed": False}]
    assert snapshot(url, "h/") == [{"key": "h/a", "value": "2"},
                                   {"key": "h/failed", "value": "1"}]
    # Every key a txn wrote changed at its offset, in one watch answer.
    watched = get(url, "/v1/watch", prefix="h/", offset=str(at), max_events="1")
    assert [(e["offset"], e["key"], e["type"]) for e in watched["events"]] == \
        [(at, "h/a", "put"), (at, "h/b", "delete")]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ("{not json", 400, "not valid JSON"),
        ({"success": [put("bad/a", "1"), {"op": "delete", "key": "bad/a"}]}, 400,
         "key 'bad/a' is put or deleted more than once in 'success'"),
        ({"compare": [{"key": "bad/a", "target": "create", "result": "=", "create": 1}],
          "success": [put("bad/a", "1")]}, 400, "'target' must be one of"),
        ({"success": [put("bad/a", "1")], "else": []}, 400, "unknown txn field 'else'"),
        ({"success": [put(f"bad/{i}", "1") for i in range(MAX_TXN_OPS + 1)]}, 413,
         "129 operations in 'success' exceed the limit of 128"),
        ({"success": [put(f"bad/{i}", "v" * MAX_VALUE_BYTES) for i in range(3)]}, 413,
         "bytes per txn"),
    ],
)
def test_a_bad_txn_is_refused_and_changes_nothing(single: Cluster, body: Any, status: int,
                                                  message: str) -> None:
    url = single.leader().url
    before = get(url, "/v1/kv", prefix="")["applied_offset"]
    reply = call(url, "POST", "/v1/txn", body)
    assert reply.status == status
    assert set(reply.body) == {"code", "message"}
    assert message in reply.body["message"]
    assert snapshot(url, "bad/") == []
    # Nothing was appended: a linearizable read finds the store where it was.
    after = get(url, "/v1/kv", prefix="")["applied_offset"]
    assert after == before


def test_txn_over_the_stream(single: Cluster) -> None:
    with open_stream(single) as stream:
        compare = [("s/a", "version", "=", None, 0)]
        stream.send(wire.encode_request(1, Op.TXN, 0, (
            compare, [("put", "s/a", "1"), ("get", "s/a", None)], [("get", "s/a", None)])))
        correlation, (offset, _, succeeded, responses) = answer(stream, Op.TXN)
        assert (correlation, succeeded) == (1, True)
        assert responses == [("put", "s/a", False, None, 0, -1),
                             ("get", "s/a", True, "1", 1, offset)]
        stream.send(wire.encode_request(2, Op.TXN, 0, (compare, [], [("get", "s/a", None)])))
        correlation, (_, _, succeeded, responses) = answer(stream, Op.TXN)
        assert (correlation, succeeded) == (2, False)
        assert responses == [("get", "s/a", True, "1", 1, offset)]
        # A refused txn: the error contract, and the stream goes on.
        stream.send(wire.encode_request(3, Op.TXN, 0, (
            [], [("put", "s/b", "1"), ("put", "s/b", "2")], [])))
        correlation, error = answer(stream, Op.TXN)
        assert isinstance(error, wire.ErrorAnswer) and correlation == 3
        assert error.code == "BAD_REQUEST" and "more than once" in error.message
        stream.send(wire.encode_request(4, Op.TXN, 0, (
            [("s/a", "version", "=", "1", None)], [], [])))
        _, error = answer(stream, Op.TXN)
        assert isinstance(error, wire.ErrorAnswer) and "64-bit integer" in error.message
    with QuorumClient(single.bootstrap) as client:
        assert client.get("s/b") is None


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_client_runs_a_txn_over_either_protocol(single: Cluster, protocol: str) -> None:
    key = f"c/{protocol}"
    with QuorumClient(single.bootstrap, protocol=protocol) as client:
        absent = [{"key": key, "target": "version", "result": "=", "version": 0}]
        created = client.txn(absent, [put(key, "1")], [{"op": "get", "key": key}])
        assert created.succeeded
        assert created.responses == [{"op": "put", "key": key, "existed": False}]
        again = client.txn(absent, [put(key, "2")], [{"op": "get", "key": key}])
        assert not again.succeeded
        assert again.responses == [{"op": "get", "key": key, "value": "1", "version": 1,
                                    "mod_offset": created.offset}]
        assert again.offset > created.offset
        with pytest.raises(QuorumClientError) as refused:
            client.txn(success=[put(key, "x"), {"op": "delete", "key": key}])
        assert refused.value.code == "BAD_REQUEST"
        assert client.get(key) == "1"


def run_cli(single: Cluster, *args: str, stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = io.StringIO(stdin), out, err
    try:
        code = client_main(["-b", single.bootstrap, *args])
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    return code, out.getvalue(), err.getvalue()


def test_cli_txn_from_stdin_in_etcdctls_form(single: Cluster) -> None:
    script = ('value("cli/a") = ""\n'  # an absent key has no value: this fails
              "\n"
              "put cli/a one\n"
              "\n"
              'put cli/a "not one"\n'
              "put cli/b two\n"
              "get cli/b\n")
    code, out, err = run_cli(single, "txn", stdin=script)
    assert (code, err) == (3, "")  # the compares did not hold: as a cas not applied
    assert out.splitlines() == ["FAILURE", "", "OK", "", "OK", "", "cli/b", "two"]
    script = ('value("cli/a") = "not one"\nversion("cli/b") > "0"\nmod("cli/b") > "-1"\n\n'
              "del cli/b\nget cli/a\n\n\n")
    code, out, err = run_cli(single, "txn", stdin=script)
    assert (code, err) == (0, "")
    assert out.splitlines() == ["SUCCESS", "", "1", "", "cli/a", "not one"]


def test_cli_txn_json_form_and_its_errors(single: Cluster) -> None:
    document = {"compare": [{"key": "cj/a", "target": "version", "result": "=", "version": 0}],
                "success": [put("cj/a", "1"), {"op": "get", "key": "cj/a"}]}
    code, out, err = run_cli(single, "txn", "--json", stdin=json.dumps(document))
    assert (code, err) == (0, "")
    answer_body = json.loads(out)
    assert answer_body["succeeded"] is True
    assert answer_body["responses"][1]["value"] == "1"
    code, out, err = run_cli(single, "txn", stdin='value("cj/a") ~ "1"\n\n\n')
    assert code == 2 and out == ""
    assert err.startswith("quorum-client: error:") and "line 1" in err
    duplicate = {"success": [put("cj/b", "1"), {"op": "delete", "key": "cj/b"}]}
    code, out, err = run_cli(single, "txn", "--json", stdin=json.dumps(duplicate))
    assert code == 1
    assert json.loads(out)["code"] == "BAD_REQUEST"  # the API's error body, under --json
    assert "success[1]" in err and len(err.splitlines()) == 1
    code, out, err = run_cli(single, "--protocol", "http", "txn", stdin=json.dumps(duplicate))
    assert code == 1 and out == "" and "success[1]" in err
    code, _, err = run_cli(single, "txn", stdin='{"success": {"op": "get"}}')
    assert code == 2 and "'success' must be a list" in err
    with QuorumClient(single.bootstrap) as client:
        assert client.get("cj/b") is None


def test_cli_txn_interactive_prompts_for_each_part(single: Cluster) -> None:
    code, out, err = run_cli(single, "txn", "-i",
                             stdin='ver("ci/a") = "0"\n\nput ci/a 1\n\n\n')
    assert code == 0
    assert out.splitlines() == ["SUCCESS", "", "OK"]
    assert err.splitlines() == ["compares:", "success requests (get, put, del):",
                                "failure requests (get, put, del):"]
