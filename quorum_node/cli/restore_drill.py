"""``quorum-node restore-drill``: prove that the newest backup restores into a quorum that serves.

    quorum-node restore-drill --from s3://backups/quorums/CLUSTER [--nodes 3] [--report FILE]

A drill restores the newest complete backup under ``--from`` (or the backup ``--from`` names) as
a scratch local quorum, exactly as ``restore --local`` and ``quorum-node local`` do for a user
(``docs/backup.md``): into a scratch data directory, with a new random cluster id (its nodes
refuse the original's peers, so the two can never mix), on loopback ports of its own. It then
waits for the scratch quorum to elect a leader, reads every key linearizably, and compares the
answer with what the backup's files hold up to its end offset (``restored_content``); then it
stops the quorum and removes the scratch directory. It passes only if all of that holds within
``--timeout``.

The outcome is printed, and written as JSON to ``--report`` (the operator's drill Job points it
at its container's termination message, which the operator reads). Exit 0: passed; 1: failed
(the reason on stderr and in the report); 2: bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from quorum_node.backup.content import restored_content
from quorum_node.backup.drill_report import MAX_MESSAGE, DrillReport
from quorum_node.backup.manifest import MANIFEST_NAME, BackupError, BackupManifest
from quorum_node.backup.restore import MAX_MANIFEST_BYTES
from quorum_node.backup.store import BackupStore, S3Options, open_store
from quorum_node.cli.local_control import fetch_status
from quorum_node.cli.local_layout import restore_local
from quorum_node.cli.local_quorum import free_base_port
from quorum_node.client import QuorumClient, QuorumClientError
from quorum_node.kv.store import KvStore
from quorum_node.storage.meta_properties import random_cluster_id

HOST = "127.0.0.1"
DEFAULT_NODES = 3
DEFAULT_TIMEOUT_S = 120.0
STOP_GRACE_S = 30.0
PAGE_SIZE = 1000
EXIT_REFUSED = 2  # quorum-node local's exit code when it cannot use its ports or directory
PORT_ATTEMPTS = 5


class DrillFailed(Exception):
    """The drill did not pass; one line saying why."""


def add_restore_drill_command(commands: argparse._SubParsersAction[Any]) -> None:
    drill = commands.add_parser(
        "restore-drill", help="restore the newest backup into a scratch quorum and check it",
        description="Restore the newest complete backup under --from (or the backup it names) "
        "into a scratch local quorum on loopback with a new cluster id, check that it elects "
        "a leader and serves, by a linearizable read, every key the backup holds up to its end "
        "offset, then stop it and remove it. Exit 0 passed, 1 failed, 2 bad usage.")
    drill.add_argument("--from", dest="source", required=True, metavar="LOCATION",
                       help="a backup, or a directory of backups (s3://bucket/prefix/CLUSTER_ID "
                       "or a local path): the newest complete one is drilled")
    drill.add_argument("--nodes", type=int, default=DEFAULT_NODES,
                       help=f"voters of the scratch quorum (default {DEFAULT_NODES})")
    drill.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                       help="fail when the scratch quorum has not served the backup this long "
                       f"after it started (default {DEFAULT_TIMEOUT_S:g})")
    drill.add_argument("--work-dir", type=Path, metavar="DIR",
                       help="where the scratch quorum lives (default: a new temporary "
                       "directory); removed afterwards")
    drill.add_argument("--report", type=Path, metavar="FILE",
                       help="also write the outcome as JSON to FILE")
    drill.add_argument("--endpoint-url", help="an S3-compatible server (default: "
                       "$AWS_ENDPOINT_URL, else AWS)")
    drill.set_defaults(command=_cmd_restore_drill)


def _cmd_restore_drill(args: argparse.Namespace) -> int:
    if args.nodes < 1 or args.timeout <= 0:
        print("quorum-node restore-drill: error: --nodes and --timeout must be positive",
              file=sys.stderr)
        return 2
    report = run_drill(args.source, S3Options(endpoint_url=args.endpoint_url), nodes=args.nodes,
                       timeout_s=args.timeout, work_dir=args.work_dir, say=print)
    if args.report is not None:
        args.report.write_text(report.model_dump_json(by_alias=True) + "\n")
    if not report.passed:
        print(f"quorum-node restore-drill: failed: {report.message}", file=sys.stderr)
        return 1
    print(f"passed: {report.message}")
    return 0


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run_drill(location: str, options: S3Options, *, nodes: int, timeout_s: float,
              work_dir: Path | None = None,
              say: Callable[[str], object] = lambda line: None) -> DrillReport:
    """Drill the newest backup at ``location``; the report (never raises for a failed drill)."""
    started_at, started = _now(), time.monotonic()
    found: dict[str, Any] = {}
    try:
        with _scratch(work_dir) as scratch:
            message = _drill(location, options, nodes=nodes, timeout_s=timeout_s,
                             scratch=scratch, found=found, say=say)
        passed = True
    except (BackupError, DrillFailed) as error:
        message, passed = str(error), False
    return DrillReport(passed=passed, message=message[:MAX_MESSAGE], **found,
                       started_at=started_at, completed_at=_now(),
                       duration_seconds=round(time.monotonic() - started, 3))


@contextlib.contextmanager
def _scratch(work_dir: Path | None) -> Iterator[Path]:
    if work_dir is not None and work_dir.exists() and any(work_dir.iterdir()):
        raise DrillFailed(f"{work_dir}: not empty; the drill needs a new or empty --work-dir")
    path = Path(tempfile.mkdtemp(prefix="restore-drill-")) if work_dir is None else work_dir
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _drill(location: str, options: S3Options, *, nodes: int, timeout_s: float, scratch: Path,
           found: dict[str, Any], say: Callable[[str], object]) -> str:
    backup, manifest = newest_backup(open_store(location, options))
    found.update(backup=backup.uri, end_offset=manifest.end_offset)
    say(f"drilling {backup.uri}: node {manifest.node_id} of cluster {manifest.cluster_id}, "
        f"offsets below {manifest.end_offset}")
    data_dir = scratch / "data"
    cluster_id, restored = restore_local(backup, data_dir, nodes, cluster_id=random_cluster_id())
    expected = restored_content(restored[0].log_dir, manifest)
    say(f"restored {nodes} nodes into {data_dir} as cluster {cluster_id}; {len(expected)} keys "
        f"expected")
    with _local_quorum(data_dir, nodes, scratch / "local.out") as (process, ports):
        deadline = time.monotonic() + timeout_s
        leader, epoch = _wait_for_leader(process, ports, deadline, scratch / "local.out")
        found.update(leader=leader, epoch=epoch)
        say(f"node {leader} leads in epoch {epoch}")
        keys = _check_content(ports, expected, manifest.end_offset, deadline)
        found.update(keys=keys)
    return (f"{backup.uri}: restored as {nodes} voters, node {leader} led in epoch {epoch}, "
            f"{keys} keys served as of offset {manifest.end_offset}")


def newest_backup(store: BackupStore) -> tuple[BackupStore, BackupManifest]:
    """``store`` if it is a complete backup, else the newest complete backup in it (backups are
    named by their UTC time first, so the last name is the newest)."""
    for candidate in [store, *(store.child(name) for name in reversed(store.children()))]:
        raw = candidate.read_bytes(MANIFEST_NAME, limit=MAX_MANIFEST_BYTES)
        if raw is not None:
            return candidate, BackupManifest.parse(raw, f"{candidate.uri}/{MANIFEST_NAME}")
    raise BackupError(f"{store.uri}: no complete backup there (no {MANIFEST_NAME} in it or in "
                      f"any directory in it)")


@contextlib.contextmanager
def _local_quorum(data_dir: Path, nodes: int, output: Path
                  ) -> Iterator[tuple[subprocess.Popen[bytes], list[int]]]:
    """``quorum-node local --data-dir DATA_DIR`` (the command ``restore --local`` prints), on
    free ports; stopped as Ctrl-C stops it when the block ends."""
    for _ in range(PORT_ATTEMPTS):
        base = free_base_port(2 * nodes, HOST)
        if base is None:
            raise DrillFailed(f"no {2 * nodes} free consecutive ports on {HOST}")
        command = [sys.executable, "-m", "quorum_node.cli.node", "local", "--data-dir",
                   str(data_dir), "--nodes", str(nodes), "--base-port", str(base),
                   "--host", HOST]
        with output.open("ab") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)
        try:
            with contextlib.suppress(subprocess.TimeoutExpired):
                if process.wait(timeout=1.0) == EXIT_REFUSED and b"cannot listen" in \
                        output.read_bytes():
                    continue  # a port taken meanwhile: other ports
            yield process, list(range(base, base + nodes))
            return
        finally:
            _stop(process)
    raise DrillFailed(f"quorum-node local found its ports taken {PORT_ATTEMPTS} times")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def _wait_for_leader(process: subprocess.Popen[bytes], ports: list[int], deadline: float,
                     output: Path) -> tuple[int, int]:
    """(leader, epoch) once a node leads and knows its high watermark."""
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise DrillFailed(f"quorum-node local exited with code {process.returncode}: "
                              f"{_tail(output)}")
        statuses = [status for port in ports if (status := fetch_status(HOST, port))]
        leaders = [s for s in statuses if s.get("state") == "leader"
                   and isinstance(s.get("high_watermark"), int) and s["high_watermark"] >= 0]
        if leaders:
            leader = max(leaders, key=lambda s: int(s.get("epoch", -1)))
            return int(leader["node_id"]), int(leader["epoch"])
        time.sleep(0.2)
    raise DrillFailed(f"no leader elected in time ({len(ports)} nodes on {HOST}:{ports[0]}..)")


def _check_content(ports: list[int], expected: KvStore, end_offset: int, deadline: float
                   ) -> int:
    """Read every key linearizably and compare with ``expected``; the number of keys."""
    remaining = max(deadline - time.monotonic(), 1.0)
    served: list[tuple[str, str]] = []
    oldest_read = None
    try:
        with QuorumClient([f"{HOST}:{port}" for port in ports], timeout_s=remaining) as client:
            after: str | None = None
            while True:
                page = client.list_keys(start_after=after, limit=PAGE_SIZE)
                served.extend(page.entries)
                if oldest_read is None:
                    oldest_read = page.applied_offset
                after = page.next_start_after
                if after is None:
                    break
    except QuorumClientError as error:
        raise DrillFailed(f"the linearizable read failed: {error}") from None
    # The restored log's last record (the new voters' batch) is at the backup's end offset.
    if oldest_read is None or oldest_read < end_offset:
        raise DrillFailed(f"the read was served as of offset {oldest_read}, before the backup's "
                          f"end {end_offset}")
    wanted = expected.items()
    if served != wanted:
        differ = next((f"{w[0]!r}" for s, w in zip(served, wanted, strict=False) if s != w),
                      "the keys after the shorter list")
        raise DrillFailed(f"the restored quorum serves {len(served)} keys, the backup holds "
                          f"{len(wanted)}; first difference at {differ}")
    return len(served)
