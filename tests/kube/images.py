"""The container images the process kubelet can run, as their Dockerfiles build them: what the
image's entry point and command are, its environment, its user and the directories it holds.
The image's Python environment (``/opt/venv`` in both Dockerfiles) is this test's virtual
environment, mounted there read-only; the rest of the image's file system is the host's, seen
through an overlay (``container.py``). ``tests/kube/test_kube_images.py`` checks this table
against the Dockerfiles.

An image is known by its name's last path component, whatever its registry and tag
(``ghcr.io/quorum-node/quorum-node:0.1.0``, ``quorum-node:next``); any other image cannot be
pulled (``ErrImagePull``), as on a cluster without that image.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

VENV = "/opt/venv"
# The python:3.11-slim base image's PATH, behind the venv's bin (ENV PATH=/opt/venv/bin:$PATH).
PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_PYTHON_ENV = {"PATH": PATH, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}


@dataclass(frozen=True)
class Image:
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    user: int
    # The user's primary group (useradd --gid 0: the images run under any uid with gid 0).
    group: int = 0
    env: Mapping[str, str] = field(default_factory=lambda: dict(_PYTHON_ENV))
    # The user the image adds (RUN useradd ...): its name, and its home directory.
    user_name: str = ""
    home: str = "/"
    # Directories the image creates, with their owner (RUN mkdir ... && chown ...).
    directories: Mapping[str, int] = field(default_factory=dict)

    def passwd_line(self) -> str:
        return f"{self.user_name}:x:{self.user}:{self.group}::{self.home}:/bin/sh"


NODE = Image(entrypoint=(), cmd=("quorum-node", "run"), user=10001, user_name="quorum",
             home="/var/lib/quorum", directories={"/var/lib/quorum": 10001})
OPERATOR = Image(entrypoint=("kafka-quorum-operator",), cmd=(), user=10001, user_name="kqo")
IMAGES: Mapping[str, Image] = {"quorum-node": NODE, "kafka-quorum-operator": OPERATOR}


def repository_name(reference: str) -> str:
    """``registry/path/name:tag@digest`` -> ``name``."""
    name = reference.split("@", 1)[0].rsplit("/", 1)[-1]
    return name.split(":", 1)[0]


def find(reference: str) -> Image | None:
    return IMAGES.get(repository_name(reference))


def command_line(image: Image, command: list[str] | None, args: list[str] | None) -> list[str]:
    """What a container runs: the pod's command replaces the image's entry point (and drops its
    CMD), the pod's args replace CMD (Kubernetes' rules)."""
    if command:
        return [*command, *(args or [])]
    return [*image.entrypoint, *(args or image.cmd)]
