"""The cluster's add-ons, in one process beside the control plane (``cluster.py`` starts it):

    python addons.py CONFIG.json

- **DNS**, in the place of CoreDNS: the records of every Service's EndpointSlices, written as a
  hosts file that every container has as ``/etc/hosts`` (``kubelet.py``; rewritten in place, so
  a running process sees new records) and that the test process consults too (``cluster.py``).
  A headless Service gives each endpoint with a hostname ``HOST.SERVICE.NAMESPACE.svc`` (and
  ``...svc.cluster.local``) and the Service's own name all its ready endpoints, as CoreDNS does
  (not-ready ones too when the Service publishes them).
- **A dynamic provisioner** of hostPath volumes for the StorageClasses whose provisioner is
  ``quorum.test/hostpath`` (the role of kind's local-path-provisioner): a claim that needs a
  volume (``volume.kubernetes.io/storage-provisioner`` set by the PV controller, and for
  WaitForFirstConsumer the node the scheduler chose) gets a PersistentVolume with a directory of
  its own, bound to that node by node affinity; a released volume whose reclaim policy is Delete
  is emptied and deleted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hosts_file import rewrite_in_place
from kafka_quorum_operator.kube import Kube, KubeError
from kubernetes import client, config

PROVISIONER = "quorum.test/hostpath"
SYNC_S = 0.5
logger = logging.getLogger("addons")


@dataclass(frozen=True)
class AddonsConfig:
    kubeconfig: str
    hosts_file: str
    volumes: str
    cluster_domain: str


class Addons:
    def __init__(self, config_: AddonsConfig) -> None:
        self.config = config_
        configured = client.Configuration()
        config.load_kube_config(config_file=config_.kubeconfig,  # type: ignore[no-untyped-call]
                                client_configuration=configured)
        self.kube = Kube(client.ApiClient(configured), field_manager="addons")

    async def run(self) -> None:
        while True:
            for step in (self.dns, self.provision, self.reclaim):
                try:
                    await step()
                except (KubeError, OSError) as error:
                    logger.warning("%s: %s", step.__name__, error)
            await asyncio.sleep(SYNC_S)

    # -- DNS --

    async def dns(self) -> None:
        services = {(s["metadata"]["namespace"], s["metadata"]["name"]): s
                    for s in await self.kube.list("/api/v1/services", {})}
        slices = await self.kube.list("/apis/discovery.k8s.io/v1/endpointslices", {})
        records: dict[str, set[str]] = {}
        for endpoint_slice in slices:
            meta = endpoint_slice["metadata"]
            service_name = (meta.get("labels") or {}).get("kubernetes.io/service-name")
            service = services.get((meta["namespace"], service_name))
            if service is None:
                continue
            publish = bool(service["spec"].get("publishNotReadyAddresses"))
            domain = f"{service_name}.{meta['namespace']}.svc"
            for endpoint in endpoint_slice.get("endpoints") or []:
                ready = (endpoint.get("conditions") or {}).get("ready") is not False
                if not (ready or publish):
                    continue
                for address in endpoint.get("addresses") or []:
                    names = [domain]
                    if endpoint.get("hostname"):
                        names.append(f"{endpoint['hostname']}.{domain}")
                    for name in names:
                        records.setdefault(name, set()).add(address)
                        records.setdefault(f"{name}.{self.config.cluster_domain}",
                                           set()).add(address)
        self.write_hosts(records)

    def write_hosts(self, records: Mapping[str, set[str]]) -> None:
        lines = ["127.0.0.1 localhost", "::1 localhost"]
        lines += [f"{address} {name}" for name, addresses in sorted(records.items())
                  for address in sorted(addresses)]
        rewrite_in_place(Path(self.config.hosts_file), "\n".join(lines) + "\n")

    # -- volumes --

    async def classes(self) -> dict[str, dict[str, Any]]:
        found = await self.kube.list("/apis/storage.k8s.io/v1/storageclasses", {})
        return {c["metadata"]["name"]: c for c in found if c.get("provisioner") == PROVISIONER}

    async def provision(self) -> None:
        classes = await self.classes()
        for claim in await self.kube.list("/api/v1/persistentvolumeclaims", {}):
            meta, spec = claim["metadata"], claim["spec"]
            annotations = meta.get("annotations") or {}
            storage_class = classes.get(spec.get("storageClassName") or "")
            if storage_class is None or spec.get("volumeName") or \
                    meta.get("deletionTimestamp") or \
                    annotations.get("volume.kubernetes.io/storage-provisioner") != PROVISIONER:
                continue
            node = annotations.get("volume.kubernetes.io/selected-node")
            if storage_class.get("volumeBindingMode") == "WaitForFirstConsumer" and not node:
                continue
            await self.create_volume(claim, storage_class, node)

    async def create_volume(self, claim: Mapping[str, Any], storage_class: Mapping[str, Any],
                            node: str | None) -> None:
        meta, spec = claim["metadata"], claim["spec"]
        name = f"pvc-{meta['uid']}"
        directory = Path(self.config.volumes) / f"{name}_{meta['namespace']}_{meta['name']}"
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o777)  # as local-path-provisioner: any pod user may write
        volume: dict[str, Any] = {
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name, "annotations": {
                "pv.kubernetes.io/provisioned-by": PROVISIONER}},
            "spec": {"capacity": {"storage": spec["resources"]["requests"]["storage"]},
                     "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": storage_class.get("reclaimPolicy",
                                                                        "Delete"),
                     "storageClassName": storage_class["metadata"]["name"],
                     "volumeMode": spec.get("volumeMode", "Filesystem"),
                     "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                  "namespace": meta["namespace"], "name": meta["name"],
                                  "uid": meta["uid"]},
                     "hostPath": {"path": str(directory), "type": "DirectoryOrCreate"}}}
        if node:
            volume["spec"]["nodeAffinity"] = {"required": {"nodeSelectorTerms": [{
                "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                      "values": [node]}]}]}}
        try:
            await self.kube.create("/api/v1/persistentvolumes", volume)
            logger.info("provisioned %s for %s/%s on %s", name, meta["namespace"],
                        meta["name"], node)
        except KubeError as error:
            if error.status != 409:
                raise

    async def reclaim(self) -> None:
        for volume in await self.kube.list("/api/v1/persistentvolumes", {}):
            meta, spec = volume["metadata"], volume["spec"]
            if (meta.get("annotations") or {}).get("pv.kubernetes.io/provisioned-by") != \
                    PROVISIONER or spec.get("persistentVolumeReclaimPolicy") != "Delete" or \
                    (volume.get("status") or {}).get("phase") not in ("Released", "Failed"):
                continue
            shutil.rmtree(spec["hostPath"]["path"], ignore_errors=True)
            await self.kube.delete(f"/api/v1/persistentvolumes/{meta['name']}")
            logger.info("deleted %s (released)", meta["name"])


def main() -> None:
    config_ = AddonsConfig(**json.loads(Path(sys.argv[1]).read_text()))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(Addons(config_).run())


if __name__ == "__main__":
    main()
