"""A job failure in the middle of a batch, and what Spark's log says about it (issue 14 item
5, decision 44), for tests/spark/test_quiet_failover.py; stderr is the log under test.

    python tests/spark/failover_log_job.py <work dir>

Phase "managed": four subtasks pull items from a work queue whose coordinator calls
``fail_job`` while they ask; ``CoordinatedJob.run`` restarts the query. Then a line
``=== unmanaged ===`` on stderr, and phase "unmanaged": the same failure in a query started
with ``writeStream.start()`` (nobody stops it; ``cancel_wait_s=1``). Prints one JSON line.
"""

from __future__ import annotations

import functools
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)


def main() -> None:
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import SparkSession

    from sparkcoord.examples.workqueue import SCHEMA, QueueWorker, WorkQueue
    from sparkcoord.runtime.config import ServiceConfig
    from sparkcoord.spark.job import CoordinatedJob

    work = sys.argv[1]
    spark = (SparkSession.builder.master("local[2,4]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")  # Spark's console default, stated
    summary: dict[str, object] = {}
    for phase in ("managed", "unmanaged"):
        base = os.path.join(work, phase)
        # managed: the handle stops the query within its poll (0.5 s) on an idle machine; a
        # long hold keeps a refused task waiting for that also on a busy one (it costs
        # nothing when the stop comes sooner)
        job = CoordinatedJob(spark, os.path.join(base, "ckpt"), config=ServiceConfig(
            cancel_wait_s=60.0 if phase == "managed" else 1.0))
        queue = functools.partial(WorkQueue, costs=[0.05] * 60, fail_job_after=20,
                                  marker_dir=os.path.join(base, "markers"))
        df = job.source(QueueWorker, coordinator=queue, parallelism=4, schema=SCHEMA)
        writer = (df.writeStream.format("parquet").option("path", os.path.join(base, "out"))
                  .trigger(availableNow=True))
        if phase == "managed":
            report = job.run(writer)
            rows = spark.read.parquet(os.path.join(base, "out")).collect()
            summary.update(restarts=report.restarts, failures=report.failures,
                           rows=len(rows), distinct=len({r.item for r in rows}))
            print("=== unmanaged ===", file=sys.stderr, flush=True)
        else:
            query = writer.option("checkpointLocation", job.spark_checkpoint).start()
            try:
                query.awaitTermination(300)
                summary["unmanaged_error"] = None
            except StreamingQueryException as exc:
                summary["unmanaged_error"] = str(exc)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
