"""A work-queue job run as its own process by the driver-kill tests:
``python -m tests.spark.queue_kill_job <workdir> <first items> <added items>``.

Four subtasks pull the first items inside the job's first batch; then the driver program adds
more items with a client request (once per job: a marker file remembers it) and waits until
the sink holds every item. SPARKCOORD_TEST_KILL may kill it at ``answered`` (a task got a
logged answer, mid-batch) or at ``client-added`` (right after the client request was
answered: the driver dies holding an acknowledged request).
"""

from __future__ import annotations

import functools
import os
import sys
import time


def main() -> None:
    workdir, first, added = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from sparkcoord.examples.sinks import BatchFileSink, read_batch_files
    from sparkcoord.examples.workqueue import SCHEMA, QueueWorker, WorkQueue
    from sparkcoord.runtime.kills import kill_point
    from sparkcoord.spark import CoordinatedJob

    spark = (SparkSession.builder.master("local[2,4]").appName("sparkcoord-queue-kill-job")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(BatchFileSink)
    job = CoordinatedJob(spark, os.path.join(workdir, "ckpt"))
    df = job.source(QueueWorker, functools.partial(WorkQueue, costs=[0.02] * first), 4, SCHEMA,
                    name="queue")
    sink = os.path.join(workdir, "sink")
    writer = (df.writeStream.format("sparkcoord-batchfiles").option("path", sink)
              .trigger(processingTime="0 seconds"))

    def items() -> int:
        return sum(len(rows) for rows in read_batch_files(sink).values())

    handle = job.start(writer, until=lambda: items() >= first + added, poll_s=0.2,
                       timeout_s=180)
    marker = os.path.join(workdir, "added")
    if not os.path.exists(marker):
        while job.request("queue", "status", timeout_s=60)["handed_out"] < first:
            time.sleep(0.1)
        ids = job.request("queue", ("add", [0.02] * added), timeout_s=60)
        with open(marker, "w") as f:
            f.write(repr(ids))
        kill_point("client-added", 0)
    handle.await_termination()
    status = job.request("queue", "status", timeout_s=60) if handle.running else None
    print("done", items(), status)


if __name__ == "__main__":
    main()
