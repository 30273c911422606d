"""The operator's calls to the Kubernetes API, all through the official ``kubernetes`` client:
get, paginated list, create, server-side apply, merge patch, delete. kopf watches; this acts.

The client is synchronous (urllib3): each call runs in a worker thread (``asyncio.to_thread``),
so a slow API server never blocks the event loop that also talks to the nodes. The async
flavour shipped in the same package (``kubernetes.aio``, on aiohttp-retry) is newer than the
urllib3 one and its retry options are another library's; the urllib3 client is the one kopf's
``login_via_client`` and most operators use.

One retry policy for every call, urllib3's own ``Retry`` on the client's configuration: connection
errors, 429 and 5xx are retried with exponential back-off (Retry-After honoured). A retried
create that had in fact succeeded answers 409, which callers take as "already there".

Credentials: ``kubernetes.config.load_incluster_config()`` in a pod (the service account token
is re-read by the client when the kubelet rotates it), else the kubeconfig; or an API server URL
without credentials (``KQ_OPERATOR_API_SERVER``: development).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from kubernetes import client, config
from kubernetes.utils import parse_quantity
from urllib3.exceptions import HTTPError
from urllib3.util.retry import Retry

from kafka_quorum_operator import GROUP, MANAGER, PLURAL, QB_KIND, QB_PLURAL, VERSION

JSON = dict[str, Any]


class KubeError(Exception):
    """The API server's error answer, in one line (``status`` is the HTTP status; 0 when no
    answer came, the retries spent; ``reason`` and ``message`` the Status object's, as
    ``Forbidden`` and what admission said)."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

# Resource kind -> (API path prefix, plural).
RESOURCES: Mapping[str, tuple[str, str]] = {
    "Pod": ("/api/v1", "pods"),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "Service": ("/api/v1", "services"),
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "Event": ("/api/v1", "events"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    "Job": ("/apis/batch/v1", "jobs"),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases"),
    "Secret": ("/api/v1", "secrets"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
    "Certificate": ("/apis/cert-manager.io/v1", "certificates"),
    "KafkaQuorum": (f"/apis/{GROUP}/{VERSION}", PLURAL),
    QB_KIND: (f"/apis/{GROUP}/{VERSION}", QB_PLURAL),
}
CLUSTER_RESOURCES: Mapping[str, tuple[str, str]] = {
    "StorageClass": ("/apis/storage.k8s.io/v1", "storageclasses"),
}

RETRY = Retry(total=5, connect=5, read=2, status=5, backoff_factor=0.25, backoff_max=4.0,
              status_forcelist=(429, 500, 502, 503, 504), allowed_methods=None,
              respect_retry_after_header=True, raise_on_status=False)
# The Eviction API's answer when the PodDisruptionBudget allows no disruption now.
TOO_MANY_REQUESTS = 429
# (connect, read) seconds of one attempt.
REQUEST_TIMEOUT = (5.0, 30.0)
PAGE_SIZE = 250
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"


def path(kind: str, namespace: str, name: str | None = None, *,
         api: tuple[str, str] | None = None) -> str:
    prefix, plural = api if api is not None else RESOURCES[kind]
    base = f"{prefix}/namespaces/{namespace}/{plural}"
    return base if name is None else f"{base}/{name}"


def cluster_path(kind: str, name: str | None = None) -> str:
    prefix, plural = CLUSTER_RESOURCES[kind]
    return f"{prefix}/{plural}" if name is None else f"{prefix}/{plural}/{name}"


def object_path(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    return path(obj["kind"], meta["namespace"], meta["name"])


def configuration(server: str | None = None) -> client.Configuration:
    """The client's configuration: ``server`` without credentials, else in-cluster, else the
    kubeconfig; with the retry policy."""
    configured = client.Configuration()
    if server:
        configured.host = server.rstrip("/")
        configured.verify_ssl = False
    else:
        try:
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configured)
        except config.ConfigException:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                client_configuration=configured)
    configured.retries = RETRY
    return configured


def quantity(text: str) -> Decimal:
    """A resource quantity (``1Gi``, ``500M``) as a number; ValueError when it is none."""
    value: Decimal = parse_quantity(text)  # type: ignore[no-untyped-call]
    return value


def label_selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


class Kube:
    """Asynchronous calls over one ``kubernetes.client.ApiClient`` (its connection pool)."""

    def __init__(self, api: client.ApiClient, field_manager: str = MANAGER) -> None:
        self.api = api
        self.field_manager = field_manager

    @classmethod
    def connect(cls, server: str | None = None) -> Kube:
        return cls(client.ApiClient(configuration(server)))

    def close(self) -> None:
        self.api.close()  # type: ignore[no-untyped-call]

    def _call(self, method: str, url_path: str, *, body: Any = None,
              query: list[tuple[str, Any]] | None = None,
              content_type: str = "application/json") -> JSON | None:
        """One request (in a worker thread); None on 404, ``KubeError`` on any other error."""
        _, url, headers, serialized, _ = self.api.param_serialize(
            method=method, resource_path=url_path, query_params=query or [],
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body, auth_settings=["BearerToken"])
        try:
            response = self.api.call_api(method, url, header_params=headers, body=serialized,
                                         _request_timeout=REQUEST_TIMEOUT)
            data = response.read()  # type: ignore[no-untyped-call]
        except HTTPError as error:
            raise KubeError(0, f"{method} {url_path}: {error}") from error
        if response.status == 404:
            return None
        if not 200 <= response.status <= 299:
            try:
                answer = json.loads(data)
                message, reason = answer.get("message"), answer.get("reason")
            except (ValueError, AttributeError):
                message = reason = None
            raise KubeError(response.status, str(message or response.reason), str(reason or ""))
        answer = json.loads(data) if data else {}
        return answer if isinstance(answer, dict) else {}

    async def _request(self, method: str, url_path: str, **kwargs: Any) -> JSON | None:
        return await asyncio.to_thread(self._call, method, url_path, **kwargs)

    async def get(self, url_path: str) -> JSON | None:
        return await self._request("GET", url_path)

    async def list(self, url_path: str, labels: Mapping[str, str]) -> list[JSON]:
        """Every object matching ``labels`` (server-side selector), page by page."""
        items: list[JSON] = []
        token: str | None = None
        while True:
            query: list[tuple[str, Any]] = [("limit", PAGE_SIZE)]
            if labels:
                query.append(("labelSelector", label_selector(labels)))
            if token:
                query.append(("continue", token))
            answer = await self._request("GET", url_path, query=query) or {}
            items += answer.get("items") or []
            token = (answer.get("metadata") or {}).get("continue")
            if not token:
                return items

    async def create(self, url_path: str, body: JSON) -> JSON:
        return await self._request("POST", url_path, body=body) or {}

    async def apply(self, obj: JSON) -> JSON:
        """Server-side apply of ``obj`` as the operator's field manager (forced: the operator
        owns these fields; anyone else's change to them is drift it undoes)."""
        return await self._request(
            "PATCH", object_path(obj), body=obj, content_type=APPLY,
            query=[("fieldManager", self.field_manager), ("force", "true")]) or {}

    async def patch(self, url_path: str, body: JSON) -> JSON | None:
        """A JSON merge patch; a ``metadata.resourceVersion`` in it makes it conditional
        (409 when the object changed since)."""
        return await self._request("PATCH", url_path, body=body, content_type=MERGE,
                                   query=[("fieldManager", self.field_manager)])

    async def evict(self, namespace: str, name: str) -> bool:
        """The pod evicted through the Eviction API, so that its PodDisruptionBudget counts this
        disruption with everyone else's (a drain's): False when the budget allows none now
        (429), True when evicted or already gone."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace}}
        try:
            await self._request("POST", f"{path('Pod', namespace, name)}/eviction", body=body)
        except KubeError as error:
            if error.status == TOO_MANY_REQUESTS:
                return False
            raise
        return True

    async def delete(self, url_path: str, grace_period_s: int | None = None) -> bool:
        body = None if grace_period_s is None else {
            "kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": grace_period_s}
        return await self._request("DELETE", url_path, body=body) is not None
