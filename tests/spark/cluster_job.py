"""Scenario two-speeds as a driver of its own, on a standalone cluster:
``python -m tests.spark.cluster_job <master url> <workdir> <seed>``.

The test process already runs a local-mode session (one SparkContext per process), so the
cluster's driver is this process. It prints the outcome as one JSON line prefixed ``OUTCOME``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys


def main() -> None:
    master, workdir, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from sparkcoord.spark.cluster import standalone_session_builder
    from tests.spark.scenarios import run_two_speeds

    # the scenario's classes live in this repository's tests package: executors import them
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spark = (standalone_session_builder(master, "sparkcoord-cluster-two-speeds")
             .config("spark.executorEnv.PYTHONPATH", repo).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    outcome = run_two_speeds(spark, workdir, seed)
    # counted after the run: executors register asynchronously after the session starts
    executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1  # minus the driver
    print("OUTCOME " + json.dumps(dict(dataclasses.asdict(outcome), passed=outcome.passed,
                                       executors=executors)), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
