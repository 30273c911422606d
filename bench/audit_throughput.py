"""Throughput of the quorum audit: records read and checked per second on Spark.

    python bench/audit_throughput.py                       # 10 million records over 3 replicas
    python bench/audit_throughput.py --records 1000000 --master 'local[2]'

The data set is written directly with the node's encoders (``quorum_audit.synthetic``): the same
log in each replica's directory, 64 MiB segments, batches of 500 records. It is kept under --dir
and reused by later runs of the same size. The time is the whole audit (``run_audit``: decoding
every file, the consistency and history jobs), after the SparkSession has started; warm runs
follow (the JVM's JIT and the Python workers' start make the first markedly slower). The load
average is printed too: on a shared machine other processes take their share of the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from pyspark.sql import SparkSession

from quorum_audit.audit import run_audit
from quorum_audit.synthetic import write_quorum


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=10_000_000,
                        help="records in all (spread over the replicas)")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/quorum-audit-bench"))
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    per_replica = args.records // args.replicas
    marker = args.dir / "dataset.json"
    wanted = {"records_per_replica": per_replica, "replicas": args.replicas}
    if not marker.exists() or json.loads(marker.read_text()) != wanted:
        shutil.rmtree(args.dir, ignore_errors=True)
        args.dir.mkdir(parents=True)
        started = time.perf_counter()
        write_quorum(args.dir, per_replica, replicas=args.replicas, records_per_batch=500)
        print(f"wrote {per_replica:,} records x {args.replicas} replicas in "
              f"{time.perf_counter() - started:.1f} s", flush=True)
        marker.write_text(json.dumps(wanted))
    size = sum(f.stat().st_size for f in args.dir.rglob("*.log"))

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (SparkSession.builder.master(args.master).appName("quorum-audit-bench")
             .config("spark.ui.enabled", "false").config("spark.driver.memory", "4g")
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        for run in range(1, args.runs + 1):
            started = time.perf_counter()
            result = run_audit(spark, [str(args.dir)])
            seconds = time.perf_counter() - started
            assert result.passed, result.findings
            print(f"run {run}: {result.rows_read:,} records ({size / 2**20:,.0f} MiB) read and "
                  f"{result.records_compared:,} compared in {seconds:.1f} s: "
                  f"{result.rows_read / seconds:,.0f} records/s with {args.master} "
                  f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
