"""``kubectl kq`` without a cluster: what ``status`` shows of a quorum's status and pods, when
``restart`` refuses, the exit statuses and one-line errors of bad input, and the report's zip.
The commands against a real API server: tests/kube/test_kube_plugin.py."""

from __future__ import annotations

import copy
import datetime
import json
import socket
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubectl_kq import EXIT_ERROR, EXIT_USAGE, views
from kubectl_kq.cli import main
from kubectl_kq.report import Bundle

NOW = datetime.datetime(2026, 11, 26, 12, 0, 0, tzinfo=datetime.UTC)
LABEL = "kraft.quorum.dev/node-id"


def pod(node_id: int, *, ready: bool = True, restarts: int = 0) -> dict[str, Any]:
    return {"metadata": {"name": f"kq-{node_id}", "namespace": "ns", "uid": f"uid-{node_id}",
                         "labels": {LABEL: str(node_id)}},
            "spec": {"containers": [{"name": "node"}]},
            "status": {"conditions": [{"type": "Ready", "status": str(ready)}],
                       "containerStatuses": [{"name": "node", "restartCount": restarts}]}}


def member(node_id: int, *, lag: int = 0, caught_up: bool = True) -> dict[str, Any]:
    found: dict[str, Any] = {"nodeId": node_id, "role": "voter", "pod": f"kq-{node_id}",
                             "pvc": f"data-kq-{node_id}", "ready": True,
                             "directoryId": f"dir{node_id}AAAAAAAAAAAAAAAA", "logEndOffset": 120,
                             "lag": lag}
    if caught_up:
        found["caughtUpSince"] = 1764158000.0
    return found


def quorum(**status: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "kraft.quorum.dev/v1alpha1", "kind": "KafkaQuorum",
        "metadata": {"name": "kq", "namespace": "ns"}, "spec": {"replicas": 3},
        "status": {"clusterId": "abcdefghijklmnopqrstuv", "leaderId": 2, "leaderEpoch": 7,
                   "highWatermark": 120, "members": [member(1), member(2), member(3)],
                   "conditions": [
                       {"type": "Ready", "status": "True", "reason": "QuorumReady",
                        "message": "3 voters, leader 2", "lastTransitionTime":
                        "2026-11-26T11:00:00Z"},
                       {"type": "Quorate", "status": "True", "reason": "LeaderElected",
                        "message": "node 2 leads epoch 7", "lastTransitionTime":
                        "2026-11-26T11:59:30Z"}],
                   "lastRemediation": {
                       "nodeId": 3, "result": "Succeeded", "started": "2026-11-26T10:00:00Z",
                       "durationSeconds": 41.5,
                       "steps": [{"name": n} for n in ("Detected", "CaughtUp", "AddVoter",
                                                       "RemoveVoter")]}}}
    body["status"].update(status)
    return body


BACKUPS: list[dict[str, Any]] = [
    {"metadata": {"name": "kq-old", "creationTimestamp": "2026-11-25T10:00:00Z"},
     "spec": {"quorum": "kq"}, "status": {"phase": "Completed"}},
    {"metadata": {"name": "other-x", "creationTimestamp": "2026-11-26T11:00:00Z"},
     "spec": {"quorum": "other"}, "status": {"phase": "Failed"}},
    {"metadata": {"name": "kq-new", "creationTimestamp": "2026-11-26T10:00:00Z"},
     "spec": {"quorum": "kq"}, "status": {"phase": "Completed", "location": "s3://b/p/c/x",
                                          "sizeBytes": 2048, "endOffset": 118, "node": 1,
                                          "durationSeconds": 3.2}},
]


def test_status_shows_members_leader_conditions_remediation_and_backup() -> None:
    found = views.summary(quorum(), [pod(1), pod(2, restarts=2), pod(3, ready=False)],
                          BACKUPS)
    assert found["leader"] == {"nodeId": 2, "epoch": 7, "highWatermark": 120}
    assert [(m["nodeId"], m["pod"], m["ready"], m["restarts"]) for m in found["members"]] == [
        (1, "kq-1", True, 0), (2, "kq-2", True, 2), (3, "kq-3", False, 0)]
    assert found["lastBackup"]["name"] == "kq-new"  # the newest of this quorum's
    json.dumps(found)  # -o json prints it as it is
    text = views.render(found, NOW)
    lines = text.splitlines()
    assert "Leader:     node 2, epoch 7, high watermark 120" in lines
    header = lines.index("Members:") + 1
    assert lines[header].split() == ["NODE", "ROLE", "DIRECTORY", "ID", "POD", "READY",
                                     "RESTARTS", "LOG", "END", "LAG", "CAUGHT", "UP"]
    assert lines[header + 3].split() == ["3", "voter", "dir3AAAAAAAAAAAAAAAA", "kq-3", "no",
                                         "0", "120", "0", "yes"]
    assert any(line.split()[:4] == ["Ready", "True", "QuorumReady", "1h"] for line in lines)
    assert any(line.split()[:4] == ["Quorate", "True", "LeaderElected", "30s"]
               for line in lines)
    assert ("Last remediation: node 3 Succeeded, started 2026-11-26T10:00:00Z, took 41.5 s "
            "(steps: Detected, CaughtUp, AddVoter, RemoveVoter)") in lines
    assert ("Last backup:      kq-new Completed (location s3://b/p/c/x, endOffset 118, "
            "sizeBytes 2048, node 1, durationSeconds 3.2)") in lines


def test_status_of_a_quorum_the_operator_has_not_seen() -> None:
    body = quorum()
    del body["status"]
    found = views.summary(body, [pod(1, ready=False)], [])
    text = views.render(found, NOW)
    assert "Ready:      - (no status yet: is the operator running?)" in text
    assert "Leader:     none" in text
    assert found["members"][0]["role"] == "unknown"
    assert "Last backup:      none" in text


@pytest.mark.parametrize(("change", "pods", "expected"), [
    ({}, None, None),
    ({"spec": {"paused": True}}, None, "spec.paused is true"),
    ({"status": {"pendingChange": {"kind": "AddVoter", "nodeId": 4}}}, None,
     "a voter change is in progress (AddVoter of node 4)"),
    ({"status": {"leaderId": None}}, None, "the quorum has no leader"),
    ({"status": {"members": [member(1), member(2), member(3, lag=500, caught_up=False)]}},
     None, "other voters are not ready or not caught up: node 3 (lag 500)"),
    ({}, [pod(1), pod(2), pod(3, ready=False)],
     "other voters are not ready or not caught up: node 3 (pod not Ready)"),
    ({}, [pod(2), pod(3)], "other voters are not ready or not caught up: node 1 (no pod)"),
])
def test_restart_refused_unless_a_leader_and_the_other_voters_caught_up(
        change: dict[str, Any], pods: list[dict[str, Any]] | None, expected: str | None
        ) -> None:
    body = quorum()
    for key, value in change.items():
        body[key].update(value)
    found = views.restart_refusal(body, pods or [pod(1), pod(2), pod(3)], 2)
    if expected is None:
        assert found is None
    else:
        assert found is not None and found.startswith(expected), found
        assert "\n" not in found


def test_restart_of_a_node_that_is_not_there() -> None:
    assert views.restart_refusal(quorum(), [pod(1), pod(2), pod(3)], 9) == \
        "node 9 has no pod in this quorum (members: 1, 2, 3)"
    # The member being restarted may itself be behind: restarting it costs no majority.
    body = quorum(members=[member(1), member(2, caught_up=False), member(3)])
    assert views.restart_refusal(body, [pod(1), pod(2, ready=False), pod(3)], 2) is None


@pytest.mark.parametrize(("argv", "message"), [
    (["status", "Bad_Name"], "argument QUORUM: 'Bad_Name' is not a KafkaQuorum name"),
    (["restart", "kq", "one"], "argument NODE_ID: 'one' is not a node id"),
    (["backup", "kq", "--wait", "--timeout", "soon"], "'soon' is not a duration"),
    (["status", "kq", "-o", "wide"], "argument -o/--output: invalid choice: 'wide'"),
    (["frobnicate", "kq"], "argument COMMAND: invalid choice: 'frobnicate'"),
])
def test_bad_input_is_a_usage_error(argv: list[str], message: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == EXIT_USAGE
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("kubectl kq") and ": error: " in last and message in last, last


def _kubeconfig(tmp_path: Path, server: str, namespace: str | None = None) -> Path:
    context: dict[str, Any] = {"cluster": "c", "user": "u"}
    if namespace:
        context["namespace"] = namespace
    file = tmp_path / "kubeconfig"
    file.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "here",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "here", "context": context}]}))
    return file


def test_unreachable_api_server_is_one_line_error(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    config = _kubeconfig(tmp_path, f"http://127.0.0.1:{port}", namespace="team")
    assert main(["--kubeconfig", str(config), "status", "kq"]) == EXIT_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kubectl kq: error: "), err
    assert "/namespaces/team/kafkaquorums/kq" in err[0]  # the context's namespace
    assert main(["status", "kq", "--kubeconfig", str(tmp_path / "missing"),
                 "-n", "x"]) == EXIT_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "kubectl kq: error: no usable Kubernetes configuration"), err


def test_report_zip_has_a_readme_and_refuses_to_overwrite(tmp_path: Path) -> None:
    bundle = Bundle(files={"kafkaquorum.yaml": "kind: KafkaQuorum\n",
                           "logs/kq-1/node.log": "started\n"},
                    missing=["the operator's pods in other namespaces than ns: HTTP 403"])
    target = tmp_path / "report-kq-kq-x.zip"
    bundle.write(target, "kq", "ns", NOW)
    with zipfile.ZipFile(target) as written:
        names = written.namelist()
        readme = written.read("report-kq-kq-x/README.txt").decode()
    assert names == ["report-kq-kq-x/README.txt", "report-kq-kq-x/kafkaquorum.yaml",
                     "report-kq-kq-x/logs/kq-1/node.log"]
    assert "Secrets are never included" in readme
    assert "Not collected:\n  - the operator's pods in other namespaces than ns" in readme
    before = target.read_bytes()
    with pytest.raises(FileExistsError):
        copy.deepcopy(bundle).write(target, "kq", "ns", NOW)
    assert target.read_bytes() == before
