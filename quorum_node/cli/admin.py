"""``quorum-admin``: describe the quorum and change its voters, like Kafka's
``kafka-metadata-quorum``.

    quorum-admin --bootstrap-server HOST:PORT[,HOST:PORT...] describe --status
    quorum-admin --bootstrap-controller HOST:CONTROLLER_PORT describe --status   # Kafka's protocol
    quorum-admin --bootstrap-server HOST:PORT describe --replication [--human-readable]
    quorum-admin describe --status --json
    quorum-admin add-voter --id 3 --uuid DIRECTORY_ID      # AddVoter (KIP-856)
    quorum-admin remove-voter --id 3 --uuid DIRECTORY_ID   # RemoveVoter
    quorum-admin remove-voter --id 5 --uuid DIRECTORY_ID --decommission   # scale down

``--bootstrap-server`` names client listeners (the HTTP admin API); ``--bootstrap-controller``,
as in Kafka, controller listeners, spoken to over Kafka's protocol as Kafka's own
``kafka-metadata-quorum`` does (``quorum_node.kafka_admin_client``): describe, add-voter and
remove-voter work either way (``status`` and ``--decommission`` need the HTTP API).
The bootstrap servers are tried in order; a non-leader redirects to the leader, which is followed.
While no leader is known (an election), the servers are retried until ``--timeout SECONDS``
(default 5 for describe, 30 for a voter change, which waits for the new voter set to commit);
when none of them accepts a connection, it fails at once. The options follow the conventions of
every ``quorum-*`` tool (``quorum_node.cli.common``). Errors are one line on stderr. Exit codes:
0 done, 1 failed (the quorum could not be described, or the voter change was refused or not
done in time), 2 bad usage, 130 interrupted.
"""

from __future__ import annotations

import argparse
import http.client
import json
import ssl
import sys
import threading
import time
import urllib.parse
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from quorum_node.addresses import address_url
from quorum_node.cli.common import (
    BOOTSTRAP_ENV,
    DEFAULT_BOOTSTRAP,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    LOCAL_DATA_DIR,
    CliError,
    CliParser,
    add_connection_options,
    add_standard_options,
    bootstrap_source,
    emit_json,
    run_cli,
    timeout_from,
    unreachable_hint,
)
from quorum_node.cli.credentials import credentials_from_args
from quorum_node.client import QuorumClient, QuorumClientError, Voter
from quorum_node.kafka_admin_client import KafkaAdminError, KafkaQuorumAdmin
from quorum_node.security.client_credentials import ClientCredentials
from quorum_node.storage.kafka_uuid import parse_uuid, to_kafka_string

PROG = "quorum-admin"
QUORUM_PATH = "/v1/quorum"
MAX_REDIRECTS = 5
DESCRIBE_TIMEOUT_S = 5.0
# A voter change waits for the new voter to catch up and for the change to commit.
VOTER_CHANGE_TIMEOUT_S = 30.0
RETRY_BACKOFF_S = 0.1
_LABEL_WIDTH = 24  # Kafka pads "ClusterId:" and the other labels to 24 columns


class AdminError(Exception):
    """The quorum could not be described; the message is one line."""


class _Refused(AdminError):
    """Nothing listens at the address: the node is stopped (or not started)."""


class _NoLeader(AdminError):
    """A server answered that no leader is known: worth retrying once an election is over."""


def _build_parser() -> CliParser:
    parser = CliParser(
        prog=PROG,
        description="Describe a quorum-node quorum (like Kafka's kafka-metadata-quorum) and "
        "change its voters.",
        epilog=f"The default servers are ${BOOTSTRAP_ENV}, else those of the quorum-node local "
        f"in ./{LOCAL_DATA_DIR}, else {DEFAULT_BOOTSTRAP}. Exit codes: "
        "0 done, 1 failed (the quorum could not be described, or the voter change was refused "
        "or not done in time), 2 bad usage, 130 interrupted.",
    )
    add_standard_options(parser)
    add_connection_options(parser, top=True, default_timeout_s=None)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    describe = _add_command(commands, "describe", "describe the quorum",
                            "Describe the quorum, as its leader sees it.")
    what = describe.add_mutually_exclusive_group(required=True)
    what.add_argument("--status", action="store_true",
                      help="leader, epoch, high watermark, lag and the voters and observers")
    what.add_argument("--replication", action="store_true",
                      help="one row per replica: offsets, lag and fetch times")
    describe.add_argument("--human-readable", action="store_true",
                          help="with --replication: timestamps as 'N ms ago'")
    _add_command(commands, "status", "every node's own status, in a table",
                 "Ask every node (the bootstrap servers, and the voters they know of) for its "
                 "own status, like etcd's endpoint status -w table: role, epoch, leader, high "
                 "watermark, log end offset, lag behind the leader, health; a node that does not "
                 "answer is listed as unreachable. Exit code 1 when a node is unreachable or "
                 "failed (the table is printed all the same).")
    for name, text in (("add-voter", "make an observer a voter (AddVoter)"),
                       ("remove-voter", "remove a voter (RemoveVoter)")):
        change = _add_command(commands, name, text,
                              f"{text[0].upper()}{text[1:]}, as KIP-856: a replica is a node id "
                              f"and the directory id its log directory was formatted with.")
        change.add_argument("--id", dest="voter_id", type=int, required=True, metavar="N",
                            help="the replica's node id")
        change.add_argument("--uuid", "--directory-id", dest="uuid", required=True,
                            metavar="DIRECTORY_ID",
                            help="the replica's directory id (22-character base64url, as "
                                 "describe prints it)")
        if name == "remove-voter":
            change.add_argument("--decommission", action="store_true",
                                help="also when it is the node id's last directory: remove "
                                     "the node from the voters (scaling down)")
    return parser


def _add_command(commands: argparse._SubParsersAction[CliParser], name: str, text: str,
                 description: str) -> CliParser:
    command = commands.add_parser(name, help=text, description=description)
    # Also accepted after the command, where people tend to put them.
    add_connection_options(command, top=False, default_timeout_s=None)
    return command


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(PROG, _build_parser(), argv, _run)


def _run(args: argparse.Namespace) -> int:
    if args.bootstrap_controller is not None:
        if args.bootstrap_server is not None:
            raise CliError("give --bootstrap-server or --bootstrap-controller, not both",
                           EXIT_USAGE, api_code="BAD_REQUEST")
        return _run_on_controllers(args)
    bootstrap, source = bootstrap_source(args)
    try:
        servers = parse_bootstrap(bootstrap)
    except ValueError as error:
        raise CliError(str(error), EXIT_USAGE, api_code="BAD_REQUEST") from None
    access = Access.of(credentials_from_args(args), bootstrap)
    try:
        return _run_command(args, servers, access)
    except CliError as error:
        if error.api_code != "UNAVAILABLE":
            raise
        raise CliError(f"{error}{unreachable_hint(source)}", error.code,
                       api_code=error.api_code, body=error.body) from None


def _run_command(args: argparse.Namespace, servers: list[tuple[str, int]],
                 access: Access) -> int:
    if args.command == "describe":
        return _describe(args, servers, timeout_from(args, DESCRIBE_TIMEOUT_S), access)
    if args.command == "status":
        return _status(args, servers, timeout_from(args, DESCRIBE_TIMEOUT_S), access)
    return _change_voters(args, servers, timeout_from(args, VOTER_CHANGE_TIMEOUT_S), access)


def _run_on_controllers(args: argparse.Namespace) -> int:
    """The command over Kafka's protocol, to the controller listeners."""
    try:
        servers = parse_bootstrap(args.bootstrap_controller, "--bootstrap-controller")
    except ValueError as error:
        raise CliError(str(error), EXIT_USAGE, api_code="BAD_REQUEST") from None
    if args.command == "status":
        raise CliError("status asks each node's own client listener: use --bootstrap-server",
                       EXIT_USAGE, api_code="BAD_REQUEST")
    if getattr(args, "decommission", False):
        raise CliError("--decommission has no field in Kafka's RemoveRaftVoter: use "
                       "--bootstrap-server (the HTTP admin API)", EXIT_USAGE,
                       api_code="BAD_REQUEST")
    credentials = credentials_from_args(args)
    if args.command == "describe":
        if args.human_readable and not args.replication:
            raise CliError("--human-readable is only valid with --replication", EXIT_USAGE,
                           api_code="BAD_REQUEST")
        admin = KafkaQuorumAdmin(servers, timeout_from(args, DESCRIBE_TIMEOUT_S), credentials)
        try:
            quorum = admin.describe()
        except KafkaAdminError as error:
            raise CliError(f"cannot describe the quorum: {error}", EXIT_FAILED,
                           api_code=error.code) from None
        _print_quorum(args, quorum)
        return 0
    voter_id, directory_id = _voter_arguments(args)
    adding = args.command == "add-voter"
    voter = f"voter {voter_id} with directory id {directory_id}"
    admin = KafkaQuorumAdmin(servers, timeout_from(args, VOTER_CHANGE_TIMEOUT_S), credentials)
    try:
        if adding:
            admin.add_voter(voter_id, directory_id)
        else:
            admin.remove_voter(voter_id, directory_id)
        voters = admin.describe()["voters"]
    except KafkaAdminError as error:
        raise CliError(f"cannot {'add' if adding else 'remove'} {voter}: {error}", EXIT_FAILED,
                       api_code=error.code) from None
    keys = [Voter(row["id"], row["directory_id"]) for row in voters]
    if args.json:
        emit_json({"error": "NONE", "id": voter_id, "directory_id": directory_id,
                   "voters": [{"id": key.id, "directory_id": key.directory_id} for key in keys]})
        return 0
    print(f"{'Added' if adding else 'Removed'} {voter}")
    print(f"{'CurrentVoters:':<{_LABEL_WIDTH}}[{', '.join(map(_voter_entry, keys))}]")
    return 0


def _voter_arguments(args: argparse.Namespace) -> tuple[int, str]:
    if args.voter_id < 0:
        raise CliError(f"--id must be a node id (>= 0), got {args.voter_id}", EXIT_USAGE,
                       api_code="BAD_REQUEST")
    try:
        return args.voter_id, to_kafka_string(parse_uuid(args.uuid))
    except ValueError as error:
        raise CliError(f"--uuid: {error}", EXIT_USAGE, api_code="BAD_REQUEST") from None


def _print_quorum(args: argparse.Namespace, quorum: dict[str, Any],
                  stopped: Collection[int] = ()) -> None:
    """``stopped``: voters whose client listener refused a connection (see ``stopped_voters``)."""
    if args.json:
        emit_json(quorum)
    elif args.status:
        print(format_status(quorum, stopped))
    else:
        print(format_replication(quorum, args.human_readable, time.time_ns() // 1_000_000))


class Access:
    """How to reach the nodes: the scheme (https once a CA or certificate is given, or a server
    is given as https://) and the credentials."""

    def __init__(self, credentials: ClientCredentials, scheme: str) -> None:
        self.credentials = credentials
        self.scheme = scheme
        self._context: ssl.SSLContext | None = None

    @classmethod
    def of(cls, credentials: ClientCredentials, bootstrap: str) -> Access:
        tls = credentials.uses_tls or "https://" in bootstrap
        return cls(credentials, "https" if tls else "http")

    def connection(self, host: str, port: int, timeout_s: float) -> http.client.HTTPConnection:
        if self.scheme == "https":
            if self._context is None:
                self._context = self.credentials.ssl_context()
            return http.client.HTTPSConnection(host, port, timeout=timeout_s,
                                               context=self._context)
        return http.client.HTTPConnection(host, port, timeout=timeout_s)


PLAIN = Access(ClientCredentials(), "http")


def _describe(args: argparse.Namespace, servers: list[tuple[str, int]], timeout_s: float,
              access: Access) -> int:
    if args.human_readable and not args.replication:
        raise CliError("--human-readable is only valid with --replication", EXIT_USAGE,
                       api_code="BAD_REQUEST")
    started = time.monotonic()
    try:
        quorum = fetch_quorum(servers, timeout_s, access)
    except AdminError as error:
        raise CliError(str(error), EXIT_FAILED, api_code="UNAVAILABLE") from None
    stopped: set[int] = set()
    if args.status and not args.json:
        remaining = timeout_s - (time.monotonic() - started)
        if remaining > 0:
            stopped = stopped_voters(servers, min(remaining, STOPPED_PROBE_S), access)
    _print_quorum(args, quorum, stopped)
    return 0


NODE_PATH = "/v1/node"
STATUS_COLUMNS = ("ENDPOINT", "ID", "DIRECTORY ID", "ROLE", "EPOCH", "LEADER", "HIGH WATERMARK",
                  "LOG END", "LAG", "HEALTH")


def node_statuses(servers: Sequence[tuple[str, int]], timeout_s: float,
                  access: Access = PLAIN) -> list[dict[str, Any]]:
    """Every node's ``GET /v1/node``: the servers given, then the voters' client endpoints that
    the nodes which answered name. Each entry has ``endpoint`` and ``reachable`` (and ``error``
    when not), then the node's answer, and ``lag`` behind the leader's log end (-1 unknown)."""
    deadline = time.monotonic() + timeout_s
    to_ask = [address_url(access.scheme, host, port) for host, port in servers]
    rows: dict[str, dict[str, Any]] = {}
    while to_ask:
        url = to_ask.pop(0)
        if url in rows:
            continue
        try:
            status, _, body = _get(url + NODE_PATH, deadline, access)
            answer = _json(url, body)
            if status != 200 or not isinstance(answer, dict) or "node_id" not in answer:
                message = answer.get("message") if isinstance(answer, dict) else None
                raise AdminError(f"HTTP {status}" + (f": {message}" if message else ""))
        except AdminError as error:
            rows[url] = {"endpoint": url, "reachable": False,
                         "error": str(error).removeprefix(f"{url}{NODE_PATH}: "),
                         "refused": isinstance(error, _Refused)}
            continue
        rows[url] = {"endpoint": url, "reachable": True, **answer}
        to_ask += [e["url"] for e in answer.get("client_endpoints", [])
                   if isinstance(e, dict) and isinstance(e.get("url"), str)]
    answered = [row for row in rows.values() if row["reachable"]]
    leaders = [row for row in answered if row.get("state") == "leader"]
    leader = max(leaders, key=lambda row: row["epoch"]) if leaders else None
    for row in answered:
        row["lag"] = -1 if leader is None else leader["log_end_offset"] - row["log_end_offset"]
    return sorted(rows.values(), key=lambda row: (row.get("node_id", 1 << 31), row["endpoint"]))


# How long describe --status spends asking the voters' client listeners whether they are up.
STOPPED_PROBE_S = 1.0


def stopped_voters(servers: Sequence[tuple[str, int]], timeout_s: float,
                   access: Access = PLAIN) -> set[int]:
    """The ids of the nodes whose client listener refuses connections: stopped, which their
    leader notices only once they have not fetched for UNREACHABLE_AFTER_MS. Only a refusal
    counts (a timeout may be a firewall between this host and the node, not a stopped node)."""
    rows = node_statuses(servers, timeout_s, access)
    ids = {endpoint["url"]: endpoint["id"] for row in rows if row["reachable"]
           for endpoint in row.get("client_endpoints", [])
           if isinstance(endpoint, dict) and isinstance(endpoint.get("id"), int)}
    return {ids[row["endpoint"]] for row in rows
            if not row["reachable"] and row.get("refused") and row["endpoint"] in ids}


def format_node_statuses(rows: Sequence[dict[str, Any]]) -> str:
    def cells(row: dict[str, Any]) -> list[str]:
        if not row["reachable"]:
            return [row["endpoint"], *["-"] * 8, f"unreachable: {row['error']}"]
        role = f"{row['state']} ({'voter' if row['is_voter'] else 'observer'})"
        leader = "-" if row["leader_id"] is None else str(row["leader_id"])
        health = "ok" if row["failure"] is None else f"failed: {row['failure']}"
        return [row["endpoint"], str(row["node_id"]), row["directory_id"], role,
                str(row["epoch"]), leader, str(row["high_watermark"]),
                str(row["log_end_offset"]), str(row["lag"]), health]

    table = [list(STATUS_COLUMNS), *map(cells, rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(STATUS_COLUMNS))]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    lines = [rule]
    for index, line in enumerate(table):
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True))
                     + " |")
        if index == 0:
            lines.append(rule)
    lines.append(rule)
    return "\n".join(lines)


def _status(args: argparse.Namespace, servers: list[tuple[str, int]], timeout_s: float,
            access: Access) -> int:
    rows = node_statuses(servers, timeout_s, access)
    if not any(row["reachable"] for row in rows):
        raise CliError("no node reachable: " + "; ".join(f"{row['endpoint']}: {row['error']}"
                                                         for row in rows),
                       EXIT_FAILED, api_code="UNAVAILABLE")
    if args.json:
        emit_json(rows)
    else:
        print(format_node_statuses(rows))
    healthy = all(row["reachable"] and row["failure"] is None for row in rows)
    return 0 if healthy else EXIT_FAILED


def _change_voters(args: argparse.Namespace, servers: list[tuple[str, int]],
                   timeout_s: float, access: Access) -> int:
    _, directory_id = _voter_arguments(args)
    adding = args.command == "add-voter"
    voter = f"voter {args.voter_id} with directory id {directory_id}"
    client = QuorumClient([address_url(access.scheme, host, port) for host, port in servers],
                          timeout_s, credentials=access.credentials, fail_fast=True)
    outcome: list[list[Voter] | QuorumClientError] = []

    def change() -> None:
        try:
            if adding:
                outcome.append(client.add_voter(args.voter_id, directory_id))
            else:
                outcome.append(client.remove_voter(args.voter_id, directory_id,
                                                   decommission=args.decommission))
        except QuorumClientError as error:
            outcome.append(error)
        finally:
            client.close()

    # The change runs aside, so that a wait of more than a second is told as it goes.
    worker = threading.Thread(target=change, name="voter-change", daemon=True)
    started = time.monotonic()
    worker.start()
    try:
        next_report = started + PROGRESS_EVERY_S
        while worker.is_alive():
            worker.join(min(0.1, max(0.0, next_report - time.monotonic())))
            if worker.is_alive() and time.monotonic() >= next_report:
                print(f"{PROG}: {'adding' if adding else 'removing'} {voter}: "
                      f"{time.monotonic() - started:.0f} s; "
                      f"{_progress(servers, access, args.voter_id, directory_id, adding)}",
                      file=sys.stderr, flush=True)
                next_report += PROGRESS_EVERY_S
    except KeyboardInterrupt:
        raise CliError(f"interrupted: the change of {voter} may still complete (quorum-admin "
                       "describe --status tells)", EXIT_INTERRUPTED,
                       api_code="OUTCOME_UNKNOWN") from None
    result = outcome[0]
    if isinstance(result, QuorumClientError):
        raise CliError(f"cannot {'add' if adding else 'remove'} {voter}: {result.code}: "
                       f"{result}", EXIT_FAILED, api_code=result.code, body=result.body)
    voters = result
    if args.json:
        emit_json(client.last_answer)
        return 0
    print(f"{'Added' if adding else 'Removed'} {voter}")
    print(f"{'CurrentVoters:':<{_LABEL_WIDTH}}[{', '.join(map(_voter_entry, voters))}]")
    return 0


PROGRESS_EVERY_S = 1.0


def _progress(servers: Sequence[tuple[str, int]], access: Access, voter_id: int,
              directory_id: str, adding: bool) -> str:
    """Where the change stands, as the leader describes the quorum: how far the replica is
    behind (it must catch up before it is added), or that it is still a voter."""
    try:
        quorum = fetch_quorum(servers, 0.5, access)
    except AdminError as error:
        return f"the quorum cannot be described now ({error})"
    leader = _leader_row(quorum)
    leader_end = leader["log_end_offset"] if leader is not None else -1
    for kind, rows in (("a voter", quorum["voters"]), ("an observer", quorum["observers"])):
        for row in rows:
            if row["id"] == voter_id and row["directory_id"] == directory_id:
                if row["log_end_offset"] < 0:
                    return f"{kind}, not fetching from leader {quorum['leader_id']} yet"
                return (f"{kind} at offset {row['log_end_offset']} of leader "
                        f"{quorum['leader_id']}'s {leader_end} (lag {row['lag']})")
    return ("not fetching from the leader (is the node running, on that directory?)" if adding
            else "no longer listed by the leader")


def _voter_entry(voter: Voter) -> str:
    return json.dumps({"id": voter.id, "directoryId": voter.directory_id})


# --- talking to the nodes --------------------------------------------------------------------


def parse_bootstrap(value: str, option: str = "--bootstrap-server") -> list[tuple[str, int]]:
    """``host:port[,host:port...]``; IPv6 literals in brackets; an ``http://`` prefix is allowed."""
    servers: list[tuple[str, int]] = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry:
            continue
        address = entry.removeprefix("http://").removeprefix("https://").rstrip("/")
        host, colon, port = address.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not (colon and host and port.isdigit() and 1 <= int(port) <= 65535):
            raise ValueError(f"{option}: {entry!r} is not HOST:PORT")
        servers.append((host, int(port)))
    if not servers:
        raise ValueError(f"{option} is empty: expected HOST:PORT[,HOST:PORT...]")
    return servers


def fetch_quorum(servers: Sequence[tuple[str, int]], timeout_s: float,
                 access: Access = PLAIN) -> dict[str, Any]:
    """The leader's DescribeQuorum answer, asked of the first server that can give it."""
    deadline = time.monotonic() + timeout_s
    while True:
        problems: list[str] = []
        election = False
        for host, port in servers:
            try:
                return _get_quorum(address_url(access.scheme, host, port) + QUORUM_PATH, deadline,
                                   access)
            except _NoLeader as error:
                election = True
                problems.append(str(error))
            except AdminError as error:
                problems.append(str(error))
        if not election or time.monotonic() + RETRY_BACKOFF_S >= deadline:
            raise AdminError("cannot describe the quorum: " + "; ".join(problems))
        time.sleep(RETRY_BACKOFF_S)


def _get_quorum(url: str, deadline: float, access: Access) -> dict[str, Any]:
    for _ in range(MAX_REDIRECTS + 1):
        status, headers, body = _get(url, deadline, access)
        if status in (301, 302, 303, 307, 308) and "location" in headers:
            url = urllib.parse.urljoin(url, headers["location"])
            continue
        answer = _json(url, body)
        if status == 200:
            return _checked(url, answer)
        code = answer.get("code") if isinstance(answer, dict) else None
        message = answer.get("message", code) if isinstance(answer, dict) else None
        if status == 503 and code == "NO_LEADER":
            raise _NoLeader(f"{url}: {message}")
        raise AdminError(f"{url}: HTTP {status}" + (f": {message}" if message else ""))
    raise AdminError(f"{url}: more than {MAX_REDIRECTS} redirects")


def _get(url: str, deadline: float, access: Access) -> tuple[int, dict[str, str], bytes]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != access.scheme or parts.hostname is None:
        raise AdminError(f"{url}: not an {access.scheme}:// URL")
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise AdminError(f"{url}: timed out")
    connection = access.connection(parts.hostname, parts.port or 443, remaining)
    try:
        connection.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""),
                           headers={"Accept": "application/json",
                                    **access.credentials.headers()})
        response = connection.getresponse()
        body = response.read()
        headers = {name.lower(): value for name, value in response.getheaders()}
        return response.status, headers, body
    except TimeoutError:
        raise AdminError(f"{url}: timed out") from None
    except ConnectionRefusedError as error:
        raise _Refused(f"{url}: {error.strerror or error}") from None
    except OSError as error:
        raise AdminError(f"{url}: {error.strerror or error}") from None
    except http.client.HTTPException as error:
        raise AdminError(f"{url}: bad HTTP answer: {error!r}") from None
    finally:
        connection.close()


def _json(url: str, body: bytes) -> Any:
    try:
        return json.loads(body) if body else None
    except ValueError:
        return None if not body else {"message": body.decode(errors="replace").strip()[:200]}


_REPLICA_FIELDS = ("id", "directory_id", "log_end_offset", "lag", "last_fetch_timestamp",
                   "last_caught_up_timestamp")
_QUORUM_FIELDS = ("cluster_id", "leader_id", "leader_epoch", "high_watermark", "voters",
                  "observers")


def _checked(url: str, answer: Any) -> dict[str, Any]:
    """Fail with one line now rather than with a KeyError while printing."""
    ok = isinstance(answer, dict) and all(key in answer for key in _QUORUM_FIELDS) and all(
        isinstance(replica, dict) and all(key in replica for key in _REPLICA_FIELDS)
        for replica in [*answer["voters"], *answer["observers"]]
    )
    if not ok:
        raise AdminError(f"{url}: not a DescribeQuorum answer")
    result: dict[str, Any] = answer
    return result


# --- output ----------------------------------------------------------------------------------


def _leader_row(quorum: dict[str, Any]) -> dict[str, Any] | None:
    return next((v for v in quorum["voters"] if v["id"] == quorum["leader_id"]), None)


# A voter that has not fetched for this long (by the leader's clock) is counted unreachable:
# followers fetch at least every fetch timeout's fraction (a 500 ms long-poll).
UNREACHABLE_AFTER_MS = 5000


def unreachable_voters(quorum: dict[str, Any],
                       stopped: Collection[int] = ()) -> list[dict[str, Any]]:
    """The voters the leader has not heard from: no fetch in this epoch, or none for
    UNREACHABLE_AFTER_MS before the leader's own row (which carries its clock); and the
    ``stopped`` ones (``stopped_voters``), which the leader has not noticed yet."""
    leader = _leader_row(quorum)
    now_ms = leader["last_fetch_timestamp"] if leader is not None else -1
    return [
        voter for voter in quorum["voters"]
        if voter is not leader and (
            voter["id"] in stopped
            or voter["log_end_offset"] < 0 or voter["last_fetch_timestamp"] < 0
            or (now_ms >= 0 and now_ms - voter["last_fetch_timestamp"] > UNREACHABLE_AFTER_MS))
    ]


def max_follower_lag(quorum: dict[str, Any],
                     stopped: Collection[int] = ()) -> tuple[int, int]:
    """Kafka's MaxFollowerLag and MaxFollowerLagTimeMs over the voters the leader hears from
    (``unreachable_voters`` are listed apart, not allowed to hide the others' lag): the laggiest
    one's offsets behind the leader, and how much longer ago it was last caught up (0 if the
    leader is the laggiest, -1 if unknown)."""
    leader = _leader_row(quorum)
    if leader is None or not quorum["voters"]:
        return -1, -1
    unreachable = {id(voter) for voter in unreachable_voters(quorum, stopped)}
    # The leader first, so that it wins ties: no follower is behind then.
    voters = [leader, *(v for v in quorum["voters"] if v is not leader
                        and id(v) not in unreachable)]
    laggiest = min(voters, key=lambda v: v["log_end_offset"])
    lag = leader["log_end_offset"] - laggiest["log_end_offset"]
    if laggiest is leader:
        return lag, 0
    leader_caught_up = leader["last_caught_up_timestamp"]
    follower_caught_up = laggiest["last_caught_up_timestamp"]
    if leader_caught_up < 0 or follower_caught_up < 0:
        return lag, -1
    return lag, leader_caught_up - follower_caught_up


def _replica_entry(replica: dict[str, Any]) -> str:
    endpoint = replica.get("endpoint")
    return json.dumps({"id": replica["id"], "directoryId": replica["directory_id"],
                       "endpoints": [endpoint] if endpoint else []})


def _replica_list(replicas: Iterable[dict[str, Any]]) -> str:
    return "[" + ", ".join(map(_replica_entry, replicas)) + "]"


def format_status(quorum: dict[str, Any], stopped: Collection[int] = ()) -> str:
    lag, lag_time_ms = max_follower_lag(quorum, stopped)
    lines = [
        ("ClusterId", quorum["cluster_id"]),
        ("LeaderId", quorum["leader_id"]),
        ("LeaderEpoch", quorum["leader_epoch"]),
        ("HighWatermark", quorum["high_watermark"]),
        ("MaxFollowerLag", lag),
        ("MaxFollowerLagTimeMs", lag_time_ms),
        ("CurrentVoters", _replica_list(quorum["voters"])),
        ("CurrentObservers", _replica_list(quorum["observers"])),
        # KIP-856: the observers that AddVoter could make voters (the leader decides which).
        ("CouldBeVoters", _replica_list(o for o in quorum["observers"]
                                        if o.get("could_be_voter"))),
        # A node's replaced disk, listed until the leader forgets it: never one to add back.
        ("RetiredObservers", _replica_list(o for o in quorum["observers"] if o.get("retired"))),
        # Not in MaxFollowerLag: a voter the leader does not hear from.
        ("UnreachableVoters", _replica_list(unreachable_voters(quorum, stopped))),
    ]
    return "\n".join(f"{label + ':':<{_LABEL_WIDTH}}{value}" for label, value in lines)


REPLICATION_COLUMNS = ("NodeId", "DirectoryId", "LogEndOffset", "Lag", "LastFetchTimestamp",
                       "LastCaughtUpTimestamp", "Status")


def format_replication(quorum: dict[str, Any], human_readable: bool, now_ms: int) -> str:
    """Kafka's table: the leader first, then the other voters, then the observers."""
    leader = _leader_row(quorum)
    others = sorted((v for v in quorum["voters"] if v is not leader), key=lambda v: v["id"])
    rows: list[tuple[dict[str, Any], str]] = [
        *([(leader, "Leader")] if leader is not None else []),
        *((v, "Follower") for v in others),
        *((o, "Observer (retired)" if o.get("retired") else "Observer")
          for o in sorted(quorum["observers"], key=lambda o: o["id"])),
    ]

    def timestamp(value: int) -> str:
        if not human_readable:
            return str(value)
        return "unknown" if value < 0 else f"{max(0, now_ms - value)} ms ago"

    table = [list(REPLICATION_COLUMNS)] + [
        [str(replica["id"]), replica["directory_id"] or "-", str(replica["log_end_offset"]),
         str(replica["lag"]), timestamp(replica["last_fetch_timestamp"]),
         timestamp(replica["last_caught_up_timestamp"]), status]
        for replica, status in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(REPLICATION_COLUMNS))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in table
    )


if __name__ == "__main__":
    sys.exit(main())
