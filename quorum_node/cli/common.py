"""The conventions every ``quorum-*`` command line follows, in one place.

- ``--bootstrap-server``/``-b`` lists the nodes to contact, ``HOST:PORT[,HOST:PORT...]``; the
  default is ``$QUORUM_BOOTSTRAP_SERVER``, else the client ports of the ``quorum-node local``
  whose data directory is ``./quorum-data`` (``LOCAL_DATA_DIR``: where the quick start runs it,
  on whatever ``--base-port``), else those of ``quorum-node local --nodes 3`` on its default
  ports (``DEFAULT_BOOTSTRAP``). When no node of a default list answers, the error says how to
  name the nodes. ``--bootstrap-controller`` means what it means in Kafka: the controller
  listeners, over Kafka's protocol; only ``quorum-admin`` talks to them (another tool refuses it,
  saying to use the client listeners).
- ``--timeout SECONDS`` bounds a whole command, retries included.
- One retry policy (``QuorumClient(fail_fast=True)``): answers that say nothing took effect (no
  leader during an election, a node shutting down) are retried across the list until the
  timeout; when no server of the list accepts a connection at all, the command fails at once.
- ``--json`` prints the API's own JSON answer, and on failure the API's error body
  (``{"code": CODE, "message": message}``, the one error body of every endpoint) on stdout
  as well.
- A value argument of ``-`` is read from stdin; ``--file PATH`` (``--value-file`` for cas) reads
  it from a file. A literal ``-`` is given on stdin (``printf - | quorum-client put k -``).
- ``--version``, and ``--print-completion SHELL`` for shell completion (shtab: bash, zsh, tcsh,
  fish, powershell).
- Errors are one line on stderr, ``PROG: error: message``. Exit codes: 0 done, 1 failed,
  2 bad usage or refused input, 3 (quorum-client) a key not found or a cas/delete not
  applied, 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

import shtab

from quorum_node.cli.credentials import add_credential_options
from quorum_node.node.config import ConfigError, read_properties
from quorum_node.wire import CLIENT_PROTOCOLS, DEFAULT_CLIENT_PROTOCOL

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_FALSE = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it

BOOTSTRAP_ENV = "QUORUM_BOOTSTRAP_SERVER"
# What `quorum-node local --nodes 3` listens on by default, so that the README's commands work
# without flags on a fresh machine.
DEFAULT_BOOTSTRAP = "127.0.0.1:9091,127.0.0.1:9092,127.0.0.1:9093"
# `quorum-node local`'s default data directory; its node-*.properties name the client ports.
LOCAL_DATA_DIR = Path("quorum-data")
DISTRIBUTION = "quorum-node"
STDIN_VALUE = "-"


def version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown"


class CliError(Exception):
    """A failure to report in one line; ``code`` is the exit code, ``api_code`` the error code
    printed under --json (the API's when the API refused)."""

    def __init__(self, message: str, code: int = EXIT_FAILED, *, api_code: str = "ERROR",
                 body: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.api_code = api_code
        self.body = body


class MissingExtraError(CliError):
    """A command needs an optional dependency that is not installed."""

    def __init__(self, module: str, extra: str) -> None:
        super().__init__(f"this command needs {module}, which is not installed: "
                         f"pip install '{DISTRIBUTION}[{extra}]'", EXIT_USAGE,
                         api_code="MISSING_EXTRA")


def require_extra(module: str, extra: str) -> None:
    """Raise MissingExtraError naming the ``pip install`` line when ``module`` is missing."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise MissingExtraError(module, extra) from None


class CliParser(argparse.ArgumentParser):
    """argparse with one-line usage errors (exit 2); --help has the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog.split()[0]}: error: {message} "
                              f"(see {self.prog} --help)\n")


def add_standard_options(parser: argparse.ArgumentParser) -> None:
    """``--version`` and ``--print-completion SHELL`` (top-level parser only)."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    shtab.add_argument_to(parser, ["--print-completion"],
                          help="print the shell's completion script, e.g. "
                          f"`source <({parser.prog} --print-completion bash)`")


def add_connection_options(parser: argparse.ArgumentParser, *, top: bool,
                           default_timeout_s: float | None) -> None:
    """The bootstrap list, --timeout, --json and the credentials. Accepted before and after the
    command: ``top=False`` (a subcommand) uses SUPPRESS so a value given before it is kept.
    ``default_timeout_s=None``: each command has its own (``timeout_s``)."""
    def default(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    parser.add_argument(
        "-b", "--bootstrap-server", dest="bootstrap_server",
        metavar="HOST:PORT[,HOST:PORT...]", default=default(None),
        help=f"nodes to contact, any of them (default: ${BOOTSTRAP_ENV}, else the quorum-node "
        f"local in ./{LOCAL_DATA_DIR}, else {DEFAULT_BOOTSTRAP})")
    parser.add_argument(
        "--bootstrap-controller", dest="bootstrap_controller",
        metavar="HOST:PORT[,HOST:PORT...]", default=default(None),
        help="controller listeners to contact over Kafka's protocol, as Kafka's "
             "--bootstrap-controller (quorum-admin only)")
    parser.add_argument(
        "--timeout", type=positive_float, metavar="SECONDS", default=default(default_timeout_s),
        help="give up after this long, retries included"
        + (f" (default: {default_timeout_s:g})" if default_timeout_s else ""))
    parser.add_argument("--json", action="store_true", default=default(False),
                        help="print the API's JSON answer (errors too)")
    add_credential_options(parser, top=top)


def add_protocol_option(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """``--protocol binary|http``: how a client talks to the nodes (the client's default: the
    binary stream). As add_connection_options, accepted before and after the command."""
    parser.add_argument("--protocol", choices=CLIENT_PROTOCOLS,
                        default=DEFAULT_CLIENT_PROTOCOL if top else argparse.SUPPRESS,
                        help=f"the client protocol (default: {DEFAULT_CLIENT_PROTOCOL}; http: "
                             f"the HTTP API, as curl speaks it)")


def bootstrap_source(args: argparse.Namespace, environ: Mapping[str, str] | None = None,
                     data_dir: Path = LOCAL_DATA_DIR) -> tuple[str, str]:
    """The nodes to contact and where that list came from (for ``unreachable_hint``): ``-b``,
    ``$QUORUM_BOOTSTRAP_SERVER``, the local quorum in ``data_dir``, or the default."""
    if getattr(args, "bootstrap_controller", None) is not None:
        raise CliError("--bootstrap-controller names controller listeners, which serve the "
                       "peers and Kafka's admin protocol (quorum-admin); this tool talks to the "
                       "client listeners: use --bootstrap-server", EXIT_USAGE,
                       api_code="WRONG_LISTENER")
    environ = os.environ if environ is None else environ
    value: str | None = args.bootstrap_server
    if value:
        return value, "-b"
    if environ.get(BOOTSTRAP_ENV):
        return environ[BOOTSTRAP_ENV], f"${BOOTSTRAP_ENV}"
    local = local_quorum_bootstrap(data_dir)
    if local is not None:
        return local, f"the quorum-node local in ./{data_dir}"
    return DEFAULT_BOOTSTRAP, "the default"


def local_quorum_bootstrap(data_dir: Path) -> str | None:
    """The client ports of the ``quorum-node local`` kept in ``data_dir`` (its nodes'
    properties, which it rewrites at every start), or None when there is none."""
    for path in sorted(data_dir.glob("node-*.properties")):
        try:
            endpoints = read_properties(path).get("controller.quorum.client.endpoints")
        except ConfigError:
            continue
        if endpoints is not None:
            # id@host:port,... -> host:port,...
            return ",".join(entry.strip().partition("@")[2]
                            for entry in endpoints.value.split(",") if "@" in entry)
    return None


def unreachable_hint(source: str) -> str:
    """What to add to "no node reachable": how to name the nodes when none of these answers."""
    if source == "-b":
        return ""  # named on the command line already
    return (f" (nodes from {source}; name the quorum's client listeners with -b HOST:PORT,... or "
            f"export {BOOTSTRAP_ENV}=HOST:PORT,..., which quorum-node local prints)")


def timeout_from(args: argparse.Namespace, default_s: float) -> float:
    value: float | None = args.timeout
    return default_s if value is None else value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text!r}")
    return value


def positive_int(text: str) -> int:
    value = non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def read_value(argument: str | None, file: Path | None, *, what: str = "value",
               stdin: TextIO | None = None) -> str:
    """A value given as an argument, ``-`` (stdin, read whole) or ``--file PATH``; UTF-8."""
    if file is not None:
        if argument is not None:
            raise CliError(f"give the {what} as an argument or with a file, not both",
                           EXIT_USAGE, api_code="BAD_REQUEST")
        try:
            return file.read_bytes().decode("utf-8")
        except OSError as error:
            raise CliError(f"{file}: {error.strerror or error}", EXIT_USAGE,
                           api_code="BAD_REQUEST") from None
        except UnicodeDecodeError as error:
            raise CliError(f"{file}: not UTF-8 text ({error.reason} at byte {error.start})",
                           EXIT_USAGE, api_code="BAD_REQUEST") from None
    if argument is None:
        raise CliError(f"no {what} given (an argument, '-' for stdin, or a file)", EXIT_USAGE,
                       api_code="BAD_REQUEST")
    if argument == STDIN_VALUE:
        source = stdin if stdin is not None else sys.stdin
        try:
            return source.buffer.read().decode("utf-8") if hasattr(source, "buffer") \
                else source.read()
        except UnicodeDecodeError as error:
            raise CliError(f"stdin: not UTF-8 text ({error.reason} at byte {error.start})",
                           EXIT_USAGE, api_code="BAD_REQUEST") from None
    return argument


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")


def add_logging_options(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` and ``--log-format`` (for commands that run a node)."""
    parser.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default="INFO",
                        help="the lowest level logged (default: INFO)")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                        help="text lines, or one JSON object a line for a log collector "
                        "(default: text)")


class JsonLogFormatter(logging.Formatter):
    """One JSON object a line: ``time`` (RFC 3339 UTC), ``level``, ``logger``, ``message``, and
    ``exception`` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        document = {"time": f"{stamp}.{int(record.msecs):03d}Z", "level": record.levelname,
                    "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, ensure_ascii=False)


def configure_logging(level: str, log_format: str) -> None:
    """Log to stderr at ``level`` in ``log_format``; like logging.basicConfig, nothing changes
    when the process has set up logging already (a host program, a test runner)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonLogFormatter() if log_format == "json" else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])


def emit_json(document: Any) -> None:
    print(json.dumps(document, ensure_ascii=False))


def run_command(prog: str, command: Callable[[], int], *, json_errors: bool = False) -> int:
    """Run ``command`` with the conventions' error handling: a CliError (or ValueError, a
    refusal before anything was sent) as one line, Ctrl-C as ``interrupted`` and exit 130, a
    closed stdout (``| head``) quietly, any other OSError (a file that cannot be written) as
    one line and exit 1."""
    try:
        return command()
    except CliError as error:
        return fail(prog, str(error), error.code, json_errors=json_errors,
                    api_code=error.api_code, body=error.body)
    except ValueError as error:
        return fail(prog, str(error), EXIT_USAGE, json_errors=json_errors,
                    api_code="BAD_REQUEST")
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # Python would complain again while flushing stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILED
    except OSError as error:  # a file that cannot be written, a full disk: one line, no traceback
        where = f"{error.filename}: " if error.filename else ""
        return fail(prog, f"{where}{error.strerror or error}", EXIT_FAILED,
                    json_errors=json_errors)


def fail(prog: str, message: str, code: int, *, json_errors: bool = False,
         api_code: str = "ERROR", body: Mapping[str, Any] | None = None) -> int:
    """Report a failure: one line on stderr; under --json also the error body on stdout."""
    if json_errors:
        emit_json(dict(body) if body else {"code": api_code, "message": message})
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code


def run_cli(prog: str, parser: argparse.ArgumentParser, argv: Sequence[str] | None,
            command: Callable[[argparse.Namespace], int]) -> int:
    """A tool's ``main``: parse ``argv`` and run ``command`` with the conventions' error
    handling (``run_command``), errors as JSON when the tool was given ``--json``."""
    parsed = parse_args(parser, None if argv is None else list(argv))
    if isinstance(parsed, int):
        return parsed
    return run_command(prog, lambda: command(parsed),
                       json_errors=bool(getattr(parsed, "json", False)))


def parse_args(parser: argparse.ArgumentParser,
               argv: list[str] | None) -> argparse.Namespace | int:
    """Parsed arguments, or the exit code when argparse exited (--help, --version, an error
    it already printed in one line)."""
    try:
        return parser.parse_args(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
