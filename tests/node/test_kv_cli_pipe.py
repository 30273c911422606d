"""``quorum-client list`` piped to ``quorum-client load`` copies any keys and values from one
quorum to another: real processes, a real pipe, keys holding newlines, tabs, backslashes, line
separators Python's splitlines honours, NUL and any UTF-8, listed in a locale whose encoding is
not UTF-8."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_client_api import Cluster

from quorum_node.client import QuorumClient

AWKWARD = ["new\nline", "tab\there", "carriage\rreturn", "back\\slash", "not\\nescaped", "\\",
           "\\t\t", "vertical\x0btab", "form\x0cfeed", "file\x1cseparator", "next\x85line",
           "line\u2028separator", "para\u2029graph", "nul\x00byte", " spaces ", "caf\u00e9",
           "\u65e5\u672c\U0001f642", "trailing\\"]


@pytest.fixture(scope="module")
def source_and_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster,
                                                                                   Cluster]]:
    source = Cluster(tmp_path_factory.mktemp("pipe-source"), 1)
    try:
        target = Cluster(tmp_path_factory.mktemp("pipe-target"), 1)
        try:
            source.leader()
            target.leader()
            yield source, target
        finally:
            target.stop()
    finally:
        source.stop()


def client_command(cluster: Cluster, *argv: str) -> list[str]:
    return [sys.executable, "-m", "quorum_node.cli.client", "-b", cluster.bootstrap, *argv]


def test_list_piped_to_load_copies_any_key_and_value(
        source_and_target: tuple[Cluster, Cluster]) -> None:
    source, target = source_and_target
    written = {f"pipe/{name}": f"value of {name}" for name in AWKWARD}
    written.update({f"pipe/value-{i}": name for i, name in enumerate(AWKWARD)})
    written["pipe/empty"] = ""
    with QuorumClient(source.bootstrap) as client:
        client.put_many(list(written.items()))
    # A listing in pages of 7, printed in a locale whose encoding cannot hold most of it.
    env = {**os.environ, "PYTHONIOENCODING": "latin-1"}
    listing = subprocess.Popen(client_command(source, "list", "pipe/", "--all", "--limit", "7"),
                               stdout=subprocess.PIPE, env=env)
    loading = subprocess.run(client_command(target, "load", "-"), stdin=listing.stdout,
                             capture_output=True, timeout=60, check=False)
    assert listing.stdout is not None
    listing.stdout.close()
    assert listing.wait(60) == 0
    assert loading.returncode == 0, loading.stderr
    assert loading.stdout.startswith(f"OK {len(written)} keys".encode())
    with QuorumClient(target.bootstrap) as client:
        assert dict(client.scan_keys("pipe/")) == written


def test_a_listing_is_one_line_a_key_and_crlf_lines_load(
        source_and_target: tuple[Cluster, Cluster], tmp_path: Path) -> None:
    source, target = source_and_target
    with QuorumClient(source.bootstrap) as client:
        client.put("crlf/a\nb", "1\t2")
    listed = subprocess.run(client_command(source, "list", "crlf/"), capture_output=True,
                            timeout=60, check=True).stdout
    assert listed == b"crlf/a\\nb\t1\\t2\n"
    keys_only = subprocess.run(client_command(source, "list", "crlf/", "--keys-only"),
                               capture_output=True, timeout=60, check=True).stdout
    assert keys_only == b"crlf/a\\nb\n"
    dump = tmp_path / "dump.tsv"
    dump.write_bytes(listed.replace(b"\n", b"\r\n") + b"crlf/c\\\\\tx\r\n")
    subprocess.run(client_command(target, "load", str(dump)), capture_output=True, timeout=60,
                   check=True)
    with QuorumClient(target.bootstrap) as client:
        assert dict(client.scan_keys("crlf/")) == {"crlf/a\nb": "1\t2", "crlf/c\\": "x"}
