"""Taking a backup of a running node: ask its ``GET /v1/backup`` (``quorum_node.backup.endpoint``)
and write what it streams to a store, checking every file against the manifest before writing
the manifest itself, last (a prefix without ``backup.json`` is an incomplete backup).
"""

from __future__ import annotations

import datetime
import hashlib
import http.client
import io
import json
import ssl
import tarfile
import time
import urllib.parse
from dataclasses import dataclass
from typing import IO

from quorum_node.backup.endpoint import (
    BACKUP_PATH,
    CLUSTER_ID_HEADER,
    CREATED_AT_HEADER,
    NODE_ID_HEADER,
)
from quorum_node.backup.manifest import (
    MANIFEST_NAME,
    BackupError,
    BackupManifest,
    FileEntry,
    check_member,
    default_backup_name,
)
from quorum_node.backup.store import BackupStore
from quorum_node.security.client_credentials import ClientCredentials

DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class TakenBackup:
    uri: str  # where it was written
    manifest: BackupManifest
    bytes: int
    seconds: float


class _Hashing(io.RawIOBase):
    """A stream that counts and hashes what is read through it."""

    def __init__(self, source: IO[bytes]) -> None:
        self._source = source
        self.digest = hashlib.sha256()
        self.size = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self._source.read(len(buffer))
        buffer[:len(data)] = data
        self.digest.update(data)
        self.size += len(data)
        return len(data)


class _NamedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to an address (a pod IP) whose certificate names another host (its DNS name)."""

    def __init__(self, host: str, port: int | None, *, context: ssl.SSLContext,
                 server_name: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._tls = context
        self._server_name = server_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._server_name)


def take_backup(server: str, target: BackupStore, credentials: ClientCredentials | None = None,
                *, tls: ssl.SSLContext | None = None, server_name: str | None = None,
                name: str | None = None, name_suffix: str = "",
                timeout_s: float = DEFAULT_TIMEOUT_S) -> TakenBackup:
    """Back the node at ``server`` (``http(s)://host:port``, its client listener) up under
    ``target``: at ``name`` if given, else at ``<cluster_id>/<YYYYMMDDTHHMMSSZ>-node-<id>``
    (followed by ``-<name_suffix>`` if given).
    Over https: ``tls`` (else the credentials' context), the certificate checked for
    ``server_name`` (else the server's host). BackupError (one line) if it cannot; then no
    manifest was written."""
    started = time.perf_counter()
    credentials = credentials or ClientCredentials()
    parts = urllib.parse.urlsplit(server)
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        connection = _NamedHTTPSConnection(
            parts.hostname or "", parts.port, context=tls or credentials.ssl_context(),
            server_name=server_name or parts.hostname or "", timeout=timeout_s)
    else:
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port,
                                                timeout=timeout_s)
    try:
        try:
            connection.request("GET", BACKUP_PATH, headers=credentials.headers())
            response = connection.getresponse()
        except OSError as error:
            raise BackupError(f"{server}: {error}") from None
        if response.status != 200:
            raise BackupError(f"{server}{BACKUP_PATH}: HTTP {response.status}: "
                              f"{_message(response.read())}")
        if name is None:
            try:
                created = datetime.datetime.strptime(
                    response.getheader(CREATED_AT_HEADER, ""), "%Y-%m-%dT%H:%M:%SZ"
                ).replace(tzinfo=datetime.UTC)
                name = default_backup_name(response.getheader(CLUSTER_ID_HEADER, ""),
                                           int(response.getheader(NODE_ID_HEADER, "")), created,
                                  name_suffix)
            except ValueError:
                raise BackupError(f"{server}{BACKUP_PATH}: no backup headers (is it a quorum "
                                  f"node?)") from None
        destination = target.child(name)
        manifest, total = _write_archive(response, destination, server)
    except (http.client.HTTPException, OSError, tarfile.TarError) as error:
        raise BackupError(f"{server}{BACKUP_PATH}: the archive broke off: {error}") from None
    finally:
        connection.close()
    return TakenBackup(destination.uri, manifest, total, time.perf_counter() - started)


def _write_archive(response: http.client.HTTPResponse, destination: BackupStore,
                   server: str) -> tuple[BackupManifest, int]:
    written: list[FileEntry] = []
    with tarfile.open(fileobj=response, mode="r|") as archive:
        for member in archive:
            source = archive.extractfile(member)
            if source is None:
                raise BackupError(f"{server}: unexpected archive member {member.name!r}")
            if member.name == MANIFEST_NAME:
                raw = source.read()
                manifest = BackupManifest.parse(raw, f"{server}{BACKUP_PATH}")
                if sorted(manifest.files, key=_path) != sorted(written, key=_path):
                    raise BackupError(f"{server}: the files received do not match the "
                                      f"manifest (sizes or checksums differ)")
                destination.write_bytes(MANIFEST_NAME, raw)  # last: the backup is complete
                return manifest, sum(entry.size for entry in written) + len(raw)
            check_member(member.name, server)
            hashing = _Hashing(source)
            destination.write(member.name, io.BufferedReader(hashing, 1 << 20))
            written.append(FileEntry(path=member.name, size=hashing.size,
                                     sha256=hashing.digest.hexdigest()))
    raise BackupError(f"{server}{BACKUP_PATH}: the archive ended without its manifest")


def _path(entry: FileEntry) -> str:
    return entry.path


def _message(body: bytes) -> str:
    try:
        document = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace").strip()
    if isinstance(document, dict):
        return str(document.get("message") or document)
    return str(document)
