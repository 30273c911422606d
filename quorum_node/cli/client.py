"""``quorum-client``: use a quorum's key-value store and record log from the command line.

It follows the conventions of every ``quorum-*`` tool (``quorum_node.cli.common``): ``-b``,
``--timeout SECONDS``, ``--json`` printing the API's answers and error bodies, ``-`` for stdin,
``--version``, ``--print-completion``. Exit codes: 0 done, 1 the request failed, 2 bad usage,
3 the key was not found or a cas (or delete, or a txn's compares) did not apply, 130
interrupted. Errors are one line on stderr.

``txn`` reads a transaction from stdin as etcdctl's ``txn`` does: compares, a blank line, the
success requests, a blank line, the failure requests, a blank line (or the end)::

    mod("k1") > "0"
    value("k2") = "v"

    put k1 "a value"
    del k2

    get k1

A compare is ``value|version|mod("KEY") =|!=|<|> "OPERAND"`` (``mod`` is the modification
offset; keys and operands are JSON strings); a request is ``put KEY VALUE``, ``del KEY`` or
``get KEY`` (words split as a shell does). Input starting with ``{`` is instead the API's JSON
body (``POST /v1/txn``). It prints SUCCESS or FAILURE, then each request's answer (``OK`` for a
put, the number of keys deleted, a get's key and value), separated by blank lines; ``--json``
prints the API's answer.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from quorum_node.cli.common import (
    BOOTSTRAP_ENV,
    DEFAULT_BOOTSTRAP,
    EXIT_FAILED,
    EXIT_FALSE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    LOCAL_DATA_DIR,
    STDIN_VALUE,
    CliError,
    CliParser,
    add_connection_options,
    add_protocol_option,
    add_standard_options,
    bootstrap_source,
    emit_json,
    non_negative_int,
    positive_int,
    read_value,
    run_cli,
    timeout_from,
    unreachable_hint,
)
from quorum_node.cli.credentials import credentials_from_args
from quorum_node.client import (
    DEFAULT_TIMEOUT_S,
    DEFAULT_WINDOW,
    QuorumClient,
    QuorumClientError,
    TxnResult,
    WriteResult,
    parse_bootstrap,
)

PROG = "quorum-client"
__all__ = ["EXIT_FAILED", "EXIT_FALSE", "EXIT_OK", "EXIT_USAGE", "main"]

_EPILOG = f"""\
Any node will do: requests that need the leader are redirected to it. The default servers are
${BOOTSTRAP_ENV}, else those of the quorum-node local in ./{LOCAL_DATA_DIR}, else
{DEFAULT_BOOTSTRAP}. A value of '-' is read from stdin. Exit codes:
0 done, 1 the request failed, 2 bad usage, 3 key not found or cas/delete/txn not applied,
{EXIT_INTERRUPTED} interrupted (a write may still commit: read it back).
"""


def _build_parser() -> argparse.ArgumentParser:
    parser = CliParser(prog=PROG, description="Read and write a quorum's key-value store and "
                       "record log.", epilog=_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_standard_options(parser)
    add_connection_options(parser, top=True, default_timeout_s=DEFAULT_TIMEOUT_S)
    add_protocol_option(parser, top=True)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)

    def command(name: str, run: Callable[[QuorumClient, argparse.Namespace], int],
                summary: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=summary, description=summary, epilog=_EPILOG,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        add_connection_options(sub, top=False, default_timeout_s=DEFAULT_TIMEOUT_S)
        add_protocol_option(sub, top=False)
        sub.set_defaults(run=run)
        return sub

    put = command("put", _put, "Set a key to a value (answers once committed).")
    put.add_argument("key")
    put.add_argument("value", nargs="?", help="the value; '-' reads it from stdin")
    put.add_argument("--file", "-f", type=Path, metavar="PATH", help="read the value from PATH")

    get = command("get", _get, "Print a key's value (linearizable unless --stale).")
    get.add_argument("key")
    get.add_argument("--stale", action="store_true",
                     help="read the contacted node's copy, which may be behind")

    load = command("load", _load, "Put many keys at once, pipelined: one KEY<TAB>VALUE line each, "
                                  "as list prints them (UTF-8; in keys and values a newline, tab, "
                                  "carriage return and backslash escaped as \\n, \\t, \\r, "
                                  "\\\\).")
    load.add_argument("file", metavar="FILE", help="the lines ('-': stdin)")
    load.add_argument("--window", type=positive_int, default=DEFAULT_WINDOW, metavar="N",
                      help=f"puts in flight at once (default: {DEFAULT_WINDOW})")

    delete = command("delete", _delete, "Delete a key.")
    delete.add_argument("key")

    cas = command("cas", _cas, "Compare-and-set: set KEY only if its value is as expected.")
    cas.add_argument("key")
    expected = cas.add_mutually_exclusive_group(required=True)
    expected.add_argument("--expected", metavar="X", help="the value KEY must have")
    expected.add_argument("--expected-absent", action="store_true",
                          help="KEY must not exist")
    value = cas.add_mutually_exclusive_group(required=True)
    value.add_argument("--value", metavar="Y", help="the value to set ('-': stdin)")
    value.add_argument("--value-file", type=Path, metavar="PATH",
                       help="the value to set, read from PATH")
    value.add_argument("--delete", action="store_true", help="delete KEY instead")

    txn = command("txn", _txn, "A multi-key transaction, read from stdin as etcdctl's txn "
                  "reads it: compares, a blank line, success requests, a blank line, failure "
                  "requests (or the API's JSON body); exit 3 if the compares did not hold.")
    txn.add_argument("--interactive", "-i", action="store_true",
                     help="prompt for each part on stderr (as etcdctl txn -i)")

    listing = command("list", _list, "Print the keys under a prefix with their values, "
                      "KEY<TAB>VALUE, in key order (linearizable unless --stale); newlines, "
                      "tabs, carriage returns and backslashes in keys and values escaped, as "
                      "load reads them.")
    listing.add_argument("prefix", nargs="?", default="", help="(default: every key)")
    listing.add_argument("--limit", type=positive_int, default=100, metavar="N",
                         help="the first N keys; with --all, keys asked for a page (default: "
                              "100)")
    listing.add_argument("--start-after", metavar="KEY", help="start after this key (the "
                         "previous page's last)")
    listing.add_argument("--all", action="store_true", help="every page, not just the first")
    listing.add_argument("--keys-only", action="store_true", help="print the keys only")
    listing.add_argument("--stale", action="store_true",
                         help="read the contacted node's copy, which may be behind")

    watch = command("watch", _watch, "Print each change of a key, or of the keys under "
                    "--prefix, as OFFSET<TAB>put|delete<TAB>KEY<TAB>VALUE (escaped as list "
                    "prints them), until Ctrl-C.")
    watch.add_argument("key", nargs="?")
    watch.add_argument("--prefix", metavar="P", help="watch every key starting with P")
    watch.add_argument("--offset", type=non_negative_int, metavar="N",
                       help="from this offset (default: changes from now on)")
    watch.add_argument("--once", action="store_true",
                       help="stop after the first answer (a long-poll of up to --wait-ms)")
    watch.add_argument("--wait-ms", type=positive_int, default=10_000, metavar="W",
                       help="each long-poll waits up to W ms (default: 10000)")

    append = command("append", _append, "Append records (as one batch) to the record log.")
    append.add_argument("values", nargs="*", metavar="VALUE",
                        help="record values (UTF-8); '-' reads one record per line from stdin")
    append.add_argument("--file", "-f", type=Path, metavar="PATH",
                        help="read one record per line from PATH")

    read = command("read", _read, "Print committed records as lines of OFFSET<TAB>VALUE "
                   "(newlines, tabs and backslashes in values escaped).")
    read.add_argument("--offset", type=non_negative_int, required=True, metavar="N",
                      help="the first offset to read")
    read.add_argument("--max-records", type=positive_int, default=100, metavar="M",
                      help="at most this many records (default: 100)")
    read.add_argument("--wait-ms", type=non_negative_int, default=0, metavar="W",
                      help="wait up to W ms for a record to be committed at N (default: 0)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(PROG, _build_parser(), argv, _run)


def _run(args: argparse.Namespace) -> int:
    credentials = credentials_from_args(args)
    bootstrap, source = bootstrap_source(args)
    try:
        servers = parse_bootstrap(bootstrap, "https" if credentials.uses_tls else "http")
    except ValueError as error:
        raise CliError(f"--bootstrap-server: {error}", EXIT_USAGE,
                       api_code="BAD_REQUEST") from None
    run: Callable[[QuorumClient, argparse.Namespace], int] = args.run
    try:
        with QuorumClient(servers, timeout_s=timeout_from(args, DEFAULT_TIMEOUT_S),
                          credentials=credentials, fail_fast=True,
                          protocol=args.protocol) as client:
            try:
                return run(client, args)
            except KeyboardInterrupt:
                if args.run in (_put, _load, _delete, _cas, _append, _txn):
                    raise CliError("interrupted: the write may still commit (read it back to "
                                   "know)", EXIT_INTERRUPTED, api_code="OUTCOME_UNKNOWN") \
                        from None
                raise
    except QuorumClientError as error:
        message = str(error)
        if error.code == "UNAVAILABLE":
            message += unreachable_hint(source)
        raise CliError(message, EXIT_FAILED, api_code=error.code, body=error.body) from None




def _write_answer(client: QuorumClient, args: argparse.Namespace, result: WriteResult,
                  yes: str, no: str) -> int:
    if args.json:
        emit_json(client.last_answer)
    else:
        print(f"{yes if result.applied else no} (offset {result.offset})")
    return EXIT_OK if result.applied else EXIT_FALSE


def _put(client: QuorumClient, args: argparse.Namespace) -> int:
    value = read_value(args.value, args.file)
    return _write_answer(client, args, client.put(args.key, value), "OK", "not applied")


def _load(client: QuorumClient, args: argparse.Namespace) -> int:
    text = read_value(args.file, None) if args.file == STDIN_VALUE \
        else read_value(None, Path(args.file))
    items: list[tuple[str, str]] = []
    # Lines end at a newline only (str.splitlines would also split at \x0b, \x1c, \x85,
    # \u2028 ..., which a key or value may hold unescaped); a CRLF file's \r goes too, as
    # list escapes every carriage return of its own.
    for number, raw_line in enumerate(text.split("\n"), 1):
        line = raw_line.removesuffix("\r")
        if not line:
            continue
        key, tab, value = line.partition("\t")
        if not tab or not key:
            raise CliError(f"line {number}: expected KEY<TAB>VALUE, got {line[:60]!r}",
                           EXIT_USAGE, api_code="BAD_REQUEST")
        items.append((_unescape(key), _unescape(value)))
    if not items:
        raise CliError("nothing to load (no KEY<TAB>VALUE line)", EXIT_USAGE,
                       api_code="BAD_REQUEST")
    results = client.put_many(items, window=args.window)
    if args.json:
        for result in results:
            emit_json({"key": result.key, "applied": result.applied, "offset": result.offset,
                       "epoch": result.epoch})
    else:
        offsets = [result.offset for result in results]
        print(f"OK {len(results)} key{'s' if len(results) != 1 else ''} (offsets "
              f"{min(offsets)}-{max(offsets)})")
    return EXIT_OK


def _unescape(text: str) -> str:
    """``_escape`` undone."""
    out: list[str] = []
    characters = iter(text)
    for character in characters:
        if character != "\\":
            out.append(character)
            continue
        following = next(characters, "")
        out.append({"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}.get(
            following, "\\" + following))
    return "".join(out)


def _delete(client: QuorumClient, args: argparse.Namespace) -> int:
    return _write_answer(client, args, client.delete(args.key), "deleted", "not found")


def _cas(client: QuorumClient, args: argparse.Namespace) -> int:
    expected = None if args.expected_absent else args.expected
    value = None if args.delete else read_value(args.value, args.value_file)
    return _write_answer(client, args, client.cas(args.key, expected, value), "applied",
                         "not applied")


# etcdctl's compare: TARGET("KEY") RESULT "OPERAND", the key and operand JSON strings.
_COMPARE_LINE = re.compile(r'\s*(\w+)\(\s*("(?:[^"\\]|\\.)*")\s*\)\s*(!=|=|<|>)\s*(\S.*?)\s*')
_COMPARE_TARGETS = {"value": "value", "version": "version", "ver": "version",
                    "mod": "mod_offset"}
_TXN_PROMPTS = ("compares:", "success requests (get, put, del):",
                "failure requests (get, put, del):")


def _txn(client: QuorumClient, args: argparse.Namespace) -> int:
    document = _txn_input(args.interactive)
    result = client.txn(document.get("compare", ()), document.get("success", ()),
                        document.get("failure", ()))
    if args.json:
        emit_json(client.last_answer)
    else:
        _print_txn(result)
    return EXIT_OK if result.succeeded else EXIT_FALSE


def _txn_input(interactive: bool) -> dict[str, Any]:
    """The txn read from stdin: the API's JSON body, or etcdctl's three blank-line-ended
    parts."""
    if not interactive:
        text = read_value(STDIN_VALUE, None, what="txn")
        if text.lstrip().startswith("{"):
            try:
                document = json.loads(text)
            except ValueError as error:
                raise CliError(f"the txn is not valid JSON: {error}", EXIT_USAGE,
                               api_code="BAD_REQUEST") from None
            if not isinstance(document, dict):
                raise CliError("the txn's JSON must be an object", EXIT_USAGE,
                               api_code="BAD_REQUEST")
            return document
        lines = iter(enumerate(text.split("\n"), 1))
    else:
        lines = iter(enumerate(iter(sys.stdin.readline, ""), 1))
    parts: list[list[tuple[int, str]]] = []
    for prompt in _TXN_PROMPTS:
        if interactive:
            print(prompt, file=sys.stderr, flush=True)
        part: list[tuple[int, str]] = []
        for number, line in lines:
            if not line.strip():
                break
            part.append((number, line.rstrip("\r\n")))
        parts.append(part)
    compares, success, failure = parts
    return {"compare": [_parse_compare(number, line) for number, line in compares],
            "success": [_parse_request(number, line) for number, line in success],
            "failure": [_parse_request(number, line) for number, line in failure]}


def _txn_usage(number: int, message: str) -> CliError:
    return CliError(f"line {number}: {message}", EXIT_USAGE, api_code="BAD_REQUEST")


def _parse_compare(number: int, line: str) -> dict[str, Any]:
    match = _COMPARE_LINE.fullmatch(line)
    if match is None:
        raise _txn_usage(number, f'expected TARGET("KEY") =|!=|<|> "OPERAND", got {line[:60]!r}')
    name, quoted_key, result, quoted_operand = match.groups()
    target = _COMPARE_TARGETS.get(name)
    if target is None:
        raise _txn_usage(number, f"unknown compare target {name!r} (value, version or mod)")
    try:
        key = json.loads(quoted_key)
        operand: Any = json.loads(quoted_operand) if quoted_operand.startswith('"') \
            else quoted_operand
    except ValueError as error:
        raise _txn_usage(number, f"not a JSON string: {error}") from None
    if target != "value":
        try:
            operand = int(operand)
        except ValueError:
            raise _txn_usage(number, f"a {name} compare needs an integer, got "
                                     f"{operand!r}") from None
    return {"key": key, "target": target, "result": result, target: operand}


def _parse_request(number: int, line: str) -> dict[str, Any]:
    try:
        words = shlex.split(line)
    except ValueError as error:
        raise _txn_usage(number, str(error)) from None
    if words[:1] == ["put"] and len(words) == 3:
        return {"op": "put", "key": words[1], "value": words[2]}
    if words[:1] in (["del"], ["get"]) and len(words) == 2:
        return {"op": "delete" if words[0] == "del" else "get", "key": words[1]}
    raise _txn_usage(number, f"expected 'put KEY VALUE', 'del KEY' or 'get KEY', got "
                             f"{line[:60]!r}")


def _print_txn(result: TxnResult) -> None:
    """As etcdctl prints a txn: SUCCESS or FAILURE, then each response after a blank line."""
    print("SUCCESS" if result.succeeded else "FAILURE")
    for response in result.responses:
        print()
        if response["op"] == "put":
            print("OK")
        elif response["op"] == "delete":
            print(1 if response["deleted"] else 0)
        elif response["value"] is not None:
            _print_utf8(response["key"])
            _print_utf8(response["value"])


def _get(client: QuorumClient, args: argparse.Namespace) -> int:
    value = client.get(args.key, stale=args.stale)
    if args.json:
        emit_json(client.last_answer)  # the value, or the API's KEY_NOT_FOUND answer
    elif value is not None:
        print(value)
    if value is None:
        if not args.json:
            print(f"{PROG}: key {args.key!r} not found", file=sys.stderr)
        return EXIT_FALSE
    return EXIT_OK


def _list(client: QuorumClient, args: argparse.Namespace) -> int:
    after: str | None = args.start_after
    printed = 0
    while True:
        limit = args.limit if args.all else args.limit - printed
        page = client.list_keys(args.prefix, start_after=after, limit=limit, stale=args.stale)
        if args.json:
            emit_json(client.last_answer)  # one API answer a line, a page each
        else:
            for key, value in page.entries:
                _print_utf8(_escape(key) if args.keys_only
                            else f"{_escape(key)}\t{_escape(value)}")
        printed += len(page.entries)
        after = page.next_start_after
        # A page holds fewer keys than asked when they would be over the node's answer size:
        # the first N keys may take more than one.
        if after is None or (not args.all and printed >= args.limit):
            return EXIT_OK


def _watch(client: QuorumClient, args: argparse.Namespace) -> int:
    if (args.key is None) == (args.prefix is None):
        raise CliError("give a KEY or --prefix P", EXIT_USAGE, api_code="BAD_REQUEST")
    watched = {"key": args.key} if args.key is not None else {"prefix": args.prefix}
    offset = args.offset
    if offset is None:  # from now on: past what the contacted node has applied
        offset = client.list_keys("", limit=1, stale=True).applied_offset + 1
    try:
        while True:
            result = client.watch(offset, wait_ms=args.wait_ms, **watched)
            if args.json:
                emit_json(client.last_answer)
            for event in result.events:
                if not args.json:
                    kind = "put" if event.value is not None else "delete"
                    value = "" if event.value is None else _escape(event.value)
                    _print_utf8(f"{event.offset}\t{kind}\t{_escape(event.key)}\t{value}")
            offset = result.next_offset
            if args.once:
                return EXIT_OK
    except KeyboardInterrupt:
        return EXIT_OK  # how a watch ends


def _escape(text: str) -> str:
    """A key or value on one line, tab-separable (PostgreSQL COPY's text escapes): backslash,
    newline, tab and carriage return as \\\\, \\n, \\t, \\r; every other character as it is."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t") \
        .replace("\r", "\\r")


def _print_utf8(line: str) -> None:
    """Print ``line`` in UTF-8, whatever the locale's encoding (load reads UTF-8)."""
    out = sys.stdout
    buffer = getattr(out, "buffer", None)
    if buffer is None or (out.encoding or "").lower().replace("-", "") == "utf8":
        print(line, flush=True)
        return
    out.flush()
    buffer.write(line.encode("utf-8") + b"\n")
    buffer.flush()


def _append(client: QuorumClient, args: argparse.Namespace) -> int:
    lines: list[str] = []
    if args.file is not None:
        lines += read_value(None, args.file).splitlines()
    for value in args.values:
        lines += read_value(value, None).splitlines() if value == STDIN_VALUE else [value]
    if not args.values and args.file is None:
        raise CliError("nothing to append: give VALUEs, '-' (stdin) or --file", EXIT_USAGE,
                       api_code="BAD_REQUEST")
    if not lines:
        raise CliError("nothing to append (the input was empty)", EXIT_USAGE,
                       api_code="BAD_REQUEST")
    first, last = client.append([line.encode("utf-8") for line in lines])
    if args.json:
        emit_json(client.last_answer)
    else:
        count = last - first + 1
        print(f"appended {count} record{'s' if count != 1 else ''} at offsets {first}-{last}")
    return EXIT_OK


def _read(client: QuorumClient, args: argparse.Namespace) -> int:
    result = client.read(args.offset, max_records=args.max_records, wait_ms=args.wait_ms)
    if args.json:
        emit_json(client.last_answer)
        return EXIT_OK
    for record in result.records:
        escaped = record.value.replace(b"\\", b"\\\\").replace(b"\n", b"\\n") \
            .replace(b"\t", b"\\t").replace(b"\r", b"\\r")
        # Bytes that are not UTF-8 print as \xNN.
        print(f"{record.offset}\t{escaped.decode('utf-8', 'backslashreplace')}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
