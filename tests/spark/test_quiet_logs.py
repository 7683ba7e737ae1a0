"""A healthy run's log holds nothing that reads like a fault (issue 25 item 6).

A driver program of its own (this module, run as a script: its stderr is the driver's log,
where the stderr of Spark's source runner, and so the channel server's lines, arrives too)
runs a healthy bounded ``availableNow`` query of the file source at ``log_level="INFO"``
(2 readers asking for splits inside the batch, 3 batches). Before issue 25, such a log could
hold "channel connection ... ended abruptly (its task failed or was killed)" for a task that
closed its connection with a reply still unread (decision 59), and a restore line naming
"RestorePoint(epoch=-1, committed=True)".

    python tests/spark/test_quiet_logs.py <work dir>    # prints one JSON line
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.own_processes]

#: words of a fault, in any case: none may appear in a line of sparkcoord's log of a healthy
#: run ("fail" covers failed/failure/failover, "retr" retried/retry, "abrupt", ...)
FAULT_WORDS = ("abrupt", "retr", "fail", "error", "exception", "traceback", "killed", "lost",
               "dropped", "refused", "reset", "warn", "unavailable", "timed out", "stall")
#: a line of sparkcoord's own log handler: ``26/11/25 19:40:30 INFO sparkcoord.x: ...``
OURS = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (\w+) (sparkcoord[\w.]*): ")
FILES, ROWS_PER_FILE = 12, 20


def test_a_healthy_run_logs_nothing_that_reads_like_a_fault_at_info(tmp_path) -> None:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    done = subprocess.run([sys.executable, __file__, str(tmp_path)], cwd=tmp_path, env=env,
                          timeout=300, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    # the run was healthy and complete: every row once, no restart
    assert summary == {"rows": FILES * ROWS_PER_FILE, "distinct": FILES * ROWS_PER_FILE,
                       "restarts": 0, "batches": 3}, summary

    ours = [(m.group(1), line) for line in done.stderr.splitlines() if (m := OURS.match(line))]
    levels = {level for level, _ in ours}
    # the log was captured at INFO: the restores, seals and completions are there
    assert levels == {"INFO"}, "\n".join(line for _, line in ours)
    text = "\n".join(line for _, line in ours)
    for expected in ("starts fresh", "sealed epoch 2", "the batch of epoch 2 committed",
                     "ended by itself after 3 batches"):
        assert expected in text, text
    faults = [line for _, line in ours if any(w in line.lower() for w in FAULT_WORDS)]
    assert faults == [], "\n".join(faults)
    # and nothing of sparkcoord outside its handler's lines (a traceback, print, a line
    # of the channel without our format)
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
    assert "channel connection" not in done.stderr, done.stderr[-4000:]


def main(work: str) -> None:
    from pyspark.sql import SparkSession

    from sparkcoord.sources.files.stream import FileStream
    from sparkcoord.spark.job import CoordinatedJob

    data = os.path.join(work, "data")
    os.makedirs(data)
    for f in range(FILES):
        with open(os.path.join(data, f"part-{f:02d}.json"), "w") as out:
            for r in range(ROWS_PER_FILE):
                out.write(json.dumps({"id": f * ROWS_PER_FILE + r, "name": f"n{r}"}) + "\n")
    spark = (SparkSession.builder.master("local[2,4]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")  # Spark's own lines are not under test
    job = CoordinatedJob(spark, os.path.join(work, "ckpt"), log_level="INFO")
    df = (FileStream(job).format("json").schema("id long, name string")
          .option("maxFilesPerTrigger", "4").option("parallelism", "2").load(data, name="files"))
    out = os.path.join(work, "out")
    report = job.run(df.writeStream.format("parquet").option("path", out)
                     .trigger(availableNow=True))
    ids = [r.id for r in spark.read.parquet(out).collect()]
    spark.stop()
    print(json.dumps({"rows": len(ids), "distinct": len(set(ids)), "restarts": report.restarts,
                      "batches": report.batches}))


if __name__ == "__main__":
    main(sys.argv[1])
