"""Real services for the audit's fleet test, on loopback, started and stopped by the tests:
moto's standalone S3 server, and a Spark standalone cluster (a master and workers) started from
PySpark's own distribution (``bin/spark-class``), each process stopped by its PID."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[1] / "node"))  # proc_cluster, shared with node tests

from proc_cluster import free_port

S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "audit-test", "AWS_SECRET_ACCESS_KEY": "audit-test-secret",
                  "AWS_REGION": "us-east-1"}


def _wait_http(url: str, ready: Any, what: str, process: subprocess.Popen[bytes], log: Path,
               *, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{what} exited with {process.returncode}:\n"
                                 f"{log.read_text(errors='replace')[-3000:]}")
        with contextlib.suppress(OSError, ValueError), \
                urllib.request.urlopen(url, timeout=2) as answer:
            if ready(answer.read()):
                return
        time.sleep(0.2)
    raise AssertionError(f"{what} not ready in {timeout_s} s:\n"
                         f"{log.read_text(errors='replace')[-3000:]}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@contextlib.contextmanager
def moto_s3(logs: Path) -> Iterator[str]:
    """moto's S3 server (``python -m moto.server``) on a free loopback port: its endpoint URL."""
    port = free_port()
    log = logs / "moto.log"
    with log.open("wb") as output:
        process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                    "-p", str(port)], stdout=output, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{endpoint}/moto-api/data.json", lambda body: True, "moto", process, log)
        yield endpoint
    finally:
        _stop(process)


@dataclass
class SparkCluster:
    master_url: str
    conf_dir: Path  # spark-defaults.conf for the applications (small executors)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)


def spark_home() -> Path:
    import pyspark  # noqa: PLC0415 (the spark extra may be missing; callers skip first)

    return Path(pyspark.__file__).parent


@contextlib.contextmanager
def spark_standalone(work: Path, workers: int = 2,
                     worker_env: Mapping[str, str] | None = None) -> Iterator[SparkCluster]:
    """A master and ``workers`` workers (one core, 1 GiB each) on 127.0.0.1. Executors inherit
    their worker's environment: ``worker_env`` is where credentials for them go."""
    home = spark_home()
    port, ui_port = free_port(), free_port()
    conf_dir = work / "conf"
    conf_dir.mkdir(parents=True)
    # Read by every application started with this SPARK_CONF_DIR: executors fit the workers.
    (conf_dir / "spark-defaults.conf").write_text(
        "spark.executor.memory 512m\nspark.executor.cores 1\nspark.driver.memory 512m\n"
        "spark.ui.enabled false\nspark.sql.shuffle.partitions 4\n")
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_DAEMON_MEMORY": "256m", "SPARK_CONF_DIR": str(conf_dir),
           "PYSPARK_PYTHON": sys.executable, "SPARK_NO_DAEMONIZE": "1"}
    cluster = SparkCluster(f"spark://127.0.0.1:{port}", conf_dir)
    spark_class = str(home / "bin" / "spark-class")

    def launch(name: str, args: list[str], extra: Mapping[str, str]) -> Path:
        log = work / f"{name}.log"
        with log.open("wb") as output:
            # spark-class execs the JVM: the PID is the daemon's own.
            cluster.processes.append(subprocess.Popen(
                [spark_class, *args], stdout=output, stderr=subprocess.STDOUT,
                env={**env, **extra}, cwd=work))
        return log

    try:
        master_log = launch("master", ["org.apache.spark.deploy.master.Master",
                                       "--host", "127.0.0.1", "--port", str(port),
                                       "--webui-port", str(ui_port)], {})
        for index in range(workers):
            worker_dir = work / f"worker-{index}"
            worker_dir.mkdir()
            launch(f"worker-{index}", [
                "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                "--webui-port", str(free_port()), "--cores", "1", "--memory", "1g",
                "--work-dir", str(worker_dir), cluster.master_url], dict(worker_env or {}))

        def all_alive(body: bytes) -> bool:
            state = json.loads(body)
            alive: int = sum(w["state"] == "ALIVE" for w in state.get("workers", []))
            return alive == workers

        _wait_http(f"http://127.0.0.1:{ui_port}/json/", all_alive, "the Spark master",
                   cluster.processes[0], master_log, timeout_s=90)
        yield cluster
    finally:
        for process in reversed(cluster.processes):  # workers first, then the master
            _stop(process)
