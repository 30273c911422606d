"""How ``quorum-node local --restart N`` (and ``--stop-node``, ``--replace``), run in another
terminal, reaches the running ``quorum-node local`` of the same data directory, and how that
one watches its nodes' status.

A request is a file ``DATA_DIR/control/<id>.request`` (JSON ``{"action", "node"}``), written
whole (renamed into place); the running ``local`` picks it up within a tenth of a second, does
it, and answers in ``<id>.response`` (JSON ``{"ok", "lines"}``), which the requester prints and
removes. Files, not a socket: nothing to listen on, and the data directory's lock already says
whether a ``local`` is running there.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quorum_node.node.story import no_writes_yet
from quorum_node.storage.dir_lock import DirectoryInUseError, lock_directory
from quorum_node.storage.fsutil import atomic_write

CONTROL_DIR = "control"
ACTIONS = ("restart", "stop", "replace")
_REQUEST = ".request"
_RESPONSE = ".response"
STATUS_PATH = "/v1/node"


class ControlError(Exception):
    """The request could not be made or was not answered; one line."""


@dataclass(frozen=True)
class ControlRequest:
    request_id: str
    action: str
    node_id: int


@dataclass(frozen=True)
class ControlAnswer:
    ok: bool
    lines: list[str]


def send_request(data_dir: Path, action: str, node_id: int, *, timeout_s: float = 60.0,
                 poll_s: float = 0.05) -> ControlAnswer:
    """Ask the ``local`` running on ``data_dir`` to act on a node, and wait for its answer.
    Raises ControlError when no ``local`` runs there or it does not answer in time."""
    if action not in ACTIONS:
        raise ControlError(f"unknown action {action!r}")
    not_running = ControlError(f"no quorum-node local is running on {data_dir} (start one "
                               f"with quorum-node local --data-dir {data_dir})")
    try:
        lock_directory(data_dir, what="data directory").release()
    except DirectoryInUseError:
        pass  # held: a `local` is running there, as wanted
    except FileNotFoundError:
        raise not_running from None
    except OSError as error:
        raise ControlError(f"{data_dir}: {error.strerror or error}") from None
    else:
        raise not_running
    directory = data_dir / CONTROL_DIR
    directory.mkdir(exist_ok=True)
    request_id = f"{os.getpid()}-{secrets.token_hex(4)}"
    atomic_write(directory / f"{request_id}{_REQUEST}",
                 json.dumps({"action": action, "node": node_id}).encode(), replace=False)
    response = directory / f"{request_id}{_RESPONSE}"
    deadline = time.monotonic() + timeout_s
    while not response.exists():
        if time.monotonic() >= deadline:
            with contextlib.suppress(FileNotFoundError):
                (directory / f"{request_id}{_REQUEST}").unlink()
            raise ControlError(f"quorum-node local on {data_dir} did not answer within "
                               f"{timeout_s:g} s")
        time.sleep(poll_s)
    try:
        document = json.loads(response.read_text(encoding="utf-8"))
    finally:
        response.unlink(missing_ok=True)
    return ControlAnswer(bool(document.get("ok")), [str(x) for x in document.get("lines", [])])


def pending_requests(data_dir: Path) -> Iterator[ControlRequest]:
    """The requests waiting, oldest first; each is removed as it is handed out (a malformed one
    is answered at once)."""
    directory = data_dir / CONTROL_DIR
    try:
        entries = sorted(directory.glob(f"*{_REQUEST}"), key=lambda p: p.stat().st_mtime_ns)
    except (FileNotFoundError, OSError):
        return
    for path in entries:
        request_id = path.name.removesuffix(_REQUEST)
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
            path.unlink()
        except (OSError, ValueError):
            continue
        action, node_id = document.get("action"), document.get("node")
        if action not in ACTIONS or not isinstance(node_id, int):
            answer(data_dir, request_id, ControlAnswer(False, ["malformed request"]))
            continue
        yield ControlRequest(request_id, action, node_id)


def answer(data_dir: Path, request_id: str, reply: ControlAnswer) -> None:
    atomic_write(data_dir / CONTROL_DIR / f"{request_id}{_RESPONSE}",
                 json.dumps({"ok": reply.ok, "lines": reply.lines}).encode(), replace=True)


# --- the nodes' status, as `local` reports it -----------------------------------------------------


def fetch_status(host: str, port: int, timeout_s: float = 0.3) -> dict[str, Any] | None:
    """A node's ``GET /v1/node``, or None when it does not answer (down, starting, paused)."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("GET", STATUS_PATH, headers={"Accept": "application/json"})
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            return None
        document = json.loads(body)
        return document if isinstance(document, dict) else None
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        connection.close()


class LeaderWatch:
    """Says when the quorum is ready (a leader that knows its high watermark and takes writes)
    and when the leadership changes, from the nodes' status; ``say`` gets one line per change."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say = say
        self._announced: tuple[int, int] | None = None  # (leader, epoch) last said
        self._ready_once = False
        self._leaderless_since: float | None = None
        self._unheard_said: tuple[int, int, tuple[int, ...]] | None = None

    def observe(self, statuses: Sequence[dict[str, Any]], now: float) -> None:
        leaders = [s for s in statuses if s.get("state") == "leader"
                   and isinstance(s.get("high_watermark"), int) and s["high_watermark"] >= 0]
        if leaders:
            leader = max(leaders, key=lambda s: int(s.get("epoch", -1)))
            key = (int(leader["node_id"]), int(leader["epoch"]))
            self._leaderless_since = None
            unheard = tuple(leader.get("voters_unheard") or ())
            if unheard:  # a new quorum's first leader, waiting for a voter that has not come
                if self._unheard_said != (*key, unheard):
                    self._unheard_said = (*key, unheard)
                    self._say(f"node {key[0]} {no_writes_yet(*key, unheard)}")
                return
            if key != self._announced:
                up = len(statuses)
                if not self._ready_once:
                    self._say(f"quorum ready: node {key[0]} leads in epoch {key[1]} "
                              f"({up} node{'s' if up != 1 else ''} answering)")
                    self._ready_once = True
                else:
                    self._say(f"node {key[0]} now leads in epoch {key[1]}")
                self._announced = key
            return
        if self._announced is None:
            return
        # A second without a leader: an election (a node or the leader is down).
        if self._leaderless_since is None:
            self._leaderless_since = now
        elif now - self._leaderless_since >= 1.0:
            self._say(f"no leader (node {self._announced[0]} led epoch {self._announced[1]}): "
                      "an election is under way, or no majority is up")
            self._announced = None
            self._leaderless_since = None
