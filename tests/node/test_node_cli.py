"""``quorum-node``: format, random-cluster-id, run and local.

``local`` is tested three ways: its set-up step and its supervisor in this process, the whole
command as a subprocess over a stand-in runtime (a ``sitecustomize`` that provides
``run_node``), and end to end over the real runtime."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import types
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from io import StringIO
from pathlib import Path

import pytest

from quorum_node.cli.local_control import ControlAnswer, ControlRequest, LeaderWatch
from quorum_node.cli.local_quorum import (
    LocalCluster,
    LocalClusterError,
    LocalNode,
    check_ports_free,
    free_base_port,
    handle_control_request,
    prepare_local_cluster,
)
from quorum_node.cli.node import main
from quorum_node.node.config import ConfigError, NodeConfig, Setting, load_config
from quorum_node.storage.errors import NotFormattedError
from quorum_node.storage.kafka_uuid import parse_uuid, to_kafka_string
from quorum_node.storage.meta_properties import format_log_dir, read_meta_properties

CLUSTER_ID = "MkU3OEVBNTcwNTJENDM2Qk"
CLI = [sys.executable, "-m", "quorum_node.cli.node"]


def one_line(text: str) -> str:
    assert text.count("\n") == 1 and text.endswith("\n"), text
    return text.rstrip("\n")


# -- format, random-cluster-id ---------------------------------------------------------------------


def test_format_prints_the_new_directory_id(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    log_dir = tmp_path / "node-1"
    assert main(["format", "--log-dir", str(log_dir), "--node-id", "1",
                 "--cluster-id", CLUSTER_ID]) == 0
    printed = one_line(capsys.readouterr().out)
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", printed)
    meta = read_meta_properties(log_dir / "meta.properties")
    assert (meta.cluster_id, meta.node_id) == (CLUSTER_ID, 1)
    assert meta.directory_id == parse_uuid(printed)


def test_format_refuses_a_formatted_directory(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    args = ["format", "--log-dir", str(tmp_path), "--node-id", "1", "--cluster-id", CLUSTER_ID]
    assert main(args) == 0
    first = capsys.readouterr().out.strip()
    before = (tmp_path / "meta.properties").read_bytes()
    assert main(args) == 2
    error = one_line(capsys.readouterr().err)
    assert error.startswith(f"quorum-node format: error: {tmp_path / 'meta.properties'} already "
                            "exists; refusing to overwrite it")
    assert (tmp_path / "meta.properties").read_bytes() == before

    assert main([*args, "--ignore-formatted"]) == 0  # kept as it is, same id printed
    assert capsys.readouterr().out.strip() == first
    assert (tmp_path / "meta.properties").read_bytes() == before


def test_ignore_formatted_still_refuses_another_nodes_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    format_log_dir(tmp_path, CLUSTER_ID, 2)
    assert main(["format", "--log-dir", str(tmp_path), "--node-id", "1", "--cluster-id",
                 CLUSTER_ID, "--ignore-formatted"]) == 2
    assert "does not match the configured node id 1" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--node-id", "-1", "--cluster-id", CLUSTER_ID], "--node-id -1 is out of range"),
        (["--node-id", "99999999999999999999", "--cluster-id", CLUSTER_ID],
         "--node-id 99999999999999999999 is out of range: expected 0 to 2147483647"),
        (["--node-id", "1", "--cluster-id", "no spaces"], "--cluster-id 'no spaces' is not a"),
        (["--node-id", "1", "--cluster-id", "hello"], "--cluster-id 'hello' is not a cluster id"),
        (["--node-id", "x", "--cluster-id", CLUSTER_ID], "argument --node-id: invalid int value"),
        (["--node-id", "1"], "missing --cluster-id"),
    ],
)
def test_format_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              args: list[str], problem: str) -> None:
    assert main(["format", "--log-dir", str(tmp_path / "d"), *args]) == 2
    assert problem in one_line(capsys.readouterr().err)
    assert not (tmp_path / "d").exists()


def test_format_refuses_an_empty_or_non_directory_path(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["format", "--log-dir", "", "--node-id", "1", "--cluster-id", CLUSTER_ID]) == 2
    assert "--log-dir is empty" in one_line(capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []  # the current directory was not formatted
    (tmp_path / "afile").write_text("x")
    assert main(["format", "--log-dir", "afile", "--node-id", "1", "--cluster-id",
                 CLUSTER_ID]) == 2
    assert "--log-dir afile: exists and is not a directory" in one_line(
        capsys.readouterr().err)


def test_format_with_a_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "server.properties"
    config.write_text(f"node.id=4\ncluster.id={CLUSTER_ID}\nlog.dir={tmp_path / 'n4'}\n")
    assert main(["format", "-c", str(config)]) == 0
    capsys.readouterr()
    meta = read_meta_properties(tmp_path / "n4" / "meta.properties")
    assert (meta.node_id, meta.cluster_id) == (4, CLUSTER_ID)
    # Flags win over the file.
    assert main(["format", "-c", str(config), "--log-dir", str(tmp_path / "n5")]) == 0
    assert read_meta_properties(tmp_path / "n5" / "meta.properties").node_id == 4


def test_random_cluster_id(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["random-cluster-id"]) == 0
    assert main(["random-cluster-id"]) == 0
    first, second = capsys.readouterr().out.split()
    assert first != second
    for cluster_id in (first, second):
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", cluster_id) and not cluster_id.startswith("-")
        parse_uuid(cluster_id)


@pytest.mark.parametrize("command", [[], ["format"], ["random-cluster-id"], ["run"], ["local"]])
def test_help_everywhere(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*command, "--help"]) == 0
    assert "usage: quorum-node" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["run", "--no-such-flag"]])
def test_usage_errors_are_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert one_line(capsys.readouterr().err).startswith("quorum-node")


# -- run ---------------------------------------------------------------------------------------


def node_flags(log_dir: Path) -> list[str]:
    return ["--node-id", "1", "--cluster-id", CLUSTER_ID, "--log-dir", str(log_dir),
            "--listeners", "127.0.0.1:9091", "--controller-quorum-voters", "1@127.0.0.1:9091"]


@pytest.fixture
def fake_runtime(monkeypatch: pytest.MonkeyPatch) -> list[NodeConfig]:
    """Stand in for ``quorum_node.node.main``; returns the configs run_node was called with."""
    calls: list[NodeConfig] = []

    def run_node(config: NodeConfig) -> int:
        calls.append(config)
        if not (config.log_dir / "meta.properties").exists():
            raise NotFormattedError(f"{config.log_dir / 'meta.properties'}: not found")
        return 0

    module = types.ModuleType("quorum_node.node.main")
    module.run_node = run_node  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "quorum_node.node.main", module)
    for name in [n for n in os.environ if n.startswith("QUORUM_")]:
        monkeypatch.delenv(name)
    return calls


def test_run_hands_the_config_to_the_runtime(tmp_path: Path, fake_runtime: list[NodeConfig],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    format_log_dir(tmp_path, CLUSTER_ID, 1)
    config_file = tmp_path / "node.properties"
    config_file.write_text("controller.quorum.election.timeout.ms=700\nnode.id=9\n")
    monkeypatch.setenv("QUORUM_CONTROLLER_QUORUM_APPEND_LINGER_MS", "3")
    argv = ["run", "--config", str(config_file), *node_flags(tmp_path), "--format-if-empty"]
    assert main(argv) == 0
    [config] = fake_runtime
    assert (config.node_id, config.quorum.election_timeout_ms) == (1, 700)  # flag beats the file
    assert (config.quorum.append_linger_ms, config.format_if_empty) == (3, True)


def test_run_with_a_bad_value_prints_one_line_and_exits_2(
    tmp_path: Path, fake_runtime: list[NodeConfig], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", *node_flags(tmp_path), "--controller-quorum-fetch-timeout-ms", "soon"]
    assert main(argv) == 2
    assert one_line(capsys.readouterr().err) == (
        "quorum-node run: error: controller.quorum.fetch.timeout.ms (from "
        "--controller-quorum-fetch-timeout-ms): expected an integer, got 'soon'"
    )
    assert fake_runtime == []


def test_run_reports_a_storage_error_in_one_line(
    tmp_path: Path, fake_runtime: list[NodeConfig], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", *node_flags(tmp_path / "empty")]) == 2
    assert one_line(capsys.readouterr().err) == (
        f"quorum-node run: error: {tmp_path / 'empty' / 'meta.properties'}: not found")


def test_run_with_a_bad_config_file_as_a_real_process(tmp_path: Path) -> None:
    config_file = tmp_path / "node.properties"
    config_file.write_text("node.id = one\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUORUM_")}
    result = subprocess.run([*CLI, "run", "--config", str(config_file)], capture_output=True,
                            text=True, env=env, timeout=60, check=False)
    assert result.returncode == 2
    assert one_line(result.stderr) == (
        f"quorum-node run: error: node.id (from {config_file}, line 1): expected an integer, "
        "got 'one'; also missing cluster.id, log.dir, listeners, controller.quorum.voters"
    )
    assert result.stdout == ""


def test_run_refuses_to_start_when_its_parent_is_gone(tmp_path: Path) -> None:
    # --parent-pid is how `local` ties its nodes to itself; this process is not that parent.
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUORUM_")}
    result = subprocess.run([*CLI, "run", *node_flags(tmp_path), "--parent-pid", "1"],
                            capture_output=True, text=True, env=env, timeout=60, check=False)
    assert result.returncode == 1
    assert one_line(result.stderr) == (
        "quorum-node run: error: parent process 1 is gone; not starting")


# -- local: set-up ---------------------------------------------------------------------------------


def test_prepare_local_cluster_on_first_use(tmp_path: Path) -> None:
    data = tmp_path / "data"
    nodes = prepare_local_cluster(data, 3, base_port=19091)
    cluster_id = (data / "cluster.id").read_text().strip()
    assert [node.node_id for node in nodes] == [1, 2, 3]
    for i, node in enumerate(nodes, start=1):
        assert node.config_path == data / f"node-{i}.properties"
        assert node.log_path == data / f"node-{i}.log"
        config = load_config(node.config_path, {}, {})
        assert config == node.config
        assert (config.node_id, config.cluster_id, config.log_dir) == (i, cluster_id,
                                                                       data / f"node-{i}")
        # Clients on base-port + i - 1, peers on the ports after the client ports.
        assert config.client_url == f"http://127.0.0.1:{19090 + i}"
        assert str(config.controller_listener) == f"CONTROLLER://127.0.0.1:{19093 + i}"
        assert [str(v) for v in config.voters] == [f"{j}@127.0.0.1:{19093 + j}" for j in (1, 2, 3)]
        assert [str(v) for v in config.voter_client_endpoints] == [
            f"{j}@127.0.0.1:{19090 + j}" for j in (1, 2, 3)]
        assert config.controller_listener_secret_file == data / "peer-secret"
        meta = read_meta_properties(data / f"node-{i}" / "meta.properties")
        assert (meta.cluster_id, meta.node_id) == (cluster_id, i)


def test_prepare_local_cluster_reuses_ids_and_applies_settings(tmp_path: Path) -> None:
    first = prepare_local_cluster(tmp_path, 3)
    meta = [read_meta_properties(n.config.log_dir / "meta.properties") for n in first]
    settings = {"controller.quorum.election.timeout.ms": Setting("500", "--x")}
    again = prepare_local_cluster(tmp_path, 3, base_port=29091, host="::1", settings=settings)
    assert [read_meta_properties(n.config.log_dir / "meta.properties") for n in again] == meta
    assert again[0].config.cluster_id == first[0].config.cluster_id
    assert again[2].config.client_url == "http://[::1]:29093"
    assert load_config(again[1].config_path, {}, {}).quorum.election_timeout_ms == 500


@pytest.mark.parametrize("nodes", [1, 5])
def test_local_refuses_a_directory_of_another_size(
    tmp_path: Path, nodes: int, capsys: pytest.CaptureFixture[str]
) -> None:
    prepare_local_cluster(tmp_path, 3)
    before = sorted(os.listdir(tmp_path))
    assert main(["local", "--nodes", str(nodes), "--data-dir", str(tmp_path)]) == 2
    assert one_line(capsys.readouterr().err) == (
        f"quorum-node local: error: {tmp_path} holds a local quorum of nodes 1, 2, 3, not "
        f"{', '.join(str(i) for i in range(1, nodes + 1))}; run with --nodes 3 or choose another "
        "--data-dir"
    )
    assert sorted(os.listdir(tmp_path)) == before


def test_local_refuses_a_config_with_another_voter_count(tmp_path: Path) -> None:
    [node] = prepare_local_cluster(tmp_path, 1)
    node.config_path.write_text("controller.quorum.voters=1@h:1,2@h:2\n")
    with pytest.raises(LocalClusterError, match="lists 2 voters, not 1; run with --nodes 2"):
        prepare_local_cluster(tmp_path, 1)


def test_local_refuses_a_directory_that_is_not_its_own(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(LocalClusterError, match="is not empty and holds no local quorum"):
        prepare_local_cluster(tmp_path, 3)
    assert os.listdir(tmp_path) == ["notes.txt"]


def test_local_refuses_node_keys_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("QUORUM_NODE_ID", "4")
    assert main(["local", "--data-dir", str(tmp_path / "d")]) == 2
    assert one_line(capsys.readouterr().err) == (
        "quorum-node local: error: QUORUM_NODE_ID: quorum-node local sets node.id for each node "
        "itself; remove it")


def test_local_bad_timing_flag_names_the_flag(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["local", "--data-dir", str(tmp_path / "d"),
                 "--controller-quorum-election-timeout-ms", "0"]) == 2
    assert one_line(capsys.readouterr().err) == (
        "quorum-node local: error: controller.quorum.election.timeout.ms (from "
        "--controller-quorum-election-timeout-ms): must be at least 1, got '0'")


def test_check_ports_free() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(LocalClusterError, match=f"cannot listen on 127.0.0.1:{port}"):
            check_ports_free("127.0.0.1", [port])
    check_ports_free("127.0.0.1", [port])


def test_free_base_ports_lie_below_the_ephemeral_range() -> None:
    for _ in range(20):
        base = free_base_port(6)
        assert base is not None and base + 6 <= 32768, base  # Linux's default range from 32768
        check_ports_free("127.0.0.1", range(base, base + 6))


# -- local: supervision, in this process, of stand-in children -------------------------------------


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


SLEEPER = python("import time; print('ready', flush=True); time.sleep(60)")


def wait_for_output(nodes: list[LocalNode], text: str) -> None:
    deadline = time.monotonic() + 20
    while not all(n.log_path.exists() and text in n.log_path.read_text() for n in nodes):
        assert time.monotonic() < deadline, "the children did not start"
        time.sleep(0.02)


def test_supervisor_stops_every_node_on_request(tmp_path: Path) -> None:
    nodes = prepare_local_cluster(tmp_path, 3)
    cluster = LocalCluster(nodes, lambda node: SLEEPER)
    cluster.start()
    wait_for_output(nodes, "ready")
    assert cluster.supervise(lambda: True) == 0
    assert [p.returncode for p in cluster.processes.values()] == [-signal.SIGTERM] * 3


def test_supervisor_reports_a_node_that_exits_and_the_others_go_on(tmp_path: Path) -> None:
    nodes = prepare_local_cluster(tmp_path, 3)
    out = StringIO()
    cluster = LocalCluster(
        nodes, lambda node: python("import sys; sys.exit(3)") if node.node_id == 2 else SLEEPER,
        out=out,
    )
    cluster.start()
    wait_for_output([nodes[0], nodes[2]], "ready")
    ticks = 0

    def enough() -> bool:  # long enough for node 2 to exit and be reported, then some
        nonlocal ticks
        ticks += 1
        return "node 2 exited" in out.getvalue() and ticks > 20

    assert cluster.supervise(enough, poll_s=0.02) == 0
    assert out.getvalue() == (f"node 2 exited with code 3; its log: {tmp_path / 'node-2.log'}; "
                              "the quorum goes on with nodes 1, 3 (2 of 3 voters)\n")
    assert [cluster.processes[i].returncode for i in (1, 2, 3)] == [-signal.SIGTERM, 3,
                                                                     -signal.SIGTERM]


def test_control_requests_stop_restart_and_replace_a_node(tmp_path: Path) -> None:
    nodes = prepare_local_cluster(tmp_path, 3)
    # Sleepers never serve: a restart says so once the wait for it is over.
    cluster = LocalCluster(nodes, lambda node: SLEEPER, out=StringIO(), serving_timeout_s=0.3)
    cluster.start()
    try:
        first_pid = cluster.processes[2].pid
        stop = handle_control_request(cluster, ControlRequest("r1", "stop", 2), lambda: False)
        assert stop == ControlAnswer(True, ["node 2 stopped; the quorum goes on with nodes 1, 3 "
                                            "(2 of 3 voters)"])
        assert handle_control_request(cluster, ControlRequest("r2", "stop", 2),
                                      lambda: False) == ControlAnswer(False,
                                                                      ["node 2 is not running"])
        restart = handle_control_request(cluster, ControlRequest("r3", "restart", 2),
                                         lambda: False)
        assert not restart.ok and restart.lines[0].startswith("node 2 started (pid ")
        assert ", not serving clients after 0 s (its log: " in restart.lines[0]
        assert cluster.processes[2].pid != first_pid and cluster.running() == [1, 2, 3]
        old_id = read_meta_properties(tmp_path / "node-3" / "meta.properties").directory_id
        replace = handle_control_request(cluster, ControlRequest("r4", "replace", 3),
                                         lambda: False)
        new_id = read_meta_properties(tmp_path / "node-3" / "meta.properties").directory_id
        assert replace.ok and new_id != old_id
        kept = [p for p in tmp_path.iterdir() if p.name.startswith("node-3.replaced-")]
        assert len(kept) == 1
        assert read_meta_properties(kept[0] / "meta.properties").directory_id == old_id
        commands = [line.strip() for line in replace.lines if "quorum-admin" in line]
        assert [c.split(" -b ")[1].split(" ", 1)[1] for c in commands] == [
            f"add-voter --id 3 --uuid {to_kafka_string(new_id)}",
            f"remove-voter --id 3 --uuid {to_kafka_string(old_id)}"]
        assert handle_control_request(cluster, ControlRequest("r5", "restart", 9),
                                      lambda: False) == ControlAnswer(
            False, ["no node 9: this quorum has nodes 1, 2, 3"])
    finally:
        cluster.stop()


def test_supervisor_kills_a_node_that_ignores_sigterm(tmp_path: Path) -> None:
    nodes = prepare_local_cluster(tmp_path, 2)
    stubborn = python("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print('ready', flush=True)
        time.sleep(60)
    """)
    out = StringIO()
    cluster = LocalCluster(nodes, lambda node: stubborn if node.node_id == 1 else SLEEPER,
                           grace_s=0.5, out=out)
    cluster.start()
    wait_for_output(nodes, "ready")
    started = time.monotonic()
    cluster.stop()
    assert time.monotonic() - started < 5
    assert out.getvalue() == "node 1 killed after 0.5 s (SIGTERM did not stop it)\n"
    assert cluster.processes[1].returncode == -signal.SIGKILL
    assert cluster.processes[2].returncode == -signal.SIGTERM


# -- local: the whole command as a process -------------------------------------------------------

# Provides quorum_node.node.main.run_node in every process started with it on PYTHONPATH: a
# node that answers GET /healthz, stops on SIGTERM/SIGINT, and exits with 3 at once if it is the
# node named by FAKE_FAIL_NODE.
FAKE_RUNTIME = '''
import os, signal, sys, threading, types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class _Health(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/v1/node":  # serving, following node 1: what `local --restart` awaits
            body = b'{"node_id": 0, "state": "follower", "leader_id": 1}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass

def run_node(config):
    if os.environ.get("FAKE_FAIL_NODE") == str(config.node_id):
        return 3
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    listener = config.client_listeners[0]
    server = ThreadingHTTPServer((listener.host, listener.port), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    while not stop.wait(0.05):
        pass
    server.shutdown()
    return 0

_module = types.ModuleType("quorum_node.node.main")
_module.run_node = run_node
sys.modules["quorum_node.node.main"] = _module
'''


def free_port_range(count: int) -> int:
    base = free_base_port(count)
    assert base is not None, f"no {count} free ports in a row"
    return base


def has_real_runtime() -> bool:
    try:
        from quorum_node.node import main  # noqa: PLC0415
    except ImportError:
        return False
    return callable(getattr(main, "run_node", None))


class LocalProcess:
    def __init__(self, tmp_path: Path, nodes: int, fake: bool, name: str = "local",
                 args: Sequence[str] = (), **env: str) -> None:
        self.data = tmp_path / "data"
        self.out_path, self.err_path = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        self.base_port = free_port_range(2 * nodes)  # client ports, then controller ports
        environ = {k: v for k, v in os.environ.items() if not k.startswith("QUORUM_")}
        if fake:
            (tmp_path / "fake").mkdir(exist_ok=True)
            (tmp_path / "fake" / "sitecustomize.py").write_text(FAKE_RUNTIME)
            environ["PYTHONPATH"] = os.pathsep.join(
                [str(tmp_path / "fake"), *filter(None, [environ.get("PYTHONPATH")])])
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.process = subprocess.Popen(
                [*CLI, "local", "--nodes", str(nodes), "--data-dir", str(self.data),
                 "--base-port", str(self.base_port), *args],
                stdout=out, stderr=err, env={**environ, **env},
            )

    def out(self) -> str:
        return self.out_path.read_text()

    def err(self) -> str:
        return self.err_path.read_text()

    def diagnostics(self) -> str:
        logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}"
                         for p in sorted(self.data.glob("node-*.log")))
        return f"stdout:\n{self.out()}\nstderr:\n{self.err()}\n{logs}"

    def node_pids(self, nodes: int) -> dict[int, int]:
        """The node lines `local` prints, once it has printed them all."""
        deadline = time.monotonic() + 30
        while True:
            found = re.findall(r"^node (\d+): http://127\.0\.0\.1:(\d+)  \(peers on "
                               r"127\.0\.0\.1:(\d+); pid (\d+), log (.+)\)$",
                               self.out(), re.MULTILINE)
            if len(found) == nodes:
                break
            assert self.process.poll() is None, self.diagnostics()
            assert time.monotonic() < deadline, self.diagnostics()
            time.sleep(0.05)
        for node_id, port, peer_port, _, log in found:
            assert int(port) == self.base_port + int(node_id) - 1
            assert int(peer_port) == self.base_port + nodes + int(node_id) - 1
            assert log == str(self.data.resolve() / f"node-{node_id}.log")
        return {int(node_id): int(pid) for node_id, _, _, pid, _ in found}

    def wait_healthy(self, nodes: int) -> None:
        deadline = time.monotonic() + 60
        for port in range(self.base_port, self.base_port + nodes):
            while True:
                url = f"http://127.0.0.1:{port}/healthz"
                with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        break
                assert self.process.poll() is None, self.diagnostics()
                assert time.monotonic() < deadline, self.diagnostics()
                time.sleep(0.1)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()  # its children get SIGTERM from Linux (--parent-pid)
            self.process.wait()


@pytest.fixture
def local_process(tmp_path: Path) -> Iterator[list[LocalProcess]]:
    started: list[LocalProcess] = []
    yield started
    for process in started:
        process.kill()


def alive(pid: int) -> bool:
    """Running (a zombie left to an init that does not reap counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


@pytest.mark.parametrize("runtime", ["stand-in", "real"])
def test_local_runs_a_quorum_until_sigint(
    tmp_path: Path, local_process: list[LocalProcess], runtime: str
) -> None:
    if runtime == "real" and not has_real_runtime():
        pytest.skip("quorum_node.node.main.run_node is not there yet")
    identity: list[str] = []
    # The second start reuses the data directory: same cluster id and directory ids. (Once over
    # the real runtime: the stand-in covers the restart, and a real start costs seconds.)
    for name in ("first", "second") if runtime == "stand-in" else ("first",):
        local = LocalProcess(tmp_path, 3, fake=runtime == "stand-in", name=name)
        local_process.append(local)
        pids = local.node_pids(3)
        local.wait_healthy(3)
        assert all(alive(pid) for pid in pids.values())

        local.process.send_signal(signal.SIGINT)
        assert local.process.wait(timeout=60) == 0, local.diagnostics()
        assert not any(alive(pid) for pid in pids.values())
        assert local.err().endswith("all nodes stopped\n"), local.diagnostics()
        files = ["cluster.id", *(f"node-{i}/meta.properties" for i in (1, 2, 3))]
        identity.append("".join((local.data / f).read_text() for f in files))
    assert len(set(identity)) == 1


def test_local_goes_on_when_a_node_dies_and_restarts_it_on_request(
    tmp_path: Path, local_process: list[LocalProcess]
) -> None:
    local = LocalProcess(tmp_path, 3, fake=True)
    local_process.append(local)
    pids = local.node_pids(3)
    local.wait_healthy(3)
    os.kill(pids[1], signal.SIGKILL)
    deadline = time.monotonic() + 20
    while "node 1 was killed by SIGKILL" not in local.err():
        assert time.monotonic() < deadline, local.diagnostics()
        time.sleep(0.05)
    assert ("; the quorum goes on with nodes 2, 3 (2 of 3 voters)\n") in local.err()
    assert local.process.poll() is None and alive(pids[2]) and alive(pids[3])
    restart = subprocess.run([*CLI, "local", "--data-dir", str(local.data), "--restart", "1"],
                             capture_output=True, text=True, timeout=60, check=False)
    assert restart.returncode == 0, restart.stderr
    assert restart.stdout.startswith("node 1 started (pid "), restart.stdout
    assert "nodes 1, 2, 3 (3 of 3 voters)" in restart.stdout
    local.wait_healthy(3)
    local.process.send_signal(signal.SIGINT)
    assert local.process.wait(timeout=60) == 0, local.diagnostics()
    # With no local running there, a request is refused at once.
    refused = subprocess.run([*CLI, "local", "--data-dir", str(local.data), "--stop-node", "1"],
                             capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 2
    assert refused.stderr == (f"quorum-node local: error: no quorum-node local is running on "
                              f"{local.data} (start one with quorum-node local --data-dir "
                              f"{local.data})\n")


def wait_for_line(local: LocalProcess, pattern: str, stream: str = "out",
                  timeout_s: float = 60) -> re.Match[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = re.search(pattern, local.out() if stream == "out" else local.err(), re.MULTILINE)
        if found:
            return found
        assert local.process.poll() is None, local.diagnostics()
        assert time.monotonic() < deadline, local.diagnostics()
        time.sleep(0.1)


def test_local_failover_and_disk_replacement_on_one_machine(
    tmp_path: Path, local_process: list[LocalProcess]
) -> None:
    """What the README walks through: a real quorum says when it is ready and who leads, goes on
    (with a new leader) when the leader is killed, and a node is given a new disk and put back
    with the add-voter and remove-voter lines that local prints."""
    if not has_real_runtime():
        pytest.skip("quorum_node.node.main.run_node is not there yet")
    local = LocalProcess(tmp_path, 3, fake=False, args=["--log-format", "json"])
    local_process.append(local)
    pids = local.node_pids(3)
    ready = wait_for_line(local, r"^quorum ready: node (\d) leads in epoch (\d+) ")
    leader = int(ready.group(1))
    os.kill(pids[leader], signal.SIGKILL)
    wait_for_line(local, rf"^node {leader} was killed by SIGKILL; .*; the quorum goes on with ",
                  "err")
    new_leader = wait_for_line(local, r"^node (\d) now leads in epoch (\d+)$")
    assert int(new_leader.group(1)) != leader
    control = [*CLI, "local", "--data-dir", str(local.data)]
    replaced = subprocess.run([*control, "--replace", str(leader)], capture_output=True,
                              text=True, timeout=60, check=False)
    assert replaced.returncode == 0, replaced.stderr
    commands = [line.split() for line in replaced.stdout.splitlines()
                if line.strip().startswith("quorum-admin")]
    assert [c[3] for c in commands] == ["add-voter", "remove-voter"], replaced.stdout
    new_id = commands[0][-1]
    # The leader says that the node on its new disk could be a voter, and how to make it one.
    successor = int(new_leader.group(1))
    deadline = time.monotonic() + 60
    while not any(m.endswith(f" add-voter --id {leader} --uuid {new_id}")
                  for m in node_log_messages(local.data / f"node-{successor}.log")):
        assert time.monotonic() < deadline, local.diagnostics()
        time.sleep(0.2)
    admin = [sys.executable, "-m", "quorum_node.cli.admin"]
    for command in commands:
        deadline = time.monotonic() + 60
        while True:
            done = subprocess.run([*admin, *command[1:]], capture_output=True, text=True,
                                  timeout=90, check=False)
            # Until the new disk's node has fetched from the leader it is no observer yet.
            if done.returncode == 0 or "is not an observer" not in done.stderr \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert done.returncode == 0, (command, done.stdout, done.stderr, local.diagnostics())
    # The nodes' logs (JSON lines) tell the story.
    said = node_log_messages(local.data / f"node-{successor}.log")
    assert any(re.fullmatch(rf"node {successor}: (candidate|prospective) -> leader in epoch "
                            r"\d+.*: won the election", m) for m in said), said
    # The killed leader's port refuses connections: its followers campaign at once (the fetch
    # timeout is the fallback when no refusal comes).
    assert any(re.fullmatch(rf"node {successor}: follower -> (prospective|candidate) in epoch "
                            rf"\d+.*: (leader {leader} refused a connection \(its process is "
                            rf"gone\)|no word from leader {leader} within the fetch timeout); "
                            "starting an election", m) for m in said), said
    assert any(m.startswith(f"node {successor}: peer {leader} unreachable: ") for m in said)
    assert any(m.startswith(f"node {successor}: peer {leader} reachable again after ")
               for m in said), said
    assert any(m.startswith(f"node {successor}: observer {leader} (directory {new_id}) fetches "
                            f"and could be a voter: quorum-admin -b ")
               and m.endswith(f" add-voter --id {leader} --uuid {new_id}") for m in said), said
    local.process.send_signal(signal.SIGINT)
    assert local.process.wait(timeout=60) == 0, local.diagnostics()
    final = node_log_messages(local.data / f"node-{successor}.log")
    assert f"node {successor}: shutting down (SIGTERM received); resigning the leadership " \
           "first" in final or f"node {successor}: shutting down (SIGTERM received)" in final
    assert f"node {successor}: stopped" in final
    assert not [line for line in (local.data / f"node-{successor}.log").read_text().splitlines()
                if not line.startswith(("{", "---"))]  # nothing but JSON lines (and local's)


def node_log_messages(path: Path) -> list[str]:
    """The messages of a node's JSON log lines (the lines local writes between are not JSON)."""
    messages = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            document = json.loads(line)
            assert set(document) >= {"time", "level", "logger", "message"}
            messages.append(document["message"])
    return messages


def test_nodes_stop_when_local_itself_is_killed(
    tmp_path: Path, local_process: list[LocalProcess]
) -> None:
    local = LocalProcess(tmp_path, 2, fake=True)
    local_process.append(local)
    pids = local.node_pids(2)
    local.wait_healthy(2)
    local.process.kill()  # no chance to stop its nodes: Linux does, through --parent-pid
    local.process.wait()
    deadline = time.monotonic() + 20
    while any(alive(pid) for pid in pids.values()):
        assert time.monotonic() < deadline, local.diagnostics()
        time.sleep(0.05)


def test_local_writes_nothing_when_a_config_is_bad(tmp_path: Path) -> None:
    with pytest.raises(ConfigError,
                       match=r"^listeners \(from quorum-node local\): 'CLIENT://a b:9091'"):
        prepare_local_cluster(tmp_path / "data", 3, host="a b")
    assert not (tmp_path / "data").exists()


def test_supervisor_reports_a_node_killed_by_a_signal_and_a_second_signal_kills(
    tmp_path: Path,
) -> None:
    nodes = prepare_local_cluster(tmp_path, 2)
    stubborn = python("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print('ready', flush=True)
        time.sleep(60)
    """)
    suicide = python("import os, time; time.sleep(0.3); os.kill(os.getpid(), 9)")
    out = StringIO()
    cluster = LocalCluster(nodes, lambda node: suicide if node.node_id == 2 else stubborn,
                           out=out)
    cluster.start()
    wait_for_output(nodes[:1], "ready")
    started = time.monotonic()
    assert cluster.supervise(lambda: "SIGKILL" in out.getvalue(), lambda: True,
                             poll_s=0.02) == 0
    assert time.monotonic() - started < 5  # not the 10 s grace period
    assert out.getvalue() == (f"node 2 was killed by SIGKILL; its log: {nodes[1].log_path}; "
                              "no majority left: node 1 (1 of 2 voters; writes wait until a "
                              "majority is back)\nnode 1 killed on a second signal\n")


def test_a_second_local_on_a_data_directory_in_use_is_refused_and_writes_nothing(
    tmp_path: Path, local_process: list[LocalProcess]
) -> None:
    if not has_real_runtime():
        pytest.skip("quorum_node.node.main.run_node is not there yet")
    first = LocalProcess(tmp_path, 3, fake=False, name="first")
    local_process.append(first)
    first.node_pids(3)
    first.wait_healthy(3)
    data = first.data.absolute()
    kept = [".lock", "cluster.id", *(f"node-{i}.properties" for i in (1, 2, 3)),
            *(f"node-{i}/{name}" for i in (1, 2, 3) for name in (".lock", "meta.properties"))]

    def state() -> dict[str, tuple[bytes, int]]:
        return {name: ((data / name).read_bytes(), (data / name).stat().st_mtime_ns)
                for name in kept}

    before = state()
    second = LocalProcess(tmp_path, 3, fake=False, name="second")  # other ports, same data
    local_process.append(second)
    assert second.process.wait(timeout=60) == 2, second.diagnostics()
    error = one_line(second.err())
    assert error.startswith(f"quorum-node local: error: data directory {data} is in use by "
                            f"another process (pid {first.process.pid})"), error
    assert second.out() == ""
    assert state() == before
    first.wait_healthy(3)  # untouched


def test_local_says_the_quorum_is_ready_once_its_leader_takes_writes() -> None:
    """A new quorum's first leader that has yet to hear from a voter is said once, with the
    voter it waits for; "quorum ready" comes when it takes writes."""
    said: list[str] = []
    watch = LeaderWatch(said.append)

    def node(node_id: int, state: str, unheard: tuple[int, ...] = ()) -> dict[str, object]:
        return {"node_id": node_id, "state": state, "epoch": 1, "high_watermark": 1,
                "voters_unheard": list(unheard)}

    waiting = [node(1, "leader", (3,)), node(2, "follower")]
    watch.observe(waiting, 0.0)
    watch.observe(waiting, 2.0)
    assert said == [
        "node 1 leads epoch 1 but takes no writes until voter 3 has fetched from it: a new "
        "quorum's first leader writes the voter set, with every voter's directory id, before any "
        "record (start it, or check that it reaches node 1)"]
    watch.observe([node(1, "leader"), node(2, "follower"), node(3, "follower")], 3.0)
    assert said[1:] == ["quorum ready: node 1 leads in epoch 1 (3 nodes answering)"]
