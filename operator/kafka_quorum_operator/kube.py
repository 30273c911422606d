"""A small asynchronous Kubernetes REST client over aiohttp, for the few calls the operator makes
(get, list, create, merge-patch, delete). kopf watches; this acts. It takes kopf's connection
info, so both authenticate the same way.

Label selectors are applied here as well as sent: an API emulator may ignore them.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

JSON = dict[str, Any]

# Resource kind -> (API path prefix, plural).
RESOURCES: Mapping[str, tuple[str, str]] = {
    "Pod": ("/api/v1", "pods"),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "Service": ("/api/v1", "services"),
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "Event": ("/api/v1", "events"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases"),
    "Secret": ("/api/v1", "secrets"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
    "Certificate": ("/apis/cert-manager.io/v1", "certificates"),
}


class KubeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


@dataclass(frozen=True)
class Connection:
    server: str
    token: str | None = None
    ca_path: str | None = None
    ca_data: str | None = None
    certificate_path: str | None = None
    private_key_path: str | None = None
    insecure: bool = False


def path(kind: str, namespace: str, name: str | None = None, *,
         api: tuple[str, str] | None = None) -> str:
    prefix, plural = api if api is not None else RESOURCES[kind]
    base = f"{prefix}/namespaces/{namespace}/{plural}"
    return base if name is None else f"{base}/{name}"


class KubeClient:
    def __init__(self, connection: Connection, timeout_s: float = 30.0) -> None:
        self.connection = connection
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _ssl(self) -> ssl.SSLContext | bool:
        c = self.connection
        if not c.server.startswith("https"):
            return False
        if c.insecure:
            return False
        context = ssl.create_default_context(cafile=c.ca_path, cadata=c.ca_data)
        if c.certificate_path:
            context.load_cert_chain(c.certificate_path, c.private_key_path)
        return context

    async def _request(self, method: str, url_path: str, body: Any = None,
                       content_type: str = "application/json",
                       params: Mapping[str, str] | None = None) -> JSON | None:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout, connector=aiohttp.TCPConnector(ssl=self._ssl()))
        headers = {"Accept": "application/json", "Content-Type": content_type}
        if self.connection.token:
            headers["Authorization"] = f"Bearer {self.connection.token}"
        url = self.connection.server.rstrip("/") + url_path
        async with self._session.request(method, url, json=body, headers=headers,
                                         params=params) as response:
            if response.status == 404:
                return None
            try:
                answer = await response.json(content_type=None)
            except (aiohttp.ContentTypeError, ValueError):
                answer = None
            if response.status >= 400:
                message = answer.get("message") if isinstance(answer, dict) else None
                raise KubeError(response.status, str(message or response.reason))
            return answer if isinstance(answer, dict) else {}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def get(self, url_path: str) -> JSON | None:
        return await self._request("GET", url_path)

    async def list(self, url_path: str, labels: Mapping[str, str]) -> list[JSON]:
        params = {"labelSelector": ",".join(f"{k}={v}" for k, v in labels.items())}
        answer = await self._request("GET", url_path, params=params) or {}
        return [item for item in answer.get("items") or []
                if all((item.get("metadata", {}).get("labels") or {}).get(k) == v
                       for k, v in labels.items())]

    async def create(self, url_path: str, body: JSON) -> JSON:
        return await self._request("POST", url_path, body) or {}

    async def patch(self, url_path: str, body: JSON) -> JSON | None:
        return await self._request("PATCH", url_path, body,
                                   content_type="application/merge-patch+json")

    async def delete(self, url_path: str, grace_period_s: int | None = None) -> bool:
        body = None if grace_period_s is None else {
            "kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": grace_period_s}
        return await self._request("DELETE", url_path, body) is not None
