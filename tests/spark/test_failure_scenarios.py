"""Declined and timed-out checkpoints, and channel faults, on real Spark: nothing lost,
nothing duplicated, no hang."""

from __future__ import annotations

import functools
import json
import os

import pytest

from sparkcoord.examples.numbers import SCHEMA, NumberCollector, NumbersCoordinator
from sparkcoord.runtime.config import ServiceConfig
from sparkcoord.spark import CoordinatedJob
from tests.spark.helpers import (
    checkpointed_reports,
    latest_snapshot,
    latest_state,
    sink_rows,
    values_by_subtask,
)
from tests.spark.scenarios import DecliningNumbers

pytestmark = pytest.mark.spark
N = 12


def run_checked(spark, job: CoordinatedJob, df, out: str, also=lambda: True, **run_options):
    """Run until the sink and the coordinator's checkpointed reports are complete and ``also()``
    holds (the checkpoint interval keeps sealing epochs meanwhile); check sink, state, reports."""
    def reports() -> list[list[int]]:
        return checkpointed_reports(job)

    writer = df.writeStream.format("parquet").option("path", out).trigger(processingTime="0 seconds")
    report = job.run(writer, until=lambda: len(sink_rows(spark, out)) >= 2 * N
                     and all(len(r) >= N for r in reports()) and also(), timeout_s=300,
                     **run_options)
    assert values_by_subtask(sink_rows(spark, out)) == {
        ("numbers", 0): list(range(N)), ("numbers", 1): list(range(N))}
    for s in (0, 1):
        assert latest_state(job, "numbers", "numbers", s) == list(range(N))
    assert reports() == [list(range(N)), list(range(N))]
    return report


@pytest.mark.parametrize("plan", ["drop-mid-send", "lose-ack", "delay-ack"])
def test_channel_faults_lose_and_duplicate_nothing(spark, tmp_path, plan: str) -> None:
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"), checkpoint_interval_s=0.3,
                         channel_fault_plan=plan)
    coordinator = functools.partial(NumbersCoordinator, total=N, per_tick=2, interval_s=0.05)
    df = job.source(NumberCollector, coordinator, 2, SCHEMA, name="numbers")
    report = run_checked(spark, job, df, str(tmp_path / "out"))
    assert report.restarts == 0
    injected = json.loads(open(os.path.join(job.coordination_url("numbers"), "faults.json")).read())
    assert injected["count"] >= 2, injected


def test_declined_and_timed_out_checkpoints_within_the_tolerance_lose_nothing(spark, tmp_path) -> None:
    markers = str(tmp_path / "markers")
    # the timeout is what checkpoint 5 waits for; it is long enough that no other checkpoint
    # times out on a busy machine (one more failure next to a decline would fail the job)
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"), checkpoint_interval_s=0.3,
                         config=ServiceConfig(checkpoint_timeout_s=5.0, tolerable_checkpoint_failures=2))
    coordinator = functools.partial(DecliningNumbers, decline=(1, 3), time_out=5, total=N,
                                    per_tick=1, interval_s=0.1, marker_dir=markers)
    df = job.source(NumberCollector, coordinator, 2, SCHEMA, name="numbers")
    expected = ["decline-1", "decline-3", "timeout-5"]
    report = run_checked(spark, job, df, str(tmp_path / "out"),
                         also=lambda: os.path.isdir(markers) and sorted(os.listdir(markers)) == expected)
    assert report.restarts == 0
    assert sorted(os.listdir(markers)) == expected


def test_declines_past_the_tolerance_fail_over_globally_and_still_end_exactly_once(
        spark, tmp_path) -> None:
    markers = str(tmp_path / "markers")
    # no checkpoint is meant to time out here: the default timeout (60 s), so that none does
    # on a busy machine (a timeout next to a decline would be a second failover)
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"), checkpoint_interval_s=0.3,
                         config=ServiceConfig(tolerable_checkpoint_failures=1))
    coordinator = functools.partial(DecliningNumbers, decline=(2, 3), total=N, per_tick=1,
                                    interval_s=0.1, marker_dir=markers)
    df = job.source(NumberCollector, coordinator, 2, SCHEMA, name="numbers")
    failures: list[str] = []
    report = run_checked(spark, job, df, str(tmp_path / "out"), on_failure=failures.append,
                         also=lambda: os.path.isdir(markers) and len(os.listdir(markers)) == 2)
    assert report.restarts == 1
    assert "2 checkpoints failed in a row, more than the 1 tolerated" in failures[0]


def test_a_retried_subtask_reports_its_last_value_and_the_coordinator_resumes_from_there(
        spark, tmp_path) -> None:
    from tests.spark.scenarios import ResumingCollector, ResumingNumbers

    markers = str(tmp_path / "markers")
    job = CoordinatedJob(spark, str(tmp_path / "ckpt"), checkpoint_interval_s=0.3)
    coordinator = functools.partial(ResumingNumbers, total=N, per_tick=1, interval_s=0.05)
    operator = functools.partial(ResumingCollector, fail_task_at=N // 3, marker_dir=markers)
    df = job.source(operator, coordinator, 2, SCHEMA, name="numbers")
    report = run_checked_values(spark, job, df, str(tmp_path / "out"))
    assert report.restarts == 0  # a Spark task retry, not a query restart
    assert os.path.exists(os.path.join(markers, "fail_task-numbers-0")), "no task failed"
    snap = latest_snapshot(job, "numbers", "numbers")
    assert snap["next"] == [N, N]


def run_checked_values(spark, job: CoordinatedJob, df, out: str):
    writer = df.writeStream.format("parquet").option("path", out).trigger(processingTime="0 seconds")
    report = job.run(writer, until=lambda: len(sink_rows(spark, out)) >= 2 * N, timeout_s=300)
    assert values_by_subtask(sink_rows(spark, out)) == {
        ("numbers", 0): list(range(N)), ("numbers", 1): list(range(N))}
    for s in (0, 1):
        assert latest_state(job, "numbers", "numbers", s) == list(range(N))
    return report


def test_a_deleted_subtask_state_file_ends_the_job_with_sparkcoords_error_first(
        spark, tmp_path, caplog) -> None:
    # issue 24 item 6: raised in a task, StateMissing reaches the driver program inside Spark's
    # wrappers ([STREAM_FAILED] ... [FOREACH_BATCH_USER_FUNCTION_ERROR] ... Python Proxy)
    import logging

    from sparkcoord.runtime.restart import NoRestart
    from sparkcoord.spark import JobGaveUp
    from tests.spark.helpers import numbers_job, run_until_rows

    job, df = numbers_job(spark, str(tmp_path), total=N // 2)
    run_until_rows(spark, job, df, str(tmp_path / "out"), N)
    state_dir = os.path.join(job.coordination_url("numbers"), "state", "numbers", "0")
    newest = max((f for f in os.listdir(state_dir) if f.endswith(".state")),
                 key=lambda f: int(f[:-len(".state")]))
    deleted = os.path.join(state_dir, newest)
    os.remove(deleted)
    job2, df2 = numbers_job(spark, str(tmp_path), total=N)  # more numbers: a batch must run
    failures: list[str] = []
    writer = df2.writeStream.foreachBatch(lambda batch, _: batch.collect()).trigger(
        processingTime="0 seconds")
    with caplog.at_level(logging.ERROR, logger="sparkcoord"), pytest.raises(JobGaveUp) as caught:
        job2.run(writer, restart=NoRestart(), on_failure=failures.append, timeout_s=240)
    ours = f"StateMissing: {deleted} is missing: numbers[0] ran the batch of epoch "
    text = str(caught.value)
    assert text.splitlines()[0].startswith(ours), text[:2000]
    assert "[STREAM_FAILED]" in text and "[FOREACH_BATCH_USER_FUNCTION_ERROR]" in text  # after
    assert text.index("[STREAM_FAILED]") > text.index(ours)
    assert len(failures) == 1 and failures[0].startswith(ours), failures
    gave_up = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR
               and r.name == "sparkcoord.spark.job"]
    assert len(gave_up) == 1 and f"gave up: {ours}" in gave_up[0], gave_up
