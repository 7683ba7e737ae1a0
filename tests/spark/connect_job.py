"""A driver program that reaches Spark only through Spark Connect, for tests/spark/test_connect.py.

    python -m tests.spark.connect_job <sc://url> <workdir> <seed>

Runs in its own process, as a Connect user's program does (and because a Connect session
switches PySpark into Connect mode for the whole process). Through one Connect session it runs
(1) scenario two-speeds (tests/spark/scenarios.py: two coordinators, a fail_job each and a
task retry each), (2) a file source tailing a directory, whose readers pull splits with
requests, until its coordinator (asked from this program) has nothing pending and the sink
holds every row, and (3) the relative paths a Connect client must refuse. Prints one JSON line: what each part found.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from dataclasses import asdict
from typing import Any


def two_speeds(spark: Any, workdir: str, seed: int) -> dict[str, Any]:
    from tests.spark.scenarios import run_two_speeds

    return asdict(run_two_speeds(spark, os.path.join(workdir, "two-speeds"), seed))


def files(spark: Any, workdir: str) -> dict[str, Any]:
    from sparkcoord.sources import FileStream
    from sparkcoord.spark import CoordinatedJob
    from tests.spark.test_file_source import SCHEMA, write_files

    data, out = os.path.join(workdir, "data"), os.path.join(workdir, "files-out")
    ids = write_files(data, "json", files=5, rows=400)
    job = CoordinatedJob(spark, os.path.join(workdir, "files-ckpt"))
    df = (FileStream(job).format("json").schema(SCHEMA)
          .options(maxSplitBytes="4k", parallelism=2).load(data))  # continuous: tails data/
    statuses: list[Any] = []

    def sink() -> list[Any]:
        try:
            return list(spark.read.parquet(out).collect())
        except Exception:  # noqa: BLE001 - nothing committed yet
            return []

    def done() -> bool:  # asks the coordinator from this program, through the channel
        statuses.append(job.request("files", "status"))
        return len(sink()) >= len(ids) and statuses[-1]["pending"] == 0

    report = job.run(df.writeStream.format("parquet").option("path", out)
                     .trigger(processingTime="0 seconds"), until=done, poll_s=0.5,
                     timeout_s=300)
    counts = Counter(r.id for r in sink())
    return {"rows": len(ids), "lost": len(set(ids) - set(counts)),
            "duplicated": sum(c - 1 for c in counts.values() if c > 1),
            "failures": report.failures, "batches": report.batches,
            "finished": statuses[-1]["finished"], "status_keys": sorted(statuses[-1])}


def refusals(spark: Any, workdir: str) -> dict[str, str]:
    from sparkcoord.sources import FileStream
    from sparkcoord.spark import CoordinatedJob

    found: dict[str, str] = {}
    for what, make in (
            ("checkpoint_dir", lambda: CoordinatedJob(spark, "relative/ckpt")),
            ("spark_checkpoint", lambda: CoordinatedJob(
                spark, os.path.join(workdir, "ok"), spark_checkpoint="relative/spark")),
            ("file source path", lambda: FileStream(CoordinatedJob(
                spark, os.path.join(workdir, "ok"))).format("json").schema("id long")
             .load("relative/data"))):
        try:
            make()
            found[what] = "accepted"
        except ValueError as exc:
            found[what] = str(exc)
    return found


def main() -> None:
    url, workdir, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).getOrCreate()
    result = {"connect": type(spark).__module__, "refusals": refusals(spark, workdir),
              "files": files(spark, workdir), "two_speeds": two_speeds(spark, workdir, seed)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
