"""Run the benchmarks and write results.json, results.md and the plots.

    python bench/run.py                     # quick preset (under 15 minutes here)
    python bench/run.py --preset full       # more rounds, 100k past epochs, 10k-epoch memory run
    python bench/run.py --only seal,core    # a subset

Benchmarks: core (in-process send -> seal -> delivery), seal (inside latestOffset), durability
(what fsync=True costs against the default fsync=False), memory
(runner RSS over many epochs), batches (per micro-batch vs a plain source, real Spark),
channel (from Spark tasks), recovery (task failure, fail_job), requests (round trip and rate
of requests from Spark tasks, the skewed work queue), filesource (the file source against
Spark's own file stream source: throughput, planning per trigger, skew, discovery state),
alignment (watermark alignment: aggregation state and batch time aligned vs unaligned, its cost
when already aligned), backfill (many small files packed into few splits: local files
against Spark's file source, objects on S3 against plain concurrent reads), backlog (what a
trigger writes and plans while 100,000 files wait, against the same state written whole),
cdc_state (the PostgreSQL source's enumerator state once its stream took over a snapshot of
1,000 and 10,000 chunks, against keeping every chunk), cdc_stream (the PostgreSQL source's
commit-to-sink latency at 5,000 changes/s, the rate it keeps, the WAL its slot holds when the
captured table is idle and another is busy), cdc_snapshot (the PostgreSQL source's snapshot
of a 500,000-row table, 2,000,000 in the full preset, against Spark's JDBC read partitioned on
the key; needs Debian's libpostgresql-jdbc-java), lake_sink (LakeSink into Delta and Iceberg
against Spark's parquet file sink on the same stream, and its commit time per batch at one
batch per second), lake_merge (mode merge at 1,000 changes/s into Delta and Iceberg, by the
committers without Spark: the lag p99 and the catch-up after 300 one-second epochs, 3,600 in
the full preset, against pyiceberg's delete + upsert and delta-rs's merge).
Each measures its baseline in the same run; the report gives medians and ratios.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import traceback
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

IN_PROCESS = ["core", "seal", "durability", "memory", "backlog", "cdc_state", "lake_merge"]
ON_SPARK = ["batches", "channel", "recovery", "filesource", "alignment", "backfill", "lake_sink"]
OWN_SESSION = ["requests", "cdc_stream", "cdc_snapshot"]  # start a Spark session of their own, in a subprocess


def main() -> int:
    from rich.console import Console

    from bench.common import compile_package, markdown, spark_session, write_report

    ap = argparse.ArgumentParser(description="sparkcoord benchmarks")
    ap.add_argument("--preset", choices=["quick", "full"], default="quick")
    ap.add_argument("--only", default="", help="comma-separated subset of "
                    + ", ".join(IN_PROCESS + ON_SPARK + OWN_SESSION))
    ap.add_argument("--out", default=None, help="output directory (default bench/results/<preset>)")
    args = ap.parse_args()
    chosen = [n for n in IN_PROCESS + ON_SPARK + OWN_SESSION
              if not args.only or n in args.only.split(",")]
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", args.preset)
    console = Console(width=max(Console().width, 120))
    t0 = time.time()
    results: dict[str, Any] = {
        "preset": args.preset, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": f"{os.cpu_count()} cores, Python {platform.python_version()}, {platform.machine()}",
        "bytecode": compile_package(),
        "figures": [], "benches": {}, "failed": {}}
    spark = None
    for name in chosen:
        console.print(f"[bold]{name}[/] ...")
        started = time.time()
        try:
            module = __import__(f"bench.{'core_throughput' if name == 'core' else name}",
                                fromlist=["run"])
            if name in ON_SPARK:
                spark = spark or spark_session()
                bench = module.run(args.preset, spark)
            elif name in OWN_SESSION and spark is not None:
                spark.stop()  # never two Spark sessions at once on this machine
                spark = None
                bench = module.run(args.preset)
            else:
                bench = module.run(args.preset)
        except Exception:  # noqa: BLE001 - report a broken benchmark, run the others
            results["failed"][name] = traceback.format_exc()
            console.print(f"[red]{name} failed[/]\n{results['failed'][name]}")
            continue
        bench["seconds"] = time.time() - started
        results["benches"][name] = bench
        results["figures"] += bench["figures"]
        for line in bench.get("notes", []):
            console.print(f"  {line}")
        console.print(f"  ({bench['seconds']:.0f} s)")
    if spark is not None:
        spark.stop()
    results["elapsed_s"] = time.time() - t0
    paths = write_report(results, out)
    console.print(markdown(results))
    console.print("written: " + ", ".join(paths))
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
