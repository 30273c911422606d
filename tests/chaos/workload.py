"""What the chaos tests run against a ``ProcessCluster``: two-way partitions, key-value clients
that record a history, and a nemesis that injects faults on a seeded schedule."""

from __future__ import annotations

import http.client
import json
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lazyfs import LazyFs
from linearizability import (
    Kind,
    Operation,
    Outcome,
    Recorder,
    Result,
    TxnCall,
    TxnCompare,
    TxnReply,
    TxnStep,
    Value,
    finished,
)
from proc_cluster import FaultProxy, ProcessCluster

# Refusals that say the write was never appended, or was truncated away and will never commit
# (the client API's contract; quorum_node.client retries the same codes as safe).
NOT_APPLIED_CODES = frozenset({"NO_LEADER", "APPEND_LOST", "NODE_FAILED", "SHUTTING_DOWN",
                               "DISK_FULL"})
SERVER_TIMEOUT_MS = 1500
SOCKET_TIMEOUT_S = 3.0  # past the server's own timeout: a node that does not answer is down
MAX_REDIRECTS = 3


class Network:
    """Two-way partitions. The cluster's own ``FaultProxy`` in front of each node cuts what
    reaches the node; here each node also reaches each peer through a link of its own (a
    ``FaultProxy`` chained to the peer's), so that what the node sends can be cut too. Call
    before the nodes start: it rewrites their voter lists."""

    def __init__(self, cluster: ProcessCluster) -> None:
        self._cluster = cluster
        self.links: dict[tuple[int, int], FaultProxy] = {}
        self.isolated: set[int] = set()
        for source, node in cluster.nodes.items():
            for target, peer in cluster.nodes.items():
                if target != source:
                    self.links[source, target] = FaultProxy(peer.proxy.port)
            lines = node.config_path.read_text().splitlines()
            for number, line in enumerate(lines):
                name, _, voters = line.partition("=")
                if name.strip() == "controller.quorum.voters":
                    lines[number] = f"{name}={self._routed(source, voters.strip())}"
            node.config_path.write_text("".join(f"{line}\n" for line in lines))

    def _routed(self, source: int, voters: str) -> str:
        routed = []
        for voter in voters.split(","):
            voter_id, _, address = voter.partition("@")
            host, _, port = address.rpartition(":")
            target = int(voter_id)
            if target != source:
                # Else a partition would silently be one-way only.
                assert int(port) == self._cluster.nodes[target].proxy.port, (
                    f"node {source} reaches voter {voter} other than through its proxy")
                port = str(self.links[source, target].port)
            routed.append(f"{voter_id}@{host}:{port}")
        return ",".join(routed)

    def node_listening_on(self, port: int) -> int | None:
        """The node a port leads to: its own, its proxy's, or a link's to it."""
        for node_id, node in self._cluster.nodes.items():
            if port in (node.port, node.proxy.port, urllib.parse.urlsplit(node.url).port):
                return node_id
        for (_, target), link in self.links.items():
            if link.port == port:
                return target
        return None

    def isolate(self, node_id: int) -> None:
        self.isolated.add(node_id)
        self._cluster.nodes[node_id].proxy.cut()
        for (source, _), link in self.links.items():
            if source == node_id:
                link.cut()

    def heal(self, node_id: int) -> None:
        self.isolated.discard(node_id)
        self._cluster.nodes[node_id].proxy.heal()
        for (source, _), link in self.links.items():
            if source == node_id:
                link.heal()

    def heal_all(self) -> None:
        for node_id in list(self._cluster.nodes):
            self.heal(node_id)

    def close(self) -> None:
        for link in self.links.values():
            link.close()


@dataclass(frozen=True)
class Reply:
    status: int | None  # None: no answer (refused, reset, timed out)
    body: Any = None
    code: str | None = None  # the error code of an error answer
    error: str | None = None
    refused: bool = False  # the connection was refused: the request never reached the node


class Client:
    """Plain HTTP to the nodes' client API, following redirects to the node they name."""

    def __init__(self, cluster: ProcessCluster, network: Network) -> None:
        self._cluster = cluster
        self._network = network
        self._opener = urllib.request.build_opener(_NoRedirect)

    def request(self, node_id: int, method: str, path: str, body: bytes | None = None,
                content_type: str = "application/json") -> tuple[Reply, int]:
        """The reply and the node that gave it (a redirect's target, if followed)."""
        reply = Reply(None, error="no request")
        for _ in range(MAX_REDIRECTS + 1):
            reply = self._once(self._cluster.nodes[node_id].url + path, method, body,
                               content_type)
            if reply.status != 307 or not isinstance(reply.body, dict):
                return reply, node_id
            location = urllib.parse.urlsplit(str(reply.body.get("location", "")))
            leader = self._network.node_listening_on(location.port or 0)
            if leader is None:
                return reply, node_id
            node_id = leader
        return reply, node_id

    def _once(self, url: str, method: str, body: bytes | None, content_type: str) -> Reply:
        request = urllib.request.Request(url, data=body, method=method,
                                         headers={"Content-Type": content_type})
        try:
            with self._opener.open(request, timeout=SOCKET_TIMEOUT_S) as response:
                return Reply(response.status, json.loads(response.read() or b"null"))
        except urllib.error.HTTPError as error:
            try:
                document = json.loads(error.read() or b"null")
            except (ValueError, OSError, http.client.HTTPException):
                document = None
            code = document.get("code") if isinstance(document, dict) else None
            if error.code == 307 and isinstance(document, dict):
                document["location"] = error.headers.get("Location", "")
            return Reply(error.code, document, code)
        except urllib.error.URLError as error:
            return Reply(None, error=f"{type(error.reason).__name__}: {error}",
                         refused=isinstance(error.reason, ConnectionRefusedError))
        except (OSError, http.client.HTTPException, ValueError) as error:
            return Reply(None, error=f"{type(error).__name__}: {error}")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def kv_path(key: str, suffix: str = "", **query: str) -> str:
    return f"/v1/kv/{urllib.parse.quote(key, safe='')}{suffix}?{_query(**query)}"


def txn_path() -> str:
    return f"/v1/txn?{_query()}"


def _query(**query: str) -> str:
    return urllib.parse.urlencode({"timeout_ms": str(SERVER_TIMEOUT_MS), **query})


def txn_body(call: TxnCall) -> bytes:
    """``POST /v1/txn``'s body for ``call``."""
    return json.dumps({
        "compare": [{"key": c.key, "target": c.target, "result": c.result, c.target: c.operand}
                    for c in call.compares],
        "success": [_txn_step_json(s) for s in call.success],
        "failure": [_txn_step_json(s) for s in call.failure],
    }).encode()


def _txn_step_json(txn_step: TxnStep) -> dict[str, str | None]:
    document: dict[str, str | None] = {"op": txn_step.kind, "key": txn_step.key}
    return {**document, "value": txn_step.value} if txn_step.kind == "put" else document


def txn_reply(body: Any) -> TxnReply:
    """An answer of ``POST /v1/txn`` as the checker's ``TxnReply``."""
    answers = {"get": "value", "put": "existed", "delete": "deleted"}
    return TxnReply(bool(body["succeeded"]),
                    tuple(response[answers[response["op"]]] for response in body["responses"]))


@dataclass
class Tally:
    """What happened, for the summary."""

    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    codes: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, op: Operation, reply: Reply) -> None:
        with self._lock:
            self.outcomes[op.kind.value, op.outcome.value] += 1
            if reply.status != 200:
                what = reply.code or (reply.error or "").split(":")[0] or str(reply.status)
                self.codes[what] += 1

    def report(self) -> str:
        kinds = sorted({kind for kind, _ in self.outcomes})
        lines = [f"  {kind:<7}" + "  ".join(
            f"{outcome} {self.outcomes[kind, outcome]:>5}" for outcome in
            ("ok", "failed", "unknown")) for kind in kinds]
        lines.append("  answers other than 200: " + (", ".join(f"{code} {count}" for code, count in
                                              self.codes.most_common()) or "none"))
        return "\n".join(lines)


class KvSession:
    """One client's operations, each recorded with its call and completion times and its
    outcome: ok, failed (definitely not applied) or unknown."""

    def __init__(self, client: Client, recorder: Recorder, tally: Tally, number: int,
                 node_id: int) -> None:
        self.client = client
        self.recorder = recorder
        self.tally = tally
        self.number = number
        self.node_id = node_id  # where the next request goes

    def put(self, key: str, value: str) -> Operation:
        return self._write(Kind.PUT, key, ("PUT", kv_path(key), value.encode(), "text/plain"),
                           value=value)

    def cas(self, key: str, expected: Value, value: Value) -> Operation:
        body = json.dumps({"expected": expected, "value": value}).encode()
        return self._write(Kind.CAS, key,
                           ("POST", kv_path(key, "/cas"), body, "application/json"),
                           value=value, expected=expected)

    def delete(self, key: str) -> Operation:
        return self._write(Kind.DELETE, key,
                           ("DELETE", kv_path(key), None, "application/json"))

    def txn(self, call: TxnCall) -> Operation:
        return self._write(Kind.TXN, call.keys[0],
                           ("POST", txn_path(), txn_body(call), "application/json"), txn=call)

    def get(self, key: str, *, stale: bool = False) -> Operation:
        invoked = time.monotonic()
        path = kv_path(key, stale="true") if stale else kv_path(key)
        reply, self.node_id = self.client.request(self.node_id, "GET", path)
        if reply.status == 200:
            op = self._finish(Kind.GET, key, invoked, Outcome.OK, result=reply.body["value"])
        elif reply.status == 404 and reply.code == "KEY_NOT_FOUND":
            op = self._finish(Kind.GET, key, invoked, Outcome.OK, result=None)
        else:
            # A read that did not answer changed nothing: whether it "happened" is moot.
            op = self._finish(Kind.GET, key, invoked, Outcome.UNKNOWN, reply=reply)
            self._check_expected(reply, op)
        self.tally.add(op, reply)
        return op

    def _write(self, kind: Kind, key: str, request: tuple[str, str, bytes | None, str], *,
               value: Value = None, expected: Value = None,
               txn: TxnCall | None = None) -> Operation:
        """``request``: method, path, body, content type."""
        invoked = time.monotonic()
        reply, self.node_id = self.client.request(self.node_id, *request)
        if reply.status == 200:
            result: Result = None
            if kind is Kind.CAS:
                result = bool(reply.body["applied"])
            elif kind is Kind.DELETE:
                result = bool(reply.body["deleted"])
            elif kind is Kind.TXN:
                result = txn_reply(reply.body)
            op = self._finish(kind, key, invoked, Outcome.OK, value=value, expected=expected,
                              result=result, txn=txn)
        elif reply.code in NOT_APPLIED_CODES or reply.status in (307, 408) or reply.refused:
            # A redirect is a refusal too (more hops than followed), and so is a body the node
            # gave up reading (408: a paused node may find its read timer expired on waking),
            # and a connection refused (a node down): the request never reached a node. Counted
            # unknown, each would make the checker's search far longer.
            op = self._finish(kind, key, invoked, Outcome.FAILED, value=value, expected=expected,
                              txn=txn, reply=reply)
        else:
            # 504 TIMEOUT, 503 OUTCOME_UNKNOWN, no answer: it may commit, now or later.
            op = self._finish(kind, key, invoked, Outcome.UNKNOWN, value=value,
                              expected=expected, txn=txn, reply=reply)
            self._check_expected(reply, op)
        self.tally.add(op, reply)
        return op

    def _finish(self, kind: Kind, key: str, invoked: float, outcome: Outcome, *,
                value: Value = None, expected: Value = None, result: Result = None,
                txn: TxnCall | None = None, reply: Reply | None = None) -> Operation:
        answer = "" if reply is None else \
            f"{reply.status or ''} {reply.code or reply.error or ''} at node {self.node_id}"
        op = finished(kind, key, invoked, outcome, client=self.number, value=value,
                      expected=expected, result=result, txn=txn, answer=answer.strip())
        self.recorder.record(op)
        return op

    def _check_expected(self, reply: Reply, op: Operation) -> None:
        """A request the API refuses as malformed is a bug of the test, not a fault."""
        if reply.status is not None and 400 <= reply.status < 500 and reply.status != 408:
            self.tally.unexpected.append(f"{op.describe()}: {reply.status} {reply.body}")


class Worker(threading.Thread):
    """A client doing random puts, linearizable gets, compare-and-sets, deletes and txns on a
    few keys until stopped. A txn either moves a value: if the first of two keys holds what
    this client last saw there (or is absent), it puts one new value to both, else it reads
    both; or it reads two or three keys at once. Either way the checker sees several keys
    written or read at one instant."""

    def __init__(self, session: KvSession, nodes: list[int], keys: Callable[[], list[str]],
                 seed: int, stop: threading.Event) -> None:
        super().__init__(daemon=True, name=f"chaos-client-{session.number}")
        self.session = session
        self._nodes = nodes
        self._keys = keys
        self._rng = random.Random(seed)
        self._halt = stop
        self._sequence = 0
        self._seen: dict[str, Value] = {}  # the last value this client saw per key

    def run(self) -> None:
        rng, session = self._rng, self.session
        while not self._halt.is_set():
            keys = self._keys()
            key = rng.choice(keys)
            roll = rng.random()
            self._sequence += 1
            value = f"c{session.number}-{self._sequence}"
            if roll < 0.3:
                op = session.put(key, value)
            elif roll < 0.58:
                op = session.get(key)
            elif roll < 0.78:
                op = session.cas(key, self._seen.get(key), value)
            elif roll < 0.82:
                op = session.delete(key)
            else:
                op = session.txn(self.txn_call(keys, value))
            if op.outcome is Outcome.OK:
                self.saw(op)
            else:
                session.node_id = rng.choice(self._nodes)
                self._halt.wait(0.05)

    def txn_call(self, keys: list[str], value: str) -> TxnCall:
        rng = self._rng
        if rng.random() < 0.3:
            return TxnCall((), tuple(TxnStep("get", key)
                                     for key in rng.sample(keys, rng.choice((2, 3)))))
        first, second = rng.sample(keys, 2)
        seen = self._seen.get(first)
        compare = TxnCompare(first, "version", "=", 0) if seen is None else \
            TxnCompare(first, "value", "=", seen)
        return TxnCall((compare,), (TxnStep("put", first, value), TxnStep("put", second, value)),
                       (TxnStep("get", first), TxnStep("get", second)))

    def saw(self, op: Operation) -> None:
        """Remember what an ok operation showed of its keys."""
        if op.kind is Kind.GET:
            self._seen[op.key] = op.result if isinstance(op.result, str) else None
        elif op.kind is Kind.PUT or (op.kind is Kind.CAS and op.result):
            self._seen[op.key] = op.value
        elif op.txn is not None and isinstance(op.result, TxnReply):
            branch = op.txn.success if op.result.succeeded else op.txn.failure
            for txn_step, answer in zip(branch, op.result.responses, strict=True):
                if txn_step.kind == "put":
                    self._seen[txn_step.key] = txn_step.value
                elif txn_step.kind == "get":
                    self._seen[txn_step.key] = answer if isinstance(answer, str) else None


ACKNOWLEDGED_PREFIX = "ack-"


class AcknowledgedWriter(threading.Thread):
    """Writes keys of its own, each once (``ack-<n>``), through random nodes until stopped, and
    keeps those the quorum acknowledged: every one of them must be there at the end, whatever
    the faults (an acknowledgement means a majority synced it)."""

    def __init__(self, session: KvSession, nodes: list[int], seed: int,
                 stop: threading.Event) -> None:
        super().__init__(daemon=True, name="chaos-acknowledged-writer")
        self.session = session
        self.written: dict[str, str] = {}
        self._nodes = nodes
        self._rng = random.Random(seed - 1)
        self._halt = stop

    def run(self) -> None:
        number = 0
        while not self._halt.is_set():
            number += 1
            key, value = f"{ACKNOWLEDGED_PREFIX}{number}", f"v{number}"
            if self.session.put(key, value).outcome is Outcome.OK:
                self.written[key] = value
            else:
                self.session.node_id = self._rng.choice(self._nodes)
                self._halt.wait(0.05)

    def lost(self, reader: KvSession) -> list[str]:
        """The acknowledged keys a linearizable read does not find with their value."""
        lost = []
        for key, value in sorted(self.written.items()):
            deadline = time.monotonic() + 30
            while (op := reader.get(key)).outcome is not Outcome.OK:
                assert time.monotonic() < deadline, f"no read of {key!r}"
                time.sleep(0.1)
            if op.result != value:
                lost.append(f"{key}={value!r} read as {op.result!r}")
        return lost


@dataclass(frozen=True)
class Fault:
    name: str
    node: int
    started: float
    seconds: float
    detail: str = ""


def log_dir_of(cluster: ProcessCluster, node_id: int) -> Path:
    for line in cluster.nodes[node_id].config_path.read_text().splitlines():
        name, _, value = line.partition("=")
        if name.strip() == "log.dir":
            return Path(value.strip())
    raise AssertionError(f"node {node_id} has no log.dir")


FAULT_KINDS = ("kill-leader", "kill-follower", "pause-leader", "pause-follower",
               "partition-leader", "partition-follower", "replace-disk")
# The faults of a real disk, on the lazy file system under each node's log directory: the power
# lost on one node (the leader), on a minority, on every node at once; fsync failing (EIO) on the
# leader and on a follower; the disk full on one node for a while, then freed.
DISK_FAULT_KINDS = ("power-loss-leader", "power-loss-minority", "power-loss-all",
                    "fsync-fail-leader", "fsync-fail-follower", "disk-full")
# The lines a node logs when a failed fsync stops it: running (runtime.py's _fail), or starting
# (the log's open makes what it found durable; quorum-node run refuses to start).
FSYNC_FAILED_LINES = ("stopping: ", "quorum-node run: error: ")


class Nemesis(threading.Thread):
    """Injects faults one at a time in a seeded order: each kind once per round, in a shuffled
    order, rounds until ``seconds`` have passed (at least one round). Between faults it waits
    for a leader, so that the clients make progress between them. The disk faults need
    ``disks``: each node's lazy file system."""

    def __init__(self, cluster: ProcessCluster, network: Network, seed: int,
                 seconds: float, *, kinds: Sequence[str] = FAULT_KINDS,
                 disks: Mapping[int, LazyFs] | None = None) -> None:
        super().__init__(daemon=True, name="chaos-nemesis")
        self.cluster = cluster
        self.network = network
        self.rng = random.Random(seed)
        self.seconds = seconds
        self.kinds = tuple(kinds)
        self.disks = dict(disks or {})
        assert self.disks or not set(self.kinds) & set(DISK_FAULT_KINDS), "disk faults need disks"
        self.faults: list[Fault] = []
        self.stopped_after_fsync: list[str] = []  # the line each such node logged
        self.error: BaseException | None = None
        self._admin = Client(cluster, network)
        self._began = time.monotonic()

    def run(self) -> None:
        try:
            while True:
                kinds = list(self.kinds)
                self.rng.shuffle(kinds)
                for kind in kinds:
                    self.inject(kind)
                if time.monotonic() - self._began >= self.seconds:
                    return
        except BaseException as error:  # reported by the test
            self.error = error

    def inject(self, kind: str) -> None:
        cluster = self.cluster
        leader = cluster.wait_for_leader(timeout_s=30)
        followers = [n for n in cluster.nodes if n != leader]
        victim = leader if kind.endswith("leader") else self.rng.choice(followers)
        started = time.monotonic()
        hold = self.rng.uniform(1.0, 2.5)
        detail = ""
        if kind in DISK_FAULT_KINDS:
            victim, detail = self.disk_fault(kind, leader, followers, hold)
        elif kind.startswith("kill"):
            cluster.kill(victim)
            time.sleep(hold)
            cluster.start(victim)
        elif kind.startswith("pause"):
            cluster.signal(victim, signal.SIGSTOP)
            try:
                time.sleep(hold)
            finally:
                cluster.signal(victim, signal.SIGCONT)
        elif kind.startswith("partition"):
            self.network.isolate(victim)
            try:
                time.sleep(hold)
            finally:
                self.network.heal(victim)
        else:
            victim = self.rng.choice(list(cluster.nodes))
            detail = self.replace_disk(victim)
        self.faults.append(Fault(kind, victim, started - self._began,
                                 time.monotonic() - started, detail))
        cluster.wait_for_leader(timeout_s=30)
        time.sleep(self.rng.uniform(0.3, 0.8))

    def disk_fault(self, kind: str, leader: int, followers: list[int],
                   hold: float) -> tuple[int, str]:
        """One fault of a real disk; the node it hit (the first, for several) and what
        happened."""
        if kind.startswith("power-loss"):
            nodes = list(self.cluster.nodes)
            victims = {"power-loss-leader": [leader],
                       "power-loss-minority": self.rng.sample(nodes, (len(nodes) - 1) // 2),
                       "power-loss-all": nodes}[kind]
            self.power_loss(victims, hold)
            return victims[0], f"nodes {sorted(victims)}"
        if kind.startswith("fsync-fail"):
            victim = leader if kind.endswith("leader") else self.rng.choice(followers)
            return victim, self.fail_fsync(victim)
        victim = self.rng.choice(list(self.cluster.nodes))
        return victim, self.fill_disk(victim, hold)

    def power_loss(self, victims: Sequence[int], hold: float) -> None:
        """The machines of ``victims`` lose power together: every process dies at once, then
        every disk drops what was never synced; they boot ``hold`` seconds later."""
        for victim in victims:
            self.cluster.kill(victim)
        for victim in victims:
            self.disks[victim].power_loss()
        time.sleep(hold)
        for victim in victims:
            self.cluster.start(victim)

    def fail_fsync(self, victim: int) -> str:
        """The victim's next fsync fails (EIO): the node must stop at once with one log line
        and a non-zero exit; it is then restarted on the same disk, as a supervisor would (the
        data the failed fsync could not write is still in the page cache, marked clean)."""
        process = self.cluster.nodes[victim].process
        assert process is not None
        self.disks[victim].fail_fsync(1)
        try:
            code = process.wait(30)  # the clients keep writing: the node fsyncs soon
        except subprocess.TimeoutExpired:
            raise AssertionError(f"node {victim} went on after a failed fsync") from None
        log = self.cluster.nodes[victim].log_path.read_text(errors="replace")
        stopped = [line for line in log.splitlines()
                   if any(marker in line for marker in FSYNC_FAILED_LINES)]
        assert code != 0, f"node {victim} exited {code} after a failed fsync"
        assert stopped and "fsync failed" in stopped[-1] \
            and "Input/output error" in stopped[-1], (
                f"node {victim} logged no reason for stopping:\n{log[-2000:]}")
        self.stopped_after_fsync.append(stopped[-1])
        self.cluster.start(victim)
        return f"exit {code}: fsync failed{stopped[-1].rsplit('fsync failed', 1)[1][:80]}"

    def fill_disk(self, victim: int, hold: float) -> str:
        """The victim's disk is full for ``hold`` seconds, then space comes back. A little room
        is left at first, so that an append fits only in part (a short write, then ENOSPC)."""
        disk = self.disks[victim]
        disk.set_capacity(disk.stats()["used"] + self.rng.randrange(512))
        time.sleep(hold)
        disk.set_capacity(None)
        process = self.cluster.nodes[victim].process
        assert process is not None and process.poll() is None, (
            f"node {victim} stopped on a full disk")
        refused = _metric(self.cluster, victim, "quorum_log_appends_refused_disk_full_total")
        return f"{refused:g} appends refused, {disk.stats()['short_writes']} short writes in all"

    def replace_disk(self, victim: int) -> str:
        """KIP-856's disk replacement: kill -9, wipe, ``quorum-node format`` (a new directory
        id), restart, AddVoter of the new directory, RemoveVoter of the old one."""
        cluster = self.cluster
        old_uuid = next(v["directory_id"] for v in self.describe()["voters"]
                        if v["id"] == victim)
        log_dir = log_dir_of(cluster, victim)
        cluster.kill(victim)
        if victim in self.disks:  # a mount point stays: the new disk is the old one wiped
            for child in log_dir.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        else:
            shutil.rmtree(log_dir)
        formatted = subprocess.run(
            [sys.executable, "-m", "quorum_node.cli.node", "format", "--log-dir", str(log_dir),
             "--node-id", str(victim), "--cluster-id", cluster.cluster_id],
            capture_output=True, text=True, timeout=60, check=True)
        new_uuid = formatted.stdout.strip()
        cluster.start(victim)
        self.until(lambda: any(
            o["id"] == victim and o["directory_id"] == new_uuid and o["could_be_voter"]
            and o["lag"] == 0 for o in self.describe()["observers"]), "the new replica")
        self.change_voters("POST", "/v1/quorum/voters",
                           json.dumps({"id": victim, "directory_id": new_uuid}).encode(),
                           done_code="DUPLICATE_VOTER")
        self.change_voters("DELETE", f"/v1/quorum/voters/{victim}/{old_uuid}", None,
                           done_code="VOTER_NOT_FOUND")
        self.until(lambda: {(v["id"], v["directory_id"]) for v in self.describe()["voters"]
                            if v["id"] == victim} == {(victim, new_uuid)}, "the voter change")
        return f"directory {old_uuid} -> {new_uuid}"

    def describe(self) -> dict[str, Any]:
        """DescribeQuorum from the leader (whichever node it is by then)."""
        deadline = time.monotonic() + 30
        while True:
            leader = self.cluster.wait_for_leader(timeout_s=30)
            described = self.cluster.quorum(leader)
            if described is not None:
                return dict(described)
            assert time.monotonic() < deadline, "no leader describes the quorum"
            time.sleep(0.1)

    def change_voters(self, method: str, path: str, body: bytes | None, done_code: str) -> None:
        """A voter change through the leader, retried until done (or found done already)."""
        deadline = time.monotonic() + 60
        while True:
            leader = self.cluster.wait_for_leader(timeout_s=30)
            reply, _ = self._admin.request(leader, method, path, body)
            if reply.status == 200 or reply.code == done_code:
                return
            assert time.monotonic() < deadline, f"{method} {path}: {reply}"
            time.sleep(0.2)

    def until(self, condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not _holds(condition):
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.1)

    def report(self) -> str:
        return "\n".join(f"  {f.started:6.1f} s  {f.name:<18} node {f.node}  {f.seconds:5.1f} s"
                         f"{'  ' + f.detail if f.detail else ''}" for f in self.faults)


def _metric(cluster: ProcessCluster, node_id: int, name: str) -> float:
    with urllib.request.urlopen(f"{cluster.nodes[node_id].url}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"node {node_id} has no metric {name}")


def _holds(condition: Callable[[], bool]) -> bool:
    try:
        return condition()
    except (AssertionError, OSError, KeyError, StopIteration):
        return False


def heal_everything(cluster: ProcessCluster, network: Network) -> None:
    """Every node running, resumed and reachable."""
    network.heal_all()
    for node_id, node in cluster.nodes.items():
        if node.process is None or node.process.poll() is not None:
            cluster.start(node_id)
        else:
            cluster.signal(node_id, signal.SIGCONT)
