"""A coordinated operator downstream of a shuffle (mapInArrow) in a stateful query: Spark runs
batches that carry no new epoch, and the recipient still gets exactly its events."""

from __future__ import annotations

import functools
import json
import os

import pytest
from pyspark.sql import functions as F

from sparkcoord.examples.numbers import (
    SCHEMA,
    DownstreamNumberCollector,
    NumberCollector,
    NumbersCoordinator,
)
from sparkcoord.spark import CoordinatedJob, OperatorSpec
from tests.spark.helpers import latest_state, sink_rows, values_by_subtask

pytestmark = pytest.mark.spark
N_SOURCE, N_DOWN = 40, 8


def epochs_by_batch(spark_checkpoint: str) -> list[int]:
    out = []
    offsets = os.path.join(spark_checkpoint, "offsets")
    for name in sorted((n for n in os.listdir(offsets) if n.isdigit()), key=int):
        lines = open(os.path.join(offsets, name)).read().splitlines()
        out.append(next(json.loads(ln)["epoch"] for ln in lines[2:] if '"sparkcoord"' in ln))
    return out


@pytest.mark.parametrize("failure", ["task-retry", "fail_job"])
def test_a_downstream_recipient_gets_exactly_its_events_across_batches_without_new_epochs(
        spark, tmp_path, failure: str) -> None:
    markers = str(tmp_path / "markers")
    task_fail = N_DOWN // 2 if failure == "task-retry" else None
    job_fail = N_DOWN // 2 if failure == "fail_job" else None
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"))
    source = OperatorSpec("numbers", functools.partial(
        NumbersCoordinator, total=N_SOURCE, per_tick=1, interval_s=0.1),
        functools.partial(NumberCollector, report=False), 2)
    recipient = OperatorSpec("downstream", functools.partial(
        NumbersCoordinator, total=N_DOWN, per_tick=1, interval_s=0.2, fail_job_at=job_fail,
        marker_dir=markers),
        functools.partial(DownstreamNumberCollector, fail_task_at=task_fail, marker_dir=markers),
        2)
    df = job.sources([source], SCHEMA, name="src", recipients=[recipient])
    windows = (df.withColumn("ts", F.timestamp_seconds("value")).withWatermark("ts", "1 second")
               .groupBy(F.window("ts", "2 seconds"), "operator").agg(F.count("*").alias("n")))
    out_df = job.apply(windows, "downstream", SCHEMA, source="src")
    out = str(tmp_path / "out")
    writer = (out_df.writeStream.format("parquet").option("path", out).outputMode("append")
              .trigger(processingTime="0 seconds"))

    # The source's numbers (event times) outlast the recipient's events, so the last data
    # batch advances the watermark and Spark then runs a no-data batch (no new epoch) that
    # emits the last windows to the recipient. Wait for all of it.
    def done() -> bool:
        rows = sink_rows(spark, out)
        if not os.path.isdir(os.path.join(job.spark_checkpoint, "commits")):
            return False
        epochs = epochs_by_batch(job.spark_checkpoint)
        return (sum(r.operator == "downstream" for r in rows) >= 2 * N_DOWN
                and any(r.operator == "input" for r in rows)
                and any(a == b for a, b in zip(epochs, epochs[1:], strict=False)))

    report = job.run(writer, until=done, timeout_s=300)
    rows = sink_rows(spark, out)
    got = {k: v for k, v in values_by_subtask(rows).items() if k[0] == "downstream"}
    assert got == {("downstream", 0): list(range(N_DOWN)), ("downstream", 1): list(range(N_DOWN))}
    if failure == "task-retry":
        assert report.restarts == 0
        assert os.path.exists(os.path.join(markers, "fail_task-downstream-0")), "no task retry"
    else:
        assert report.restarts == 1
        assert os.path.exists(os.path.join(markers, "fail_job-downstream")), "no fail_job"
    # the shape this test is about: batches that carried no new epoch really ran
    epochs = epochs_by_batch(job.spark_checkpoint)
    assert any(a == b for a, b in zip(epochs, epochs[1:], strict=False)), f"no batch without a new epoch: {epochs}"
    assert any(r.operator == "input" for r in rows), "no aggregated input reached the recipient"
    assert latest_state(job, "src", "downstream", 1) == list(range(N_DOWN))
