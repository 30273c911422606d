"""Run a ```console transcript of a document as a user types it, in the current directory.

    python doc_transcript.py DOCUMENT HEADING

The transcript is the first ```console block after the line HEADING. Lines:

- ``$ COMMAND   # comment``: run COMMAND with the shell; it must exit 0. A comment naming
  "terminal 1" starts it in the background (a ``quorum-node local``), and the next line is run
  once it printed "quorum ready".
- ``# Ctrl-C in terminal 1 ...``: SIGINT to the background command; it must exit 0.
- any other line: a line the previous command must have printed (in that order).

A command that printed an indented ``quorum-node ...`` line (the command ``restore --local``
says to run next) must be followed by exactly that command. Exit 0 when the whole transcript
ran as written; 1 and the first difference otherwise. The test runs it in a network namespace
of its own, so that the default ports are free.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

READY = "quorum ready"
READY_TIMEOUT_S = 120.0


def block(document: Path, heading: str) -> list[str]:
    lines = document.read_text().splitlines()
    start = lines.index(heading)
    opening = next(i for i in range(start, len(lines)) if lines[i].startswith("```console"))
    closing = next(i for i in range(opening + 1, len(lines)) if lines[i].startswith("```"))
    return lines[opening + 1:closing]


def wait_ready(process: subprocess.Popen[str], output: list[str]) -> None:
    assert process.stdout is not None
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            raise SystemExit(f"the background command exited ({process.wait()}): {output}")
        output.append(line.rstrip("\n"))
        if READY in line:
            return
    raise SystemExit(f"no {READY!r} in {READY_TIMEOUT_S:g} s: {output}")


def stop(process: subprocess.Popen[str]) -> int:
    process.send_signal(signal.SIGINT)
    try:
        return process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def run(lines: list[str]) -> None:
    background: subprocess.Popen[str] | None = None
    printed: list[str] = []
    announced: str | None = None  # the command the last one said to run next
    try:
        for line in lines:
            if line.startswith("$ "):
                command, _, comment = line[2:].partition("  #")
                command = command.strip()
                if announced is not None and command != announced:
                    raise SystemExit(f"the transcript runs {command!r}, the previous command "
                                     f"said to run {announced!r}")
                print(f"$ {command}", flush=True)
                if "terminal 1" in comment:
                    # exec: Ctrl-C reaches the command, not a shell waiting for it.
                    background = subprocess.Popen(f"exec {command}", shell=True, text=True,
                                                  stdout=subprocess.PIPE,
                                                  stderr=subprocess.STDOUT)
                    printed = []
                    wait_ready(background, printed)
                else:
                    done = subprocess.run(command, shell=True, text=True, capture_output=True,
                                          check=False, timeout=120)
                    if done.returncode != 0:
                        raise SystemExit(f"{command!r} exited {done.returncode}: "
                                         f"{done.stdout}{done.stderr}")
                    printed = done.stdout.splitlines()
                print("\n".join(printed), flush=True)
                announced = next((p.strip() for p in printed
                                  if p.startswith("  quorum-node ")), None)
            elif line.startswith("# Ctrl-C in terminal 1"):
                assert background is not None, "Ctrl-C with nothing running"
                code = stop(background)
                background = None
                if code != 0:
                    raise SystemExit(f"the background command exited {code} on Ctrl-C")
            elif line.strip():
                if line not in printed:
                    raise SystemExit(f"expected {line!r} in the output {printed}")
                printed = printed[printed.index(line) + 1:]
        if announced is not None:
            raise SystemExit(f"the transcript ends before {announced!r}")
    finally:
        if background is not None:
            stop(background)


if __name__ == "__main__":
    run(block(Path(sys.argv[1]), sys.argv[2]))
