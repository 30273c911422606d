"""Fixtures of the backup tests: node processes (``proc_cluster``, shared with the node tests) and
moto's standalone S3 server on a free loopback port, started for the test and stopped after."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "node"))  # proc_cluster
from proc_cluster import free_port

from quorum_node.backup.store import S3Options, s3_client

BUCKET = "quorum-backups"


@pytest.fixture
def s3_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Options]:
    """A fresh moto S3 server with one bucket; the AWS variables point boto3 at it."""
    server_module = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    port = free_port()
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "backup-test")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "backup-test-secret")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        options = S3Options(endpoint_url=endpoint)
        s3_client(options).create_bucket(Bucket=BUCKET)
        yield options
    finally:
        server.stop()
