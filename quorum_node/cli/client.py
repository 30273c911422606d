"""``quorum-client``: use a quorum's key-value store and record log from the command line.

Exit codes: 0 done, 1 the request failed, 2 bad usage, 3 the key was not found or a cas (or
delete) did not apply. Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from quorum_node.cli.credentials import add_credential_options, credentials_from_args
from quorum_node.client import (
    DEFAULT_TIMEOUT_S,
    QuorumClient,
    QuorumClientError,
    WriteResult,
    parse_bootstrap,
)

PROG = "quorum-client"
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_FALSE = 3
BOOTSTRAP_ENV = "QUORUM_BOOTSTRAP_SERVER"
DEFAULT_BOOTSTRAP = "127.0.0.1:9091"  # the first node of `quorum-node local`

_EPILOG = f"""\
Any node will do: requests that need the leader are redirected to it. The default server is
${BOOTSTRAP_ENV}, else {DEFAULT_BOOTSTRAP}. Exit codes: 0 done, 1 the request failed,
2 bad usage, 3 key not found or cas/delete not applied.
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line instead of argparse's usage block; --help has the usage.
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _common_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    # Accepted before and after the command; SUPPRESS keeps a subcommand from resetting a value
    # given before it.
    default: Any = None if top else argparse.SUPPRESS
    parser.add_argument("--bootstrap-server", "-b", metavar="HOST:PORT[,HOST:PORT...]",
                        default=default, help=f"nodes to contact (default: ${BOOTSTRAP_ENV} "
                                              f"or {DEFAULT_BOOTSTRAP})")
    parser.add_argument("--timeout", type=_positive_float, metavar="SECONDS",
                        default=DEFAULT_TIMEOUT_S if top else argparse.SUPPRESS,
                        help=f"give up after this long, retries included "
                             f"(default: {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--json", action="store_true", default=False if top else
                        argparse.SUPPRESS, help="print the result as JSON")
    add_credential_options(parser, top=top)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Read and write a quorum's key-value store and "
                     "record log.", epilog=_EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _common_options(parser, top=True)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)

    def command(name: str, run: Callable[[QuorumClient, argparse.Namespace], int],
                summary: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=summary, description=summary, epilog=_EPILOG,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        _common_options(sub, top=False)
        sub.set_defaults(run=run)
        return sub

    put = command("put", _put, "Set a key to a value (answers once committed).")
    put.add_argument("key")
    put.add_argument("value")

    get = command("get", _get, "Print a key's value (linearizable unless --stale).")
    get.add_argument("key")
    get.add_argument("--stale", action="store_true",
                     help="read the contacted node's copy, which may be behind")

    delete = command("delete", _delete, "Delete a key.")
    delete.add_argument("key")

    cas = command("cas", _cas, "Compare-and-set: set KEY only if its value is as expected.")
    cas.add_argument("key")
    expected = cas.add_mutually_exclusive_group(required=True)
    expected.add_argument("--expected", metavar="X", help="the value KEY must have")
    expected.add_argument("--expected-absent", action="store_true",
                          help="KEY must not exist")
    value = cas.add_mutually_exclusive_group(required=True)
    value.add_argument("--value", metavar="Y", help="the value to set")
    value.add_argument("--delete", action="store_true", help="delete KEY instead")

    append = command("append", _append, "Append records (as one batch) to the record log.")
    append.add_argument("values", nargs="+", metavar="VALUE",
                        help="record values (UTF-8); '-' reads one record per line from stdin")

    read = command("read", _read, "Print committed records as lines of OFFSET<TAB>VALUE "
                   "(newlines, tabs and backslashes in values escaped).")
    read.add_argument("--offset", type=_non_negative_int, required=True, metavar="N",
                      help="the first offset to read")
    read.add_argument("--max-records", type=_positive_int, default=100, metavar="M",
                      help="at most this many records (default: 100)")
    read.add_argument("--wait-ms", type=_non_negative_int, default=0, metavar="W",
                      help="wait up to W ms for a record to be committed at N (default: 0)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, or a usage error already printed
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    bootstrap = args.bootstrap_server or os.environ.get(BOOTSTRAP_ENV) or DEFAULT_BOOTSTRAP
    try:
        credentials = credentials_from_args(args)
    except ValueError as error:
        return _fail(str(error), EXIT_USAGE)
    try:
        servers = parse_bootstrap(bootstrap, "https" if credentials.uses_tls else "http")
    except ValueError as error:
        return _fail(f"--bootstrap-server: {error}", EXIT_USAGE)
    run: Callable[[QuorumClient, argparse.Namespace], int] = args.run
    try:
        with QuorumClient(servers, timeout_s=args.timeout, credentials=credentials) as client:
            return run(client, args)
    except QuorumClientError as error:
        return _fail(str(error), EXIT_FAILED)
    except ValueError as error:  # refused before anything was sent
        return _fail(str(error), EXIT_USAGE)
    except KeyboardInterrupt:
        return 130


def _fail(message: str, code: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return code


def _emit_json(document: Any) -> None:
    print(json.dumps(document, ensure_ascii=False))


def _write_answer(args: argparse.Namespace, result: WriteResult, yes: str, no: str) -> int:
    if args.json:
        _emit_json({"key": result.key, "applied": result.applied, "offset": result.offset,
                    "epoch": result.epoch})
    else:
        print(f"{yes if result.applied else no} (offset {result.offset})")
    return EXIT_OK if result.applied else EXIT_FALSE


def _put(client: QuorumClient, args: argparse.Namespace) -> int:
    return _write_answer(args, client.put(args.key, args.value), "OK", "not applied")


def _delete(client: QuorumClient, args: argparse.Namespace) -> int:
    return _write_answer(args, client.delete(args.key), "deleted", "not found")


def _cas(client: QuorumClient, args: argparse.Namespace) -> int:
    expected = None if args.expected_absent else args.expected
    value = None if args.delete else args.value
    return _write_answer(args, client.cas(args.key, expected, value), "applied", "not applied")


def _get(client: QuorumClient, args: argparse.Namespace) -> int:
    value = client.get(args.key, stale=args.stale)
    if args.json:
        _emit_json({"key": args.key, "value": value})
    elif value is not None:
        print(value)
    if value is None:
        if not args.json:
            print(f"{PROG}: key {args.key!r} not found", file=sys.stderr)
        return EXIT_FALSE
    return EXIT_OK


def _append(client: QuorumClient, args: argparse.Namespace) -> int:
    values: list[bytes] = []
    for value in args.values:
        if value == "-":
            values += [line.rstrip("\n").encode("utf-8") for line in sys.stdin]
        else:
            values.append(value.encode("utf-8"))
    if not values:
        raise ValueError("nothing to append (stdin was empty)")
    first, last = client.append(values)
    if args.json:
        _emit_json({"first_offset": first, "last_offset": last})
    else:
        count = last - first + 1
        print(f"appended {count} record{'s' if count != 1 else ''} at offsets {first}-{last}")
    return EXIT_OK


def _read(client: QuorumClient, args: argparse.Namespace) -> int:
    result = client.read(args.offset, max_records=args.max_records, wait_ms=args.wait_ms)
    if args.json:
        _emit_json({
            "records": [
                {"offset": record.offset, "value": base64.b64encode(record.value).decode(),
                 "text": _text(record.value), "timestamp_ms": record.timestamp_ms}
                for record in result.records
            ],
            "high_watermark": result.high_watermark,
            "next_offset": result.next_offset,
        })
        return EXIT_OK
    for record in result.records:
        escaped = record.value.replace(b"\\", b"\\\\").replace(b"\n", b"\\n") \
            .replace(b"\t", b"\\t").replace(b"\r", b"\\r")
        # Bytes that are not UTF-8 print as \xNN.
        print(f"{record.offset}\t{escaped.decode('utf-8', 'backslashreplace')}")
    return EXIT_OK


def _text(value: bytes) -> str | None:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


if __name__ == "__main__":
    sys.exit(main())
