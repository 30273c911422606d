"""``quorum-audit``: the audit jobs from the command line, or through ``spark-submit``.

    quorum-audit run ./quorum-data --out ./audit                 # local[*], everything
    quorum-audit consistency s3a://backups/fleet/ --master spark://host:7077
    spark-submit quorum_audit/cli.py run s3a://backups/fleet/ --out s3a://backups/audit/

Exit status: 0 when the audit passes, 1 when it finds an error, 2 on a usage error, an input
that cannot be read, or the spark extra missing (``pip install 'quorum-node[spark]'``), 130
interrupted. The options follow the conventions of every ``quorum-*`` tool
(``quorum_node.cli.common``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from quorum_node.cli.common import (
    EXIT_FAILED,
    EXIT_USAGE,
    CliError,
    CliParser,
    add_standard_options,
    require_extra,
    run_cli,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from quorum_audit.audit import AuditResult

PROG = "quorum-audit"
EXIT_PASSED = 0
SPARK_MODULES = ("pyspark", "pyarrow", "numpy")  # what the spark extra brings
_TABLES = {
    "consistency": {"replicas", "findings", "divergences"},
    "history": {"replicas", "leadership", "membership", "write_rates"},
    "run": None,  # everything
}


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(PROG, _parser(), argv, _audit)


def _audit(args: argparse.Namespace) -> int:
    for module in SPARK_MODULES:
        require_extra(module, "spark")
    # Imported once the extra is known to be there: --help, --version and the message above
    # work with the light install.
    from quorum_audit.audit import run_audit, to_json  # noqa: PLC0415
    from quorum_audit.discover import s3_endpoint  # noqa: PLC0415
    from quorum_audit.report import write_outputs  # noqa: PLC0415

    check_local_paths(args.paths)  # before Spark's start, which takes seconds
    spark, created = _session(args.master, verbose=args.verbose)
    try:
        result = run_audit(spark, args.paths, args.high_watermark, args.s3_endpoint_url)
    except (ValueError, OSError) as error:
        raise CliError(str(error), EXIT_USAGE, api_code="BAD_REQUEST") from None
    finally:
        if created:
            spark.stop()
    if args.out:
        for path in write_outputs(result, args.out, tables=_TABLES[args.job],
                                  endpoint_url=s3_endpoint(args.s3_endpoint_url)):
            print(f"wrote {path}", file=sys.stderr)
    print(to_json(result) if args.json else _summary(result, args.job))
    return EXIT_PASSED if result.passed or args.job == "history" else EXIT_FAILED


def _parser() -> argparse.ArgumentParser:
    parser = CliParser(
        prog=PROG,
        description="Audit quorum replicas' logs and snapshots on Spark: that they agree, and "
        "the quorum's history.")
    add_standard_options(parser)
    jobs = parser.add_subparsers(dest="job", required=True, metavar="JOB")
    for job, help_text in (
            ("run", "consistency and history, with the report and chart"),
            ("consistency", "replicas agree below the high watermark; one leader per epoch"),
            ("history", "leadership and membership timelines, write rates, chart")):
        sub = jobs.add_parser(job, help=help_text, description=help_text)
        sub.add_argument("paths", nargs="+", metavar="PATH",
                         help="log directories, or directories/URIs holding them at any depth "
                         "(s3a://, s3://, gs://, hdfs://, file://)")
        sub.add_argument("--out", help="where to write the Parquet tables, report and chart")
        sub.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
        sub.add_argument("--high-watermark", type=int,
                         help="check offsets below this one (default: what a majority holds)")
        sub.add_argument("--json", action="store_true", help="print the findings as JSON")
        sub.add_argument("-v", "--verbose", action="store_true",
                         help="show Spark's own log (WARN and up) and progress bars on stderr "
                         "(default: only the audit's output and errors)")
        sub.add_argument("--s3-endpoint-url", metavar="URL",
                         help="an S3-compatible server for s3:// paths and --out (default: "
                         "$AWS_ENDPOINT_URL_S3 or $AWS_ENDPOINT_URL; credentials from the usual "
                         "AWS variables, files or roles)")
    return parser


def check_local_paths(paths: Sequence[str]) -> None:
    """Refuse a local path that does not exist at once (a URI is left to its file system)."""
    for path in paths:
        scheme, _, rest = path.partition("://")
        local = path if not rest else (rest if scheme == "file" else None)
        if local is not None and not Path(local).exists():
            raise CliError(f"{path}: no such file or directory", EXIT_USAGE,
                           api_code="BAD_REQUEST")


def _session(master: str | None, *, verbose: bool) -> tuple[SparkSession, bool]:
    """The active session if there is one (a test, a notebook), else a new one; with
    ``spark-submit`` the master comes from it, otherwise it defaults to local[*]. Unless
    ``verbose``, Spark says nothing on stderr: no progress bars, its log at ERROR, and the
    JVM that this process starts writes its start-up chatter (printed before any log level
    applies) to /dev/null; its errors still reach the audit as exceptions."""
    from pyspark.sql import SparkSession  # noqa: PLC0415 (the spark extra, checked by now)

    active = SparkSession.getActiveSession()
    if active is not None and master is None:
        return active, False
    spark = _new_session(master, verbose)
    spark.sparkContext.setLogLevel("WARN" if verbose else "ERROR")
    return spark, True


def _new_session(master: str | None, verbose: bool) -> SparkSession:
    from pyspark.sql import SparkSession  # noqa: PLC0415
    # The workers must run this interpreter: it has pyarrow and this package.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("quorum-audit")
    if master is not None:
        builder = builder.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:  # not launched by spark-submit
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Few shuffle partitions: the audit's shuffles are small (a row per batch or fewer).
        builder = builder.master("local[*]").config("spark.ui.enabled", "false") \
            .config("spark.sql.shuffle.partitions", str(2 * (os.cpu_count() or 1)))
    if verbose:
        return builder.getOrCreate()
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    with _stderr_to_devnull():  # the JVM started here inherits it for its lifetime
        return builder.getOrCreate()


@contextlib.contextmanager
def _stderr_to_devnull() -> Iterator[None]:
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _summary(result: AuditResult, job: str) -> str:
    lines = []
    if job != "history":
        verdict = "PASSED" if result.passed else "FAILED"
        lines.append(f"{verdict}: {result.rows_read} rows from {len(result.replicas)} replicas, "
                     f"{result.records_compared} record copies compared")
        lines += [f"{f.severity.upper()} {f.kind} {f.cluster_id}"
                  + (f" node {f.node_id} ({f.directory_id})" if f.node_id is not None else "")
                  + (f" at {f.root}" if f.root is not None else "")
                  + (f" offsets {f.first_offset}-{f.last_offset}"
                     if f.first_offset is not None else "") + f": {f.detail}"
                  for f in result.findings]
    if job != "consistency":
        lines += [f"epoch {e.epoch}: leader {e.leader_id} from offset {e.start_offset}"
                  for e in result.history.leadership]
        lines += [f"offset {m.offset}: {m.change} {m.node_id}:{m.directory_id}"
                  for m in result.history.membership]
    return "\n".join(lines)


if __name__ == "__main__":  # spark-submit runs this file as a script
    sys.exit(main())
