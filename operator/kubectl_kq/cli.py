"""``kubectl kq``: status, backup, restart, pause/resume and report of a KafkaQuorum.

    kubectl kq [--kubeconfig FILE] [--context NAME] [-n NAMESPACE] COMMAND QUORUM ...

The connection is kubectl's: ``--kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``,
else the pod's service account (in a cluster); the namespace is ``-n``, else the context's, else
the service account's, else ``default``. Output goes to stdout, messages to stderr, each with one
prefix per exit status (docs/kubectl-kq.md):

    0  done
    1  kubectl kq: error: ...    the API server refused or failed, or the object is not there
    2  kubectl kq: error: ...    bad arguments (with the usage)
    3  kubectl kq: refused: ...  a safety check or the PodDisruptionBudget said no; nothing done
    4  kubectl kq: failed: ...   what --wait followed ended badly (a QuorumBackup Failed)
    5  kubectl kq: timeout: ...  --wait ran out of time (what was started goes on)
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import re
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kafka_quorum_operator import API_VERSION, GROUP, KIND, VERSION
from kafka_quorum_operator.kube import Kube, KubeError, path
from kafka_quorum_operator.resources import labels
from kubernetes import client, config
from urllib3.util.retry import Retry

from kubectl_kq import (
    BACKUP_KIND,
    BACKUP_PLURAL,
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_TIMEOUT,
    PROG,
    report,
    views,
)

JSON = dict[str, Any]
# The CRD's rule for a KafkaQuorum's name (a DNS-1035 label, its Services named after it).
NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
NAME_MAX = 57
DURATION = re.compile(r"(\d+(?:\.\d+)?)(s|m|h)?")
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# Connection failures and a server's 5xx are tried again, a few times; a create (POST) or patch
# never is once sent (a QuorumBackup's generateName would make a second one), nor an eviction's
# 429 (reported: the budget's answer).
RETRY = Retry(total=3, connect=3, read=1, status=2, backoff_factor=0.25, backoff_max=2.0,
              status_forcelist=(500, 502, 503, 504), respect_retry_after_header=True,
              raise_on_status=False)
POLL_SECONDS = 2.0


PREFIXES: Mapping[int, str] = {EXIT_ERROR: "error", EXIT_REFUSED: "refused",
                               EXIT_FAILED: "failed", EXIT_TIMEOUT: "timeout"}


class Outcome(Exception):
    """The end of a command other than success: its exit status and one line."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    def line(self) -> str:
        return f"{PROG}: {PREFIXES[self.status]}: {self}"


def quorum_name(text: str) -> str:
    if len(text) > NAME_MAX or not NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a KafkaQuorum name (a letter, then lowercase letters, digits and "
            f"'-', at most {NAME_MAX} characters)")
    return text


def node_id(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a node id (a number, 0 or more)")
    return int(text)


def duration(text: str) -> float:
    """Seconds, from 90, 90s, 5m or 1h (kubectl's --timeout units)."""
    found = DURATION.fullmatch(text)
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (such as 90s, 5m, 1h)")
    return float(found.group(1)) * {"s": 1, "m": 60, "h": 3600}[found.group(2) or "s"]


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    # The connection flags are taken before or after the command, as kubectl takes them; the
    # command's copies default to nothing so they never undo one given before it.
    connection = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    for target in (top, connection):
        target.add_argument("--kubeconfig", help="the kubeconfig file (default: $KUBECONFIG, "
                            "then ~/.kube/config, then the pod's service account)")
        target.add_argument("--context", help="the kubeconfig context (default: its current)")
        target.add_argument("-n", "--namespace", help="the quorum's namespace (default: the "
                            "context's)")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=text, description=text, parents=[connection])
        sub.add_argument("quorum", type=quorum_name, metavar="QUORUM",
                         help="the KafkaQuorum's name")
        return sub

    status = command("status", "the quorum's members, leader, lag, conditions, last "
                     "remediation and last backup")
    status.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")
    backup = command("backup", "take a backup now: create a QuorumBackup, print its name")
    backup.add_argument("--wait", action="store_true",
                        help="follow it until Completed (exit 0) or Failed (exit 4)")
    backup.add_argument("--timeout", type=duration, default=1800.0,
                        help="how long --wait waits (default 30m)")
    restart = command("restart", "restart one member's pod through the Eviction API, when "
                      "the quorum has a leader and the other voters are caught up")
    restart.add_argument("node_id", type=node_id, metavar="NODE_ID")
    restart.add_argument("--wait", action="store_true",
                         help="wait until the new pod is Ready")
    restart.add_argument("--timeout", type=duration, default=600.0,
                         help="how long --wait waits (default 10m)")
    command("pause", "set spec.paused: the operator changes nothing until resumed")
    command("resume", "clear spec.paused")
    bundle = command("report", "write a support bundle (a zip; never a Secret) and print its "
                     "file name")
    bundle.add_argument("-f", "--file", type=Path,
                        help="the zip to write (default report-kq-QUORUM-TIME.zip); never "
                        "overwritten")
    return top


# --- the connection --------------------------------------------------------------------------


def _kubeconfig_given(kubeconfig: str | None) -> bool:
    return bool(kubeconfig or os.environ.get("KUBECONFIG")) or \
        Path("~/.kube/config").expanduser().exists()


def connect(kubeconfig: str | None, context: str | None, namespace: str | None
            ) -> tuple[client.ApiClient, str]:
    """The client and the namespace, found as kubectl finds them."""
    configured = client.Configuration()
    try:
        if _kubeconfig_given(kubeconfig) or context:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=configured)
            contexts, current = config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
                config_file=kubeconfig)
            chosen = next((c for c in contexts if c["name"] == context), current) \
                if context else current
            found = (chosen or {}).get("context", {}).get("namespace")
        else:
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configured)
            found = SERVICE_ACCOUNT_NAMESPACE.read_text().strip() \
                if SERVICE_ACCOUNT_NAMESPACE.exists() else None
    except (config.ConfigException, OSError, ValueError) as error:
        raise Outcome(EXIT_ERROR, f"no usable Kubernetes configuration: {error}") from error
    configured.retries = RETRY
    return client.ApiClient(configured), namespace or found or "default"


@dataclass
class Session:
    kube: Kube
    logs: report.Logs
    namespace: str

    def quorum_path(self, name: str) -> str:
        return path("KafkaQuorum", self.namespace, name)

    def backups_path(self, name: str | None = None) -> str:
        return path("", self.namespace, name,
                    api=(f"/apis/{GROUP}/{VERSION}", BACKUP_PLURAL))

    async def quorum(self, name: str) -> JSON:
        found = await self.kube.get(self.quorum_path(name))
        if found is None:
            raise Outcome(EXIT_ERROR, f"kafkaquorum {name} not found in namespace "
                          f"{self.namespace}")
        return found

    async def pods(self, name: str) -> list[JSON]:
        return await self.kube.list(path("Pod", self.namespace), labels(name))


def _print(text: str) -> None:
    print(text, flush=True)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --- the commands ----------------------------------------------------------------------------


async def status(session: Session, args: argparse.Namespace) -> int:
    quorum = await session.quorum(args.quorum)
    pods = await session.pods(args.quorum)
    try:
        backups = await session.kube.list(session.backups_path(), {})
    except KubeError as error:
        _say(f"{PROG}: warning: the QuorumBackups could not be listed: {error}")
        backups = []
    found = views.summary(quorum, pods, backups)
    if args.output == "json":
        _print(json.dumps(found, indent=2))
    elif args.output == "yaml":
        _print(yaml.safe_dump(found, sort_keys=False).rstrip())
    else:
        _print(views.render(found))
    return EXIT_OK


async def backup(session: Session, args: argparse.Namespace) -> int:
    await session.quorum(args.quorum)
    body = {"apiVersion": API_VERSION, "kind": BACKUP_KIND,
            "metadata": {"generateName": f"{args.quorum}-", "namespace": session.namespace},
            "spec": {"quorum": args.quorum}}
    try:
        made = await session.kube.create(session.backups_path(), body)
    except KubeError as error:
        if error.status == 404:
            raise Outcome(EXIT_ERROR, f"the {BACKUP_KIND} resource is not installed "
                          f"({BACKUP_PLURAL}.{GROUP}): {error}") from error
        raise
    name = str(made["metadata"]["name"])
    _print(name)
    if not args.wait:
        return EXIT_OK
    started = time.monotonic()
    phase = None
    while True:
        current = await session.kube.get(session.backups_path(name))
        if current is None:
            raise Outcome(EXIT_FAILED, f"quorumbackup {name} was deleted")
        found = views.backup_summary(current)
        if found["phase"] != phase:
            phase = found["phase"]
            _say(f"quorumbackup {name}: {phase} after {time.monotonic() - started:.0f} s")
        if phase == "Completed":
            _print(views.backup_line(found))
            return EXIT_OK
        if phase == "Failed":
            raise Outcome(EXIT_FAILED, views.backup_line(found))
        await _pause_or_time_out(started, args.timeout, f"quorumbackup {name} is {phase}")


async def _pause_or_time_out(started: float, timeout_s: float, what: str) -> None:
    if time.monotonic() - started >= timeout_s:
        raise Outcome(EXIT_TIMEOUT, f"{what} after {timeout_s:.0f} s")
    await asyncio.sleep(POLL_SECONDS)


async def restart(session: Session, args: argparse.Namespace) -> int:
    quorum = await session.quorum(args.quorum)
    pods = await session.pods(args.quorum)
    refusal = views.restart_refusal(quorum, pods, args.node_id)
    if refusal is not None:
        raise Outcome(EXIT_REFUSED, refusal)
    old = next(p for p in pods if views.pod_node_id(p) == args.node_id)
    name = str(old["metadata"]["name"])
    if not await session.kube.evict(session.namespace, name):
        raise Outcome(EXIT_REFUSED, f"the PodDisruptionBudget allows no disruption now "
                      f"(eviction of {name} answered 429); try again later")
    _print(f"pod/{name} evicted")
    if not args.wait:
        return EXIT_OK
    started = time.monotonic()
    while True:
        current = await session.kube.get(path("Pod", session.namespace, name))
        if current is not None and current["metadata"]["uid"] != old["metadata"]["uid"] \
                and views.pod_ready(current):
            _print(f"pod/{name} Ready again after {time.monotonic() - started:.0f} s")
            return EXIT_OK
        await _pause_or_time_out(started, args.timeout, f"pod/{name} is not Ready again")


async def set_paused(session: Session, name: str, paused: bool) -> int:
    quorum = await session.quorum(name)
    word = "paused" if paused else "resumed"
    if bool((quorum.get("spec") or {}).get("paused")) == paused:
        _print(f"{KIND.lower()}.{GROUP}/{name} already {word}")
        return EXIT_OK
    if await session.kube.patch(session.quorum_path(name),
                                {"spec": {"paused": paused}}) is None:
        raise Outcome(EXIT_ERROR, f"kafkaquorum {name} was deleted")
    _print(f"{KIND.lower()}.{GROUP}/{name} {word}")
    return EXIT_OK


async def support_bundle(session: Session, args: argparse.Namespace) -> int:
    quorum = await session.quorum(args.quorum)
    now = datetime.datetime.now(datetime.UTC)
    target = args.file or report.default_file(args.quorum, now)
    if target.exists():
        raise Outcome(EXIT_ERROR, f"{target} exists; give another --file")
    bundle = await report.collect(session.kube, session.logs, args.quorum,
                                  session.namespace, quorum)
    try:
        bundle.write(target, args.quorum, session.namespace, now)
    except OSError as error:
        raise Outcome(EXIT_ERROR, f"cannot write {target}: {error}") from error
    for gap in bundle.missing:
        _say(f"{PROG}: warning: not collected: {gap}")
    _print(str(target))
    return EXIT_OK


COMMANDS: dict[str, Callable[[Session, argparse.Namespace], Awaitable[int]]] = {
    "status": status, "backup": backup, "restart": restart, "report": support_bundle,
    "pause": lambda session, args: set_paused(session, args.quorum, True),
    "resume": lambda session, args: set_paused(session, args.quorum, False),
}


async def run(args: argparse.Namespace) -> int:
    api, namespace = connect(args.kubeconfig, args.context, args.namespace)
    session = Session(Kube(api, field_manager="kubectl-kq"), report.pod_logs(api), namespace)
    try:
        return await COMMANDS[args.command](session, args)
    finally:
        session.kube.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return asyncio.run(run(args))
    except Outcome as outcome:
        _say(outcome.line())
        return outcome.status
    except KubeError as error:
        _say(f"{PROG}: error: {error}")
        return EXIT_ERROR
    except KeyboardInterrupt:
        _say(f"{PROG}: error: interrupted")
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
