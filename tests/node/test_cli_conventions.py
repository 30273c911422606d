"""The conventions every ``quorum-*`` command line follows (``quorum_node.cli.common``): every
subcommand given bad input answers in one line with a documented exit code and no traceback,
``--version`` and ``--print-completion`` everywhere, fast failure on refused connections,
``--json`` errors, Ctrl-C, and a missing extra named with its ``pip install`` line."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from proc_cluster import free_port

from quorum_audit import cli as audit_cli
from quorum_node.cli import admin, client, launch, node
from quorum_node.cli.local_quorum import prepare_local_cluster
from quorum_node.node.config import CONFIG_KEYS
from quorum_node.storage.meta_properties import format_log_dir

TOOLS: dict[str, Callable[[list[str]], int]] = {
    "quorum-node": node.main,
    "quorum-client": client.main,
    "quorum-admin": admin.main,
    "quorum-audit": audit_cli.main,
}
MODULES = {
    "quorum-node": "quorum_node.cli.node",
    "quorum-client": "quorum_node.cli.client",
    "quorum-admin": "quorum_node.cli.admin",
    "quorum-audit": "quorum_audit.cli",
}
DIRECTORY_ID = "AAAAAAAAAAAAAAAAAAAAAw"
CLUSTER_ID = "MkU3OEVBNTcwNTJENDM2Qg"


@pytest.fixture
def dead() -> str:
    """An address where nothing listens."""
    return f"127.0.0.1:{free_port()}"


def bad_inputs(tmp: Path, dead: str) -> list[tuple[str, list[str], int]]:
    """(tool, argv, exit code): every subcommand at least once."""
    a_file = tmp / "a-file"
    a_file.write_text("not a directory\n")
    missing = tmp / "missing"
    b = ["-b", dead]
    formatted = tmp / "formatted"
    format_log_dir(formatted, CLUSTER_ID, 1)
    quorum = tmp / "quorum"
    prepare_local_cluster(quorum, 3, base_port=free_port())
    return [
        ("quorum-node", [], 2),
        ("quorum-node", ["frobnicate"], 2),
        ("quorum-node", ["format", "--log-dir", str(a_file), "--node-id", "1",
                         "--cluster-id", CLUSTER_ID], 2),
        ("quorum-node", ["format", "--log-dir", str(tmp / "d"), "--node-id", "x",
                         "--cluster-id", CLUSTER_ID], 2),
        ("quorum-node", ["format", "--log-dir", str(tmp / "d"), "--node-id", "1",
                         "--cluster-id", "hello"], 2),
        ("quorum-node", ["random-cluster-id", "extra"], 2),
        ("quorum-node", ["run", "--config", str(missing)], 2),
        ("quorum-node", ["run", "--node-id", "-4"], 2),
        ("quorum-node", ["repair-log", "--log-dir", str(missing)], 2),
        ("quorum-node", ["local", "--nodes", "0", "--data-dir", str(tmp / "l")], 2),
        ("quorum-node", ["local", "--data-dir", str(a_file)], 2),
        ("quorum-node", ["local", "--data-dir", str(missing), "--restart", "1"], 2),
        ("quorum-node", ["local", "--data-dir", str(tmp), "--replace", "1"], 2),
        ("quorum-node", ["export", "--log-dir", str(missing)], 2),
        ("quorum-node", ["export", "--log-dir", str(formatted), "--output",
                         str(missing / "x.tar")], 2),
        ("quorum-node", ["local", "--data-dir", str(quorum), "--stop-node", "9"], 2),
        ("quorum-node", ["info", "--log-dir", str(a_file)], 2),
        ("quorum-node", ["backup", *b, "--to", str(tmp / "backups")], 1),
        ("quorum-node", ["backup", "-b", "nope", "--to", str(tmp / "backups")], 2),
        ("quorum-node", ["backup", *b, "--to", str(tmp / "backups"), "--timeout", "0"], 2),
        ("quorum-node", ["restore", "--from", str(missing), "--voters", "x",
                         "--log-dir", str(tmp / "r-{id}")], 2),
        ("quorum-client", [], 2),
        ("quorum-client", [*b, "put", "k"], 2),
        ("quorum-client", [*b, "put", "k", "v", "--file", str(a_file)], 2),
        ("quorum-client", [*b, "put", "k", "--file", str(missing)], 2),
        ("quorum-client", [*b, "put", "k", "v"], 1),
        ("quorum-client", [*b, "get", "k"], 1),
        ("quorum-client", [*b, "get"], 2),
        ("quorum-client", [*b, "delete", "k"], 1),
        ("quorum-client", [*b, "delete", ""], 2),
        ("quorum-client", [*b, "cas", "k", "--value", "v"], 2),
        ("quorum-client", [*b, "cas", "k", "--expected-absent", "--value", "v"], 1),
        ("quorum-client", [*b, "list", "p"], 1),
        ("quorum-client", [*b, "list", "--limit", "0"], 2),
        ("quorum-client", [*b, "watch"], 2),
        ("quorum-client", [*b, "watch", "k"], 1),
        ("quorum-client", [*b, "append"], 2),
        ("quorum-client", [*b, "append", "x"], 1),
        ("quorum-client", [*b, "read", "--offset", "-1"], 2),
        ("quorum-client", [*b, "read", "--offset", "0"], 1),
        ("quorum-client", ["-b", "nope", "get", "k"], 2),
        ("quorum-client", [*b, "--timeout", "-1", "get", "k"], 2),
        ("quorum-client", [*b, "--token-file", str(missing), "get", "k"], 2),
        ("quorum-admin", [], 2),
        ("quorum-admin", [*b, "describe"], 2),
        ("quorum-admin", [*b, "describe", "--status"], 1),
        ("quorum-admin", [*b, "describe", "--replication"], 1),
        ("quorum-admin", [*b, "status"], 1),
        ("quorum-admin", [*b, "add-voter", "--id", "3", "--uuid", "nope"], 2),
        ("quorum-admin", [*b, "add-voter", "--id", "3", "--uuid", DIRECTORY_ID], 1),
        ("quorum-admin", [*b, "remove-voter", "--id", "-3", "--uuid", DIRECTORY_ID], 2),
        ("quorum-admin", [*b, "remove-voter", "--id", "3", "--uuid", DIRECTORY_ID], 1),
        ("quorum-admin", ["-b", "h:0", "describe", "--status"], 2),
        ("quorum-audit", [], 2),
        ("quorum-audit", ["run"], 2),
        ("quorum-audit", ["consistency", "p", "--high-watermark", "x"], 2),
        ("quorum-audit", ["history", "--out"], 2),
        # A path that does not exist is refused before Spark starts (seconds), within 2 s.
        ("quorum-audit", ["run", str(missing)], 2),
        ("quorum-audit", ["consistency", f"file://{missing}"], 2),
        ("quorum-audit", ["history", str(tmp), str(missing)], 2),
    ]


def test_every_subcommand_answers_bad_input_in_one_line(
        tmp_path: Path, dead: str, capsys: pytest.CaptureFixture[str]) -> None:
    cases = bad_inputs(tmp_path, dead)
    commands = {(tool, argv[2] if argv[:1] == ["-b"] and len(argv) > 2 else
                 (argv[0] if argv and not argv[0].startswith("-") else None))
                for tool, argv, _ in cases}
    # Every subcommand of every tool has a case.
    assert {c for t, c in commands if t == "quorum-node"} >= {
        "format", "random-cluster-id", "run", "repair-log", "local", "export", "info", "backup",
        "restore"}
    assert {c for t, c in commands if t == "quorum-audit"} >= {"run", "consistency", "history"}
    assert {c for t, c in commands if t == "quorum-client"} >= {
        "put", "get", "delete", "cas", "list", "watch", "append", "read"}
    assert {c for t, c in commands if t == "quorum-admin"} >= {
        "describe", "status", "add-voter", "remove-voter"}
    # The audit imports Spark's modules on its first run (seconds on a busy machine): imported
    # before the clock starts, so that the bound below times the commands, not the imports.
    with contextlib.suppress(ImportError):
        importlib.import_module("quorum_audit.audit")
    wrong = []
    for tool, argv, expected in cases:
        started = time.monotonic()
        code = TOOLS[tool](argv)
        elapsed = time.monotonic() - started
        out, err = capsys.readouterr()
        # "quorum-node format: error: ..." names the subcommand too.
        one_line = err.count("\n") == 1 and err.startswith(tool) and ": error: " in err
        # A refused connection fails at once, never waiting out the timeout.
        if (code, out, one_line) != (expected, "", True) or "Traceback" in err or elapsed > 2:
            wrong.append((tool, argv, code, out, err, elapsed))
    assert wrong == []


PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "quorum-node": node._build_parser,
    "quorum-client": client._build_parser,
    "quorum-admin": admin._build_parser,
    "quorum-audit": audit_cli._parser,
}


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def test_one_flag_for_the_nodes_and_one_for_the_timeout_everywhere() -> None:
    """Every subcommand that contacts a node names it with -b/--bootstrap-server and bounds
    itself with --timeout SECONDS; no --server, --timeout-s or other spelling (the node's own
    configuration keys, Kafka's names, aside)."""
    key_flags = {key.flag for key in CONFIG_KEYS}
    contacting = set()
    for tool, build in PARSERS.items():
        top = build()
        for name, parser in {"": top, **subcommands(top)}.items():
            options = {option for action in parser._actions for option in action.option_strings
                       if option not in key_flags}
            where = f"{tool} {name}".strip()
            assert not options & {"--server", "--timeout-s", "--timeout-ms"}, where
            assert not [o for o in options if "timeout" in o and o != "--timeout"], where
            if options & {"-b", "--bootstrap-server"}:
                assert {"-b", "--bootstrap-server", "--timeout"} <= options, where
                contacting.add(where)
    assert {"quorum-node backup", "quorum-client get", "quorum-admin describe"} <= contacting


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_version_and_completion(tool: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert TOOLS[tool](["--version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{tool} ") and out.strip() != tool
    assert TOOLS[tool](["--print-completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert "complete" in script and tool.replace("-", "_") in script


def test_json_errors_are_the_api_shape(dead: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert client.main(["-b", dead, "--json", "get", "k"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["code"] == "UNAVAILABLE"
    assert err.startswith("quorum-client: error: no node reachable: ")
    assert admin.main(["-b", dead, "describe", "--status", "--json"]) == 1
    out, _ = capsys.readouterr()
    assert json.loads(out)["code"] == "UNAVAILABLE"
    assert client.main(["-b", dead, "--json", "read", "--offset", "-1"]) == 2  # argparse's own
    assert capsys.readouterr().out == ""


def test_a_missing_extra_names_its_pip_line(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "pyspark", None)  # as if not installed
    assert audit_cli.main(["run", "somewhere"]) == 2
    assert capsys.readouterr().err == (
        "quorum-audit: error: this command needs pyspark, which is not installed: "
        "pip install 'quorum-node[spark]'\n")
    monkeypatch.setitem(sys.modules, "kopf", None)
    assert launch.operator_main() == 2
    assert capsys.readouterr().err == (
        "kafka-quorum-operator: error: this command needs kopf, which is not installed: "
        "pip install 'quorum-node[operator]'\n")


# --- as processes: what only a real process shows -----------------------------------------------


def run_tool(tool: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", MODULES[tool], *argv], capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_run_on_a_port_in_use_then_with_a_voter_list_without_its_own_id(tmp_path: Path) -> None:
    assert node.main(["format", "--log-dir", str(tmp_path / "n1"), "--node-id", "1",
                      "--cluster-id", CLUSTER_ID]) == 0
    client_port, peer_port = free_port(), free_port()
    common = ["run", "--node-id", "1", "--cluster-id", CLUSTER_ID, "--log-dir",
              str(tmp_path / "n1"), "--controller-listener-names", "CONTROLLER",
              "--listener-security-protocol-map", "CLIENT:PLAINTEXT,CONTROLLER:PLAINTEXT",
              "--listeners", f"CLIENT://127.0.0.1:{client_port},"
                             f"CONTROLLER://127.0.0.1:{peer_port}"]
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", client_port))
        taken.listen()
        in_use = run_tool("quorum-node", *common,
                          "--controller-quorum-voters", f"1@127.0.0.1:{peer_port}",
                          "--controller-quorum-client-endpoints", f"1@127.0.0.1:{client_port}")
    assert in_use.returncode == 2, in_use.stderr
    last = in_use.stderr.splitlines()[-1]
    assert last.startswith("quorum-node run: error: cannot start: ") and "in use" in last
    assert "Traceback" not in in_use.stderr
    # The log now holds the voter set {1}; a configuration naming only node 2 contradicts it.
    other = run_tool("quorum-node", *common,
                     "--controller-quorum-voters", f"2@127.0.0.1:{free_port()}",
                     "--controller-quorum-client-endpoints", f"2@127.0.0.1:{free_port()}")
    assert other.returncode == 2, other.stderr
    assert "Traceback" not in other.stderr
    assert other.stderr.splitlines()[-1].startswith(
        "quorum-node run: error: refusing to start: ")


@pytest.fixture
def silent_server() -> Iterator[socket.socket]:
    """Accepts connections and never answers: a request waits until interrupted."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server


@pytest.mark.parametrize(("tool", "argv", "hint"), [
    ("quorum-client", ["put", "k", "v"], "the write may still commit"),
    ("quorum-client", ["get", "k"], "interrupted"),
    ("quorum-admin", ["describe", "--status"], "interrupted"),
])
def test_ctrl_c_is_one_line_and_exit_130(silent_server: socket.socket, tool: str,
                                         argv: list[str], hint: str) -> None:
    port = silent_server.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", MODULES[tool], "-b", f"127.0.0.1:{port}", "--timeout", "60",
         *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        silent_server.settimeout(30)
        connection, _ = silent_server.accept()  # the request is on its way: now waiting
        with connection:
            time.sleep(0.2)
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(f"{tool}: ") and hint in err, err


def test_help_runs_without_extras_installed(tmp_path: Path) -> None:
    """--help and --version of quorum-audit work with the light install (no pyspark)."""
    blocker = tmp_path / "pyspark.py"
    blocker.write_text("raise ImportError('pyspark is not installed')\n")
    result = subprocess.run([sys.executable, "-m", "quorum_audit.cli", "--help"],
                            capture_output=True, text=True, timeout=60, check=False,
                            env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0 and result.stdout.startswith("usage: quorum-audit")


EXTRA_MODULES = ("pyspark", "pyarrow", "numpy", "matplotlib", "kopf", "kubernetes", "cryptography")


def test_a_local_quorum_needs_no_extra(tmp_path: Path) -> None:
    """What `pip install -e .` brings is enough for the node, the CLIs and the client: none of
    them imports a module of an extra."""
    for module in EXTRA_MODULES:
        (tmp_path / f"{module}.py").write_text(f"raise ImportError('{module}: an extra')\n")
    code = ("import quorum_node.cli.node, quorum_node.cli.client, quorum_node.cli.admin, "
            "quorum_node.node.runtime, quorum_node.node.main, quorum_node.client, quorum_audit.cli")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=False,
                            env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr


def test_an_output_that_cannot_be_written_is_one_line() -> None:
    """An I/O error no command expects (stdout on a full disk) is one line and exit 1, never a
    traceback."""
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", MODULES["quorum-node"],
                                 "random-cluster-id"], stdout=full, stderr=subprocess.PIPE,
                                text=True, timeout=60, check=False)
    assert (result.returncode, result.stderr) == (
        1, "quorum-node: error: No space left on device\n")
