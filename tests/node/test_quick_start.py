"""The README's quick start as a newcomer types it, on ports moved with ``--base-port``: the real
CLIs as processes against a real ``quorum-node local``. The other CLIs find the quorum from the
directory holding ``./quorum-data``, or from the ``export`` line ``local`` prints; when they
find no node, the error says how to name the nodes. ``--restart`` answers once the node serves,
``describe --status`` lists a voter just stopped as unreachable, and after ``--replace`` and the
printed voter changes the old disk is shown as retired, never offered back as a voter."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_node_cli import free_port_range

NODE = [sys.executable, "-m", "quorum_node.cli.node"]
CLIENT = [sys.executable, "-m", "quorum_node.cli.client"]
ADMIN = [sys.executable, "-m", "quorum_node.cli.admin"]
# A user's shell: no QUORUM_* variable unless the test exports one.
SHELL_ENV = {k: v for k, v in os.environ.items() if not k.startswith("QUORUM_")}


@dataclass
class Local:
    process: subprocess.Popen[bytes]
    home: Path  # the directory the user started it in, holding ./quorum-data
    out_path: Path
    base_port: int

    def out(self) -> str:
        return self.out_path.read_text()

    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.base_port + i}" for i in range(3))

    def wait_for(self, pattern: str, timeout_s: float = 60) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while not (found := re.search(pattern, self.out(), re.MULTILINE)):
            assert self.process.poll() is None, self.out()
            assert time.monotonic() < deadline, self.out()
            time.sleep(0.1)
        return found


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None,
        timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, env=SHELL_ENV if env is None else env,
                          capture_output=True, text=True, timeout=timeout_s, check=False)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    home = tmp_path_factory.mktemp("home")
    base_port = free_port_range(6)
    out_path = home / "local.out"
    with out_path.open("wb") as out:
        process = subprocess.Popen([*NODE, "local", "--nodes", "3", "--base-port", str(base_port)],
                                   cwd=home, stdout=out, stderr=subprocess.STDOUT, env=SHELL_ENV)
    started = Local(process, home, out_path, base_port)
    try:
        started.wait_for(r"^quorum ready: ")
        yield started
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_the_other_clis_find_a_local_quorum_on_moved_ports(local: Local, tmp_path: Path) -> None:
    ports = [local.base_port + i for i in range(3)]
    export = local.wait_for(r"^  export QUORUM_BOOTSTRAP_SERVER=(\S+)$")
    assert export.group(1) == ",".join(f"127.0.0.1:{port}" for port in ports)
    # In the directory holding ./quorum-data, as the README's next commands are typed.
    put = run([*CLIENT, "put", "colour", "blue"], local.home)
    assert (put.returncode, put.stderr) == (0, ""), put.stderr
    described = run([*ADMIN, "describe", "--status"], local.home)
    assert described.returncode == 0, described.stderr
    assert re.search(r"^LeaderId:\s+[123]$", described.stdout, re.MULTILINE)
    # Anywhere else, after the line local printed.
    exported = {**SHELL_ENV, "QUORUM_BOOTSTRAP_SERVER": export.group(1)}
    got = run([*CLIENT, "get", "colour"], tmp_path, exported)
    assert (got.returncode, got.stdout) == (0, "blue\n"), got.stderr
    # Anywhere else without it: the error names -b and the variable.
    for command in ([*CLIENT, "get", "colour"], [*ADMIN, "describe", "--status"]):
        lost = run(command, tmp_path)
        assert lost.returncode == 1 and lost.stdout == ""
        assert lost.stderr.count("\n") == 1 and "Traceback" not in lost.stderr, lost.stderr
        assert "127.0.0.1:9091" in lost.stderr
        assert " -b HOST:PORT" in lost.stderr and "QUORUM_BOOTSTRAP_SERVER" in lost.stderr


def test_restart_answers_once_the_node_serves_and_a_stopped_voter_is_unreachable_at_once(
        local: Local) -> None:
    restarted = run([*NODE, "local", "--restart", "2"], local.home)
    assert restarted.returncode == 0, restarted.stderr
    assert re.match(r"node 2 restarted \(pid \d+\), serving clients on http://127\.0\.0\.1:\d+ "
                    r"after [0-9.]+ s \(leader: node \d\)", restarted.stdout), restarted.stdout
    # Served at once: a stale read on node 2 itself, no retry given time to hide a gap.
    stale = run([*CLIENT, "-b", f"127.0.0.1:{local.base_port + 1}", "--timeout", "5",
                 "get", "colour", "--stale"], local.home)
    assert stale.returncode in (0, 3), stale.stderr  # served (found or not, by test order)

    stopped = 3 if "leader: node 3" not in restarted.stdout else 1
    done = run([*NODE, "local", "--stop-node", str(stopped)], local.home)
    assert done.returncode == 0, done.stderr
    described = run([*ADMIN, "-b", local.bootstrap(), "describe", "--status"], local.home)
    assert described.returncode == 0, described.stderr
    lines = dict(re.findall(r"^(\w+):\s+(.*)$", described.stdout, re.MULTILINE))
    assert [v["id"] for v in json.loads(lines["UnreachableVoters"])] == [stopped], lines
    assert lines["MaxFollowerLagTimeMs"] != "-1", lines
    assert run([*NODE, "local", "--restart", str(stopped)], local.home).returncode == 0


def test_a_replaced_disk_is_retired_not_offered_back(local: Local) -> None:
    replaced = run([*NODE, "local", "--replace", "3"], local.home)
    assert replaced.returncode == 0, replaced.stderr
    commands = [line.split()[1:] for line in replaced.stdout.splitlines()
                if line.strip().startswith("quorum-admin")]
    assert [c[2] for c in commands] == ["add-voter", "remove-voter"], replaced.stdout
    old_id = commands[1][-1]
    for command in commands:  # as printed
        deadline = time.monotonic() + 60
        while (done := run([*ADMIN, *command], local.home)).returncode != 0:
            # Until the new disk has fetched from the leader it is no observer yet.
            assert "is not an observer" in done.stderr, done.stderr
            assert time.monotonic() < deadline, done.stderr
            time.sleep(0.5)
    described = run([*ADMIN, "-b", local.bootstrap(), "describe", "--status"], local.home)
    assert described.returncode == 0, described.stderr
    lines = dict(re.findall(r"^(\w+):\s+(.*)$", described.stdout, re.MULTILINE))
    def replicas(label: str) -> list[tuple[int, str]]:
        return [(r["id"], r["directoryId"]) for r in json.loads(lines[label])]

    if (3, old_id) in replicas("CurrentObservers"):  # until the leader forgets it
        assert replicas("RetiredObservers") == [(3, old_id)], described.stdout
    assert json.loads(lines["CouldBeVoters"]) == [], described.stdout
    replication = run([*ADMIN, "-b", local.bootstrap(), "describe", "--replication"],
                      local.home)
    assert not [row for row in replication.stdout.splitlines()
                if old_id in row and not row.endswith("Observer (retired)")], replication.stdout
    # No leader's log offers the old disk back.
    said = [line for path in (local.home / "quorum-data").glob("node-[0-9].log")
            for line in path.read_text().splitlines()]
    assert not [line for line in said if f"add-voter --id 3 --uuid {old_id}" in line]
