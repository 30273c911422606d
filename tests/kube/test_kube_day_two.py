"""Day two on the real control plane, with the parts only a real cluster has:

- the operator's pod killed between AddVoter and RemoveVoter of a disk replacement (its process
  SIGKILLed, its pod force-deleted as when its node is lost): the Deployment makes a new pod, it
  takes the Lease once the old holder's expires and finishes the replacement; no acknowledged
  write lost;
- ``helm upgrade`` to a chart whose CRD adds a field (the API server then accepts it), and
  ``helm rollback`` (refused again; the quorum untouched throughout);
- deleting a namespace that holds a KafkaQuorum, with its operator running and with the
  operator uninstalled first: the namespace goes either way (no finalizer waits for the
  operator).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import yaml
from cluster import Cluster
from kq_real import CHART, NAMESPACE, OPERATOR_RELEASE, RealQuorum, create_namespace, namespaced
from kq_scenarios import Timings, create_and_ready, leader, no_write_lost, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
OPERATOR_LABEL = "app.kubernetes.io/name=kafka-quorum-operator"


def operator_pod(cluster: Cluster, namespace: str = NAMESPACE) -> dict[str, object]:
    pods = json.loads(cluster.kubectl("--namespace", namespace, "get", "pods", "-l",
                                      OPERATOR_LABEL, "-o", "json"))["items"]
    running = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    assert len(running) == 1, [p["metadata"]["name"] for p in pods]
    pod: dict[str, object] = running[0]
    return pod


def container_pid(pod: dict[str, object]) -> int:
    """The operator container's process (the process kubelet's container id ends with it)."""
    statuses = pod["status"]["containerStatuses"]  # type: ignore[index]
    return int(statuses[0]["containerID"].rsplit("-", 1)[1])


async def test_operator_killed_between_add_and_remove_voter(
        kube_cluster: Cluster, operator_installed: None) -> None:
    quorum = RealQuorum.named(kube_cluster, "crash")
    timings = Timings("real")
    await create_and_ready(quorum, timings)
    load = await quorum.load()
    load.start()
    try:
        current = await leader(quorum)
        victim = next(i for i in (1, 2, 3) if i != current)
        before = operator_pod(kube_cluster)
        await quorum.delete_claim_and_pod(victim)

        async def added() -> dict[str, object] | None:
            last = ((await quorum.quorum()).get("status") or {}).get("lastRemediation") or {}
            steps = [s["name"] for s in last.get("steps") or []]
            return last if steps[-1:] == ["AddVoter"] and last.get("nodeId") == victim \
                else None

        await wait_for(quorum, "AddVoter of the new directory", added, interval_s=0.1)
        os.kill(container_pid(before), signal.SIGKILL)
        killed = time.monotonic()
        kube_cluster.kubectl("--namespace", NAMESPACE, "delete", "pod",
                             before["metadata"]["name"], "--grace-period=0",  # type: ignore[index]
                             "--force")
        # Killed in the window: the replacement is half done.
        last = (await quorum.quorum())["status"]["lastRemediation"]
        assert [s["name"] for s in last["steps"]][-1] == "AddVoter", last

        async def healed() -> dict[str, object] | None:
            last = ((await quorum.quorum()).get("status") or {}).get("lastRemediation") or {}
            return last if last.get("result") == "Succeeded" else None

        done = await wait_for(quorum, "the replacement finished", healed)
        timings.record("replacement finished after the operator was killed",
                       time.monotonic() - killed)
        assert [s["name"] for s in done["steps"]] == ["Detected", "CaughtUp", "AddVoter",
                                                      "RemoveVoter"], done
        after = operator_pod(kube_cluster)
        assert after["metadata"]["uid"] != before["metadata"]["uid"]  # type: ignore[index]
    finally:
        load.stop()
    print(f"\n[scenario real] {await no_write_lost(load, 20)}")
    await asyncio.to_thread(kube_cluster.kubectl, "--namespace", NAMESPACE, "delete",
                            "kafkaquorum", quorum.name, "--wait=false")


def chart_with_new_field(root: Path) -> Path:
    """The chart, version 0.1.1, its CRD with one more optional field (spec.comment)."""
    chart = root / "chart-0.1.1"
    shutil.rmtree(chart, ignore_errors=True)
    shutil.copytree(CHART, chart)
    crd_file = chart / "files" / "kafkaquorums.kraft.quorum.dev.yaml"
    crd = yaml.safe_load(crd_file.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["comment"] = {"type": "string", "maxLength": 200}
    crd_file.write_text(yaml.safe_dump(crd, sort_keys=False))
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta["version"] = "0.1.1"
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    return chart


async def test_helm_upgrade_and_rollback(kube_cluster: Cluster, operator_installed: None
                                         ) -> None:
    quorum = RealQuorum.named(kube_cluster, "upgrade")
    await create_and_ready(quorum, Timings("real"))
    commented = {"apiVersion": "kraft.quorum.dev/v1alpha1", "kind": "KafkaQuorum",
                 "metadata": {"name": quorum.name}, "spec": {"replicas": 3, "comment": "hi"}}

    def apply_comment() -> str:
        done = kube_cluster.control_plane.kubectl(
            "--namespace", NAMESPACE, "apply", "-f", "-", stdin=json.dumps(commented),
            check=False)
        return done.stderr if done.returncode else ""

    assert 'unknown field "spec.comment"' in apply_comment()
    voters_before = (await quorum.quorum())["status"]["members"]
    kube_cluster.helm("upgrade", OPERATOR_RELEASE, str(chart_with_new_field(kube_cluster.root)),
                      "--namespace", NAMESPACE, "--wait", "--timeout", "5m")
    assert apply_comment() == ""
    assert (await quorum.quorum())["spec"]["comment"] == "hi"
    kube_cluster.helm("rollback", OPERATOR_RELEASE, "1", "--namespace", NAMESPACE, "--wait",
                      "--timeout", "5m")
    # The field is gone from the schema again: refused, and pruned from what is stored.
    commented["spec"]["comment"] = "again"  # type: ignore[index]
    assert 'unknown field "spec.comment"' in apply_comment()
    body = await quorum.quorum()
    assert "comment" not in body["spec"], body["spec"]
    history = kube_cluster.helm("history", OPERATOR_RELEASE, "--namespace", NAMESPACE,
                                "-o", "json").stdout
    assert [r["status"] for r in json.loads(history)][-1] == "deployed"

    async def ready() -> bool:
        body = await quorum.quorum()
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for c in body["status"]["conditions"])

    await wait_for(quorum, "Ready after the rollback", ready)
    assert (await quorum.quorum())["status"]["members"] == voters_before
    await asyncio.to_thread(kube_cluster.kubectl, "--namespace", NAMESPACE, "delete",
                            "kafkaquorum", quorum.name, "--wait=false")


async def test_namespace_deleted(kube_cluster: Cluster, operator_installed: None) -> None:
    """A team's namespace with a quorum, managed by an operator release of its own in another
    namespace (watchNamespaces), deleted: with the operator running (the namespace's deletion
    takes the operator's Role there too, so nothing may wait for the operator), then after the
    operator was uninstalled. A KafkaQuorum carries no finalizer: one an earlier version put
    there is removed by the operator."""
    operator_namespace, release, team = "teams-operator", "kqo-teams", "team-a"
    install = ["install", release, str(CHART), "--namespace", operator_namespace,
               "--set", "crds.install=false", "--set", f"watchNamespaces={{{team}}}",
               "--wait", "--timeout", "5m"]
    create_namespace(kube_cluster, operator_namespace)
    for operator_running in (True, False):
        create_namespace(kube_cluster, team)
        kube_cluster.helm(*install)
        quorum = await _quorum_in(kube_cluster, team, finalizers=["kraft.quorum.dev/finalizer"])
        body = await quorum.quorum()
        assert not body["metadata"].get("finalizers"), body["metadata"]
        if not operator_running:
            kube_cluster.helm("uninstall", release, "--namespace", operator_namespace, "--wait")
        started = time.monotonic()
        kube_cluster.kubectl("delete", "namespace", team, "--timeout=300s", timeout_s=330)
        state = "running" if operator_running else "uninstalled"
        print(f"\n[scenario real] namespace deleted with the operator {state} in "
              f"{time.monotonic() - started:.1f} s")
        if operator_running:
            kube_cluster.helm("uninstall", release, "--namespace", operator_namespace, "--wait")
    kube_cluster.kubectl("delete", "namespace", operator_namespace, "--timeout=300s",
                         timeout_s=330)


async def _quorum_in(cluster: Cluster, namespace: str, finalizers: list[str]) -> RealQuorum:
    """A quorum of one in ``namespace``, Ready (made with ``finalizers``)."""
    quorum = RealQuorum(f"{namespace}-quorum", namespaced(cluster, namespace), namespace,
                        spec={"replicas": 1}, cluster=cluster)
    manifest = {"apiVersion": "kraft.quorum.dev/v1alpha1", "kind": "KafkaQuorum",
                "metadata": {"name": quorum.name, "finalizers": finalizers},
                "spec": {"replicas": 1}}
    await quorum.run("apply", "-f", "-", stdin=json.dumps(manifest))

    async def ready() -> bool:
        body = await quorum.quorum()
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for c in (body.get("status") or {}).get("conditions") or []) and \
            not body["metadata"].get("finalizers")

    await wait_for(quorum, f"the quorum in {namespace} Ready", ready)
    return quorum
