"""Where backups live: a local directory or an object-store prefix (``s3://bucket/prefix``).

Both are a tree of files addressed by "/"-separated paths under a root. Object storage goes
through boto3 (the ``s3`` extra): credentials come from the usual AWS variables and files (or are
given), ``endpoint_url`` (or ``AWS_ENDPOINT_URL``) names an S3-compatible server.

A local tree is read as ``quorum-node backup`` writes it: regular files in directories. No
symbolic link below the root is followed (each component is opened ``O_NOFOLLOW`` from the one
before, so none can be swapped in between a check and the open), and anything but a regular file
(a device, a FIFO that would block) is refused: a backup never holds either, and following one
could read anything on the restoring host, ``/dev/zero`` without end, or ``/proc``. (The root
itself may be a link: it is the caller's choice.) Files and directories it writes are ``0600``
and ``0700`` whatever the umask: a backup holds every record of the quorum.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
import stat
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol

from quorum_node.backup.manifest import BackupError
from quorum_node.storage.fsutil import ensure_directory, fsync_directory, open_private

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ObjectIdentifierTypeDef

_COPY_CHUNK = 1 << 20


class BackupStore(Protocol):
    """A tree of files under a root (``uri``)."""

    @property
    def uri(self) -> str: ...

    def child(self, name: str) -> BackupStore:
        """The tree under ``name`` ("a/b": a sub-directory, or a longer key prefix)."""
        ...

    def write(self, path: str, source: BinaryIO) -> None:
        """Write a file from a stream, read to its end."""
        ...

    def write_bytes(self, path: str, data: bytes) -> None: ...

    def read_bytes(self, path: str, limit: int | None = None) -> bytes | None:
        """The whole file; None if there is none; BackupError if it holds more than ``limit``
        bytes."""
        ...

    def open(self, path: str) -> contextlib.AbstractContextManager[BinaryIO]:
        """A stream of the file; BackupError if there is none (or, in a local tree, if it is no
        regular file or a symbolic link is on its way)."""
        ...

    def children(self) -> list[str]:
        """The names of the sub-trees directly under the root, sorted."""
        ...

    def delete_all(self) -> None:
        """Delete every file under the root."""
        ...


@dataclass(frozen=True)
class S3Options:
    """How to reach an object store; None fields come from boto3's usual sources."""

    endpoint_url: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    region: str | None = None


def open_store(location: str, options: S3Options | None = None) -> BackupStore:
    """The store at ``location``: ``s3://bucket/prefix`` or a local path."""
    if location.startswith("s3://"):
        parsed = urllib.parse.urlsplit(location)
        if not parsed.netloc:
            raise BackupError(f"{location}: no bucket (expected s3://BUCKET/PREFIX)")
        return S3Store(s3_client(options or S3Options()), parsed.netloc,
                       parsed.path.strip("/"))
    if "://" in location:
        raise BackupError(f"{location}: unsupported location (expected a path or s3://...)")
    return LocalStore(Path(location))


def s3_client(options: S3Options) -> S3Client:
    # Imported here, not at the top: boto3 is an optional extra, and importing it is slow
    # enough to be felt by every quorum-node command (run included).
    try:
        import boto3  # noqa: PLC0415
    except ImportError:
        raise BackupError("s3:// locations need boto3: pip install 'quorum-node[s3]'") from None
    region = options.region or os.environ.get("AWS_REGION") \
        or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return boto3.client("s3", endpoint_url=options.endpoint_url, region_name=region,
                        aws_access_key_id=options.access_key_id,
                        aws_secret_access_key=options.secret_access_key)


class LocalStore:
    """Files under a local directory, each written to a temporary name, fsynced and renamed."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def uri(self) -> str:
        return str(self.root)

    def child(self, name: str) -> LocalStore:
        return LocalStore(self.root / name)

    def write(self, path: str, source: BinaryIO) -> None:
        target = self.root / path
        ensure_directory(target.parent)
        partial = target.with_name(target.name + ".part")
        with open(open_private(partial, os.O_WRONLY | os.O_TRUNC), "wb") as output:
            shutil.copyfileobj(source, output, _COPY_CHUNK)
            output.flush()
            os.fsync(output.fileno())
        partial.replace(target)
        fsync_directory(target.parent)

    def write_bytes(self, path: str, data: bytes) -> None:
        self.write(path, io.BytesIO(data))

    def read_bytes(self, path: str, limit: int | None = None) -> bytes | None:
        try:
            with self.open(path) as stream:
                data = stream.read() if limit is None else stream.read(limit + 1)
        except _Missing:
            return None
        if limit is not None and len(data) > limit:
            raise BackupError(f"{self.root / path}: larger than {limit} bytes")
        return data

    @contextlib.contextmanager
    def open(self, path: str) -> Iterator[BinaryIO]:
        with os.fdopen(self._open_regular(path), "rb") as stream:
            yield stream

    def _open_regular(self, path: str) -> int:
        """A descriptor of the regular file at ``path``, reached through directories only."""
        *directories, name = path.split("/")
        where = self.root / path
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise _Missing(f"{where}: missing") from None
        except OSError as error:
            raise BackupError(f"{self.root}: {error.strerror}") from None
        # Each step closes the descriptor it was given, whether it opens the next or not.
        for directory in directories:
            fd = _open_below(fd, directory, os.O_DIRECTORY, where)
        fd = _open_below(fd, name, os.O_NONBLOCK, where)  # a FIFO must not block the open
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise BackupError(f"{where}: not a regular file: a backup holds regular files only")
        os.set_blocking(fd, True)
        return fd

    def children(self) -> list[str]:
        try:
            return sorted(entry.name for entry in os.scandir(self.root) if entry.is_dir())
        except FileNotFoundError:
            return []

    def delete_all(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class _Missing(BackupError):
    """A file a local tree does not hold."""


def _open_below(directory_fd: int, name: str, flags: int, where: Path) -> int:
    """Open ``name`` in the directory open on ``directory_fd`` without following a symbolic
    link; the directory's descriptor is closed either way."""
    try:
        return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | flags,
                       dir_fd=directory_fd)
    except FileNotFoundError:
        raise _Missing(f"{where}: missing") from None
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise BackupError(f"{where}: {name} is a symbolic link (or not a directory): a "
                              f"backup holds regular files only, and no link is followed"
                              ) from None
        raise BackupError(f"{where}: {error.strerror}") from None
    finally:
        os.close(directory_fd)


class S3Store:
    """Objects under ``s3://bucket/prefix/``."""

    def __init__(self, client: S3Client, bucket: str, prefix: str) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def child(self, name: str) -> S3Store:
        return S3Store(self.client, self.bucket, self._key(name))

    def _key(self, path: str) -> str:
        return f"{self.prefix}/{path}" if self.prefix else path

    def write(self, path: str, source: BinaryIO) -> None:
        with self._errors(path):
            self.client.upload_fileobj(source, self.bucket, self._key(path))

    def write_bytes(self, path: str, data: bytes) -> None:
        with self._errors(path):
            self.client.put_object(Bucket=self.bucket, Key=self._key(path), Body=data)

    def read_bytes(self, path: str, limit: int | None = None) -> bytes | None:
        with self._errors(path):
            try:
                answer = self.client.get_object(Bucket=self.bucket, Key=self._key(path))
            except self.client.exceptions.NoSuchKey:
                return None
            body = answer["Body"]
            try:
                data: bytes = body.read() if limit is None else body.read(limit + 1)
            finally:
                body.close()
        if limit is not None and len(data) > limit:
            raise BackupError(f"{self.uri}/{path}: larger than {limit} bytes")
        return data

    @contextlib.contextmanager
    def open(self, path: str) -> Iterator[BinaryIO]:
        with self._errors(path):
            try:
                answer = self.client.get_object(Bucket=self.bucket, Key=self._key(path))
            except self.client.exceptions.NoSuchKey:
                raise BackupError(f"{self.uri}/{path}: missing") from None
            body = answer["Body"]
            try:
                yield body  # type: ignore[misc]  # a StreamingBody reads like a binary file
            finally:
                body.close()

    def children(self) -> list[str]:
        names: set[str] = set()
        start = f"{self.prefix}/" if self.prefix else ""
        with self._errors(""):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=start, Delimiter="/")
            for page in pages:
                for common in page.get("CommonPrefixes", []):
                    names.add(common["Prefix"][len(start):].strip("/"))
        return sorted(names)

    def delete_all(self) -> None:
        start = f"{self.prefix}/" if self.prefix else ""
        with self._errors(""):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=start)
            for page in pages:
                keys: list[ObjectIdentifierTypeDef] = [
                    {"Key": item["Key"]} for item in page.get("Contents", [])]
                if keys:
                    self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys})

    @contextlib.contextmanager
    def _errors(self, path: str) -> Iterator[None]:
        """boto3's errors as one line naming the object."""
        import botocore.exceptions  # noqa: PLC0415 (loaded with the client: see s3_client)

        try:
            yield
        except botocore.exceptions.ClientError as error:
            details = error.response.get("Error", {})
            raise BackupError(f"{self.uri}/{path}: {details.get('Code', 'error')}: "
                              f"{details.get('Message', error)}") from None
        except botocore.exceptions.BotoCoreError as error:
            raise BackupError(f"{self.uri}/{path}: {error}") from None
