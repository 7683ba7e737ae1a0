"""A driver program that reaches Spark only through Spark Connect, for tests/spark/test_connect.py.

    python -m tests.spark.connect_job <sc://url> <workdir> <seed>

Runs in its own process, as a Connect user's program does (and because a Connect session
switches PySpark into Connect mode for the whole process). Through one Connect session it runs
(1) scenario two-speeds (tests/spark/scenarios.py: two coordinators, a fail_job each and a
task retry each), (2) a bounded file source whose readers pull splits with requests, asking
its coordinator from this program while it runs, and (3) the checks a Connect client must
refuse. Prints one JSON line: what each part found.
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
          .options(bounded="true", maxSplitBytes="4k", parallelism=2).load(data))
    statuses: list[Any] = []

    def ask() -> bool:  # a client request from this program, through the channel
        from sparkcoord.core.errors import RequestFailed

        try:
            statuses.append(job.request("files", "status", timeout_s=5))
        except RequestFailed:  # the bounded run ended meanwhile; counted below
            pass
        return False

    report = job.run(df.writeStream.format("parquet").option("path", out)
                     .trigger(availableNow=True), until=ask, poll_s=0.5, timeout_s=300)
    counts = Counter(r.id for r in spark.read.parquet(out).collect())
    return {"rows": len(ids), "lost": len(set(ids) - set(counts)),
            "duplicated": sum(c - 1 for c in counts.values() if c > 1),
            "failures": report.failures, "batches": report.batches,
            "status_keys": sorted(statuses[-1]) if statuses else []}


def refusals(spark: Any) -> dict[str, str]:
    from sparkcoord.spark import CoordinatedJob

    found: dict[str, str] = {}
    try:
        CoordinatedJob(spark, "relative/ckpt")
    except ValueError as exc:
        found["relative"] = str(exc)
    return found


def main() -> None:
    url, workdir, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).getOrCreate()
    result = {"connect": type(spark).__module__, "refusals": refusals(spark),
              "files": files(spark, workdir), "two_speeds": two_speeds(spark, workdir, seed)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
