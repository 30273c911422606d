"""The process kubelet's images (``images.py``) are what the Dockerfiles build: the same entry
point and command, user, environment and directories. A Dockerfile changed without the table
fails here, in the default suite."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import images
import pytest

ROOT = Path(__file__).resolve().parents[2]


def final_stage(dockerfile: Path) -> list[tuple[str, str]]:
    """The instructions of the Dockerfile's last stage, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text())
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    last_from = max(i for i, line in enumerate(lines) if line.upper().startswith("FROM "))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in
            lines[last_from:]]


def exec_form(argument: str) -> tuple[str, ...]:
    return tuple(json.loads(argument))


@pytest.mark.parametrize(("dockerfile", "image"), [
    ("Dockerfile", images.NODE), ("operator/Dockerfile", images.OPERATOR)])
def test_images_are_the_dockerfiles(dockerfile: str, image: images.Image) -> None:
    stage = final_stage(ROOT / dockerfile)
    found = dict(stage)
    assert exec_form(found.get("ENTRYPOINT", "[]")) == image.entrypoint
    assert exec_form(found.get("CMD", "[]")) == image.cmd
    assert int(found["USER"]) == image.user
    env = dict(pair.split("=", 1) for pair in shlex.split(found["ENV"]))
    assert env["PATH"] == f"{images.VENV}/bin:$PATH"
    assert {k: v for k, v in env.items() if k != "PATH"} == \
        {k: v for k, v in image.env.items() if k != "PATH"}
    run = found["RUN"]
    assert f"--uid {image.user}" in run and f" {image.user_name}" in run
    assert f"--gid {image.group}" in run
    if image.home != "/":
        assert f"--home-dir {image.home}" in run
    for directory, owner in image.directories.items():
        assert f"mkdir -p {directory}" in run and \
            f"chown {owner}:{image.group} {directory}" in run


def test_image_names() -> None:
    assert images.find("ghcr.io/quorum-node/quorum-node:0.1.0") is images.NODE
    assert images.find("quorum-node:next@sha256:00") is images.NODE
    assert images.find("registry:5000/x/kafka-quorum-operator") is images.OPERATOR
    assert images.find("busybox") is None
    assert images.command_line(images.NODE, None, None) == ["quorum-node", "run"]
    assert images.command_line(images.OPERATOR, None, ["--verbose"]) == \
        ["kafka-quorum-operator", "--verbose"]
    assert images.command_line(images.NODE, ["quorum-admin"], None) == ["quorum-admin"]
