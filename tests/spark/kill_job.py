"""A coordinated job run as its own process by the driver-kill tests:
``python -m tests.spark.kill_job <workdir> <numbers per subtask>``.

It runs until the sink holds 2 x N rows and exits 0, unless SPARKCOORD_TEST_KILL kills it.
With SPARKCOORD_TEST_CHECKPOINT (JSON: ``url``, ``storage_options``) the coordination
directory is that URL (e.g. on an S3 server) and Spark's checkpoint is ``<workdir>/spark``.
With SPARKCOORD_TEST_HOLD (a path) it also runs until that file exists (the lease test keeps a
driver program running while a second one starts).
"""

from __future__ import annotations

import functools
import os
import sys


def main() -> None:
    workdir, total = sys.argv[1], int(sys.argv[2])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from sparkcoord.examples.numbers import SCHEMA, NumberCollector, NumbersCoordinator
    from sparkcoord.examples.sinks import BatchFileSink, read_batch_files
    from sparkcoord.spark import CoordinatedJob

    spark = (SparkSession.builder.master("local[2,4]").appName("sparkcoord-kill-job")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(BatchFileSink)
    remote = os.environ.get("SPARKCOORD_TEST_CHECKPOINT")
    if remote:
        import json

        where = json.loads(remote)
        job = CoordinatedJob(spark, where["url"], checkpoint_interval_s=0.5,
                             spark_checkpoint=os.path.join(workdir, "spark"),
                             storage_options=where["storage_options"])
    else:
        job = CoordinatedJob(spark, os.path.join(workdir, "ckpt"), checkpoint_interval_s=0.5)
    coordinator = functools.partial(NumbersCoordinator, total=total, per_tick=1, interval_s=0.2)
    df = job.source(NumberCollector, coordinator, 2, SCHEMA, name="numbers")
    sink = os.path.join(workdir, "sink")
    writer = (df.writeStream.format("sparkcoord-batchfiles").option("path", sink)
              .trigger(processingTime="0 seconds"))

    commits = os.path.join(job.spark_checkpoint, "commits")
    hold = os.environ.get("SPARKCOORD_TEST_HOLD")

    def done() -> bool:
        # all numbers in the sink, and at least 4 committed batches (the checkpoint interval
        # seals epochs even with nothing to carry), so that every kill point at epoch >= 1
        # is reached whatever the machine's speed
        batches = len([n for n in os.listdir(commits) if n.isdigit()]) if os.path.isdir(commits) else 0
        return (batches >= 4 and sum(len(r) for r in read_batch_files(sink).values()) >= 2 * total
                and (hold is None or os.path.exists(hold)))

    job.run(writer, until=done, timeout_s=240)
    spark.stop()


if __name__ == "__main__":
    main()
