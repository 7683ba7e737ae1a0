"""A work-queue job that stops by the documented recipe, run as its own process by
``test_until_recipe.py``: ``python -m tests.spark.until_kill_job <workdir> <items>``.

Four subtasks pull the items inside the job's first batch; the driver program runs
``job.run(writer, until=lambda: job.request("queue", "status")["done"])`` and prints
``ended by until: restarts <n>``. SPARKCOORD_TEST_KILL may kill it at ``answered`` (a task got a
logged answer, mid-batch); run again, the new driver program's recipe asks the restored run.
"""

from __future__ import annotations

import functools
import os
import sys


def main() -> None:
    workdir, items = sys.argv[1], int(sys.argv[2])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from sparkcoord.examples.sinks import BatchFileSink
    from sparkcoord.examples.workqueue import SCHEMA, QueueWorker
    from sparkcoord.spark import CoordinatedJob
    from tests.spark.test_until_recipe import CommittedQueue  # importable by Spark's runner

    spark = (SparkSession.builder.master("local[2,4]").appName("sparkcoord-until-kill-job")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(BatchFileSink)
    job = CoordinatedJob(spark, os.path.join(workdir, "ckpt"))
    df = job.source(QueueWorker, functools.partial(CommittedQueue, costs=[0.02] * items), 4,
                    SCHEMA, name="queue")
    writer = (df.writeStream.format("sparkcoord-batchfiles")
              .option("path", os.path.join(workdir, "sink")).trigger(processingTime="0 seconds"))
    report = job.run(writer, until=lambda: job.request("queue", "status")["done"],
                     timeout_s=240)
    print(f"ended by until: restarts {report.restarts}")


if __name__ == "__main__":
    main()
