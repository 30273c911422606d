"""Apache Kafka's own ``kafka-metadata-quorum`` (``MetadataQuorumCommand`` of the pinned
``org.apache.kafka:kafka-tools``, fetched by ``e2e/kafka_tools/fetch.sh``) against a quorum of
real node processes, over the controller listeners' Kafka protocol, each output beside
``quorum-admin --bootstrap-controller``'s for the same quorum: ``describe --status``,
``describe --replication`` (and ``--human-readable``), and the README's disk replacement done
with Kafka's tool (``add-controller`` from the new directory's node properties, then
``remove-controller`` of the old directory); then SASL/PLAIN with a bearer token.

Slow (a JVM per command): CI's step "Kafka's kafka-metadata-quorum against a quorum". Without
Java or Maven the tests skip with one line. Run with ``-s`` to see the outputs side by side.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from proc_cluster import ProcessCluster

pytestmark = pytest.mark.slow

FETCH = Path(__file__).parents[2] / "e2e" / "kafka_tools" / "fetch.sh"
KAFKA_VERSION = re.search(r"<kafka.version>(.+)</kafka.version>",
                          (FETCH.parent / "pom.xml").read_text()).group(1)  # type: ignore[union-attr]
TOOL = "org.apache.kafka.tools.MetadataQuorumCommand"
# The lines of describe --status that both tools print (quorum-admin adds CouldBeVoters and
# UnreachableVoters); MaxFollowerLagTimeMs is compared apart (it moves between two calls).
COMMON_STATUS = ("ClusterId", "LeaderId", "LeaderEpoch", "HighWatermark", "MaxFollowerLag",
                 "CurrentVoters", "CurrentObservers")


@pytest.fixture(scope="module")
def kafka_lib() -> Path:
    if shutil.which("java") is None:
        pytest.skip("Kafka's kafka-metadata-quorum needs Java (java), not found")
    done = subprocess.run(["bash", str(FETCH)], capture_output=True, text=True, timeout=600,
                          check=False)
    if done.returncode != 0 and shutil.which("mvn") is None:  # and nothing cached
        pytest.skip("Kafka's tools are fetched with Maven (mvn), not found")
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def kafka_tool(lib: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["java", "-cp", f"{lib}/*", TOOL, *args], capture_output=True,
                          text=True, timeout=180, check=False)
    if ok:
        assert done.returncode == 0, f"kafka-metadata-quorum {' '.join(args)}\n" \
                                     f"{done.stdout}\n{done.stderr[-3000:]}"
    return done


def quorum_admin(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "quorum_node.cli.admin", *args],
                          capture_output=True, text=True, timeout=120, check=False)
    if ok:
        assert done.returncode == 0, f"quorum-admin {' '.join(args)}\n{done.stdout}\n" \
                                     f"{done.stderr}"
    return done


def wait_until_every_voter_is_heard(*admin_args: str,
                                    logs: Callable[[], str] = lambda: "") -> None:
    """Until the leader knows each voter's directory id, null before the voter's first Fetch
    reaches it: two describes on either side of that Fetch differ."""
    deadline = time.monotonic() + 30
    while not all(voter["directory_id"] for voter in json.loads(
            quorum_admin(*admin_args, "describe", "--status", "--json").stdout)["voters"]):
        assert time.monotonic() < deadline, logs()
        time.sleep(0.1)


def side_by_side(command: str, kafka: str, ours: str) -> None:
    print(f"\n=== {command}\n--- kafka-metadata-quorum {KAFKA_VERSION}\n{kafka.rstrip()}\n"
          f"--- quorum-admin\n{ours.rstrip()}")


def status_fields(output: str) -> dict[str, str]:
    return {label: value.strip() for label, _, value in
            (line.partition(":") for line in output.splitlines() if ":" in line)}


def replication_rows(output: str) -> list[list[str]]:
    """The table's rows, cells split on tabs or runs of spaces, without the timestamps."""
    rows = [re.split(r"\s{2,}|\t", line.strip()) for line in output.strip().splitlines()]
    return [[cell.strip() for i, cell in enumerate(row) if i not in (4, 5)] for row in rows]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    # Kafka's keys beside ours, so that the node's own properties file is a controller
    # configuration to Kafka's add-controller.
    def kafka_keys(i: int) -> dict[str, object]:
        return {"metadata.log.dir": tmp_path / f"node-{i}", "process.roles": "controller"}

    started = ProcessCluster.create(tmp_path, 3, node_settings=kafka_keys, proxied=False,
                                    controller_quorum_election_timeout_ms=500,
                                    controller_quorum_fetch_timeout_ms=1000)
    try:
        started.start_all()
        started.wait_all_serving()
        started.wait_for_leader(timeout_s=30)
        wait_until_every_voter_is_heard("--bootstrap-controller",
                                        f"127.0.0.1:{started.nodes[1].peer_port}",
                                        logs=started.logs)
        yield started
    finally:
        started.stop_all()


def controller(cluster: ProcessCluster, node_id: int) -> str:
    return f"127.0.0.1:{cluster.nodes[node_id].peer_port}"


def test_describe_and_disk_replacement_with_kafkas_tool(kafka_lib: Path,
                                                        cluster: ProcessCluster) -> None:
    bootstrap = ["--bootstrap-controller", controller(cluster, 1)]
    timings: list[tuple[str, float]] = []

    def both(*args: str) -> tuple[str, str]:
        started = time.monotonic()
        kafka = kafka_tool(kafka_lib, *bootstrap, *args).stdout
        timings.append((f"kafka-metadata-quorum {' '.join(args)}", time.monotonic() - started))
        ours = quorum_admin(*bootstrap, *args).stdout
        side_by_side(" ".join(args), kafka, ours)
        return kafka, ours

    kafka, ours = both("describe", "--status")
    theirs, mine = status_fields(kafka), status_fields(ours)
    assert {label: theirs[label] for label in COMMON_STATUS} == \
           {label: mine[label] for label in COMMON_STATUS}
    assert int(theirs["MaxFollowerLagTimeMs"]) >= 0 and int(mine["MaxFollowerLagTimeMs"]) >= 0
    assert f"CONTROLLER://{controller(cluster, 1)}" in theirs["CurrentVoters"]

    kafka, ours = both("describe", "--replication")
    assert replication_rows(kafka) == replication_rows(ours)
    kafka, ours = both("describe", "--replication", "--human-readable")
    assert replication_rows(kafka) == replication_rows(ours)
    assert "ms ago" in kafka and "ms ago" in ours

    # The README's disk replacement, with Kafka's tool: a follower's disk is lost.
    before = json.loads(quorum_admin(*bootstrap, "describe", "--status", "--json").stdout)
    victim = next(v["id"] for v in before["voters"] if v["id"] != before["leader_id"])
    old_directory = next(v["directory_id"] for v in before["voters"] if v["id"] == victim)
    via = next(n for n in cluster.nodes if n != victim)
    bootstrap = ["--bootstrap-controller", controller(cluster, via)]
    cluster.kill(victim)
    log_dir = cluster.directory / f"node-{victim}"
    shutil.rmtree(log_dir)
    new_directory = subprocess.run(
        [sys.executable, "-m", "quorum_node.cli.node", "format", "--log-dir", str(log_dir),
         "--node-id", str(victim), "--cluster-id", cluster.cluster_id],
        capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    cluster.start(victim)

    deadline = time.monotonic() + 60
    while True:
        quorum = json.loads(quorum_admin(*bootstrap, "describe", "--status", "--json").stdout)
        if any(o["id"] == victim and o["directory_id"] == new_directory and o["lag"] == 0
               for o in quorum["observers"]):
            break
        assert time.monotonic() < deadline, f"no observer {victim}\n{cluster.logs()}"
        time.sleep(0.2)
    both("describe", "--status")

    config = str(cluster.nodes[victim].config_path)
    started = time.monotonic()
    added = kafka_tool(kafka_lib, *bootstrap, "--command-config", config, "add-controller")
    timings.append(("kafka-metadata-quorum add-controller", time.monotonic() - started))
    print(f"\n=== add-controller --command-config node-{victim}.properties\n{added.stdout}")
    assert added.stdout.strip() == (
        f"Added controller {victim} with directory id {new_directory} and endpoints: "
        f"CONTROLLER://{controller(cluster, victim)}")
    started = time.monotonic()
    removed = kafka_tool(kafka_lib, *bootstrap, "remove-controller", "--controller-id",
                         str(victim), "--controller-directory-id", old_directory)
    timings.append(("kafka-metadata-quorum remove-controller", time.monotonic() - started))
    print(f"=== remove-controller --controller-id {victim} --controller-directory-id "
          f"{old_directory}\n{removed.stdout}")
    assert removed.stdout.strip() == \
        f"Removed KRaft controller {victim} with directory id {old_directory}"

    kafka, ours = both("describe", "--status")
    theirs, mine = status_fields(kafka), status_fields(ours)
    assert {label: theirs[label] for label in COMMON_STATUS} == \
           {label: mine[label] for label in COMMON_STATUS}
    voters = json.loads(quorum_admin(*bootstrap, "describe", "--status", "--json").stdout)
    assert {(v["id"], v["directory_id"]) for v in voters["voters"]} == {
        *((v["id"], v["directory_id"]) for v in before["voters"] if v["id"] != victim),
        (victim, new_directory)}
    both("describe", "--replication")
    print("\n" + "\n".join(f"  {what:<60} {seconds:6.1f} s" for what, seconds in timings))


def test_kafkas_tool_is_refused_what_the_quorum_refuses(kafka_lib: Path,
                                                        cluster: ProcessCluster) -> None:
    """Kafka's error codes reach Kafka's tool: removing a voter that is not there."""
    quorum = json.loads(quorum_admin("--bootstrap-controller", controller(cluster, 1),
                                     "describe", "--status", "--json").stdout)
    voter = quorum["voters"][0]
    missing = kafka_tool(kafka_lib, "--bootstrap-controller", controller(cluster, 1),
                         "remove-controller", "--controller-id", str(voter["id"]),
                         "--controller-directory-id", "AAAAAAAAAAAAAAAAAAAAAQ", ok=False)
    print(f"\n=== remove-controller of a directory that is no voter's\n{missing.stderr[:400]}")
    assert missing.returncode == 1
    assert "VoterNotFoundException" in missing.stderr
